"""What a GPU's PCIe path (host.pci_tree) says about its links and about P2P between two GPUs.

    gpu_node(snap, gpu)          -> PciNode | None   the GPU's own node
    path_up(snap, gpu)           -> list[str]        bus ids from the GPU up to its root port
    card_max(snap, gpu)          -> (gen, width)     what the card itself can do (either may be None)
    slot_max(snap, gpu)          -> (gen, width)     what the port above it can do
    p2p_redirect(snap, a, b)     -> Redirect | None  why P2P between two GPUs goes through the root complex

ACS (PCIe base spec, "Access Control Services"): a bridge with P2P Request Redirect (ReqRedir) or
Completion Redirect (CmpltRedir) sends peer-to-peer requests up to the root complex instead of across,
and with an IOMMU that translates the GPUs' DMA ("DMA"/"DMA-FQ" domain), the peer's address is looked
up there. NCCL's troubleshooting guide: IO virtualization "can interfere with GPU Direct by redirecting
all PCI point-to-point traffic to the CPU root complex, causing a significant performance reduction or
even a hang"; "If PCI switches have ACS enabled, it needs to be disabled". Linux turns ACS redirection on
at boot on every bridge that has it whenever an IOMMU driver is active (drivers/pci/pci.c
pci_enable_acs, requested by the Intel and AMD IOMMU drivers), unless `pci=noacs` or the BIOS hides
the capability. Real cases: NVIDIA/nccl#2079 (ACSCtl 0x001d on the root ports above both GPUs: a hang,
fixed by pci=noacs), nccl#257 (fixed by intel_iommu=off), nccl#667 (PXB/PIX pairs hang, SYS pairs that
NCCL does not run P2P on work; fixed with VT-d off).
"""

from __future__ import annotations

from gpudoctor.knowledge.nic_locality import sysfs_bus_id
from gpudoctor.records import Record, record
from gpudoctor.snapshot import Gpu, Missing, PciNode, Snapshot

ACS_SRC_VALID = 1 << 0
ACS_REQ_REDIR = 1 << 2
ACS_CMPLT_REDIR = 1 << 3
ACS_UPSTREAM_FWD = 1 << 4
ACS_EGRESS_CTRL = 1 << 5
ACS_REDIRECTS = ACS_REQ_REDIR | ACS_CMPLT_REDIR | ACS_EGRESS_CTRL
ACS_NAMES = {
    ACS_SRC_VALID: "SrcValid",
    1 << 1: "TransBlk",
    ACS_REQ_REDIR: "ReqRedir",
    ACS_CMPLT_REDIR: "CmpltRedir",
    ACS_UPSTREAM_FWD: "UpstreamFwd",
    ACS_EGRESS_CTRL: "EgressCtrl",
    1 << 6: "DirectTrans",
}
TRANSLATED = ("DMA", "DMA-FQ")  # /sys/kernel/iommu_groups/<n>/type of a translating domain


def acs_text(ctrl: int) -> str:
    """0x001d -> 'SrcValid+ ReqRedir+ CmpltRedir+ UpstreamFwd+' (lspci's ACSCtl words for the bits set)."""
    return " ".join(f"{name}+" for bit, name in ACS_NAMES.items() if ctrl & bit) or "all off"


def _tree(snap: Snapshot) -> dict[str, PciNode]:
    tree = snap.host.pci_tree
    return tree if isinstance(tree, dict) else {}


def _key(gpu: Gpu) -> str | None:
    try:
        return sysfs_bus_id(gpu.pci_bus_id)
    except ValueError:
        return None


def gpu_node(snap: Snapshot, gpu: Gpu) -> PciNode | None:
    key = _key(gpu)
    return _tree(snap).get(key) if key else None


def path_up(snap: Snapshot, gpu: Gpu) -> list[str]:
    """The GPU's bus id and each bridge above it, nearest first (empty when not recorded)."""
    tree, out = _tree(snap), []
    key = _key(gpu)
    while key and key in tree and key not in out and len(out) < 16:
        out.append(key)
        key = tree[key].upstream
    return out


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def card_max(snap: Snapshot, gpu: Gpu) -> tuple[int | None, int | None]:
    """What the card can do by itself: the GPU probe's own maxima where recorded (pcie_gen_gpu_max:
    nvmlDeviceGetGpuMaxPcieLinkGeneration; pcie_width_gpu_max: the card's Link Capabilities), else the
    GPU's Link Capabilities in host.pci_tree (snapshots written before those fields)."""
    node = gpu_node(snap, gpu)
    gen, width = _int(gpu.pcie_gen_gpu_max), _int(gpu.pcie_width_gpu_max)
    if node is not None:
        gen = gen if gen is not None else _int(node.max_link_gen)
        width = width if width is not None else _int(node.max_link_width)
    return gen, width


def slot_max(snap: Snapshot, gpu: Gpu) -> tuple[int | None, int | None]:
    """What the port the card sits in can do (the bridge above it in sysfs)."""
    node = gpu_node(snap, gpu)
    parent = _tree(snap).get(node.upstream) if node is not None and node.upstream else None
    if parent is None:
        return None, None
    return _int(parent.max_link_gen), _int(parent.max_link_width)


@record
class Redirect(Record):
    """Why P2P between two GPUs is sent to the root complex (or likely is)."""

    bridges: dict[str, int]  # bridge bus id -> its ACS control, for bridges that redirect
    translated: bool  # the GPUs' IOMMU domain translates their DMA
    certain: bool  # ACS was read on the bridges (root); else inferred from the IOMMU
    unread: list[str]  # bridges whose ACS control could not be read

    def reason(self) -> str:
        if self.bridges:
            where = ", ".join(f"{bdf} (ACSCtl {ctrl:#06x}: {acs_text(ctrl)})" for bdf, ctrl in self.bridges.items())
            which = "bridges" if len(self.bridges) > 1 else "bridge"
            text = f"ACS on {which} {where} redirects their peer traffic to the CPU root complex"
            return text + (", through the IOMMU, which translates the GPUs' DMA" if self.translated else "")
        return (
            "the IOMMU translates the GPUs' DMA (IOMMU domain DMA), and Linux turns ACS redirection on at boot "
            "on every PCIe bridge that has it while an IOMMU is active, so their peer traffic likely goes "
            "through the root complex and the IOMMU"
            + (f" (ACS on {', '.join(self.unread)} not readable without root)" if self.unread else "")
        )


def _between(snap: Snapshot, a: Gpu, b: Gpu) -> tuple[list[str], bool] | None:
    """The bridges a P2P request between the two GPUs crosses below their common ancestor (both
    sides), and whether both paths were recorded."""
    up_a, up_b = path_up(snap, a), path_up(snap, b)
    if not up_a or not up_b:
        return None
    common = next((n for n in up_a if n in up_b), None)
    side_a = up_a[1 : up_a.index(common)] if common else up_a[1:]
    side_b = up_b[1 : up_b.index(common)] if common else up_b[1:]
    return side_a + side_b, True


def acs_off_by_kernel(snap: Snapshot) -> bool:
    """The kernel was told not to use ACS: `pci=noacs`, or `pci=disable_acs_redir=` (Documentation/
    admin-guide/kernel-parameters.txt), possibly among other pci= options."""
    cmdline = snap.host.iommu_cmdline if isinstance(snap.host.iommu_cmdline, list) else []
    options = [o for t in cmdline if t.startswith("pci=") for o in t[4:].split(",")]
    return any(o == "noacs" or o.startswith("disable_acs_redir") for o in options)


def p2p_redirect(snap: Snapshot, a: Gpu, b: Gpu) -> Redirect | None:
    """Why P2P between GPUs a and b goes through the root complex, or None when nothing recorded says
    so. ACS read on the bridges decides; where it could not be read, GPUs whose IOMMU domain translates
    count as likely redirected (Linux enables ACS with the IOMMU) unless the kernel ran with pci=noacs."""
    tree = _tree(snap)
    nodes = [gpu_node(snap, g) for g in (a, b)]
    translated = all(n is not None and n.iommu_type in TRANSLATED for n in nodes)
    between = _between(snap, a, b)
    bridges = between[0] if between else []
    redirecting = {bdf: ctrl for bdf in bridges if isinstance(ctrl := tree[bdf].acs_ctrl, int) and ctrl & ACS_REDIRECTS}
    unread = [bdf for bdf in bridges if isinstance(tree[bdf].acs_ctrl, Missing)]
    if redirecting:
        return Redirect(redirecting, translated, True, unread)
    if translated and not acs_off_by_kernel(snap) and (unread or not bridges):
        return Redirect({}, True, False, unread)
    return None
