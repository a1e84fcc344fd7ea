"""`gpudoctor report` on a long recording says how far it has read, on a terminal only (a day of 8 GPUs
takes most of a minute), and leaves nothing of it behind."""

from __future__ import annotations

import gzip
import io
import os
import pty
import re
import sys
from pathlib import Path

import pytest

from gpudoctor.cli.output import ProgressLine
from gpudoctor.watch import summary
from gpudoctor.watch.recording import RecordWriter
from gpudoctor.watch.summary import summarize_recording
from gpudoctor.watch.synthetic import synthetic_run
from tests.helpers.cli import run_cli

ERASE = "\r\x1b[K"


def recording(tmp_path: Path, n: int, compressed: bool = False) -> Path:
    path = tmp_path / "run.jsonl"
    writer = RecordWriter(str(path), {"interval": 1.0})
    for s in synthetic_run("straggler", n, ranks=True):
        writer.write(s)
    writer.close()
    if compressed:
        packed = tmp_path / "run.jsonl.gz"
        packed.write_bytes(gzip.compress(path.read_bytes()))
        return packed
    return path


@pytest.mark.parametrize("compressed", [False, True], ids=["plain", "gzip"])
def test_the_share_read_grows_to_the_whole_file(
    tmp_path: Path, compressed: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(summary, "PROGRESS_EVERY", 10)
    shares: list[float] = []
    done = summarize_recording(str(recording(tmp_path, 95, compressed)), progress=shares.append)
    assert done.samples == 95 and len(shares) == 9  # every 10 samples
    assert shares == sorted(shares) and 0 < shares[0] and shares[-1] <= 1
    if not compressed:  # a compressed file is read in blocks: a small one may be read whole at once
        assert shares[0] < 0.5 and shares[-1] > 0.8


class Tty:
    """A terminal for stderr: what is written reaches a pseudo-terminal, read back from its other end."""

    def __init__(self) -> None:
        self.master, slave = pty.openpty()
        self.stream = io.TextIOWrapper(os.fdopen(slave, "wb", buffering=0), encoding="utf-8", write_through=True)

    def read(self) -> str:
        self.stream.close()
        got = b""
        while True:
            try:
                chunk = os.read(self.master, 65536)
            except OSError:  # the other end closed: all is read
                break
            if not chunk:
                break
            got += chunk
        os.close(self.master)
        return got.decode()


def test_report_on_a_terminal_says_how_far_it_read_then_erases_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = str(recording(tmp_path, 120))
    quiet = run_cli(capsys, "report", path)  # into a pipe: no progress
    assert quiet.exit_code == 0 and quiet.err == ""
    monkeypatch.setattr(summary, "PROGRESS_EVERY", 20)
    monkeypatch.setattr(ProgressLine, "SHOW_AFTER_S", 0.0)  # this recording is read well under a second
    monkeypatch.setattr(ProgressLine, "EVERY_S", 0.0)
    tty = Tty()
    monkeypatch.setattr(sys, "stderr", tty.stream)
    shown = run_cli(capsys, "report", path)
    err = tty.read()
    assert shown.exit_code == 0 and shown.out == quiet.out  # the summary is the same
    shares = [int(p) for p in re.findall(r"\rgpudoctor: [^\r]*: (\d+)% read", err)]
    assert len(shares) == 6 and shares == sorted(shares) and shares[-1] <= 100, err
    assert err.endswith(ERASE), repr(err[-40:])  # what follows starts on a clean line


def test_report_into_a_log_gets_no_progress_however_long_it_takes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(summary, "PROGRESS_EVERY", 1)
    monkeypatch.setattr(ProgressLine, "SHOW_AFTER_S", 0.0)
    got = run_cli(capsys, "report", str(recording(tmp_path, 30)))
    assert got.exit_code == 0 and got.err == "" and "% read" not in got.out


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_waits_a_second_then_says_it_at_most_twice_a_second() -> None:
    clock, term = Clock(), FakeTerminal()
    line = ProgressLine("gpudoctor: run.jsonl", term, clock)
    line(0.1)
    clock.t += 0.9
    line(0.2)
    assert term.getvalue() == ""  # a quick command says nothing
    clock.t += 0.2
    line(0.3)
    clock.t += 0.2
    line(0.4)  # 0.2 s after the last: not said
    clock.t += 0.4
    line(0.456)
    assert term.getvalue() == "\rgpudoctor: run.jsonl: 30% read\rgpudoctor: run.jsonl: 46% read"
    line.done()
    assert term.getvalue().endswith(ERASE)
    quiet = FakeTerminal()
    ProgressLine("x", quiet, Clock()).done()  # nothing shown: nothing to erase
    assert quiet.getvalue() == ""


def test_a_file_name_cannot_reach_the_terminal_as_an_escape() -> None:
    clock, term = Clock(), FakeTerminal()
    line = ProgressLine("gpudoctor: \x1b]0;owned\x07run\n.jsonl", term, clock)
    clock.t += 2
    line(0.5)
    assert "\x1b" not in term.getvalue() and "\x07" not in term.getvalue() and "\n" not in term.getvalue()


def test_a_terminal_gone_mid_report_ends_the_progress_not_the_report() -> None:
    class Gone(FakeTerminal):
        def write(self, text: str) -> int:
            raise OSError(5, "Input/output error")

    clock = Clock()
    line = ProgressLine("gpudoctor: run.jsonl", Gone(), clock)
    clock.t += 2
    line(0.5)  # no exception
    line.done()
    assert not line.on and not line.shown
