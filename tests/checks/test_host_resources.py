"""Host resource checks (GD510-520): /dev/shm with the NCCL version, limits, CPUs and NUMA."""

from __future__ import annotations

from dataclasses import replace

from gpudoctor.checks import host_resources as hr
from gpudoctor.engine import CheckContext
from gpudoctor.findings import Finding, Status
from gpudoctor.knowledge.units import MIB
from gpudoctor.snapshot import Snapshot
from tests.helpers.snapshots import SnapshotOf


def host(s: Snapshot, **values: object) -> Snapshot:
    return replace(s, host=replace(s.host, **values))


def find(s: Snapshot, code: str) -> list[Finding]:
    return [f for f in hr.host_resources(CheckContext(s)) if f.code == code]


def newer_stack(s: Snapshot) -> Snapshot:
    """NCCL 2.26 and a CUDA 12.8 driver: NCCL keeps its buffers in cuMem host memory."""
    s = replace(s, software=replace(s.software, torch_nccl="2.26.2", torch_cuda="12.6"))
    return replace(s, driver=replace(s.driver, cuda_driver_version="12.8"))


def test_small_shm_fails_for_several_gpus_on_an_older_nccl(snapshot_of: SnapshotOf) -> None:
    (f,) = find(host(snapshot_of("rtx4090_pcie_4x"), shm_total_bytes=64 * MIB), "GD510")
    assert f.status is Status.FAIL and "64 MiB" in f.message and "--shm-size" in f.hint


def test_small_shm_only_warns_when_nccl_keeps_its_buffers_in_cumem_memory(snapshot_of: SnapshotOf) -> None:
    (f,) = find(newer_stack(host(snapshot_of("rtx4090_pcie_4x"), shm_total_bytes=64 * MIB)), "GD510")
    assert f.status is Status.WARN and f.evidence["nccl_uses_cumem_host"] is True
    assert "DataLoader" in f.message


def test_a_container_does_not_get_the_cumem_relief(snapshot_of: SnapshotOf) -> None:
    s = newer_stack(host(snapshot_of("rtx4090_pcie_4x"), shm_total_bytes=64 * MIB, container="docker"))
    (f,) = find(s, "GD510")
    assert f.status is Status.FAIL  # Docker withholds SYS_NICE: NCCL falls back to /dev/shm


def test_shm_requirement_grows_with_the_gpu_count(snapshot_of: SnapshotOf) -> None:
    # NVIDIA's --shm-size=1g at least; PyTorch CI's 2 GiB for 4 GPUs, i.e. 512 MiB per GPU
    s = host(snapshot_of("h100_sxm_8x"), shm_total_bytes=3 * 1024 * MIB)
    (f,) = find(s, "GD510")
    assert f.status is Status.WARN and f.evidence["expected_bytes"] == 4096 * MIB
    # The hint asks for what is wanted: a machine that already has --shm-size=1g is not told to set it.
    assert "--shm-size=4g" in f.hint and "sizeLimit 4Gi" in f.hint and "1g" not in f.hint
    four = replace(s, env={"CUDA_VISIBLE_DEVICES": "0,1,2,3"})
    assert find(four, "GD510")[0].status is Status.PASS
    assert [hr.shm_wanted(n) // MIB for n in (1, 2, 4, 8)] == [512, 1024, 2048, 4096]


def test_nccl_cumem_switched_off_sends_nccl_back_to_dev_shm(snapshot_of: SnapshotOf) -> None:
    small = newer_stack(host(snapshot_of("rtx4090_pcie_4x"), shm_total_bytes=64 * MIB))
    for name in ("NCCL_CUMEM_ENABLE", "NCCL_CUMEM_HOST_ENABLE"):
        (f,) = find(replace(small, env={name: "0"}), "GD510")
        assert f.status is Status.FAIL and f.evidence["nccl_uses_cumem_host"] is False, name
    (f,) = find(replace(small, env={"NCCL_CUMEM_ENABLE": "1"}), "GD510")
    assert f.status is Status.WARN


def test_memlock_matters_only_with_rdma_interfaces(snapshot_of: SnapshotOf) -> None:
    s = host(snapshot_of("rtx4090_pcie_4x"), memlock_limit_bytes=8 * MIB)  # no IB: nothing to say
    assert find(s, "GD511") == []


def test_cpu_quota_caps_usable_cores(snapshot_of: SnapshotOf) -> None:
    s = host(snapshot_of("container_32gb_8gpu"), cpu_quota=16.0)
    (f,) = find(s, "GD515")
    assert f.status is Status.WARN and f.evidence["cpus_per_gpu"] == 2.0


def test_numa_falls_back_to_nvml_gpu_affinity(snapshot_of: SnapshotOf) -> None:
    s = snapshot_of("h100_sxm_8x")
    numa = s.host.numa_cpus
    assert isinstance(numa, dict)
    # no NUMA map; NVML's ideal CPUs of each GPU are its socket's
    gpus = [replace(g, cpu_affinity=numa[str(g.numa_node)]) for g in s.gpus]
    s = host(replace(s, gpus=gpus), numa_cpus={}, cpu_affinity=list(numa["1"]))
    (f,) = find(s, "GD516")
    assert f.status is Status.WARN and f.evidence["gpus_without_local_cpus"] == [0, 1, 2, 3]


def test_container_finding_says_what_changes(snapshot_of: SnapshotOf) -> None:
    (f,) = find(snapshot_of("container_32gb_8gpu"), "GD520")
    assert f.status is Status.PASS
    assert "host PIDs" in f.message and "--pid=host" in f.message and "32 GiB" in f.message


def test_bare_metal_has_no_container_finding(snapshot_of: SnapshotOf) -> None:
    assert find(snapshot_of("h100_sxm_8x"), "GD520") == []


def test_memlock_limited_with_rdma_devices_nccl_will_use_fails(snapshot_of: SnapshotOf) -> None:
    # NVIDIA/nccl-tests#206: `ulimit -l` 8192 (KiB) with 8 HCAs: ibv_reg_mr fails, the run stops.
    s = host(snapshot_of("h100_sxm_8x"), memlock_limit_bytes=8 * MIB, network_interfaces=["lo", "eno1", "ibp25s0"])
    (f,) = find(s, "GD511")
    assert f.status is Status.FAIL and "8 MiB" in f.message and "ulimit -l unlimited" in f.hint
    (f,) = find(replace(s, env={"NCCL_IB_DISABLE": "1"}), "GD511")
    assert f.status is Status.WARN  # NCCL stays off IB (GD625 says what that costs)
    ram = s.host.ram_total_bytes
    assert isinstance(ram, int)
    (f,) = find(host(s, memlock_limit_bytes=ram), "GD511")
    assert f.status is Status.PASS  # as much as the machine has: no registration can fail on it
    (f,) = find(host(s, memlock_limit_bytes=None), "GD511")
    assert f.status is Status.PASS


def test_a_low_open_files_limit_warns_for_one_gpu_too(snapshot_of: SnapshotOf) -> None:
    # DonsetPG/graph-physics#22: one GPU, ulimit -n 1024, DataLoader workers: "received 0 items of ancdata".
    (f,) = find(host(snapshot_of("single_gpu"), nofile_limit=1024), "GD512")
    assert f.status is Status.WARN and "ulimit -n" in f.hint
