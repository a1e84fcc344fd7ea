"""The probe against a fake NVML driven by snapshots: what goes in comes back out."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from gpudoctor import snapshot as snap
from gpudoctor.probe.machine import collect_machine
from gpudoctor.probe.nvml import Nvml
from gpudoctor.snapshot import Driver, FabricInfo, Gpu, Missing, Snapshot
from tests.fakes import nvml_c as c
from tests.fakes.fake_nvml import GVISOR_ANSWERS, FakeNvml, SnapshotLibrary
from tests.fakes.machines import H200_VM, a100_mig_gpu, h100_nvswitch_8x, h200_smi, h200_vm, rtx4090_pcie_2x
from tests.fakes.nvml_c import NvmlError
from tests.fakes.nvml_h import FABRIC_V3
from tests.paths import FIXTURES

FIXTURE_FILES = sorted(FIXTURES.glob("*.json"))


def reasons_only(value: Any) -> Any:
    """Missing details are NVML's wording, not recorded facts: compare reasons only.
    "not_collected" reads back as "unsupported" (the fake answers NOT_SUPPORTED for it)."""
    if isinstance(value, Missing):
        return Missing("unsupported" if value.reason == "not_collected" else value.reason)
    if dataclasses.is_dataclass(value):
        return type(value)(**{f.name: reasons_only(getattr(value, f.name)) for f in dataclasses.fields(value)})
    if isinstance(value, list):
        return [reasons_only(v) for v in value]
    return value


def comparable_gpu(gpu: Gpu) -> Gpu:
    """Owner, command and local PID are resolved on the machine that probes, not recorded.
    NVLink version_raw is what the fake's driver style made of the recorded generation: the
    tests below check it on its own. The time between the two readings of the error counters
    is measured by the probe, not recorded."""
    gpu = dataclasses.replace(reasons_only(gpu), error_window_s=Missing("unsupported"))
    if isinstance(gpu.nvlinks, list):
        gpu = dataclasses.replace(
            gpu, nvlinks=[dataclasses.replace(link, version_raw=Missing("unsupported")) for link in gpu.nvlinks]
        )
    if isinstance(gpu.processes, list):
        procs = [dataclasses.replace(p, local_pid=None, user=None, command=None) for p in gpu.processes]
        gpu = dataclasses.replace(gpu, processes=procs)
    return gpu


def driver_root(tmp_path: Path, source: Driver) -> Path:
    """A filesystem root whose /proc/driver/nvidia/version matches the recorded module version."""
    if isinstance(source.kernel_module_version, str):
        version = tmp_path / "proc/driver/nvidia/version"
        version.parent.mkdir(parents=True, exist_ok=True)
        version.write_text(
            f"NVRM version: NVIDIA UNIX x86_64 Kernel Module  {source.kernel_module_version}  "
            "Tue Mar  5 22:23:56 UTC 2024\nGCC version:  gcc version 12.3.0 (Ubuntu 12.3.0-1ubuntu1~22.04)\n"
        )
    return tmp_path


def probe(source: Snapshot, tmp_path: Path, **fake_options: Any) -> tuple[Snapshot, FakeNvml]:
    fake = FakeNvml(source, **fake_options)
    fm = source.driver.fabric_manager
    collected = collect_machine(Nvml(fake), {}, root=driver_root(tmp_path, source.driver), systemctl=lambda unit: fm)
    return collected, fake


def assert_round_trip(source: Snapshot, collected: Snapshot) -> None:
    assert [g.index for g in collected.gpus] == [g.index for g in source.gpus]
    for got, want in zip(collected.gpus, source.gpus, strict=True):
        assert comparable_gpu(got) == comparable_gpu(want), f"GPU {want.index} differs"
    assert reasons_only(collected.pairs) == reasons_only(source.pairs)
    for name in ("nvml_status", "driver_version", "cuda_driver_version", "nvml_version", "kernel_module_version"):
        got, want = getattr(collected.driver, name), getattr(source.driver, name)
        if isinstance(want, str):
            assert got == want, name


def test_h100_nvswitch_round_trip(tmp_path: Path) -> None:
    source = dataclasses.replace(
        h100_nvswitch_8x(), driver=dataclasses.replace(h100_nvswitch_8x().driver, fabric_manager="active")
    )
    collected, fake = probe(source, tmp_path)
    assert_round_trip(source, collected)
    gpu = collected.gpu(3)
    assert gpu.uuid == source.gpu(3).uuid and gpu.pci_bus_id == "00000000:5D:00.0"
    assert len(gpu.nvlinks) == 18 and all(link.remote_type == "switch" and link.version == 4 for link in gpu.nvlinks)
    assert {link.version_raw for link in gpu.nvlinks} == {6}  # NVML_NVLINK_VERSION_4_0, kept as the driver said
    assert gpu.cpu_affinity[:2] == [0, 1] and gpu.cpu_affinity[-1] == 167
    assert gpu.fabric == FabricInfo(state="completed", status="success", health="healthy")
    assert collected.driver.fabric_manager == "active"  # asked because the links end at NVSwitches
    assert collected.driver.nvml_status == "ok"
    assert len(collected.pairs) == 28
    assert fake.initialized == 0, "the probe shuts NVML down after itself"


def test_pcie_box_without_nvlink_records_why(tmp_path: Path) -> None:
    source = rtx4090_pcie_2x()
    collected, fake = probe(source, tmp_path)
    assert_round_trip(source, collected)
    gpu = collected.gpu(0)
    assert gpu.nvlinks == Missing("unsupported", "this GPU has no NVLink")
    assert gpu.numa_node.reason == "no_permission"
    assert gpu.ecc_uncorrected_volatile.reason == "unsupported"
    assert collected.gpu(1).compute_mode == "exclusive_process"
    assert collected.pair(0, 1).p2p_read == "gpu_not_supported"
    # No NVSwitch, so systemd was never asked about the fabric manager.
    assert collected.driver.fabric_manager.reason == "unsupported"


def test_mig_devices_are_listed_from_occupied_slots(tmp_path: Path) -> None:
    source = dataclasses.replace(rtx4090_pcie_2x(), gpus=[a100_mig_gpu()], pairs=[])
    collected, _ = probe(source, tmp_path)
    gpu = collected.gpu(0)
    assert gpu.mig_mode_current is True
    assert [(m.index, m.memory_total_mib) for m in gpu.mig_devices] == [(0, 19968), (1, 19968), (2, 19968), (5, 19968)]
    assert gpu.mig_devices[3].uuid.startswith("MIG-")
    assert gpu.processes[0].used_memory_mib is None
    assert gpu.fabric.state == "not_supported"


@pytest.mark.parametrize("path", FIXTURE_FILES, ids=lambda p: p.stem)
def test_every_recorded_fixture_round_trips(path: Path, tmp_path: Path) -> None:
    source = snap.load(path)
    status = source.driver.nvml_status
    options = {} if status == "ok" else {"init_failure": status}
    collected, _ = probe(source, tmp_path, **options)
    assert_round_trip(source, collected)


def test_gpu_lost_mid_probe_is_marked_and_the_others_are_complete(tmp_path: Path) -> None:
    source = h100_nvswitch_8x()
    # GPU 2 answers its first 10 calls (identity, memory, modes...) and then falls off the bus.
    collected, fake = probe(source, tmp_path, lose_after={2: 10})
    lost = collected.gpu(2)
    assert lost.lost is True
    assert lost.uuid == source.gpu(2).uuid and lost.memory_total_mib == 81559  # read before the loss
    assert lost.nvlinks == Missing("gpu_lost", "the GPU was lost earlier in this probe")
    assert lost.temperature_c.reason == "gpu_lost" and lost.processes.reason == "gpu_lost"
    assert collected.pair(1, 2).pcie_level.reason == "gpu_lost"
    for index in (0, 1, 3, 4, 5, 6, 7):
        assert comparable_gpu(collected.gpu(index)) == comparable_gpu(source.gpu(index))
    assert collected.pair(0, 1).pcie_level == "NODE"
    # Once lost, the probe stops asking: one GPU_IS_LOST answer, not thirty.
    assert fake.devices[2].calls == 11


def test_gpu_lost_before_the_probe_keeps_its_identity(tmp_path: Path) -> None:
    source = h100_nvswitch_8x()
    gpus = [dataclasses.replace(g, lost=True) if g.index == 5 else g for g in source.gpus]
    collected, _ = probe(dataclasses.replace(source, gpus=gpus), tmp_path)
    gpu = collected.gpu(5)
    assert gpu.lost and gpu.pci_bus_id == "00000000:AB:00.0"
    assert gpu.memory_total_mib.reason == "gpu_lost"
    assert not collected.gpu(4).lost and collected.gpu(4).vbios == "96.00.74.00.01"


@pytest.mark.parametrize(
    "failure, status",
    [
        ("no_driver", "no_driver"),
        ("no_library", "no_library"),
        ("version_mismatch", "version_mismatch"),
        ("no_permission", "no_permission"),
        ("unknown", "error"),
    ],
)
def test_init_failure_gives_driver_status_and_host_facts(failure: str, status: str, tmp_path: Path) -> None:
    collected, _ = probe(h100_nvswitch_8x(), tmp_path, init_failure=failure)
    assert collected.driver.nvml_status == status
    assert collected.driver.nvml_detail  # NVML's own words, for the user
    assert collected.gpus == [] and collected.pairs == []
    assert collected.driver.driver_version.reason == "error"
    assert collected.host.hostname and collected.software.python


def test_version_mismatch_still_reads_the_kernel_module_version(tmp_path: Path) -> None:
    source = dataclasses.replace(
        h100_nvswitch_8x(), driver=Driver(nvml_status="version_mismatch", kernel_module_version="550.54.15")
    )
    collected, _ = probe(source, tmp_path, init_failure="version_mismatch")
    assert collected.driver.kernel_module_version == "550.54.15"


def test_missing_reasons_reach_the_snapshot(tmp_path: Path) -> None:
    gpu = dataclasses.replace(
        h100_nvswitch_8x().gpu(0),
        vbios=Missing("no_permission"),
        power_draw_w=Missing("error"),
        remapped_rows=Missing("unsupported"),
        processes=Missing("no_permission"),
    )
    source = dataclasses.replace(h100_nvswitch_8x(), gpus=[gpu], pairs=[])
    got = probe(source, tmp_path)[0].gpu(0)
    assert (got.vbios.reason, got.power_draw_w.reason) == ("no_permission", "error")
    assert (got.remapped_rows.reason, got.processes.reason) == ("unsupported", "no_permission")
    assert got.vbios.detail == "Insufficient Permissions"  # pynvml's message is kept as the detail
    assert got.temperature_c == gpu.temperature_c and not got.lost  # the readable fields still arrive


def test_older_driver_falls_back_to_older_calls(tmp_path: Path) -> None:
    source = dataclasses.replace(h100_nvswitch_8x(), pairs=[])
    # A 525-era driver: no ClocksEventReasons (only the Throttle name) and no fabric ...V.
    collected, fake = probe(
        source,
        tmp_path,
        missing={"nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetGpuFabricInfoV"},
    )
    gpu = collected.gpu(0)
    assert gpu.clock_event_reasons == 0x1
    assert "nvmlDeviceGetCurrentClocksThrottleReasons" in fake.calls
    # The legacy fabric struct has state and status but no health.
    assert gpu.fabric.state == "completed" and gpu.fabric.status == "success"
    assert gpu.fabric.health.reason == "unsupported"


def test_fabric_health_is_derived_from_the_v2_mask(tmp_path: Path) -> None:
    source = h100_nvswitch_8x()
    degraded = FabricInfo(state="completed", status="success", health="limited_capacity")
    gpus = [dataclasses.replace(g, fabric=degraded) if g.index == 1 else g for g in source.gpus]
    source = dataclasses.replace(source, gpus=gpus, pairs=[])

    class V2Only(SnapshotLibrary):  # a driver that knows the v2 struct, not v3
        def nvmlDeviceGetGpuFabricInfoV(self, handle: Any, ref: Any) -> None:
            if ref._obj.version == FABRIC_V3:
                raise NvmlError(c.ARGUMENT_VERSION_MISMATCH)
            super().nvmlDeviceGetGpuFabricInfoV(handle, ref)

    fake = FakeNvml(library=V2Only(source))
    collected = collect_machine(Nvml(fake), {}, root=tmp_path, systemctl=lambda unit: "active")
    assert collected.gpu(1).fabric.health == "limited_capacity"
    assert collected.gpu(0).fabric.health == "healthy"


def test_gb200_invalid_argument_past_the_last_link_ends_the_list(tmp_path: Path) -> None:
    source = dataclasses.replace(h100_nvswitch_8x(), pairs=[])
    collected, _ = probe(source, tmp_path, past_last_link=c.INVALID_ARGUMENT)
    assert len(collected.gpu(0).nvlinks) == 18


def test_processes_are_not_pinned_on_local_pids_inside_a_pid_namespace(tmp_path: Path) -> None:
    import os

    source = dataclasses.replace(h100_nvswitch_8x(), pairs=[])
    gpu0 = dataclasses.replace(source.gpu(0), processes=[snap.GpuProcess(pid=os.getpid(), used_memory_mib=100)])
    source = dataclasses.replace(source, gpus=[gpu0])
    host_view = collect_machine(Nvml(FakeNvml(source)), {}, root="/", systemctl=lambda unit: "active")
    proc = host_view.gpu(0).processes[0]
    if host_view.host.pid_namespace_isolated is False:
        assert proc.local_pid == os.getpid() and "python" in (proc.command or "")
        assert proc.user
    # Inside a container the same number names some other process: leave it unresolved.
    ns = tmp_path / "proc/self/ns"
    ns.mkdir(parents=True)
    (ns / "pid").symlink_to("pid:[4026532481]")
    (tmp_path / "proc" / str(os.getpid())).mkdir()
    (tmp_path / "proc" / str(os.getpid()) / "status").write_text("Name:\tsleep\nUid:\t0\t0\t0\t0\n")
    isolated = collect_machine(Nvml(FakeNvml(source)), {}, root=tmp_path, systemctl=lambda unit: "active")
    assert isolated.host.pid_namespace_isolated is True
    assert isolated.gpu(0).processes[0] == snap.GpuProcess(pid=os.getpid(), used_memory_mib=100)


def test_gpu_without_a_handle_carries_the_reason_and_the_rest_go_on(tmp_path: Path) -> None:
    source = h100_nvswitch_8x()
    denied = {("nvmlDeviceGetHandleByIndex_v2", 1): c.NO_PERMISSION}  # /dev/nvidia1 not accessible to this user
    fake = FakeNvml(source, device_answers=denied)
    collected = collect_machine(Nvml(fake), {}, root=tmp_path, systemctl=lambda unit: "active")
    denied = collected.gpu(1)
    assert (denied.uuid, denied.lost) == ("", False)
    assert denied.memory_total_mib.reason == "no_permission" and denied.nvlinks.reason == "no_permission"
    assert collected.pair(0, 1).p2p_read.reason == "no_permission"
    assert collected.pair(0, 2).p2p_read == "ok"
    assert comparable_gpu(collected.gpu(2)) == comparable_gpu(source.gpu(2))


def health_gpu(gpu: Gpu, **changes: Any) -> Gpu:
    """A GPU with every fact added after schema 1 recorded, as an R570+ driver reports them."""
    links = [
        dataclasses.replace(link, errors=snap.NvLinkErrors(0, 0, 3, 1), errors_later=snap.NvLinkErrors(0, 0, 3, 1))
        for link in gpu.nvlinks
    ]
    facts: dict[str, Any] = dict(
        nvlinks=links,
        inforom_image="G520.0200.00.05",
        gsp_firmware="570.124.06",
        recovery_action="none",
        sram_ecc=snap.SramEcc(0, 0, 0, 0, False),
        ecc_uncorrected_dram_volatile=0,
        ecc_uncorrected_dram_aggregate=0,
        remap_histogram=snap.RemapHistogram(2560, 0, 0, 0, 0),
        pcie_replays=9,
        pcie_replays_later=9,
    )
    facts.update(changes)
    return dataclasses.replace(gpu, **facts)


def test_health_facts_round_trip_and_the_counters_are_read_twice(tmp_path: Path) -> None:
    source = h100_nvswitch_8x()
    gpus = [health_gpu(g) for g in source.gpus]
    # GPU 4's link 7 retrains and replays between the two readings: the second reading shows it.
    link7 = dataclasses.replace(
        gpus[4].nvlinks[7], errors=snap.NvLinkErrors(2, 0, 3, 1), errors_later=snap.NvLinkErrors(5, 1, 3, 1)
    )
    gpus[4] = dataclasses.replace(gpus[4], nvlinks=[*gpus[4].nvlinks[:7], link7, *gpus[4].nvlinks[8:]])
    source = dataclasses.replace(source, gpus=gpus)
    collected, fake = probe(source, tmp_path)
    assert_round_trip(source, collected)
    gpu = collected.gpu(4)
    assert (gpu.inforom_image, gpu.gsp_firmware, gpu.recovery_action) == ("G520.0200.00.05", "570.124.06", "none")
    assert gpu.sram_ecc == snap.SramEcc(0, 0, 0, 0, False) and gpu.remap_histogram.max == 2560
    assert (gpu.nvlinks[7].errors.replay, gpu.nvlinks[7].errors_later.replay) == (2, 5)
    assert gpu.nvlinks[7].errors_later.recovery == 1
    assert (gpu.pcie_replays, gpu.pcie_replays_later) == (9, 9)
    assert isinstance(gpu.error_window_s, float) and gpu.error_window_s >= 0
    # Each counter of each active link was read exactly twice, the PCIe replay counter too.
    assert set(fake.counter_reads.values()) == {2}
    assert len(fake.counter_reads) == 8 * (18 * 4 + 1)


def test_link_counters_a_gpu_does_not_support_are_asked_once(tmp_path: Path) -> None:
    # NVML documents the per-link error counters as unsupported from Blackwell on.
    source = dataclasses.replace(h100_nvswitch_8x(), pairs=[])
    collected, fake = probe(source, tmp_path)  # the recorded H100 has no counters: NOT_SUPPORTED
    gpu = collected.gpu(0)
    assert all(link.errors.reason == "unsupported" for link in gpu.nvlinks)
    asked = [c for c in fake.calls if c == "nvmlDeviceGetNvLinkErrorCounter"]
    assert len(asked) == 8 * 4, "four counters of link 0 per GPU, then no more questions, nor a second pass"
    assert all(link.errors_later == Missing("not_collected") for link in gpu.nvlinks)
    assert gpu.pcie_replays_later == 0 and isinstance(gpu.error_window_s, float)  # PCIe is still read twice


def test_an_older_driver_without_the_newer_calls_records_unsupported(tmp_path: Path) -> None:
    source = dataclasses.replace(h100_nvswitch_8x(), gpus=[health_gpu(h100_nvswitch_8x().gpu(0))], pairs=[])
    old = {
        "nvmlDeviceGetFieldValues",
        "nvmlDeviceGetSramEccErrorStatus",
        "nvmlDeviceGetGspFirmwareVersion",
        "nvmlDeviceGetRowRemapperHistogram",
    }
    gpu = probe(source, tmp_path, missing=old)[0].gpu(0)
    for name in ("recovery_action", "sram_ecc", "gsp_firmware", "remap_histogram"):
        assert getattr(gpu, name).reason == "unsupported", name
    assert gpu.inforom_image == "G520.0200.00.05" and gpu.ecc_uncorrected_dram_aggregate == 0


def test_gsp_firmware_off_is_unsupported_not_an_empty_version(tmp_path: Path) -> None:
    source = dataclasses.replace(h100_nvswitch_8x(), gpus=[health_gpu(h100_nvswitch_8x().gpu(0), gsp_firmware="N/A")])
    gpu = probe(dataclasses.replace(source, pairs=[]), tmp_path)[0].gpu(0)
    # nvml.h: NOT_SUPPORTED "if GSP firmware is not enabled"; nvidia-smi prints N/A. A fact, not unknown.
    assert isinstance(gpu.gsp_firmware, Missing) and gpu.gsp_firmware.reason == "unsupported"


def test_a_gpu_without_a_handle_is_named_by_the_kernel_drivers_bus_id(tmp_path: Path) -> None:
    def lost_gpu3() -> FakeNvml:  # fell off the bus before the probe: no handle at all
        return FakeNvml(source, device_answers={("nvmlDeviceGetHandleByIndex_v2", 3): c.GPU_IS_LOST})

    source = h100_nvswitch_8x()
    for gpu in source.gpus:  # what /proc/driver/nvidia/gpus lists: lower-case, no 8-digit domain
        (tmp_path / "proc/driver/nvidia/gpus" / gpu.pci_bus_id[4:].lower()).mkdir(parents=True)
    collected = collect_machine(Nvml(lost_gpu3()), {}, root=tmp_path, systemctl=lambda unit: "active")
    lost = collected.gpu(3)
    assert lost.lost and lost.uuid == "" and lost.pci_bus_id == source.gpu(3).pci_bus_id
    assert lost.unreachable.startswith("nvmlDeviceGetHandleByIndex(3): ")
    assert collected.gpu(2).unreachable == Missing("not_collected")  # the others answered
    # Without the kernel's list (or when it disagrees with NVML's count), no bus id is guessed.
    (tmp_path / "proc/driver/nvidia/gpus" / source.gpu(0).pci_bus_id[4:].lower()).rmdir()
    again = collect_machine(Nvml(lost_gpu3()), {}, root=tmp_path, systemctl=lambda unit: "active")
    assert again.gpu(3).pci_bus_id == ""


def test_a_gpu_lost_between_the_two_readings_is_marked_lost(tmp_path: Path) -> None:
    source = dataclasses.replace(h100_nvswitch_8x(), gpus=[health_gpu(g) for g in h100_nvswitch_8x().gpus])

    class LostLate(SnapshotLibrary):
        def nvmlDeviceGetPcieReplayCounter(self, handle: Any, ref: Any) -> None:
            device, _ = self._index_of(handle)
            if device.gpu.index == 6 and self.counter_reads.get((6, "pcie")):
                device.lost = True  # the second reading finds it gone
            super().nvmlDeviceGetPcieReplayCounter(handle, ref)

    fake = FakeNvml(library=LostLate(source))
    collected = collect_machine(Nvml(fake), {}, root=tmp_path, systemctl=lambda unit: "active")
    gpu = collected.gpu(6)
    assert gpu.lost is True and gpu.pcie_replays == 9 and gpu.pcie_replays_later.reason == "gpu_lost"
    assert not collected.gpu(5).lost


def smi_mib(text: str) -> int:
    return int(text.split()[0])


def test_used_memory_is_what_nvidia_smi_prints_and_the_reserved_memory_is_apart(tmp_path: Path) -> None:
    # The real H200 (driver 580.159.04), idle: NVML v1 said used 615 MiB, v2 used 0 and reserved 615;
    # nvidia-smi printed memory.used 0 MiB, memory.reserved 616 MiB.
    collected, fake = probe(h200_vm(), tmp_path)
    gpu, smi = collected.gpu(0), h200_smi()
    assert gpu.memory_used_mib == smi_mib(smi["memory.used"]) == 0
    assert abs(gpu.memory_reserved_mib - smi_mib(smi["memory.reserved"])) <= 1  # MiB, rounded apart
    assert gpu.memory_total_mib == smi_mib(smi["memory.total"]) == 143771
    assert "nvmlDeviceGetMemoryInfo_v2" in fake.library.c_calls


def test_a_driver_without_memory_info_v2_gives_v1_and_says_it_includes_the_reserved_memory(tmp_path: Path) -> None:
    gpu = probe(h200_vm(), tmp_path, missing={"nvmlDeviceGetMemoryInfo_v2"})[0].gpu(0)
    assert gpu.memory_used_mib == 615  # nvml.h 259: v1 used is the "Sum of Reserved and Allocated device memory"
    assert gpu.memory_reserved_mib.reason == "unsupported" and "includes the reserved" in gpu.memory_reserved_mib.detail


def test_what_a_sandbox_blocks_is_recorded_as_not_there_not_as_an_error(tmp_path: Path) -> None:
    # gVisor's nvproxy refuses queries it does not pass on: NVML answers OPERATING_SYSTEM (nvml.h 1315:
    # "blocked by the operating system/cgroups"; google/gvisor PR #10676 for the ECC mode).
    gpu = probe(h200_vm(), tmp_path, answers=GVISOR_ANSWERS)[0].gpu(0)
    assert gpu.ecc_mode_current.reason == "unsupported"
    assert "blocked by the operating system or a sandbox" in gpu.ecc_mode_current.detail
    assert gpu.power_draw_w.reason == "error"  # UNKNOWN: "An internal driver error occurred", a failed reading


def test_invalid_argument_for_a_fixed_query_is_not_there(tmp_path: Path) -> None:
    gpu = probe(h200_vm(), tmp_path, answers={"nvmlDeviceGetNumaNodeId": c.INVALID_ARGUMENT})[0].gpu(0)
    assert gpu.numa_node.reason == "unsupported" and "not available on this device" in gpu.numa_node.detail


def test_a_driver_older_than_pynvmls_process_call_is_unsupported_not_an_error(tmp_path: Path) -> None:
    # pynvml's @throwOnVersionMismatch raises NVMLLibraryMismatchError, with no NVML code, when the
    # driver lacks nvmlDeviceGetComputeRunningProcesses_v3 (pynvml issue #43: driver 430).
    gpu = probe(h200_vm(), tmp_path, missing={"nvmlDeviceGetComputeRunningProcesses_v3"})[0].gpu(0)
    assert gpu.processes.reason == "unsupported" and "older than nvidia-ml-py" in gpu.processes.detail


def test_temperature_asks_the_current_call_first_and_the_deprecated_one_on_older_drivers(tmp_path: Path) -> None:
    # nvml.h 13.0: nvmlDeviceGetTemperature is DEPRECATED(13.0), "Use nvmlDeviceGetTemperatureV instead".
    collected, fake = probe(h200_vm(), tmp_path)
    assert collected.gpu(0).temperature_c == 44
    assert "nvmlDeviceGetTemperatureV" in fake.calls and "nvmlDeviceGetTemperature" not in fake.calls
    # A driver before R570 has no nvmlDeviceGetTemperatureV: FUNCTION_NOT_FOUND, then the old call.
    collected, fake = probe(h200_vm(), tmp_path, missing={"nvmlDeviceGetTemperatureV"})
    assert collected.gpu(0).temperature_c == 44 and "nvmlDeviceGetTemperature" in fake.calls


def sysfs_link_width(root: Path, bus_id: str, lanes: str) -> None:
    device = root / "sys/bus/pci/devices" / (bus_id[4:].lower())
    device.mkdir(parents=True, exist_ok=True)
    (device / "max_link_width").write_text(lanes)


def test_the_cards_own_pcie_maximum_is_recorded_beside_the_slots(tmp_path: Path) -> None:
    sysfs_link_width(tmp_path, "00000000:00:06.0", "16\n")
    gpu, smi = probe(h200_vm(), tmp_path)[0].gpu(0), h200_smi()
    assert gpu.pcie_gen_gpu_max == int(smi["pcie.link.gen.gpumax"]) == 5  # the H200 VM: not capped
    assert gpu.pcie_width_gpu_max == 16 and gpu.pcie_gen_max == 5
    # A Gen5 card behind a Gen4 root port: NVML's Max* is "possible with this device and system".
    capped = dataclasses.replace(h200_vm().gpu(0), pcie_gen_max=4, pcie_width_max=8)
    got = probe(dataclasses.replace(h200_vm(), gpus=[capped]), tmp_path)[0].gpu(0)
    assert (got.pcie_gen_max, got.pcie_gen_gpu_max, got.pcie_width_max, got.pcie_width_gpu_max) == (4, 5, 8, 16)


def test_the_numa_affinity_is_nvidia_smis_and_the_gpu_numa_id_stays_not_supported(tmp_path: Path) -> None:
    from gpudoctor.knowledge.interconnect import topo_table

    collected, fake = probe(h200_vm(), tmp_path)
    gpu = collected.gpu(0)
    assert gpu.numa_node.reason == "unsupported"  # nvml.h 5035: only where GPU memory is a NUMA node
    assert gpu.numa_affinity == [0] and "nvmlDeviceGetMemoryAffinity" in fake.calls
    smi = (H200_VM / "nvidia-smi-topo.txt").read_text().splitlines()
    header, row = smi[0].split("\t"), smi[1].split("\t")
    table = topo_table(collected)
    column = table["columns"].index("NUMA Affinity")
    assert table["rows"][0][column] == row[header.index("NUMA Affinity")].strip() == "0"
