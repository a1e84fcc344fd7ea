"""PCIe link state and NVLinks of one GPU."""

from __future__ import annotations

from typing import Any

from gpudoctor.probe.device import LOST, DeviceReader, bus_id, convert_value
from gpudoctor.snapshot import Missing, NvLink
from gpudoctor.topology import decode_nvml_nvlink_version

NVLINK_MAX_LINKS = 36  # NVML_NVLINK_MAX_LINKS in nvml.h (13.x)

# nvmlDeviceGetNvLinkVersion's answer depends on the driver: older ones answer the plain
# generation (A100 -> 3, H100 -> 4), newer ones nvml.h's nvmlNvlinkVersion_t enum (A100 -> 4 or
# 5, H100 -> 6), and some answer 7 (the enum's 5.0) for H100. The snapshot keeps the raw answer
# (NvLink.version_raw) and records as `version` the generation of the GPU's architecture, read
# from its compute capability; the raw answer decides only when the architecture is unknown.
# See gpudoctor/topology.py (the tables) and gpudoctor/expectations.py (what uses them).

REMOTE_TYPES = {0: "gpu", 1: "ibmnpu", 2: "switch"}


def pcie(reader: DeviceReader) -> dict[str, int | Missing]:
    return {
        "pcie_gen_current": reader.read("nvmlDeviceGetCurrPcieLinkGeneration", int),
        # Max*: what the GPU and its slot can do together ("Max" in nvidia-smi -q).
        "pcie_gen_max": reader.read("nvmlDeviceGetMaxPcieLinkGeneration", int),
        "pcie_width_current": reader.read("nvmlDeviceGetCurrPcieLinkWidth", int),
        "pcie_width_max": reader.read("nvmlDeviceGetMaxPcieLinkWidth", int),
    }


def generation(raw: int | Missing, compute_capability: str | Missing) -> int | Missing:
    """The generation recorded as NvLink.version for a raw NVML answer on this architecture."""
    if isinstance(raw, Missing):
        return raw
    gen = decode_nvml_nvlink_version(raw, compute_capability)
    return gen if gen is not None else Missing("error", f"nvmlDeviceGetNvLinkVersion: unknown version {raw}")


def _remote_type(value: Any) -> str:
    return REMOTE_TYPES.get(int(value), "unknown")


def nvlinks(reader: DeviceReader, compute_capability: str | Missing = "") -> list[NvLink] | Missing:
    """Every NVLink the GPU has: links are numbered from 0 until NVML says no more.

    A GPU without NVLink answers NOT_SUPPORTED for link 0: the list is then
    Missing("unsupported"). Past the last link NVML answers NOT_SUPPORTED, or
    INVALID_ARGUMENT on GB200. A GPU lost midway gives Missing("gpu_lost"): a partial
    list would read as missing links.

    The generation of each link comes from `compute_capability` (see the note above);
    the raw nvmlDeviceGetNvLinkVersion answer is kept beside it.
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
        raw = reader.read("nvmlDeviceGetNvLinkVersion", int, link)
        links.append(
            NvLink(
                link=link,
                active=bool(state),
                version=generation(raw, compute_capability),
                remote_bus_id=convert_value(
                    reader.call("nvmlDeviceGetNvLinkRemotePciInfo", link), bus_id, "nvmlDeviceGetNvLinkRemotePciInfo"
                ),
                remote_type=reader.read("nvmlDeviceGetNvLinkRemoteDeviceType", _remote_type, link),
                version_raw=raw,
            )
        )
    return LOST if reader.lost else links
