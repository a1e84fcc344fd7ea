"""What the CLI does when its output or its run is cut short, and with options that make no sense."""

from __future__ import annotations

import json
import subprocess
import sys

import jsonschema
import pytest

from gpudoctor.schemas import report_schema
from tests.helpers.processes import GpudoctorCli, clean_env
from tests.paths import CONTAINER, H100


def no_traceback(stderr: str) -> None:
    assert "Traceback" not in stderr and "Exception ignored" not in stderr
    assert stderr.count("\n") <= 1


@pytest.mark.parametrize(("fixture", "verdict"), [(H100, 0), (CONTAINER, 1)])
def test_a_reader_closing_the_pipe_early_does_not_change_the_verdict(fixture: str, verdict: int) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpudoctor", "check", "--snapshot", fixture, "-v"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # like `| head -0`: every write gets EPIPE
    assert proc.wait(timeout=60) == verdict
    no_traceback(proc.stderr.read())


def test_a_full_disk_on_stdout_is_one_line_and_exit_3(gpudoctor_cli: GpudoctorCli) -> None:
    with open("/dev/full", "w") as full:
        out = gpudoctor_cli(
            "check", "--snapshot", H100, "--json", stdout=full, stderr=subprocess.PIPE, capture_output=False
        )
    assert out.returncode == 3
    assert out.stderr == "gpudoctor: cannot write to standard output: No space left on device\n"


def test_a_closed_stdout_is_one_line_and_exit_3() -> None:
    out = subprocess.run(
        f"{sys.executable} -m gpudoctor list-checks >&-", shell=True, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 3
    assert out.stderr == "gpudoctor: cannot write to standard output: standard output is closed\n"


def test_a_gate_that_checked_nothing_is_a_usage_error_not_ready(gpudoctor_cli: GpudoctorCli) -> None:
    out = gpudoctor_cli("check", "--snapshot", H100, "--select", "ddp", "--json")
    assert out.returncode == 2
    doc = json.loads(out.stdout)
    jsonschema.validate(doc, report_schema())
    assert doc["error"]["kind"] == "usage"
    assert "no check ran" in doc["error"]["message"] and "ddp" in doc["error"]["message"]


@pytest.mark.parametrize(
    "args",
    [
        ["--timeout", "nan"],
        ["--timeout", "inf"],
        ["--min-busbw", "nan"],
        ["--ram-per-gpu", "-inf"],
        ["--ranks", "3"],  # ranks only mean something on CPU
    ],
)
def test_options_that_make_no_sense_are_usage_errors(args: list[str], gpudoctor_cli: GpudoctorCli) -> None:
    out = gpudoctor_cli("check", "--snapshot", H100, *args)
    assert out.returncode == 2, out.stdout
    assert "Traceback" not in out.stderr


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["check", "--bogus"], "No such option '--bogus'"),
        (["explain"], "Missing argument 'CODE'"),
        (["no-such-command"], "No such command"),
    ],
)
def test_usage_errors_are_one_line(args: list[str], says: str, gpudoctor_cli: GpudoctorCli) -> None:
    out = gpudoctor_cli(*args)
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1 and says in out.stderr and "--help" in out.stderr


def test_json_after_double_dash_belongs_to_the_followed_command(gpudoctor_cli: GpudoctorCli) -> None:
    env = clean_env(GPUDOCTOR_WATCH_FAKE="healthy:2")
    out = gpudoctor_cli("watch", "--no-tui", "--gpus", "9", "--", "true", "--json", env=env)
    assert out.returncode == 2
    assert out.stdout == ""  # no JSON error document: gpudoctor was not asked for JSON
