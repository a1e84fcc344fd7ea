"""The probe as users meet it: `gpudoctor snapshot`, `gpudoctor check` on this machine,
JSON round-trips, speed, and never importing torch."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gpudoctor import snapshot as snap
from gpudoctor.probe.machine import collect_machine
from gpudoctor.probe.nvml import Nvml
from gpudoctor.snapshot import Missing
from tests.conftest import HAVE_GPU
from tests.fakes.fake_nvml import FakeNvml
from tests.fakes.machines import a100_mig_gpu, h100_nvswitch_8x
from tests.helpers.processes import GpudoctorCli, clean_env

no_driver_here = pytest.mark.skipif(HAVE_GPU, reason="asserts what a machine without an NVIDIA driver reports")


def test_collect_never_imports_torch_nor_textual() -> None:
    # What it costs is a figure, not a test (it depends on the host's load): benchmarks/probe_collect.py.
    code = (
        "import sys\n"
        "from gpudoctor.probe import collect\n"
        "s = collect()\n"
        "print('torch' in sys.modules, 'textual' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    torch_imported, textual_imported = out.stdout.split()
    assert torch_imported == "False" and textual_imported == "False"


def test_snapshot_json_round_trip_keeps_missing_values(tmp_path: Path) -> None:
    source = h100_nvswitch_8x()
    gpus = [a100_mig_gpu() if g.index == 0 else g for g in source.gpus]
    source = snap.Snapshot(**{**source.__dict__, "gpus": gpus})
    collected = collect_machine(Nvml(FakeNvml(source, lose_after={7: 5})), {"NCCL_DEBUG": "INFO"}, root=tmp_path)
    text = snap.dumps(collected)
    again = snap.loads(text)
    assert again == collected
    assert again.gpu(7).lost and again.gpu(7).nvlinks == Missing("gpu_lost", "the GPU was lost earlier in this probe")
    assert again.gpu(0).mig_devices[0].memory_total_mib == 19968
    assert json.loads(text)["gpus"][0]["retired_pages_pending"] == {"missing": "unsupported", "detail": "Not Supported"}


def test_live_snapshot_round_trips() -> None:
    from gpudoctor.probe import collect

    live = collect()
    assert snap.loads(snap.dumps(live)) == live


@no_driver_here
def test_snapshot_command_writes_a_loadable_file(tmp_path: Path, gpudoctor_cli: GpudoctorCli) -> None:
    out = tmp_path / "machine.json"
    done = gpudoctor_cli("snapshot", "-o", str(out), env=clean_env(HF_TOKEN="hf_secret_value", NCCL_DEBUG="WARN"))
    assert done.returncode == 0, done.stderr
    assert "wrote" in done.stderr and "0 GPU(s)" in done.stderr
    recorded = snap.load(out)
    assert recorded.driver.nvml_status != "ok"
    assert recorded.gpus == []
    assert recorded.env.get("NCCL_DEBUG") == "WARN"
    assert "hf_secret_value" not in out.read_text()
    assert isinstance(recorded.host.ram_total_bytes, int)


def test_snapshot_to_stdout_is_json(gpudoctor_cli: GpudoctorCli) -> None:
    done = gpudoctor_cli("snapshot")
    assert done.returncode == 0, done.stderr
    assert snap.loads(done.stdout).schema_version == snap.SCHEMA_VERSION


@pytest.mark.parametrize("target", ["missing-dir/machine.json", "."])
def test_unwritable_output_is_one_line_and_exit_3(tmp_path: Path, target: str, gpudoctor_cli: GpudoctorCli) -> None:
    done = gpudoctor_cli("snapshot", "-o", str(tmp_path / target))
    assert done.returncode == 3
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpudoctor: cannot write")
    assert "Traceback" not in done.stderr


@no_driver_here
def test_check_without_driver_fails_with_gd101_text(gpudoctor_cli: GpudoctorCli) -> None:
    done = gpudoctor_cli("check", env=clean_env(NO_COLOR="1", COLUMNS="200"))
    assert done.returncode == 1, done.stdout + done.stderr
    assert "GD101" in done.stdout and "no NVIDIA driver" in done.stdout


@no_driver_here
def test_check_without_driver_fails_with_gd101_json(gpudoctor_cli: GpudoctorCli) -> None:
    done = gpudoctor_cli("check", "--json")
    assert done.returncode == 1, done.stderr
    report = json.loads(done.stdout)
    findings = [f for c in report["checks"] for f in c["findings"] if f["code"] == "GD101"]
    assert findings and findings[0]["status"] == "fail"
    assert findings[0]["message"].startswith("no NVIDIA driver")
    assert report["exit_code"] == 1
