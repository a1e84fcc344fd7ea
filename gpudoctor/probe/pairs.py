"""Facts about each pair of GPUs: PCIe path type and NVML's P2P verdicts."""

from __future__ import annotations

from typing import Any

from gpudoctor.probe.device import convert_value
from gpudoctor.probe.nvml import Nvml
from gpudoctor.snapshot import GpuPair, Missing

# nvmlGpuTopologyLevel_t -> the names `nvidia-smi topo -m` prints.
TOPOLOGY_LEVELS = {0: "SAME", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}
P2P_STATUS = {
    0: "ok",
    1: "chipset_not_supported",
    2: "gpu_not_supported",
    3: "topology_not_supported",
    4: "disabled_by_regkey",
    5: "not_supported",
    6: "unknown",
}
P2P_CAPS_INDEX_READ = 0
P2P_CAPS_INDEX_WRITE = 1


def _level(value: Any) -> str:
    return TOPOLOGY_LEVELS[int(value)]


def _p2p(value: Any) -> str:
    return P2P_STATUS.get(int(value), "unknown")


def read_pair(nvml: Nvml, a: int, b: int, handle_a: Any, handle_b: Any) -> GpuPair:
    for handle in (handle_a, handle_b):
        if isinstance(handle, Missing):  # one GPU of the pair is lost or out of reach
            return GpuPair(a=a, b=b, pcie_level=handle, p2p_read=handle, p2p_write=handle)
    where = "nvmlDeviceGetP2PStatus"
    return GpuPair(
        a=a,
        b=b,
        pcie_level=convert_value(
            nvml.call("nvmlDeviceGetTopologyCommonAncestor", handle_a, handle_b),
            _level,
            "nvmlDeviceGetTopologyCommonAncestor",
        ),
        p2p_read=convert_value(nvml.call(where, handle_a, handle_b, P2P_CAPS_INDEX_READ), _p2p, where),
        p2p_write=convert_value(nvml.call(where, handle_a, handle_b, P2P_CAPS_INDEX_WRITE), _p2p, where),
    )


def read_pairs(nvml: Nvml, handles: dict[int, Any]) -> list[GpuPair]:
    indices = sorted(handles)
    return [read_pair(nvml, a, b, handles[a], handles[b]) for i, a in enumerate(indices) for b in indices[i + 1 :]]
