"""PCIe link state and NVLinks of one GPU."""

from __future__ import annotations

from typing import Any

from gpudoctor.probe.device import LOST, DeviceReader, bus_id, convert_value
from gpudoctor.snapshot import Missing, NvLink

NVLINK_MAX_LINKS = 36  # NVML_NVLINK_MAX_LINKS in nvml.h (13.x)

# nvmlDeviceGetNvLinkVersion answers an nvmlNvlinkVersion_t enum, not the generation:
# an A100 answers 5 (NVLink 3.1). The snapshot records the generation (major version).
NVLINK_ENUM_TO_GENERATION = {1: 1, 2: 2, 3: 2, 4: 3, 5: 3, 6: 4, 7: 5, 8: 6}
GENERATION_TO_NVLINK_ENUM = {1: 1, 2: 2, 3: 4, 4: 6, 5: 7, 6: 8}  # for fakes and tests

REMOTE_TYPES = {0: "gpu", 1: "ibmnpu", 2: "switch"}


def pcie(reader: DeviceReader) -> dict[str, int | Missing]:
    return {
        "pcie_gen_current": reader.read("nvmlDeviceGetCurrPcieLinkGeneration", int),
        # Max*: what the GPU and its slot can do together ("Max" in nvidia-smi -q).
        "pcie_gen_max": reader.read("nvmlDeviceGetMaxPcieLinkGeneration", int),
        "pcie_width_current": reader.read("nvmlDeviceGetCurrPcieLinkWidth", int),
        "pcie_width_max": reader.read("nvmlDeviceGetMaxPcieLinkWidth", int),
    }


def _generation(value: Any) -> int:
    return NVLINK_ENUM_TO_GENERATION[int(value)]


def _remote_type(value: Any) -> str:
    return REMOTE_TYPES.get(int(value), "unknown")


def nvlinks(reader: DeviceReader) -> list[NvLink] | Missing:
    """Every NVLink the GPU has: links are numbered from 0 until NVML says no more.

    A GPU without NVLink answers NOT_SUPPORTED for link 0: the list is then
    Missing("unsupported"). Past the last link NVML answers NOT_SUPPORTED, or
    INVALID_ARGUMENT on GB200. A GPU lost midway gives Missing("gpu_lost"): a partial
    list would read as missing links.
    """
    links: list[NvLink] = []
    for link in range(NVLINK_MAX_LINKS):
        state = reader.call("nvmlDeviceGetNvLinkState", link)
        if isinstance(state, Missing):
            if link > 0 and not reader.lost:
                break  # past the last link
            if state.reason == "unsupported":
                return Missing("unsupported", "this GPU has no NVLink")
            return state
        links.append(
            NvLink(
                link=link,
                active=bool(state),
                version=reader.read("nvmlDeviceGetNvLinkVersion", _generation, link),
                remote_bus_id=convert_value(
                    reader.call("nvmlDeviceGetNvLinkRemotePciInfo", link), bus_id, "nvmlDeviceGetNvLinkRemotePciInfo"
                ),
                remote_type=reader.read("nvmlDeviceGetNvLinkRemoteDeviceType", _remote_type, link),
            )
        )
    return LOST if reader.lost else links
