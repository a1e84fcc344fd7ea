"""docs/recipes/ exercised: the Slurm prolog against a fake scontrol, the CI jobs' scripts with their
variables set, the Kubernetes init container's command, the training script's preflight."""

from __future__ import annotations

import json
import os
import runpy
import subprocess
import sys
from pathlib import Path
from typing import Any

import junitparser
import pytest
import yaml

from gpudoctor import snapshot as snap
from tests.helpers.cli import run_cli
from tests.paths import H100, MIXED, REPO

RECIPES = REPO / "docs" / "recipes"
BIN = Path(sys.executable).parent  # the venv's bin: gpudoctor's console script


def base_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GITHUB_", "SLURM", "GPUDOCTOR"))}
    env.update({"PATH": f"{tmp_path / 'fakebin'}:{BIN}:/usr/bin:/bin", "HOME": str(tmp_path), **extra})
    return env


# --- Slurm prolog ----------------------------------------------------------------------------


@pytest.fixture
def scontrol(tmp_path: Path) -> Path:
    """A fake scontrol on PATH that records each call's arguments, one JSON list per line."""
    fakebin = tmp_path / "fakebin"
    fakebin.mkdir()
    calls = tmp_path / "scontrol.calls"
    script = fakebin / "scontrol"
    script.write_text(
        f"#!{sys.executable}\nimport json, sys\nopen({str(calls)!r}, 'a').write(json.dumps(sys.argv[1:]) + '\\n')\n"
    )
    script.chmod(0o755)
    return calls


def prolog(tmp_path: Path, args: str, **extra: str) -> subprocess.CompletedProcess[str]:
    env = base_env(
        tmp_path,
        SLURMD_NODENAME="gpu07",
        SLURM_JOB_ID="4242",
        GPUDOCTOR_ARGS=args,
        GPUDOCTOR_LOG_DIR=str(tmp_path / "log"),
        **extra,
    )
    return subprocess.run(
        ["bash", str(RECIPES / "slurm-prolog.sh")], env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path
    )


def calls(path: Path) -> list[list[str]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_prolog_drains_a_failing_node_with_the_codes_as_reason(tmp_path: Path, scontrol: Path) -> None:
    out = prolog(tmp_path, f"--snapshot {MIXED}")
    assert out.returncode == 1, out.stderr  # Slurm then requeues the job
    (call,) = calls(scontrol)
    report = tmp_path / "log" / "prolog-gpu07.json"
    assert call == [
        "update",
        "nodename=gpu07",
        "state=drain",
        f"reason=gpudoctor: GD301 GD302 (job 4242, {report})",
    ]
    assert json.loads(report.read_text())["exit_code"] == 1  # the report is kept for whoever resumes it
    assert "drained gpu07" in out.stderr


def test_prolog_leaves_a_healthy_node_alone(tmp_path: Path, scontrol: Path) -> None:
    out = prolog(tmp_path, f"--snapshot {H100} --expect-gpus 8")
    assert out.returncode == 0, out.stderr
    assert calls(scontrol) == []


def test_prolog_does_not_drain_when_gpudoctor_itself_cannot_run(tmp_path: Path, scontrol: Path) -> None:
    bad = tmp_path / "broken.json"
    bad.write_text("{ not json")
    out = prolog(tmp_path, f"--snapshot {bad}")
    assert out.returncode == 0 and calls(scontrol) == []
    assert "could not run (exit 2)" in out.stderr and "not valid JSON" in out.stderr


def test_prolog_drains_a_node_whose_check_hangs(tmp_path: Path, scontrol: Path) -> None:
    hang = tmp_path / "fakebin" / "slow-gpudoctor"
    hang.write_text("#!/bin/sh\nexec sleep 30\n")
    hang.chmod(0o755)
    out = prolog(tmp_path, "", GPUDOCTOR=str(hang), GPUDOCTOR_TIMEOUT="1")
    assert out.returncode == 1
    (call,) = calls(scontrol)
    assert call[-1].startswith("reason=gpudoctor: check hung for 1 s")


def fake_gpudoctor(tmp_path: Path, report: dict[str, Any], status: int) -> Path:
    """A gpudoctor that prints `report` and exits `status`, as a release with a crashing check would."""
    fake = tmp_path / "fakebin" / "fake-gpudoctor"
    fake.write_text(f"#!/bin/sh\ncat <<'EOF'\n{json.dumps(report)}\nEOF\nexit {status}\n")
    fake.chmod(0o755)
    return fake


def finding(code: str, status: str) -> dict[str, Any]:
    return {"code": code, "status": status, "subject": "host", "message": "m", "hint": "", "evidence": {}}


def test_prolog_does_not_drain_when_only_gpudoctors_own_checks_crashed(tmp_path: Path, scontrol: Path) -> None:
    crashed = {"exit_code": 1, "checks": [{"findings": [finding("GD401", "error"), finding("GD105", "pass")]}]}
    out = prolog(tmp_path, "", GPUDOCTOR=str(fake_gpudoctor(tmp_path, crashed, 1)))
    assert out.returncode == 0 and calls(scontrol) == []
    assert "a gpudoctor check crashed (GD401), node left in service" in out.stderr


def test_prolog_drains_a_failure_even_beside_a_crashed_check(tmp_path: Path, scontrol: Path) -> None:
    both = {"exit_code": 1, "checks": [{"findings": [finding("GD401", "error"), finding("GD202", "fail")]}]}
    out = prolog(tmp_path, "", GPUDOCTOR=str(fake_gpudoctor(tmp_path, both, 1)))
    assert out.returncode == 1
    (call,) = calls(scontrol)
    assert call[-1].startswith("reason=gpudoctor: GD202 (job 4242")


def test_prolog_names_its_policy_and_never_uses_one_found_around_it(tmp_path: Path, scontrol: Path) -> None:
    # A policy left in the prolog's working directory would hide the mixed GPUs; it is not read.
    planted = tmp_path / "gpudoctor.toml"
    planted.write_text('ignore = ["GD3"]\n')
    planted.chmod(0o644)
    out = prolog(tmp_path, f"--snapshot {MIXED}")
    assert out.returncode == 1 and len(calls(scontrol)) == 1
    assert json.loads((tmp_path / "log" / "prolog-gpu07.json").read_text())["policy"] is None
    site = tmp_path / "etc" / "gpudoctor.toml"
    site.parent.mkdir()
    site.write_text('ignore = ["GD301", "GD302"]\n')
    site.chmod(0o644)
    out = prolog(tmp_path, f"--snapshot {MIXED}", GPUDOCTOR_CONFIG=str(site))
    assert out.returncode == 0, out.stderr
    assert json.loads((tmp_path / "log" / "prolog-gpu07.json").read_text())["policy"]["path"] == str(site)


# --- GitHub Actions and GitLab: the jobs' scripts, run as the runner would -------------------


def repository_policy(tmp_path: Path) -> Path:
    """The checkout's pyproject.toml with its [tool.gpudoctor] table, which the jobs name with --config."""
    path = tmp_path / "pyproject.toml"
    path.write_text('[project]\nname = "train"\n\n[tool.gpudoctor]\nfail-on = "fail"\n')
    path.chmod(0o644)
    return path


def run_script(script: str, tmp_path: Path, **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "-e", "-c", script],
        env=base_env(tmp_path, **extra),
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )


def test_github_workflow_step_writes_summary_annotations_and_artifacts(tmp_path: Path) -> None:
    workflow = yaml.safe_load((RECIPES / "github-actions.yml").read_text())
    steps = workflow["jobs"]["gpudoctor"]["steps"]
    assert "self-hosted" in workflow["jobs"]["gpudoctor"]["runs-on"]
    (check,) = [s for s in steps if "gpudoctor check" in s.get("run", "")]
    summary = tmp_path / "summary.md"
    summary.write_text("")
    (tmp_path / "fakebin").mkdir()
    policy = repository_policy(tmp_path)
    out = run_script(check["run"], tmp_path, GITHUB_ACTIONS="true", GITHUB_STEP_SUMMARY=str(summary))
    report = json.loads((tmp_path / "gpudoctor-report.json").read_text())
    assert "--config pyproject.toml" in check["run"] and report["policy"]["path"] == policy.name
    assert out.returncode == report["exit_code"]  # the step fails exactly when the node is not ready
    verdict = "NOT READY" if report["exit_code"] else "READY"
    assert summary.read_text().startswith(f"## {'❌' if report['exit_code'] else '✅'} gpudoctor check: {verdict}")
    failing = [f for c in report["checks"] for f in c["findings"] if f["status"] in ("fail", "error")]
    errors = [line for line in out.stderr.splitlines() if line.startswith("::error title=gpudoctor ")]
    assert len(errors) == min(len(failing), 10)
    kept = steps[-1]["with"]["path"].split()
    assert all((tmp_path / name).is_file() for name in kept), kept  # every artifact the step names exists
    junitparser.JUnitXml.fromfile(str(tmp_path / "gpudoctor-junit.xml"))
    assert "gpudoctor_ready" in (tmp_path / "gpudoctor.prom").read_text()


def test_gitlab_job_script_fills_the_junit_report_it_declares(tmp_path: Path) -> None:
    job = yaml.safe_load((RECIPES / "gitlab-ci.yml").read_text())["gpudoctor"]
    (tmp_path / "fakebin").mkdir()
    policy = repository_policy(tmp_path)
    out = run_script("\n".join(job["script"]), tmp_path)
    report = json.loads((tmp_path / "gpudoctor-report.json").read_text())
    assert report["policy"]["path"] == policy.name  # named with --config, not discovered
    assert out.returncode == report["exit_code"]
    assert job["artifacts"]["when"] == "always"
    xml = junitparser.JUnitXml.fromfile(str(tmp_path / job["artifacts"]["reports"]["junit"]))
    assert sum(len(list(suite)) for suite in xml) == sum(report["summary"].values())
    assert all((tmp_path / p).is_file() for p in job["artifacts"]["paths"])


# --- Kubernetes ------------------------------------------------------------------------------


def test_kubernetes_init_container_checks_the_gpus_training_gets(capsys: pytest.CaptureFixture[str]) -> None:
    job = yaml.safe_load((RECIPES / "kubernetes.yaml").read_text())
    pod = job["spec"]["template"]["spec"]
    (init,) = pod["initContainers"]
    (train,) = pod["containers"]
    gpus = init["resources"]["limits"]["nvidia.com/gpu"]
    assert gpus == train["resources"]["limits"]["nvidia.com/gpu"]
    argv: list[str] = init["command"]
    assert argv[:2] == ["gpudoctor", "check"] and argv[argv.index("--expect-gpus") + 1] == str(gpus)
    assert "--no-config" in argv  # no policy file found in the image decides
    assert run_cli(capsys, *argv[1:], "--snapshot", H100).exit_code == 0
    failing = run_cli(capsys, *argv[1:], "--snapshot", MIXED)
    assert failing.exit_code == 1 and "GD202" in failing.out  # 3 GPUs where 8 were asked for


# --- the training script ---------------------------------------------------------------------


def load_recipe() -> dict[str, Any]:
    return runpy.run_path(str(RECIPES / "train_preflight.py"), run_name="recipe")


@pytest.mark.parametrize(
    ("machine", "local_world", "stops"), [(H100, "8", False), (MIXED, "3", True), (H100, "16", True)]
)
def test_training_script_preflight(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    machine: str,
    local_world: str,
    stops: bool,
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", local_world)
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setattr("gpudoctor.probe.collect", lambda: snap.load(machine))  # the probe's boundary
    check_machine = load_recipe()["check_machine"]
    if not stops:
        check_machine()
        assert capsys.readouterr().err == ""
        return
    with pytest.raises(SystemExit) as exc:
        check_machine()
    assert exc.value.code == 1
    err = capsys.readouterr().err
    assert err.startswith("gpudoctor preflight: ") and "hint:" in err
