"""`check --snapshot -`: a snapshot piped in (`gpudoctor snapshot -o - | ssh node gpudoctor check
--snapshot -`) is judged like the same file; bad input is one line and exit 2; a terminal on
standard input is refused at once rather than waited on."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.clirun import FIXTURES
from tests.terminal import Terminal

SNAPSHOT = FIXTURES / "h100_sxm_8x.json"
GPUDOCTOR = [sys.executable, "-m", "gpudoctor"]


def _check(args: list[str], stdin: bytes) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([*GPUDOCTOR, "check", *args], input=stdin, capture_output=True, timeout=120)


def _verdicts(doc: dict) -> list[tuple[str, str, str]]:
    return [(f["code"], f["status"], f["message"]) for c in doc["checks"] for f in c["findings"]]


def test_a_piped_snapshot_is_judged_like_the_same_file() -> None:
    piped = _check(["--snapshot", "-", "--json"], SNAPSHOT.read_bytes())
    named = _check(["--snapshot", str(SNAPSHOT), "--json"], b"")
    assert piped.returncode == named.returncode
    a, b = json.loads(piped.stdout), json.loads(named.stdout)
    assert a["source"] == "stdin" and b["source"] == str(SNAPSHOT)
    assert _verdicts(a) == _verdicts(b) and len(_verdicts(a)) > 10


def test_bad_input_on_stdin_is_one_line_and_exit_2() -> None:
    for data, why in [(b"", "not valid JSON"), (b"\xff\xfe", "not a text file"), (b"[1, 2]", "snapshot -")]:
        result = _check(["--snapshot", "-"], data)
        lines = result.stderr.decode().strip().splitlines()
        assert result.returncode == 2 and len(lines) == 1, result.stderr
        assert lines[0].startswith("gpudoctor: cannot use snapshot -: ") and why in lines[0]


def test_a_terminal_on_stdin_is_refused_not_waited_on() -> None:
    with Terminal(["check", "--snapshot", "-"], 80, 24) as term:
        code, out = term.finish(timeout=30)
    assert code == 2
    assert b"standard input is a terminal" in out
