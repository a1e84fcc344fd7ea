"""Facts about NVIDIA's GPU product lines that checks in several areas rely on: which boards have
ECC on by default, which GeForce cards' peer-to-peer is broken on which drivers."""

from __future__ import annotations

import re

from gpudoctor.knowledge.versions import version_tuple
from gpudoctor.snapshot import Gpu, Snapshot, known

# Product names of cards that ship with ECC off (GeForce, TITAN, Quadro and RTX workstation boards):
# their ECC mode is the owner's choice, compared across GPUs by GD305. Data-centre boards ship with it
# on. A server board with RTX in its name ("RTX PRO 6000 Blackwell Server Edition") is data-centre.
ECC_OFF_BY_DEFAULT = ("geforce", "titan", "quadro", "rtx")


def ecc_expected_on(gpu: Gpu) -> bool:
    """A data-centre GPU whose ECC mode NVML reads (readable: the board has ECC): GD833 judges it."""
    if not (known(gpu.ecc_mode_current) or known(gpu.ecc_mode_pending)):
        return False
    name = gpu.name.lower()
    return "server edition" in name or not any(word in name for word in ECC_OFF_BY_DEFAULT)


# GeForce RTX 40 cards report P2P as supported on drivers before 550.40.07, where it is broken
# (Hugging Face accelerate, check_cuda_p2p_ib_support).
RTX40_FIXED_DRIVER = (550, 40, 7)
RTX40_RE = re.compile(r"GeForce RTX 40\d\d")


def rtx40_p2p_broken(snapshot: Snapshot, gpus: list[Gpu]) -> bool:
    """More than one GeForce RTX 40 card on a driver whose P2P is broken for them."""
    if not known(snapshot.driver.driver_version):
        return False
    dv = version_tuple(str(snapshot.driver.driver_version))
    return dv is not None and dv < RTX40_FIXED_DRIVER and sum(1 for g in gpus if RTX40_RE.search(g.name)) > 1


# The NVLink bridges a PCIe card takes: (links per bridge, bridges), from NVIDIA's published specs:
# A100 PCIe, H100 PCIe and H100 NVL reach 600 GB/s over three 2-way bridges (12 links of 50 GB/s both
# ways; NVML lists 18 on the H100 NVL, of which "only ... 12 out of the 18 available links" are wired,
# "by design": Azure/azurehpc-health-checks#162); GA102 cards (RTX 3090, RTX A6000/A5000, A40) run "four
# x4 links" over one bridge (GA102 whitepaper); TU102 (RTX 2080 Ti, TITAN RTX, Quadro RTX 6000/8000) two
# links and TU104 (RTX 2080 / 2080 SUPER, Quadro RTX 5000) one, over one bridge (Turing whitepaper).
# A card whose active links are not a whole number of bridges has a bridge making contact on only some
# of its links (sjeaugey, NVIDIA/nccl#557: "some NVLinks were detected but not all, as the connector was
# only partially making contact").
BRIDGE_LINKS: tuple[tuple[re.Pattern[str], int, int], ...] = (
    (re.compile(r"\bH100 (NVL|PCIE)\b|\bA100[- ](\d+GB )?PCIE\b", re.I), 4, 3),
    (re.compile(r"\bRTX 3090\b|\bRTX A(5000|5500|6000)\b|\bNVIDIA A40\b", re.I), 4, 1),
    (re.compile(r"\b2080 TI\b|\bTITAN RTX\b|\bQUADRO RTX [68]000\b", re.I), 2, 1),
    (re.compile(r"\bRTX 2080( SUPER)?$|\bRTX 2070 SUPER\b|\bQUADRO RTX 5000\b", re.I), 1, 1),
)


def bridge_links(gpu: Gpu) -> tuple[int, int] | None:
    """(links per bridge, bridges the card takes) for a PCIe card NVIDIA publishes it for; None else."""
    return next(((per, n) for pattern, per, n in BRIDGE_LINKS if pattern.search(gpu.name)), None)
