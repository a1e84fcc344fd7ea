"""A fake NVML answering from a Snapshot, under the real pynvml (tests/fakes/nvml_c.py).

    fake = FakeNvml(snapshot)
    collected = collect_machine(Nvml(fake), environ={})

`FakeNvml` is the pynvml module the probe sees; `fake.library` (a `SnapshotLibrary`) is the
libnvidia-ml under it, one C symbol per method. A `Missing` field is answered with the code its
reason stands for (unsupported / not_collected -> NOT_SUPPORTED, no_permission -> NO_PERMISSION,
gpu_lost -> GPU_IS_LOST, error -> UNKNOWN). What nvml.h documents and the probe must survive is a
knob, each with its nvml.h line (go-nvml 2f9e261, CUDA 13.3; /work/research/nvml/calls.md):

- `init_failure`: "no_driver" (DRIVER_NOT_LOADED, 3998), "no_library" (LIBRARY_NOT_FOUND: pynvml's
  own when dlopen fails), "version_mismatch", "no_permission" (3999), "unknown";
- `lose_after`: GPU index -> device calls answered before GPU_IS_LOST ("if the target GPU has
  fallen off the bus", e.g. 5183); every later call to that GPU answers it;
- `missing`: C symbols an older driver lacks (pynvml: FUNCTION_NOT_FOUND, or NVMLLibraryMismatchError
  for nvmlDeviceGetComputeRunningProcesses, pynvml 13.615.71 line 4227);
- `answers` / `device_answers`: a code for every call of a C symbol (or of one GPU's): the
  sandbox and vGPU profiles below;
- `root`: False is a user without privileges. On driver 580.159.04 that changes nothing the probe
  reads (measured as uid 65534: /work/gpurun1/summary.txt); `documented_root` makes the calls nvml.h
  marks "Requires root/admin permissions." answer NO_PERMISSION (SramEccErrorStatus, 8111), and a MIG
  GPU's aggregate memory and process list answer NO_PERMISSION to a user (6678-6680, 7378-7380;
  nvidia-container-toolkit #842);
- `pid_view`: "host" (drivers before 535.113.01 and the closed module: NVML reports host PIDs,
  `host_pid(pid)`), or "namespace" (open kernel modules since 535.113.01 convert PIDs into the
  caller's namespace and drop processes it cannot see; /work/research/nvml/pids.md). A process's
  recorded `pid` is its PID in the prober's namespace;
- `past_last_link`: the code past the last NVLink (NOT_SUPPORTED, or INVALID_ARGUMENT on GB200);
  `nvlink_version_style`: "enum" (nvmlNvlinkVersion_t, newer drivers) or "generation" (older);
- live readings for the watch sampler: `LiveGpu` per GPU index (utilization, SM clock, PCIe
  throughput and byte counters, process utilization samples, XID events).

Memory: v1 `used` is "Sum of Reserved and Allocated device memory" (nvml.h 259), v2 `used` is
"Allocated device memory" and `reserved` apart (274): the recorded memory_used_mib is v2's, and
v1 answers used + reserved. Error counters (NVLink, PCIe replays) answer their first recorded
reading the first time they are asked and the `*_later` reading after that.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from gpudoctor.knowledge.units import MIB
from gpudoctor.snapshot import Gpu, Snapshot
from tests.fakes import nvml_c as c
from tests.fakes.nvml_c import NvmlError, put, put_text, target, value
from tests.fakes.nvml_h import (
    COMPUTE_MODE_CODES,
    GVISOR_ANSWERS,
    IDENTITY,
    INIT_FAILURES,
    MEMORY_V2,
    NVLINK_ENUM_OF_GENERATION,
    REMOTE_TYPE_CODES,
    VGPU_ANSWERS,
    raise_if_missing,
)
from tests.fakes.nvml_health import HealthSymbols
from tests.fakes.nvml_live import LiveGpu, LiveSymbols

__all__ = ["FakeNvml", "LiveGpu", "SnapshotLibrary", "GVISOR_ANSWERS", "VGPU_ANSWERS"]

_BASES = iter(range(0x10000000, 1 << 40, 0x100000))  # handle addresses, distinct per library


class FakeDevice:
    def __init__(self, gpu: Gpu, address: int) -> None:
        self.gpu = gpu
        self.address = address
        self.calls = 0
        self.lost = gpu.lost


class SnapshotLibrary(HealthSymbols, LiveSymbols, c.FakeLibrary):
    """libnvidia-ml answering from a Snapshot (see the module docstring for the knobs)."""

    def __init__(
        self,
        snapshot: Snapshot,
        *,
        init_failure: str | None = None,
        lose_after: dict[int, int] | None = None,
        device_answers: dict[tuple[str, int], int] | None = None,
        past_last_link: int = c.NOT_SUPPORTED,
        nvlink_version_style: str = "enum",
        root: bool = True,
        documented_root: bool = False,
        pid_view: str = "namespace",
        host_pid: Callable[[int], int] = lambda pid: pid + 3_000_000,
        foreign: set[int] | frozenset[int] = frozenset(),
        live: dict[int, LiveGpu] | None = None,
        wall: Callable[[], float] = time.time,
        **options: Any,
    ) -> None:
        super().__init__(**options)
        self.snapshot = snapshot
        self.init_failure = init_failure
        self.lose_after = dict(lose_after or {})
        self.device_answers = dict(device_answers or {})
        self.past_last_link = past_last_link
        self.nvlink_version_style = nvlink_version_style
        self.root, self.documented_root = root, documented_root
        self.pid_view, self.host_pid, self.foreign = pid_view, host_pid, set(foreign)
        self.wall = wall
        base = next(_BASES)
        self.devices = [
            FakeDevice(g, base + 0x100 * (i + 1)) for i, g in enumerate(sorted(snapshot.gpus, key=lambda g: g.index))
        ]
        self.live = {d.gpu.index: (live or {}).get(d.gpu.index, LiveGpu()) for d in self.devices}
        self.event_set = base + 0xF000
        self.t0 = wall()
        self.counter_reads: dict[tuple[object, ...], int] = {}
        self.util_asked: list[int] = []  # the timestamps nvmlDeviceGetProcessUtilization was asked since

    # -- bookkeeping ---------------------------------------------------------------------------------
    def _index_of(self, handle: Any) -> tuple[FakeDevice, int | None]:
        """The device behind a handle, and the MIG slot when it is one of its MIG devices' handles."""
        address = c.pointer_value(handle)
        for dev in self.devices:
            offset = address - dev.address
            if offset == 0:
                return dev, None
            if 0x10 <= offset < 0x20:
                return dev, offset - 0x10
        raise NvmlError(c.INVALID_ARGUMENT)  # nvml.h: "if device is invalid"

    def _device(self, handle: Any, symbol: str = "") -> Gpu:
        """The Gpu behind a handle; GPU_IS_LOST once it has fallen off the bus."""
        dev, _ = self._index_of(handle)
        dev.calls += 1
        budget = self.lose_after.get(dev.gpu.index)
        if budget is not None and dev.calls > budget:
            dev.lost = True
        if dev.lost and not (dev.gpu.lost and symbol in IDENTITY):
            raise NvmlError(c.GPU_IS_LOST)
        code = self.device_answers.get((symbol, dev.gpu.index))
        if code is not None:
            raise NvmlError(code)
        return dev.gpu

    def _field(self, handle: Any, name: str, symbol: str = "") -> Any:
        v = getattr(self._device(handle, symbol), name)
        raise_if_missing(v)
        return v

    def _scalar(self, handle: Any, ref: Any, name: str, symbol: str) -> None:
        put(ref, symbol, int(self._field(handle, name, symbol)))

    # -- library and system ----------------------------------------------------------------------------
    def nvmlInitWithFlags(self, flags: Any) -> None:
        if self.init_failure is not None:
            raise NvmlError(INIT_FAILURES[self.init_failure])
        super().nvmlInitWithFlags(flags)

    def nvmlSystemGetDriverVersion(self, buffer: Any, length: Any) -> None:
        raise_if_missing(self.snapshot.driver.driver_version)
        put_text(buffer, length, self.snapshot.driver.driver_version)

    def nvmlSystemGetCudaDriverVersion(self, ref: Any) -> None:
        version = self.snapshot.driver.cuda_driver_version
        raise_if_missing(version)
        major, minor = version.split(".")[:2]
        put(ref, "cudaDriverVersion", int(major) * 1000 + int(minor) * 10)

    def nvmlSystemGetNVMLVersion(self, buffer: Any, length: Any) -> None:
        raise_if_missing(self.snapshot.driver.nvml_version)
        put_text(buffer, length, self.snapshot.driver.nvml_version)

    def nvmlDeviceGetCount_v2(self, ref: Any) -> None:
        put(ref, "deviceCount", len(self.devices))

    def nvmlDeviceGetHandleByIndex_v2(self, index: Any, ref: Any) -> None:
        i = value(index)
        if not 0 <= i < len(self.devices):
            raise NvmlError(c.INVALID_ARGUMENT)  # nvml.h 4631: "if index is invalid"
        code = self.device_answers.get(("nvmlDeviceGetHandleByIndex_v2", i))
        if code is not None:
            raise NvmlError(code)
        c.set_pointer(ref, self.devices[i].address)

    def nvmlDeviceGetIndex(self, handle: Any, ref: Any) -> None:
        put(ref, "index", self._device(handle).index)

    # -- identity and configuration ----------------------------------------------------------------------
    def nvmlDeviceGetUUID(self, handle: Any, buffer: Any, length: Any) -> None:
        dev, slot = self._index_of(handle)
        if slot is not None:
            put_text(buffer, length, self._mig(dev, slot).uuid)
            return
        put_text(buffer, length, self._device(handle, "nvmlDeviceGetUUID").uuid)

    def nvmlDeviceGetName(self, handle: Any, buffer: Any, length: Any) -> None:
        put_text(buffer, length, self._device(handle, "nvmlDeviceGetName").name)

    def nvmlDeviceGetPciInfo_v3(self, handle: Any, ref: Any) -> None:
        target(ref, "pci").busId = self._device(handle, "nvmlDeviceGetPciInfo_v3").pci_bus_id.encode()

    def _memory(self, handle: Any, ref: Any, symbol: str) -> tuple[Any, int, int, int]:
        dev, slot = self._index_of(handle)
        struct = target(ref, "memory")
        if slot is not None:
            total = self._mig(dev, slot).memory_total_mib
            raise_if_missing(total)
            return struct, total * MIB, 0, 0
        gpu = self._device(handle, symbol)
        if self._mig_denied(gpu):
            raise NvmlError(c.NO_PERMISSION)
        raise_if_missing(gpu.memory_total_mib, gpu.memory_used_mib)
        reserved = gpu.memory_reserved_mib if isinstance(gpu.memory_reserved_mib, int) else 0
        return struct, gpu.memory_total_mib * MIB, gpu.memory_used_mib * MIB, reserved * MIB

    def nvmlDeviceGetMemoryInfo(self, handle: Any, ref: Any) -> None:
        struct, total, used, reserved = self._memory(handle, ref, "nvmlDeviceGetMemoryInfo")
        struct.total, struct.used = total, used + reserved  # nvml.h 259
        struct.free = total - used - reserved

    def nvmlDeviceGetMemoryInfo_v2(self, handle: Any, ref: Any) -> None:
        """A recording without the reserved memory is a driver without this call."""
        struct, total, used, reserved = self._memory(handle, ref, "nvmlDeviceGetMemoryInfo_v2")
        dev, slot = self._index_of(handle)
        if slot is None:
            raise_if_missing(dev.gpu.memory_reserved_mib)
        c.check_version(struct, MEMORY_V2, "nvmlMemory_v2_t")
        struct.total, struct.used, struct.reserved = total, used, reserved  # nvml.h 274
        struct.free = total - used - reserved

    def nvmlDeviceGetCudaComputeCapability(self, handle: Any, major: Any, minor: Any) -> None:
        cc = self._field(handle, "compute_capability")
        a, b = cc.split(".")
        put(major, "major", int(a))
        put(minor, "minor", int(b))

    def nvmlDeviceGetVbiosVersion(self, handle: Any, buffer: Any, length: Any) -> None:
        put_text(buffer, length, self._field(handle, "vbios"))

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: Any, ref: Any) -> None:
        put(ref, "limit", round(self._field(handle, "power_limit_w") * 1000))

    def nvmlDeviceGetPersistenceMode(self, handle: Any, ref: Any) -> None:
        self._scalar(handle, ref, "persistence_mode", "nvmlDeviceGetPersistenceMode")

    def nvmlDeviceGetComputeMode(self, handle: Any, ref: Any) -> None:
        put(ref, "mode", COMPUTE_MODE_CODES[self._field(handle, "compute_mode")])

    def nvmlDeviceGetMigMode(self, handle: Any, current: Any, pending: Any) -> None:
        gpu = self._device(handle)
        raise_if_missing(gpu.mig_mode_current, gpu.mig_mode_pending)
        put(current, "currentMode", int(gpu.mig_mode_current))
        put(pending, "pendingMode", int(gpu.mig_mode_pending))

    def _mig(self, dev: FakeDevice, slot: int) -> Any:
        migs = dev.gpu.mig_devices
        raise_if_missing(migs)
        for mig in migs:
            if mig.index == slot:
                return mig
        raise NvmlError(c.NOT_FOUND)  # nvml.h 13437: "if no valid MIG device was found at index"

    def _mig_denied(self, gpu: Gpu) -> bool:
        """A user asking a MIG GPU's aggregate (nvml.h 6678-6680, 7378-7380)."""
        return not self.root and self.documented_root and gpu.mig_mode_current is True

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: Any, ref: Any) -> None:
        migs = self._field(handle, "mig_devices")
        put(ref, "count", max([7] + [m.index + 1 for m in migs]))

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: Any, index: Any, ref: Any) -> None:
        dev, _ = self._index_of(handle)
        self._device(handle)
        slot = value(index)
        self._mig(dev, slot)
        c.set_pointer(ref, dev.address + 0x10 + slot)

    def nvmlDeviceGetEccMode(self, handle: Any, current: Any, pending: Any) -> None:
        gpu = self._device(handle)
        raise_if_missing(gpu.ecc_mode_current, gpu.ecc_mode_pending)
        put(current, "current", int(gpu.ecc_mode_current))
        put(pending, "pending", int(gpu.ecc_mode_pending))

    # -- PCIe and NVLink --------------------------------------------------------------------------------
    def nvmlDeviceGetCurrPcieLinkGeneration(self, handle: Any, ref: Any) -> None:
        self._scalar(handle, ref, "pcie_gen_current", "nvmlDeviceGetCurrPcieLinkGeneration")

    def nvmlDeviceGetMaxPcieLinkGeneration(self, handle: Any, ref: Any) -> None:
        self._scalar(handle, ref, "pcie_gen_max", "nvmlDeviceGetMaxPcieLinkGeneration")

    def nvmlDeviceGetGpuMaxPcieLinkGeneration(self, handle: Any, ref: Any) -> None:
        self._scalar(handle, ref, "pcie_gen_gpu_max", "nvmlDeviceGetGpuMaxPcieLinkGeneration")

    def nvmlDeviceGetCurrPcieLinkWidth(self, handle: Any, ref: Any) -> None:
        self._scalar(handle, ref, "pcie_width_current", "nvmlDeviceGetCurrPcieLinkWidth")

    def nvmlDeviceGetMaxPcieLinkWidth(self, handle: Any, ref: Any) -> None:
        self._scalar(handle, ref, "pcie_width_max", "nvmlDeviceGetMaxPcieLinkWidth")

    def _link(self, handle: Any, link: Any) -> Any:
        links = self._field(handle, "nvlinks")
        for nvlink in links:
            if nvlink.link == value(link):
                return nvlink
        # No such link: NOT_SUPPORTED, or INVALID_ARGUMENT past the last link on GB200.
        raise NvmlError(self.past_last_link if links else c.NOT_SUPPORTED)

    def nvmlDeviceGetNvLinkState(self, handle: Any, link: Any, ref: Any) -> None:
        put(ref, "isActive", int(self._link(handle, link).active))

    def nvmlDeviceGetNvLinkVersion(self, handle: Any, link: Any, ref: Any) -> None:
        """A recorded raw answer as it was; else the generation in `nvlink_version_style`."""
        nvlink = self._link(handle, link)
        if isinstance(nvlink.version_raw, int):
            put(ref, "version", nvlink.version_raw)
            return
        raise_if_missing(nvlink.version)
        style = (
            nvlink.version if self.nvlink_version_style == "generation" else NVLINK_ENUM_OF_GENERATION[nvlink.version]
        )
        put(ref, "version", style)

    def nvmlDeviceGetNvLinkRemotePciInfo_v2(self, handle: Any, link: Any, ref: Any) -> None:
        remote = self._link(handle, link).remote_bus_id
        raise_if_missing(remote)
        target(ref, "pci").busId = remote.encode()

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, handle: Any, link: Any, ref: Any) -> None:
        remote = self._link(handle, link).remote_type
        raise_if_missing(remote)
        put(ref, "type", REMOTE_TYPE_CODES.get(remote, 0xFF))

    def nvmlDeviceGetNumaNodeId(self, handle: Any, ref: Any) -> None:
        self._scalar(handle, ref, "numa_node", "nvmlDeviceGetNumaNodeId")

    def _mask(self, ref: Any, size: Any, ids: list[int]) -> None:
        words = target(ref, "set")
        if value(size) == 0:
            raise NvmlError(c.INVALID_ARGUMENT)  # nvml.h 4933/4963: "cpuSetSize == 0"
        for i in ids:
            if i // 64 < value(size):
                words[i // 64] |= 1 << (i % 64)

    def nvmlDeviceGetCpuAffinity(self, handle: Any, size: Any, ref: Any) -> None:
        self._mask(ref, size, self._field(handle, "cpu_affinity"))

    def nvmlDeviceGetMemoryAffinity(self, handle: Any, size: Any, ref: Any, scope: Any) -> None:
        if value(scope) not in (0, 1):
            raise NvmlError(c.INVALID_ARGUMENT)
        self._mask(ref, size, self._field(handle, "numa_affinity"))


class FakeNvml(c.PynvmlView):
    """The pynvml module over a SnapshotLibrary (or over `library=` a library built elsewhere)."""

    def __init__(
        self, snapshot: Snapshot | None = None, *, library: c.FakeLibrary | None = None, **options: Any
    ) -> None:
        if library is None:
            assert snapshot is not None
            library = SnapshotLibrary(snapshot, **options)
        super().__init__(library)

    @property
    def initialized(self) -> int:
        return self.library.initialized

    @property
    def devices(self) -> list[FakeDevice]:
        return self.library.devices  # type: ignore[attr-defined,no-any-return]

    @property
    def counter_reads(self) -> dict[tuple[object, ...], int]:
        return self.library.counter_reads  # type: ignore[attr-defined,no-any-return]
