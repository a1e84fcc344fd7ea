"""The real H200 (pass-through VM, driver 580.159.04; tests/fixtures/real/h200-vm-driver580.159.04-2026-11-26/):
the static checks judge it as the machine deserves, and `gpudoctor report` reads its watch recording.

Healthy, one GPU: everything passes or skips for want of a second GPU, except GD502, which is right to
warn (126 GiB of RAM for 140 GiB of GPU memory; tests/reference/gpu_first_contact.md).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.fakes.machines import H200_VM, h200_smi, h200_vm
from tests.helpers.cli import run_cli
from tests.helpers.snapshots import write_variant

SNAPSHOT = H200_VM / "snapshot.json"
RECORDING = H200_VM / "watch.jsonl"


def _not_passing(findings: list[dict[str, object]]) -> list[tuple[object, object]]:
    return sorted((f["code"], f["status"]) for f in findings if f["status"] != "pass")


def test_the_healthy_h200_is_ready_with_one_warning_for_its_small_ram(capsys: pytest.CaptureFixture[str]) -> None:
    r = run_cli(capsys, "check", "--snapshot", str(SNAPSHOT), "--json")
    assert r.exit_code == 0
    warns = [f for f in r.findings() if f["status"] in ("warn", "fail", "error")]
    assert [(f["code"], f["status"]) for f in warns] == [("GD502", "warn")], warns
    ram = warns[0]["evidence"]
    assert ram["usable_ram_gb"] == pytest.approx(125.9, abs=0.1) and ram["gpu_memory_gb"] == pytest.approx(140.4, 0.01)
    # What a one-GPU machine cannot have is a skip, never a warning.
    skips = {f["code"] for f in r.findings() if f["status"] == "skip"}
    assert skips <= {"GD407", "GD421", "GD601", "GD650", "GD460", "GD860", "GD420"}, skips
    # The warning is real, so a gate on warnings stops here: the user is told, not surprised later.
    assert run_cli(capsys, "check", "--snapshot", str(SNAPSHOT), "--fail-on", "warn").exit_code == 1


def test_the_h200_as_nvml_v2_reports_it_is_judged_alike_and_its_idle_gpu_holds_nothing(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # Today's probe reads v2 memory (used 0, reserved 615 MiB, as nvidia-smi printed), the card's own
    # PCIe maximum and the NUMA affinity: same verdicts as the recording, and the idle GPU holds nothing.
    machine = h200_vm()
    gpu, smi = machine.gpu(0), h200_smi()
    assert f"{gpu.memory_used_mib} MiB" == smi["memory.used"]
    recorded = run_cli(capsys, "check", "--snapshot", str(SNAPSHOT), "--json")
    now = run_cli(capsys, "check", "--snapshot", write_variant(tmp_path, machine), "--json")
    assert now.exit_code == 0
    assert _not_passing(now.findings()) == _not_passing(recorded.findings())
    assert now.one("GD825")["status"] == "pass" and now.findings("GD826") == []


def test_report_reads_the_trimmed_recording(capsys: pytest.CaptureFixture[str]) -> None:
    r = run_cli(capsys, "report", str(RECORDING), "--json")
    assert r.exit_code == 0, r.err
    doc = json.loads(r.out)
    assert doc["samples"] == 25 and doc["damage"] is None
    (gpu,) = doc["gpus"]
    assert (gpu["name"], gpu["mem_total_mib"], gpu["lost"]) == ("NVIDIA H200", 143771, False)
    assert gpu["peak_mem_mib"] == 4473  # the training loop's 2 GiB tensor plus torch's cache (summary.txt)
    (rank,) = doc["ranks"]
    assert rank["pid"] == 761 and rank["steps"] > 0  # the loop's gpudoctor.step() records, by its PID
    text = run_cli(capsys, "report", str(RECORDING))
    assert text.exit_code == 0 and "NVIDIA H200" in text.out and "Traceback" not in text.err
