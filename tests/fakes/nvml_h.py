"""nvml.h's enums, field ids and struct versions, as the fake NVML answers them (written out here,
never imported from the probe, so the fake does not echo the probe's own tables). Line numbers are
go-nvml gen/nvml/nvml.h at 2f9e261 (CUDA 13.3), as in /work/research/nvml/calls.md."""

from __future__ import annotations

from typing import Any

from gpudoctor.snapshot import Missing
from tests.fakes import nvml_c as c
from tests.fakes.nvml_c import NvmlError

REASON_CODES = {
    "unsupported": c.NOT_SUPPORTED,
    "not_collected": c.NOT_SUPPORTED,
    "no_permission": c.NO_PERMISSION,
    "gpu_lost": c.GPU_IS_LOST,
    "error": c.UNKNOWN,
}
INIT_FAILURES = {
    "no_driver": c.DRIVER_NOT_LOADED,
    "no_library": c.LIBRARY_NOT_FOUND,
    "version_mismatch": c.LIB_RM_VERSION_MISMATCH,
    "no_permission": c.NO_PERMISSION,
    "unknown": c.UNKNOWN,
}
# Sandbox and virtual-GPU profiles (`answers=`), from the threads in /work/research/nvml/errors.md:
# gVisor's nvproxy refused the ECC configuration query (google/gvisor PR #10676: nvidia-smi printed
# "GPU access blocked by the operating system" = OPERATING_SYSTEM) and, until PR #13989 (2026-08),
# the process utilization samples; wattage printed ERR! (issue #10627; UNKNOWN is an inference).
GVISOR_ANSWERS = {
    "nvmlDeviceGetEccMode": c.OPERATING_SYSTEM,
    "nvmlDeviceGetProcessUtilization": c.OPERATING_SYSTEM,
    "nvmlDeviceGetPowerUsage": c.UNKNOWN,
}
# nvml.h 5576: PcieThroughput "is not supported in virtual machines running virtual GPU (vGPU)".
VGPU_ANSWERS = {"nvmlDeviceGetPcieThroughput": c.NOT_SUPPORTED}

COMPUTE_MODE_CODES = {"default": 0, "exclusive_thread": 1, "prohibited": 2, "exclusive_process": 3}
REMOTE_TYPE_CODES = {"gpu": 0, "ibmnpu": 1, "switch": 2}
FABRIC_STATE_CODES = {"not_supported": 0, "not_started": 1, "in_progress": 2, "completed": 3}
FABRIC_HEALTH_CODES = {"healthy": 1, "unhealthy": 2, "limited_capacity": 3}
# healthMask bits consistent with the summary: DEGRADED_BW at bit 0, ROUTE_UNHEALTHY at bit 4
# (1 = true, 2 = false).
FABRIC_HEALTH_MASKS = {
    "healthy": (2 << 0) | (2 << 4),
    "limited_capacity": (1 << 0) | (2 << 4),
    "unhealthy": (2 << 0) | (1 << 4),
}
# nvmlGpuTopologyLevel_t: INTERNAL 0, SINGLE 10, MULTIPLE 20, HOSTBRIDGE 30, NODE 40, SYSTEM 50.
LEVEL_CODES = {"SAME": 0, "PIX": 10, "PXB": 20, "PHB": 30, "NODE": 40, "SYS": 50}
# nvmlGpuP2PStatus_t.
P2P_CODES = {
    "ok": 0,
    "chipset_not_supported": 1,
    "gpu_not_supported": 2,
    "topology_not_supported": 3,
    "disabled_by_regkey": 4,
    "not_supported": 5,
    "unknown": 6,
}
# nvmlNvlinkVersion_t for each generation, as a newer driver answers nvmlDeviceGetNvLinkVersion.
NVLINK_ENUM_OF_GENERATION = {1: 1, 2: 2, 3: 4, 4: 6, 5: 7}
# nvmlReturn_t names as a snapshot spells a recorded status (FabricInfo.status).
STATUS_CODES = {"success": 0, "not_supported": 3, "in_progress": 19, "unknown": 999}
RECOVERY_ACTION_CODES = {"none": 0, "gpu_reset": 1, "node_reboot": 2, "drain_p2p": 3, "drain_and_reset": 4}
FI_RECOVERY_ACTION = 230  # NVML_FI_DEV_GET_GPU_RECOVERY_ACTION
FI_PCIE_TX_BYTES, FI_PCIE_RX_BYTES = 197, 198  # nvml.h 2735-2736: "Value can be wrapped." (R555+)
VALUE_TYPE_UINT, VALUE_TYPE_ULL = 1, 3  # nvmlValueType_t
MEMORY_ERROR_UNCORRECTED, VOLATILE_ECC = 1, 0
MEMORY_LOCATION_DRAM = 2
P2P_CAPS_INDEX_READ = 0
NVLINK_COUNTER_FIELDS = {0: "replay", 1: "recovery", 2: "crc_flit", 3: "crc_data"}
TEMPERATURE_V1 = 0x0100000C  # nvmlTemperature_v1
MEMORY_V2 = 0x02000028  # nvmlMemory_v2
SRAM_ECC_V1 = 0x01000068  # nvmlEccSramErrorStatus_v1
FABRIC_V2, FABRIC_V3 = 0x02000024, 0x03000028  # nvmlGpuFabricInfo_v2/_v3
NOT_AVAILABLE_ULL = (1 << 64) - 1  # NVML_VALUE_NOT_AVAILABLE for an unsigned long long
EVENT_XID = 0x8  # nvmlEventTypeXidCriticalError
CLOCK_SM = 1
PCIE_TX, PCIE_RX = 0, 1  # nvmlPcieUtilCounter_t
IDENTITY = {"nvmlDeviceGetUUID", "nvmlDeviceGetName", "nvmlDeviceGetPciInfo_v3"}


def raise_if_missing(*values: Any) -> None:
    """A Missing reading is answered with the code its reason stands for."""
    for v in values:
        if isinstance(v, Missing):
            raise NvmlError(REASON_CODES.get(v.reason, c.UNKNOWN))
