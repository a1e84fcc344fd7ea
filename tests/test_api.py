"""The Python API: gpudoctor.run_checks returns the report, gpudoctor.preflight raises on a failing machine."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import gpudoctor
from gpudoctor.findings import Report, Status
from tests.helpers.snapshots import fixture
from tests.paths import REPO

H100 = fixture("h100_sxm_8x")
MIXED = fixture("rtx4090_2x_rtx4080_1x")


pytestmark = pytest.mark.usefixtures("no_policy")


def test_run_checks_returns_the_report_that_check_json_prints() -> None:
    report = gpudoctor.run_checks(snapshot=H100, expect_gpus=8)
    assert isinstance(report, Report) and report.exit_code == 0
    assert report.source == str(H100) and report.facts is not None and len(report.facts["gpus"]) == 8
    assert {f.code for f in report.findings if f.code == "GD202"} == {"GD202"}
    doc = report.to_json()
    assert doc["command"] == "check" and doc["summary"]["fail"] == 0


def test_run_checks_takes_a_snapshot_object_and_the_cli_options() -> None:
    from gpudoctor import snapshot as snap

    report = gpudoctor.run_checks(snapshot=snap.load(MIXED), ignore=["GD301", "GD302"], fail_on="warn")
    assert report.source == "snapshot" and report.fail_on is Status.WARN and report.exit_code == 1
    assert not {"GD301", "GD302"} & {f.code for f in report.findings}


def test_preflight_raises_one_error_listing_every_failure_with_its_hint() -> None:
    with pytest.raises(gpudoctor.PreflightError) as caught:
        gpudoctor.preflight(snapshot=MIXED)
    err = caught.value
    assert [f.code for f in err.failures] == ["GD301", "GD302"]
    text = str(err)
    assert text.splitlines()[0] == "gpudoctor preflight: 2 finding(s) at or above fail:"
    assert "FAIL GD301 gpu:1: GPU 1 is an NVIDIA GeForce RTX 4080" in text and "hint: Train on identical GPUs" in text
    assert err.report.exit_code == 1


def test_preflight_returns_the_report_when_ready_and_judges_expect_gpus() -> None:
    assert gpudoctor.preflight(8, snapshot=H100).exit_code == 0
    with pytest.raises(gpudoctor.PreflightError) as caught:
        gpudoctor.preflight(16, snapshot=H100)
    assert [f.code for f in caught.value.failures] == ["GD202"]


def test_the_api_reads_the_policy_and_arguments_win(tmp_path: Path) -> None:
    (tmp_path / "gpudoctor.toml").write_text('expect-model = "A100"\n')
    (tmp_path / "gpudoctor.toml").chmod(0o644)  # a group-writable file is not trusted, whatever the umask
    with pytest.raises(gpudoctor.PreflightError) as caught:
        gpudoctor.preflight(snapshot=H100)
    assert {f.code for f in caught.value.failures} == {"GD010"}
    assert gpudoctor.preflight(snapshot=H100, expect_model="H100").exit_code == 0
    assert gpudoctor.preflight(snapshot=H100, use_config=False).policy is None


def test_bad_arguments_raise_user_error() -> None:
    with pytest.raises(gpudoctor.UserError, match="unknown check or code 'GD999'"):
        gpudoctor.run_checks(snapshot=H100, select=["GD999"])
    with pytest.raises(gpudoctor.UserError, match="fail_on must be"):
        gpudoctor.run_checks(snapshot=H100, fail_on="error")
    with pytest.raises(gpudoctor.UserError, match="no such file"):
        gpudoctor.run_checks(snapshot="/nonexistent/snapshot.json")


def test_diff_report_is_the_diff_command_as_a_function() -> None:
    report = gpudoctor.diff_report(H100, fixture("a100_sxm_8x"))
    assert report.command == "diff" and report.exit_code == 1
    assert {f.code for f in report.findings if f.status is Status.FAIL} == {"GD011", "GD013"}


def _python(code: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"},
    )


def test_preflight_imports_no_torch_and_import_gpudoctor_stays_light(tmp_path: Path) -> None:
    out = _python(
        f"""
        import json, sys
        import gpudoctor
        light = sorted(m for m in ("gpudoctor.api", "click", "rich", "textual") if m in sys.modules)
        failed = []
        try:  # live: this machine (no GPU in CI: GD101 fails)
            gpudoctor.preflight(expect_gpus=8)
        except gpudoctor.PreflightError as exc:
            failed = [f.code for f in exc.failures]
        gpudoctor.preflight(8, snapshot={str(H100)!r})
        print(json.dumps({{"light": light, "torch": "torch" in sys.modules, "failed": failed}}))
        """,
        tmp_path,
    )
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["light"] == []  # `import gpudoctor` loads none of the API, the CLI or the UI
    assert result["torch"] is False
    assert isinstance(result["failed"], list)


def test_a_training_script_sees_the_error_not_a_traceback_from_inside(tmp_path: Path) -> None:
    out = _python(
        f"""
        import gpudoctor
        gpudoctor.preflight(snapshot={str(MIXED)!r})
        """,
        tmp_path,
    )
    assert out.returncode == 1
    last = out.stderr.strip().splitlines()
    assert any(line.startswith("gpudoctor.PreflightError: gpudoctor preflight: 2 finding(s)") for line in last)
    assert "hint:" in out.stderr


# --- arguments are checked as the command line's options are ---------------------------------

BAD_ARGUMENTS = [
    ({"expect_gpus": "8"}, TypeError, "expect_gpus must be an integer of at least 1, got '8' (str)"),
    ({"expect_gpus": True}, TypeError, "expect_gpus must be an integer"),
    ({"expect_gpus": 9.5}, TypeError, "expect_gpus must be an integer"),
    ({"expect_gpus": 0}, ValueError, "expect_gpus must be an integer of at least 1, got 0"),
    ({"expect_gpus": -1}, ValueError, "got -1"),
    ({"ram_per_gpu_gb": float("nan")}, ValueError, "ram_per_gpu_gb must be a finite number"),
    ({"ram_per_gpu_gb": "16"}, TypeError, "ram_per_gpu_gb must be a number"),
    ({"timeout_s": -5}, ValueError, "timeout_s must be a finite number of at least 1"),
    ({"ranks": 0, "device": "cpu"}, ValueError, "ranks must be an integer from 1 to 64, got 0"),
    ({"ranks": 1000, "device": "cpu"}, ValueError, "ranks must be an integer from 1 to 64, got 1000"),
    ({"select": "GD4"}, TypeError, "select takes a list of strings, e.g. select=['GD4'], not a string"),
    ({"ignore": ["GD105", ""]}, TypeError, "ignore takes a list of non-empty strings"),
    ({"expect_model": ""}, ValueError, "expect_model must not be empty"),
    ({"expect_model": 8}, TypeError, "expect_model must be a string"),
    ({"allow_mig": "yes"}, TypeError, "allow_mig must be True or False"),
    ({"fail_on": "error"}, ValueError, "fail_on must be 'warn' or 'fail'"),
    ({"device": "gpu"}, ValueError, "device must be 'auto' or 'cuda' or 'cpu'"),
    ({"level": 4}, ValueError, "level must be an integer from 1 to 3"),
    ({"duration_s": 0, "level": 3}, ValueError, "duration_s must be a finite number from 1 to 86400"),
    ({"mem_share": 5.0, "level": 3}, ValueError, "mem_share must be a finite number from 0.01 to 0.95"),
    ({"min_busbw": float("inf")}, ValueError, "min_busbw must be a finite number"),
    ({"tolerance": 1.5}, ValueError, "tolerance 1.5 is ambiguous"),
    ({"tolerance": [0.1]}, TypeError, "tolerance must be a share"),
    ({"snapshot": {"gpus": []}}, TypeError, "snapshot must be a file name (str or pathlib.Path)"),
    ({"baseline": ""}, ValueError, "baseline must name a file"),
    ({"progress": "print"}, TypeError, "progress must be a function"),
]


@pytest.mark.parametrize(("kwargs", "kind", "words"), BAD_ARGUMENTS, ids=lambda v: str(v)[:40])
def test_bad_arguments_raise_type_or_value_errors_naming_the_keyword(
    monkeypatch: pytest.MonkeyPatch, kwargs: dict, kind: type, words: str
) -> None:
    def no_probe() -> None:
        raise AssertionError("the probe ran before the arguments were checked")

    monkeypatch.setattr("gpudoctor.probe.collect", no_probe)
    with pytest.raises(kind) as caught:
        gpudoctor.run_checks(use_config=False, **kwargs)
    assert isinstance(caught.value, gpudoctor.UserError)  # the documented type still catches it
    assert words in str(caught.value)


def test_integers_of_any_integral_type_are_taken() -> None:
    class Int64:  # what numpy.int64 offers (numpy is not a dependency): an integer through __index__
        def __index__(self) -> int:
            return 8

    report = gpudoctor.run_checks(snapshot=H100, expect_gpus=Int64(), use_config=False)  # type: ignore[arg-type]
    assert report.exit_code == 0


def test_diff_report_checks_its_arguments_too() -> None:
    with pytest.raises(TypeError, match="ignore takes a list of strings"):
        gpudoctor.diff_report(H100, H100, ignore="GD012")
    with pytest.raises(TypeError, match="after must be a file name"):
        gpudoctor.diff_report(H100, None)  # type: ignore[arg-type]


# --- a gate that checked nothing is not READY -------------------------------------------------


def test_run_checks_that_skipped_everything_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(gpudoctor.UserError) as caught:
        gpudoctor.run_checks(level=3, select=["deep_links"], device="cpu", use_config=False)
    assert caught.value.exit_code == 2
    assert str(caught.value) == (
        "nothing was checked: every selected check skipped (deep_links: host links not measured: --device cpu)"
    )
    from tests.helpers.cli import run_cli

    r = run_cli(capsys, "check", "--level", "3", "--select", "deep_links", "--device", "cpu", "--json")
    assert r.exit_code == 2 and r.doc["error"]["kind"] == "usage" and "nothing was checked" in r.doc["error"]["message"]


def test_diff_of_two_reports_with_nothing_to_compare_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    v1 = fixture("reports/v1-h100-static")  # no facts, no measurements
    with pytest.raises(gpudoctor.UserError, match="nothing was compared: every selected check skipped"):
        gpudoctor.diff_report(v1, v1, use_config=False)
    from tests.helpers.cli import run_cli

    r = run_cli(capsys, "diff", str(v1), str(v1))
    assert r.exit_code == 2 and "records no machine facts" in r.err and r.err.count("\n") == 1


def test_preflight_with_nothing_to_check_raises_rather_than_pass() -> None:
    with pytest.raises(gpudoctor.UserError, match="nothing was checked"):
        gpudoctor.preflight(quick=False, level=3, select=["deep_links"], device="cpu", use_config=False)


# --- PreflightError: a Python caller's words, and it travels -----------------------------------


def test_preflight_error_speaks_in_keywords_not_command_line_options() -> None:
    with pytest.raises(gpudoctor.PreflightError) as caught:
        gpudoctor.preflight(16, snapshot=H100, use_config=False)
    text = str(caught.value)
    assert "8 GPU(s) visible, expect_gpus=16: too few" in text and "--expect-gpus" not in text
    (failure,) = caught.value.failures
    assert "--expect-gpus 16" in failure.message  # the report itself is the command's


def test_preflight_error_survives_a_pickle_round_trip() -> None:
    import pickle

    with pytest.raises(gpudoctor.PreflightError) as caught:
        gpudoctor.preflight(snapshot=MIXED, use_config=False)
    again = pickle.loads(pickle.dumps(caught.value))
    assert type(again) is gpudoctor.PreflightError and str(again) == str(caught.value)
    assert [f.code for f in again.failures] == ["GD301", "GD302"] and again.report.exit_code == 1


def test_keywords_leave_other_tools_options_and_quoted_commands_alone() -> None:
    from gpudoctor.api import as_keywords

    assert as_keywords("docker run --gpus all --shm-size 8g") == "docker run --gpus all --shm-size 8g"
    assert as_keywords("run `gpudoctor check --level 3` or pass --allow-mig.") == (
        "run `gpudoctor check --level 3` or pass allow_mig=True."
    )
    assert as_keywords("--collectives allgather,reducescatter, --min-busbw 80%") == (
        "collectives=['allgather', 'reducescatter'], min_busbw='80%'"
    )
