"""GPU modes (GD820-826): MIG unless allowed, and the processes on each GPU with their memory."""

from __future__ import annotations

from gpudoctor.checks import gpu_modes
from gpudoctor.engine import CheckContext, CheckOptions
from gpudoctor.findings import Status
from gpudoctor.snapshot import GpuProcess
from tests.helpers.findings import not_ok
from tests.helpers.snapshots import SnapshotOf, with_gpu


def test_mig_fails_unless_allowed(snapshot_of: SnapshotOf) -> None:
    s = snapshot_of("a100_mig")
    assert not_ok(gpu_modes.gpu_modes(CheckContext(s))) == [("GD820", "host", Status.FAIL)]
    allowed = gpu_modes.gpu_modes(CheckContext(s, CheckOptions(allow_mig=True)))
    assert not_ok(allowed) == []
    assert any(f.code == "GD820" and "--allow-mig" in f.message for f in allowed)


def test_processes_name_pid_user_command_and_memory(snapshot_of: SnapshotOf) -> None:
    proc = GpuProcess(
        pid=912345, used_memory_mib=20480, local_pid=4711, user="bob", command="/opt/conda/bin/python train.py"
    )
    s = with_gpu(snapshot_of("container_32gb_8gpu"), 2, processes=[proc], memory_used_mib=20480 + 300)
    (f,) = gpu_modes.gpu_processes(CheckContext(s))
    assert (f.code, f.subject, f.status) == ("GD825", "gpu:2", Status.WARN)
    assert "pid 912345 python (bob) 20480 MiB" in f.message
    assert f.evidence["processes"][0]["local_pid"] == 4711 and "kill 4711" in f.hint


def test_small_unaccounted_memory_is_driver_overhead_not_a_ghost(snapshot_of: SnapshotOf) -> None:
    s = with_gpu(snapshot_of("h100_sxm_8x"), 1, memory_used_mib=600, processes=[])
    assert not_ok(gpu_modes.gpu_processes(CheckContext(s))) == []


def test_ghost_memory_cannot_be_judged_when_a_process_has_no_memory_figure(snapshot_of: SnapshotOf) -> None:
    proc = GpuProcess(pid=1, used_memory_mib=None)
    s = with_gpu(snapshot_of("h100_sxm_8x"), 1, memory_used_mib=40000, processes=[proc])
    assert [c for c, _, _ in not_ok(gpu_modes.gpu_processes(CheckContext(s)))] == ["GD825"]


def test_an_exclusive_gpu_that_a_process_already_holds_fails() -> None:
    # NVIDIA/DIGITS#2005: a K40m in Exclusive_Process mode holding the DIGITS server: error 46 for the next.
    from dataclasses import replace

    from gpudoctor.checks.gpu_modes import _compute_mode
    from tests.helpers.snapshots import load

    gpu = replace(load("rtx4090_pcie_4x").gpu(0), compute_mode="exclusive_process", processes=[])
    (alone,) = _compute_mode([gpu])
    assert alone.status is Status.WARN
    held = replace(gpu, processes=[GpuProcess(4242, 74, command="python digits-devserver")])
    (f,) = _compute_mode([held])
    assert f.status is Status.FAIL and "PID 4242" in f.message and "-c DEFAULT" in f.hint
