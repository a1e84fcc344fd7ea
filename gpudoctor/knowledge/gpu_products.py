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
