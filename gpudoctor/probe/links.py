"""PCIe link state, NVLinks, and the link error counters of one GPU."""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Any

from gpudoctor.knowledge.interconnect import decode_nvml_nvlink_version
from gpudoctor.probe.device import LOST, DeviceReader, bus_id, convert_value
from gpudoctor.snapshot import Gpu, Missing, NvLink, NvLinkErrors

NVLINK_MAX_LINKS = 36  # NVML_NVLINK_MAX_LINKS in nvml.h (13.x)

# nvmlDeviceGetNvLinkVersion's answer depends on the driver: older ones answer the plain
# generation (A100 -> 3, H100 -> 4), newer ones nvml.h's nvmlNvlinkVersion_t enum (A100 -> 4 or
# 5, H100 -> 6), and some answer 7 (the enum's 5.0) for H100. The snapshot keeps the raw answer
# (NvLink.version_raw) and records as `version` the generation of the GPU's architecture, read
# from its compute capability; the raw answer decides only when the architecture is unknown.
# See gpudoctor/knowledge/interconnect.py (the tables) and gpudoctor/knowledge/expectations.py (what uses them).

REMOTE_TYPES = {0: "gpu", 1: "ibmnpu", 2: "switch"}


def pcie(reader: DeviceReader) -> dict[str, int | Missing]:
    return {
        "pcie_gen_current": reader.read("nvmlDeviceGetCurrPcieLinkGeneration", int),
        # Max*: what the GPU and its slot can do together ("possible with this device and system",
        # nvml.h 5474, 5513); GpuMax*: the card alone ("supported by this device", 5495).
        "pcie_gen_max": reader.read("nvmlDeviceGetMaxPcieLinkGeneration", int),
        "pcie_gen_gpu_max": reader.read("nvmlDeviceGetGpuMaxPcieLinkGeneration", int),
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


# nvmlNvLinkErrorCounter_t (nvml.h): the counters `nvidia-smi nvlink -e` prints per link.
NVLINK_ERROR_COUNTERS = {"replay": 0, "recovery": 1, "crc_flit": 2, "crc_data": 3}


def _link_errors(reader: DeviceReader, link: int) -> NvLinkErrors | Missing:
    values = {
        name: reader.read("nvmlDeviceGetNvLinkErrorCounter", int, link, counter)
        for name, counter in NVLINK_ERROR_COUNTERS.items()
    }
    if all(isinstance(v, Missing) for v in values.values()):
        return next(iter(values.values()))  # the GPU answers none of them: say why once
    return NvLinkErrors(**values)


@dataclass(frozen=True)
class ErrorCounts:
    """One reading of a GPU's link error counters: per active NVLink, and PCIe replays."""

    at: float  # time.monotonic() when read
    nvlinks: dict[int, NvLinkErrors | Missing]
    pcie_replays: int | Missing

    @property
    def any_read(self) -> bool:
        return not isinstance(self.pcie_replays, Missing) or any(
            not isinstance(e, Missing) for e in self.nvlinks.values()
        )


def read_error_counts(reader: DeviceReader, links: list[NvLink] | Missing) -> ErrorCounts:
    """The counters of the active links (an idle, inactive link's counters say nothing) and the
    PCIe replay counter. A GPU that answers NOT_SUPPORTED for its first link (NVML documents
    these counters as unsupported on Blackwell and later) is not asked for the others."""
    counts: dict[int, NvLinkErrors | Missing] = {}
    for link in links if isinstance(links, list) else []:
        if not link.active:
            continue
        first = next(iter(counts.values()), None)
        if isinstance(first, Missing) and first.reason == "unsupported":
            counts[link.link] = first
            continue
        counts[link.link] = _link_errors(reader, link.link)
    replays = reader.read("nvmlDeviceGetPcieReplayCounter", int)
    return ErrorCounts(at=time.monotonic(), nvlinks=counts, pcie_replays=replays)


def with_counts(links: list[NvLink] | Missing, counts: ErrorCounts, field: str = "errors") -> list[NvLink] | Missing:
    """The links with one reading of their counters set (`errors`, or `errors_later`)."""
    if not isinstance(links, list):
        return links
    return [
        dataclasses.replace(link, **{field: counts.nvlinks[link.link]}) if link.link in counts.nvlinks else link
        for link in links
    ]


def with_second_counts(gpu: Gpu, first_at: float, counts: ErrorCounts) -> Gpu:
    """The GPU with the counters read again `counts.at - first_at` seconds after the first time."""
    return dataclasses.replace(
        gpu,
        nvlinks=with_counts(gpu.nvlinks, counts, "errors_later"),
        pcie_replays_later=counts.pcie_replays,
        error_window_s=round(counts.at - first_at, 4),
    )
