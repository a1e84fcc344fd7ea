"""The real `gpudoctor watch` in a pseudo-terminal at 80x24, 120x40 and 200x60, read from the screen a
terminal emulator (pyte) shows: what a user sees, over SSH or in a tmux pane."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from gpudoctor.watch.recording import RecordWriter
from gpudoctor.watch.synthetic import STRAGGLER_GPU, synthetic_run
from tests.helpers.processes import GpudoctorCli
from tests.helpers.terminal import Terminal

SIZES = [(80, 24), (120, 40), (200, 60)]
HISTORY_S = 200  # more than 3 minutes of history behind the final screen


def straggler_recording(tmp_path: Path, n_gpus: int) -> tuple[Path, dict[int, int]]:
    """A straggler recording of `n_gpus` GPUs; returns it and the utilization of each GPU at its end."""
    path = tmp_path / f"straggler-{n_gpus}.jsonl"
    samples = synthetic_run("straggler", HISTORY_S, n_gpus=n_gpus, seed=11)
    writer = RecordWriter(str(path), {"interval": 1.0})
    for s in samples:
        writer.write(s)
    writer.close()
    return path, {g.index: g.util for g in samples[-1].gpus if g.util is not None}


def gpu_panel(screen: str) -> str:
    """The lines of the GPUs panel (between its top and bottom borders)."""
    lines = screen.splitlines()
    top = next(i for i, line in enumerate(lines) if "─ GPUs ─" in line)
    bottom = next(i for i in range(top + 1, len(lines)) if lines[i].lstrip().startswith("╰"))
    return "\n".join(lines[top + 1 : bottom])


def shown_utils(panel: str) -> dict[int, int]:
    """GPU index -> utilization % as drawn (one row per GPU, or several GPUs a line in compact mode)."""
    return {int(i): int(u) for i, u in re.findall(r"(?<![\d%/.])[*!]?(\d+) +(\d{1,3})%", panel)}


@pytest.mark.parametrize("n_gpus", [8, 32])
@pytest.mark.parametrize(("cols", "rows"), SIZES)
def test_every_gpu_and_the_straggler_verdict_are_on_screen(tmp_path: Path, cols: int, rows: int, n_gpus: int) -> None:
    path, last = straggler_recording(tmp_path, n_gpus)
    with Terminal(["watch", "--replay", str(path), "--speed", "100"], cols, rows) as term:
        screen = term.wait_for(lambda s: "recording ended" in s, timeout=90)
        panel = gpu_panel(screen)
        assert shown_utils(panel) == last, screen  # every GPU: its index and its latest utilization
        assert f"*{STRAGGLER_GPU} " in panel  # marked
        assert "GD901 straggler" in screen
        assert "│" in screen.splitlines()[rows - 2] or "╯" in screen.splitlines()[rows - 2]  # nothing pushed off
        assert all(len(line.rstrip()) <= cols for line in screen.splitlines())
        term.press(b"q")
        code, _ = term.finish()
        assert code == 0


def test_an_xid_keeps_its_verdict_on_the_final_screen_and_in_the_summary() -> None:
    with Terminal(["watch", "--replay", "sample:xid", "--speed", "100"], 80, 24) as term:
        screen = term.wait_for(lambda s: "recording ended" in s, timeout=90)
        assert "GD907 xid-event" in screen and "balanced" not in screen  # 140 s after the XID left the window
        assert "!6 " in gpu_panel(screen)
        term.press(b"q")
        code, raw = term.finish()
    assert code == 0
    summary = raw[raw.rfind(b"gpudoctor watch summary") :].decode()
    assert "GD907 xid-event" in summary and "XID 48" in summary


def test_the_status_line_fits_80_columns_while_paused() -> None:
    with Terminal(["watch", "--demo", "straggler", "--speed", "5"], 80, 24) as term:
        term.wait_for(lambda s: "demo straggler" in s, timeout=60)
        term.press(b"p")
        screen = term.wait_for(lambda s: "PAUSED" in s)
        status = screen.splitlines()[0]
        assert status.strip().startswith("PAUSED") and "t+" in status and len(status.rstrip()) <= 80
        term.press(b"q")
        assert term.finish()[0] == 0


EVIL_COMMAND = "python [bold red]MARKUP[/] [link=https://evil.example]CLICK[/link] \x1b]0;PWNEDTITLE\x07 \x1b[2J END"


def test_a_co_tenants_command_line_cannot_drive_the_terminal(tmp_path: Path, gpudoctor_cli: GpudoctorCli) -> None:
    # Another user's process on a GPU names itself with Rich markup and escape sequences: the
    # dashboard shows the text, and no link, title or screen clear reaches the terminal.
    path = tmp_path / "evil.jsonl"
    samples = synthetic_run("straggler", 20, n_gpus=2, seed=3)
    lines = [json.dumps({"format": "gpudoctor-watch", "version": 1, "interval": 1.0})]
    for s in samples:
        doc = s.to_json()
        doc["procs"] = [{"pid": 4242, "gpu": 0, "gpu_mem": 1000, "user": "[reverse]root[/]", "command": EVIL_COMMAND}]
        doc["gpus"][1]["name"] = "H100 \x1b]0;GPUTITLE\x07"
        lines.append(json.dumps(doc))
    path.write_text("\n".join(lines) + "\n")
    with Terminal(["watch", "--replay", str(path), "--speed", "20"], 200, 60) as term:
        screen = term.wait_for(lambda s: "recording ended" in s, timeout=90)
        assert "[link=https://evil.example]CLICK[/link]" in screen and "[reverse]root[/]" in screen
        term.press(b"q")
        code, raw = term.finish()
    assert code == 0
    assert b"\x1b]8;" not in raw, "no hyperlink escape"
    assert b"\x1b]0;PWNEDTITLE" not in raw and b"\x1b]0;GPUTITLE" not in raw, "no window title set"
    r = gpudoctor_cli("report", str(path))
    assert r.returncode == 0 and "\x1b" not in r.stdout and "\x07" not in r.stdout
