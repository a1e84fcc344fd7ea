"""`check --snapshot -`: a snapshot piped in (`gpudoctor snapshot -o - | ssh node gpudoctor check
--snapshot -`) is judged like the same file; bad input is one line and exit 2; a terminal on
standard input is refused at once rather than waited on."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.helpers.processes import GPUDOCTOR, run_gpudoctor
from tests.helpers.terminal import Terminal
from tests.paths import FIXTURES

SNAPSHOT = FIXTURES / "h100_sxm_8x.json"


def _check(args: list[str], stdin: bytes) -> subprocess.CompletedProcess[bytes]:
    """`gpudoctor check ARGS` with `stdin` on its standard input, its output as bytes."""
    return run_gpudoctor("check", *args, input=stdin, text=False, timeout=120)  # type: ignore[return-value]


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


def test_a_non_blocking_pipe_written_late_is_read_to_its_end() -> None:
    """review5: a pipe set O_NONBLOCK by its writer gave `read()` None and an internal error."""
    import fcntl
    import os
    import time

    r, w = os.pipe()
    fcntl.fcntl(r, fcntl.F_SETFL, fcntl.fcntl(r, fcntl.F_GETFL) | os.O_NONBLOCK)
    proc = subprocess.Popen(
        [*GPUDOCTOR, "check", "--snapshot", "-", "--json"], stdin=r, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    os.close(r)
    time.sleep(0.5)  # gpudoctor is reading before any data is there
    os.write(w, SNAPSHOT.read_bytes())
    os.close(w)
    out, err = proc.communicate(timeout=120)
    assert err == b"" and json.loads(out)["source"] == "stdin"


def test_closed_or_oversized_stdin_is_one_line_naming_it() -> None:
    import os

    closed = run_gpudoctor("check", "--snapshot", "-", text=False, timeout=120, preexec_fn=lambda: os.close(0))
    assert closed.returncode == 2
    assert closed.stderr.decode() == "gpudoctor: cannot use snapshot -: standard input is closed\n"
    big = _check(["--snapshot", "-"], b"x" * ((32 << 20) + 1))
    assert big.returncode == 2
    assert big.stderr.decode() == "gpudoctor: cannot use snapshot -: is larger than 32 MiB\n"


def test_the_python_api_reads_an_in_memory_stdin_and_refuses_a_closed_one(monkeypatch: pytest.MonkeyPatch) -> None:
    import io

    import gpudoctor
    from gpudoctor.errors import UserError

    monkeypatch.setattr(sys, "stdin", io.StringIO(SNAPSHOT.read_text()))
    assert gpudoctor.run_checks(snapshot="-").source == "stdin"
    sys.stdin.close()
    with pytest.raises(UserError, match="standard input is closed"):
        gpudoctor.run_checks(snapshot="-")


def test_a_baseline_is_not_read_from_stdin() -> None:
    result = _check(["--snapshot", str(SNAPSHOT), "--baseline", "-"], SNAPSHOT.read_bytes())
    assert result.returncode == 2 and b"only `check --snapshot -` reads stdin" in result.stderr
