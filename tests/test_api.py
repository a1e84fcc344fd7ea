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
from tests.clirun import REPO_ROOT, fixture

H100 = fixture("h100_sxm_8x")
MIXED = fixture("rtx4090_2x_rtx4080_1x")


@pytest.fixture(autouse=True)
def _no_policy(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)


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
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO_ROOT), "OMP_NUM_THREADS": "1"},
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
