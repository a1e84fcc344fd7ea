"""GD404-406 on PCIe machines (issue 21): a link judged against what the card can do, with the slot
named when it is the limit; severity from what the link still carries; P2P that NVML offers but ACS or
the IOMMU redirects through the root complex."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gpudoctor.checks import pcie_links
from gpudoctor.findings import Finding, Status
from gpudoctor.knowledge.nic_locality import sysfs_bus_id
from gpudoctor.snapshot import GpuPair, Missing, PciNode, Snapshot
from tests.helpers.snapshots import load, with_gpu

ACS_ON = 0x001D  # NVIDIA/nccl#2079: "ACSCtl: 0x001d = SrcValid+, ReqRedir+, CmpltRedir+, UpstreamFwd+"


def tree(s: Snapshot, *, acs: int | Missing | None = 0, iommu: str | None = None, card=(4, 16), slot=(4, 16)):  # type: ignore[no-untyped-def]
    """Each GPU on its own root port (bus - 1), with the port's ACS control and the GPU's IOMMU domain."""
    nodes: dict[str, PciNode] = {}
    for g in s.gpus:
        bdf = sysfs_bus_id(g.pci_bus_id)
        port = f"{bdf[:5]}{int(bdf[5:7], 16) - 1:02x}:01.1"
        group = Missing("unsupported") if iommu is None else iommu
        nodes[port] = PciNode(None, slot[0], slot[1], None, Missing("unsupported"), acs)
        nodes[bdf] = PciNode(port, card[0], card[1], None if iommu is None else g.index, group, None)
    return replace(s, host=replace(s.host, pci_tree=nodes))


def l40s(p2p: str = "ok", level: str = "NODE", cpu: str = "AuthenticAMD") -> Snapshot:
    """Four data-centre PCIe cards (P2P offered) on one socket: the 4-GPU box of the fixtures."""
    base = load("rtx4090_pcie_4x")
    gpus = [replace(g, name="NVIDIA L40S", compute_capability="8.9") for g in base.gpus]
    pairs = [GpuPair(p.a, p.b, level, p2p, p2p) for p in base.pairs]
    return replace(base, gpus=gpus, pairs=pairs, host=replace(base.host, cpu_vendor=cpu))


def findings(s: Snapshot, code: str) -> list[Finding]:
    gpus = list(s.gpus)
    out = pcie_links.pcie_findings(s, gpus) + pcie_links.p2p_findings(s, [g.index for g in gpus])
    return [f for f in out if f.code == code]


def bad(s: Snapshot, code: str) -> dict[str, Finding]:
    return {f.subject: f for f in findings(s, code) if f.status is not Status.PASS}


# ------------------------------------------------------------------------------ the slot as the limit


def test_a_x16_card_in_a_slot_wired_x4_is_named_with_the_slot_to_move_it_to() -> None:
    s = tree(l40s())
    s = with_gpu(s, 1, pcie_width_current=4, pcie_width_max=4)  # NVML's maximum is the slot's
    node = sysfs_bus_id(s.gpu(1).pci_bus_id)
    port = s.host.pci_tree[node].upstream  # type: ignore[index]
    s = replace(s, host=replace(s.host, pci_tree={**s.host.pci_tree, port: PciNode(None, 4, 4)}))  # type: ignore[dict-item]
    (f,) = bad(s, "GD404").values()
    assert (f.subject, f.status) == ("gpu:1", Status.FAIL)  # a quarter of the card's bandwidth
    assert "its slot is wired x4, the card can x16" in f.message
    assert f.hint.startswith("Move GPU 1 to a slot wired x16 (the slots of GPU 0, 2, 3 reach further)")
    before = with_gpu(l40s(), 1, pcie_width_current=4, pcie_width_max=4)
    assert bad(before, "GD404") == {}  # without the card's own maximum the card looks at its "maximum"


def test_a_slot_of_an_older_generation_limits_the_card_at_any_load() -> None:
    s = with_gpu(tree(l40s()), 2, pcie_gen_max=2, pcie_gen_current=1)  # idle: Gen1, whatever the slot
    (f,) = bad(s, "GD405").values()
    assert (f.subject, f.status) == ("gpu:2", Status.FAIL)  # Gen2 of Gen4: a quarter
    assert "slot limits its PCIe link to Gen2; the card can Gen4" in f.message and "Gen4 slot" in f.hint
    gen3 = with_gpu(tree(l40s()), 2, pcie_gen_max=3, pcie_gen_current=1)
    assert bad(gen3, "GD405")["gpu:2"].status is Status.WARN  # half


def test_the_cards_own_maximum_from_the_gpu_probe_is_what_the_link_is_judged_against() -> None:
    # pcie_gen_gpu_max (nvmlDeviceGetGpuMaxPcieLinkGeneration) and pcie_width_gpu_max (the card's Link
    # Capabilities), recorded by the GPU probe (issue 19), with no host.pci_tree in the snapshot.
    s = with_gpu(l40s(), 0, pcie_gen_max=3, pcie_gen_current=3, pcie_gen_gpu_max=5)
    (f,) = bad(s, "GD405").values()
    assert f.subject == "gpu:0" and "the card can Gen5" in f.message and f.status is Status.FAIL
    narrow = with_gpu(l40s(), 0, pcie_width_max=8, pcie_width_current=8, pcie_width_gpu_max=16)
    assert bad(narrow, "GD404")["gpu:0"].status is Status.WARN  # x8 of the card's x16: half
    assert bad(with_gpu(l40s(), 0, pcie_width_max=8, pcie_width_current=8), "GD404") == {}  # NVML's max alone


def test_gen2_of_gen5_under_load_fails() -> None:
    # local-inference-lab/rtx6kpro#88: GPU e3:00.0 held at Gen2 of Gen5 under load for hours.
    s = load("rtx4090_pcie_4x")
    s = with_gpu(s, 1, pcie_gen_max=5, pcie_gen_current=2, clock_event_reasons=0)
    f = bad(s, "GD405")["gpu:1"]
    assert f.status is Status.FAIL and "Gen2 of Gen5 while busy: 13%" in f.message
    idle = with_gpu(s, 1, clock_event_reasons=1)
    assert bad(idle, "GD405") == {}  # idle GPUs lower the generation: normal


# ------------------------------------------------------------------------------ ACS / IOMMU redirection


def test_acs_redirect_on_the_bridges_of_a_p2p_pair_warns_on_that_pair() -> None:
    # NVIDIA/nccl#2079: two GPUs below AMD root ports with ACSCtl 0x001d: NVML says P2P OK, NCCL hangs.
    s = tree(l40s(), acs=ACS_ON, iommu="DMA")
    found = bad(s, "GD406")
    assert set(found) == {"host"}  # more than four pairs: one finding lists them
    assert found["host"].evidence["pairs"] == ["0-1", "0-2", "0-3", "1-2", "1-3", "2-3"]
    f = next(iter(found.values()))
    assert f.status is Status.WARN and "ACS" in f.hint and "setpci" in f.hint and "NCCL_P2P_DISABLE=1" in f.hint
    assert "SrcValid+ ReqRedir+ CmpltRedir+ UpstreamFwd+" in f.message and "P2P OK" in f.message


def test_a_pair_of_two_gpus_under_acs_is_named_as_a_pair() -> None:
    s = load("rtx4090_pcie_4x")
    s = replace(s, gpus=[replace(g, name="NVIDIA RTX 5880 Ada Generation") for g in s.gpus[:2]])
    s = replace(s, pairs=[GpuPair(0, 1, "PHB", "ok", "ok")])
    (f,) = bad(tree(s, acs=ACS_ON), "GD406").values()
    assert f.subject == "pair:0-1" and f.evidence["certain"] is True
    assert f.evidence["acs_redirect"] == {"0000:00:01.1": "0x1d", "0000:20:01.1": "0x1d"}


def test_acs_off_or_pass_through_iommu_is_fine() -> None:
    assert bad(tree(l40s(), acs=0, iommu="DMA"), "GD406") == {}  # ACS read and clear: P2P goes across
    assert bad(tree(l40s(), acs=Missing("no_permission"), iommu="identity"), "GD406") == {}  # iommu=pt
    (ok,) = findings(tree(l40s(), acs=0), "GD406")
    assert ok.status is Status.PASS


def test_a_translating_iommu_without_root_warns_that_p2p_is_likely_redirected() -> None:
    # nccl#257 (fixed by intel_iommu=off), nccl#667 (fixed with VT-d off): ACS not readable without root.
    s = tree(l40s(), acs=Missing("no_permission"), iommu="DMA")
    found = bad(s, "GD406")
    assert found and all(f.status is Status.WARN for f in found.values())
    f = next(iter(found.values()))
    assert "likely" in f.message and "not readable without root" in f.message
    noacs = replace(s, host=replace(s.host, iommu_cmdline=["amd_iommu=on", "pci=realloc,noacs"]))
    assert bad(noacs, "GD406") == {}  # the kernel was told not to use ACS


@pytest.mark.parametrize(("cpu", "judged"), [("GenuineIntel", False), ("AuthenticAMD", True)])
def test_only_pairs_nccl_runs_p2p_on_are_judged(cpu: str, judged: bool) -> None:
    # nccl#667: "all_reduce_perf works fine only with those linked through SYS": NCCL does not run P2P
    # across the sockets on Intel (PXB), so ACS there costs nothing; on AMD with 2 GPUs it does (SYS).
    base = load("rtx4090_pcie_4x")
    s = replace(
        base, gpus=[replace(g, name="NVIDIA L40S") for g in base.gpus[:2]], pairs=[GpuPair(0, 1, "SYS", "ok", "ok")]
    )
    s = replace(s, host=replace(s.host, cpu_vendor=cpu), software=replace(s.software, torch_nccl="2.23.4"))
    assert bool(bad(tree(s, acs=ACS_ON), "GD406")) is judged


# ------------------------------------------------------------------------------ bridges (GD402)


def _bridged(name: str, listed: int, active: set[int], count: int = 2) -> Snapshot:
    from gpudoctor.snapshot import NvLink

    base = load("rtx4090_pcie_4x")
    gpus = base.gpus[:count]
    bus = [g.pci_bus_id for g in gpus]
    gpus = [
        replace(
            g,
            name=name,
            nvlinks=[
                NvLink(
                    k,
                    k in active,
                    3,
                    bus[1 - i] if k in active else Missing("error"),
                    "gpu" if k in active else "unknown",
                )
                for k in range(listed)
            ],
        )
        for i, g in enumerate(gpus)
    ]
    return replace(base, gpus=gpus, pairs=[p for p in base.pairs if p.b < count])


def _gd402(s: Snapshot) -> dict[str, Finding]:
    from gpudoctor.checks.topology import _fewer_links

    return {f.subject: f for f in _fewer_links(s, list(s.gpus)) if f.status is not Status.PASS}


def test_a_half_seated_bridge_fails_on_both_cards_though_they_agree() -> None:
    # NVIDIA/nccl#340: two RTX 2080 Ti, the bridge blocked by a water block on card 0; each card shows
    # the same link down, so a comparison with the peers finds nothing wrong.
    found = _gd402(_bridged("GeForce RTX 2080 Ti", 2, {0}))
    assert set(found) == {"gpu:0", "gpu:1"}
    f = found["gpu:0"]
    assert f.status is Status.FAIL and "partly seated" in f.message and "bridge" in f.hint
    assert _gd402(_bridged("GeForce RTX 2080 Ti", 2, {0, 1})) == {}


def test_fewer_bridges_than_the_card_takes_warns_and_the_h100_nvl_is_whole_at_12_of_18() -> None:
    one_of_three = _gd402(_bridged("NVIDIA A100 80GB PCIe", 12, {0, 1, 2, 3}))
    assert {f.status for f in one_of_three.values()} == {Status.WARN}
    assert "1 of the 3 bridges" in one_of_three["gpu:0"].message
    # Azure/azurehpc-health-checks#162: "only support 12 out of the 18 available links ... by design".
    nvl = set(range(4)) | set(range(6, 10)) | set(range(12, 16))
    assert _gd402(_bridged("NVIDIA H100 NVL", 18, nvl)) == {}
    # A card with no bridge at all is a card without one (NVSentinel#1481: all 12 links down, no bridge).
    assert _gd402(_bridged("NVIDIA A100 80GB PCIe", 12, set())) == {}


def test_a_limit_every_slot_shares_is_the_platforms_and_milder() -> None:
    # Gen5 cards in a Gen4 server: no slot to move to. Named (pass), not warned, on every GPU.
    s = tree(l40s(), card=(5, 16))
    found = findings(s, "GD405")
    limited = [f for f in found if "slot limits" in f.message]
    assert len(limited) == 4 and {f.status for f in limited} == {Status.PASS}
    # Gen2 slots for Gen4 cards everywhere: a quarter, still a warning though no slot is better.
    s = tree(replace(l40s(), gpus=[replace(g, pcie_gen_max=2) for g in l40s().gpus]))
    assert {f.status for f in bad(s, "GD405").values()} == {Status.WARN}
