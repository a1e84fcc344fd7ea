"""`gpudoctor watch` / `report` options: bad values are usage errors, never a busy loop or a lost file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import click
import jsonschema
import pytest

from gpudoctor.cli.types import FiniteFloat
from tests.helpers.processes import GpudoctorCli, clean_env
from tests.paths import FIXTURES, shipped_schema

RECORDINGS = FIXTURES / "recordings"
SCHEMA = shipped_schema("watch_summary")
FAKE = clean_env(GPUDOCTOR_WATCH_FAKE="healthy:4", PYTHONUNBUFFERED="1")


def test_finite_float_refuses_nan_and_infinities() -> None:
    @click.command()
    @click.option("--x", type=FiniteFloat(min=0.1))
    def cmd(x: float) -> None:
        click.echo(repr(x))

    for bad in ("nan", "NaN", "inf", "-inf", "Infinity", "1e999"):
        with pytest.raises(click.BadParameter, match="not a finite number"):
            cmd.main(["--x", bad], standalone_mode=False)
    with pytest.raises(click.BadParameter, match="x>=0.1"):
        cmd.main(["--x", "0.01"], standalone_mode=False)
    assert cmd.main(["--x", "0.5"], standalone_mode=False) is None


@pytest.mark.parametrize(
    "option",
    [
        ("--interval", "nan"),
        ("--duration", "nan"),
        ("--duration", "inf"),
        ("--process-interval", "inf"),
        ("--speed", "-inf"),
        ("--speed", "nan"),
    ],
)
def test_non_finite_option_values_are_usage_errors(option: tuple[str, str], gpudoctor_cli: GpudoctorCli) -> None:
    start = time.monotonic()
    r = gpudoctor_cli("watch", "--no-tui", *option, env=FAKE)  # before: a busy loop, or a run that never ends
    assert r.returncode == 2, r.stdout[-500:]
    assert "not a finite number" in r.stderr and r.stdout == ""
    assert time.monotonic() - start < 15


def test_gpus_naming_a_gpu_that_is_not_there_is_a_usage_error(gpudoctor_cli: GpudoctorCli) -> None:
    r = gpudoctor_cli("watch", "--no-tui", "--duration", "1", "--gpus", "9", env=FAKE)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.strip() == "gpudoctor: --gpus: no GPU 9 in this machine, which has GPUs 0,1,2,3"
    r = gpudoctor_cli("watch", "--replay", str(RECORDINGS / "healthy.jsonl"), "--no-tui", "--gpus", "3,8", env=FAKE)
    assert r.returncode == 2 and "no GPU 8 in the recording, which has GPUs 0,1,2,3,4,5,6,7" in r.stderr
    r = gpudoctor_cli("watch", "--no-tui", "--duration", "1", "--gpus", "0,0", env=FAKE)
    assert r.returncode == 2 and "--gpus names GPU 0 more than once" in r.stderr
    r = gpudoctor_cli("watch", "--no-tui", "--duration", "0.5", "--interval", "0.2", "--gpus", "1,3", env=FAKE)
    assert r.returncode == 0 and "util% [" in r.stdout and "2 GPUs" in r.stdout


def test_record_never_overwrites_a_previous_recording(tmp_path: Path, gpudoctor_cli: GpudoctorCli) -> None:
    old = tmp_path / "run.jsonl"
    old.write_text("precious\n")
    r = gpudoctor_cli("watch", "--no-tui", "--duration", "0.5", "--interval", "0.2", "--record", str(old), env=FAKE)
    assert r.returncode == 2 and "exists; use --force" in r.stderr and r.stdout == ""
    assert old.read_text() == "precious\n"
    r = gpudoctor_cli(
        "watch", "--no-tui", "--duration", "0.5", "--interval", "0.2", "--record", str(old), "--force", env=FAKE
    )
    assert r.returncode == 0, r.stderr
    assert old.read_text().startswith('{"format":"gpudoctor-watch"')
    empty = tmp_path / "empty.jsonl"
    empty.touch()  # e.g. made by mktemp: nothing to lose
    r = gpudoctor_cli("watch", "--no-tui", "--duration", "0.5", "--interval", "0.2", "--record", str(empty), env=FAKE)
    assert r.returncode == 0 and empty.stat().st_size > 0
    r = gpudoctor_cli("watch", "--no-tui", "--duration", "0.5", "--force", env=FAKE)
    assert r.returncode == 2 and "--force goes with --record" in r.stderr


def test_json_lines_errors_are_one_json_line(tmp_path: Path, gpudoctor_cli: GpudoctorCli) -> None:
    existing = tmp_path / "run.jsonl"
    existing.write_text("x\n")
    cases = [
        ("--interval", "nan"),  # click's own option parsing
        ("--gpus", "9"),  # gpudoctor's usage error
        ("--record", str(existing)),
        ("--replay", str(tmp_path / "missing.jsonl")),
    ]
    for case in cases:
        r = gpudoctor_cli("watch", "--json", "--duration", "1", *case, env=FAKE)
        assert r.returncode == 2, case
        lines = r.stdout.splitlines()
        assert len(lines) == 1, (case, r.stdout)
        doc = json.loads(lines[0])
        jsonschema.validate(doc, SCHEMA["$defs"]["error_line"])
        assert doc["kind"] == "error" and doc["exit_code"] == 2 and doc["error"]["message"], case
        assert len(r.stderr.strip().splitlines()) == 1 and r.stderr.startswith("gpudoctor: ")


def test_an_unwritable_record_path_is_refused_before_the_job_starts(
    tmp_path: Path, gpudoctor_cli: GpudoctorCli
) -> None:
    marker = tmp_path / "started"
    env = clean_env(GPUDOCTOR_WATCH_FAKE="healthy:2")
    out = gpudoctor_cli(
        "watch",
        "--no-tui",
        "--record",
        str(tmp_path / "no" / "such" / "x.jsonl"),
        "--",
        sys.executable,
        "-c",
        f"open({str(marker)!r}, 'w')",
        env=env,
    )
    assert out.returncode == 3
    assert "no directory" in out.stderr and out.stderr.count("\n") == 1
    assert not marker.exists()  # the command never ran


def _on_a_pty(args: list[str], env: dict[str, str], timeout: float = 30) -> tuple[int, bytes]:
    """Run gpudoctor with a pseudo-terminal as its stdin/stdout/stderr; returns the exit code and all it wrote."""
    import pty

    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpudoctor", *args], stdin=slave, stdout=slave, stderr=slave, env=env
    )
    os.close(slave)
    out = bytearray()
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            try:
                data = os.read(master, 65536)
            except OSError:
                break
            if not data:
                break
            out.extend(data)
        return proc.wait(timeout=5), bytes(out)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)


def test_a_dumb_terminal_gets_lines_not_the_dashboard() -> None:
    for term in ("dumb", None):
        env = {k: v for k, v in FAKE.items() if k != "TERM"}
        if term:
            env["TERM"] = term
        code, out = _on_a_pty(["watch", "--duration", "1.5", "--interval", "0.3"], env)
        assert code == 0, out[-500:]
        assert b"cannot show the dashboard; printing lines (--no-tui)" in out
        assert out.count(b"util% [") >= 3
        assert b"\x1b[?1000h" not in out and b"\x1b[?1049h" not in out  # no mouse tracking, no alternate screen
