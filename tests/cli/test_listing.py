"""list-checks lists every code in order, explain says where a code comes from (and speaks JSON),
and the text report honours -q, --color and NO_COLOR, also on a real terminal."""

from __future__ import annotations

import json
import os
import pty
import re
import select
import subprocess
import sys

import pytest

from gpudoctor.catalogue import catalogue
from tests.helpers.cli import run_cli
from tests.paths import CONTAINER, REPO

ANSI = re.compile(r"\x1b\[[0-9;]*m")


def test_list_checks_lists_every_code_sorted(capsys: pytest.CaptureFixture[str]) -> None:
    r = run_cli(capsys, "list-checks")
    codes = [line.split()[0] for line in r.out.splitlines()[1:]]  # under the heading line
    assert codes == sorted(catalogue().codes)
    assert {"GD001", "GD002", "GD901", "GD908"} <= set(codes)
    rows = json.loads(run_cli(capsys, "list-checks", "--json").out)
    assert [row["code"] for row in rows] == codes
    by_code = {row["code"]: row for row in rows}
    assert by_code["GD901"]["check"] == "watch" and by_code["GD901"]["selectable"] is False
    assert by_code["GD001"]["kind"] == "runner" and by_code["GD401"]["selectable"] is True


def test_explain_a_watch_code_does_not_offer_a_select_that_fails(capsys: pytest.CaptureFixture[str]) -> None:
    text = run_cli(capsys, "explain", "GD901").out
    assert "--select GD901" not in text and "gpudoctor watch" in text
    r = run_cli(capsys, "check", "--snapshot", CONTAINER, "--select", "GD901")
    assert r.exit_code == 2 and "`gpudoctor watch` codes, which `check` never gives" in r.err


def test_explain_json_is_one_document(capsys: pytest.CaptureFixture[str]) -> None:
    r = run_cli(capsys, "explain", "gd401", "--json")
    doc = json.loads(r.out)
    assert r.exit_code == 0
    assert doc["code"] == "GD401" and doc["raised_by"] == "topology" and doc["selectable"] is True
    assert all(doc[k] for k in ("what", "why", "fix", "title", "name"))
    bad = run_cli(capsys, "explain", "GD999", "--json")
    assert bad.exit_code == 2 and json.loads(bad.out)["error"]["kind"] == "usage"


def test_quiet_prints_only_what_is_not_a_pass_and_the_summary(capsys: pytest.CaptureFixture[str]) -> None:
    compact = run_cli(capsys, "check", "--snapshot", CONTAINER).out
    quiet = run_cli(capsys, "check", "--snapshot", CONTAINER, "-q").out
    assert "[✓] NVIDIA driver and NVML" in compact and "[✓]" not in quiet
    assert compact.startswith("gpudoctor ") and not quiet.startswith("gpudoctor ")
    lines = quiet.splitlines()
    assert lines[0] == "[✗] Host RAM for the GPUs" and lines[-1] == compact.splitlines()[-1]  # the summary
    assert [ln.split()[1] for ln in lines if ln.startswith("  ") and "hint:" not in ln] == ["GD501", "GD502"]
    both = run_cli(capsys, "check", "--snapshot", CONTAINER, "-q", "-v")
    assert both.exit_code == 2 and "opposite" in both.err


def _on_a_terminal(*args: str, env: dict[str, str]) -> str:
    """What `gpudoctor check ...` writes when its stdout is a real terminal (a pty)."""
    leader, follower = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpudoctor", "check", "--snapshot", CONTAINER, *args],
        stdout=follower,
        stderr=subprocess.DEVNULL,
        cwd=REPO,
        env={**{k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "FORCE_COLOR", "TERM")}, **env},
    )
    os.close(follower)
    chunks = []
    while True:
        ready, _, _ = select.select([leader], [], [], 30)
        if not ready:
            break
        try:
            data = os.read(leader, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    proc.wait(timeout=30)
    os.close(leader)
    return b"".join(chunks).decode("utf-8", "replace")


@pytest.mark.parametrize(
    ("args", "env", "styled"),
    [
        ((), {"TERM": "xterm-256color"}, True),
        ((), {"TERM": "xterm-256color", "NO_COLOR": "1"}, False),
        (("--color", "never"), {"TERM": "xterm-256color"}, False),
        (("--color", "always"), {"TERM": "xterm-256color", "NO_COLOR": "1"}, True),  # the option wins
    ],
    ids=["terminal", "NO_COLOR", "never", "always-beats-NO_COLOR"],
)
def test_styling_on_a_terminal(args: tuple[str, ...], env: dict[str, str], styled: bool) -> None:
    out = _on_a_terminal(*args, env=env)
    assert "GD501" in out
    assert bool(ANSI.search(out)) is styled, out[:300]


def test_color_always_styles_a_pipe_too(capsys: pytest.CaptureFixture[str]) -> None:
    assert ANSI.search(run_cli(capsys, "check", "--snapshot", CONTAINER, "--color", "always").out)
    assert not ANSI.search(run_cli(capsys, "check", "--snapshot", CONTAINER).out)
