"""The PCIe-class expectation (issue 21): bridged islands, VMs and translating IOMMUs, NCCL_P2P_LEVEL
that widens P2P, and a range with its basis where no published figure backs a class."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gpudoctor.checks.active.allreduce import verdict
from gpudoctor.findings import Status
from gpudoctor.knowledge.expectations import Expectation, expected_busbw
from gpudoctor.snapshot import Missing, PciNode, Snapshot, Virtualization
from tests.helpers.reference_machines import build

WARN, FAIL = 0.8, 0.5


def expect(snapshot: Snapshot, indices: list[int] | None = None) -> Expectation:
    e = expected_busbw(snapshot, indices or [g.index for g in snapshot.gpus])
    assert e is not None
    return e


# Azure NC96ads A100 v4: 4x A100 80GB PCIe, two NVLink-bridged pairs, a VM. Azure's health check fails a
# node below 25 GB/s at 8 GiB (azurehpc-health-checks conf/nc96ads_a100_v4.conf).
# nccl-tests#178's real matrix: 8x A100 PCIe in NV12 pairs, NODE within a socket, SYS across.
PAIRS = dict(
    id="bridged-pairs",
    gpu="NVIDIA A100 80GB PCIe",
    cc="8.0",
    count=8,
    fabric="bridge",
    pcie=[4, 16],
    topo="topo/nccl-tests-178-8x-a100-pcie-nv12-pairs.txt",
    cpu=["x86_64", "GenuineIntel"],
)


def test_two_bridged_pairs_leave_through_two_pcie_links_up_to_the_bridge() -> None:
    s = build(PAIRS)
    e = expect(s, [0, 1, 2, 3])  # two pairs on one socket
    one_hop = 24 * 0.75  # one PCIe hop through host memory (NODE is beyond NCCL's PXB): the old figure
    assert e.busbw_gbps == pytest.approx(one_hop) and e.high_gbps == pytest.approx(2 * one_hop)
    assert not e.certain and "NC96ads" in e.unknown
    assert "2 GPUs' PCIe links side by side" in e.basis
    assert e.busbw_gbps <= 25.0 <= e.high_gbps  # Azure's floor sits inside the range
    assert verdict(25.0, e, WARN, FAIL) is Status.PASS
    assert verdict(5.0, e, WARN, FAIL) is Status.WARN  # far below: warned, never failed on an estimate
    # One pair and a lone GPU (nccl-tests#178, 20 GB/s measured): the ring leaves through one link.
    three = expect(s, [0, 1, 2])
    assert three.certain and three.high_gbps is None


def test_a_vm_without_p2p_gets_a_range_not_the_bare_metal_figure() -> None:
    entry = dict(id="vm", gpu="NVIDIA A10G", cc="8.6", count=4, fabric="pcie", pcie=[4, 16], p2p="not_supported")
    bare = expect(build(entry))
    vm = expect(build({**entry, "vm": True}))
    assert bare.certain and not vm.certain
    assert vm.high_gbps == pytest.approx(bare.busbw_gbps) and vm.busbw_gbps < bare.busbw_gbps
    assert "virtual machine" in vm.basis and verdict(0.2 * bare.busbw_gbps, vm, WARN, FAIL) is Status.WARN
    # With P2P (a VM whose hypervisor passes it through) nothing goes through host memory: no doubt.
    assert expect(build({**entry, "vm": True, "p2p": "ok", "pcie_level": "PIX"})).certain


def test_a_translating_iommu_on_bare_metal_is_a_range_too() -> None:
    s = build(dict(id="iommu", gpu="NVIDIA L40S", cc="8.9", count=2, fabric="pcie", pcie=[4, 16], p2p="not_supported"))
    nodes = {f"0000:{0x10 + 0x10 * i:02x}:00.0": PciNode(None, 4, 16, i, "DMA") for i in range(2)}
    e = expect(replace(s, host=replace(s.host, pci_tree=nodes)))
    assert not e.certain and "IOMMU" in e.basis
    pt = {k: replace(v, iommu_type="identity") for k, v in nodes.items()}
    assert expect(replace(s, host=replace(s.host, pci_tree=pt))).certain


def test_nccl_p2p_level_that_widens_p2p_is_modelled_as_a_range() -> None:
    # Two GPUs across the sockets on Intel: NCCL's default PXB keeps them on host memory.
    entry = dict(
        id="w",
        gpu="NVIDIA RTX A6000",
        cc="8.6",
        count=2,
        fabric="pcie",
        sockets=2,
        pcie=[4, 16],
        p2p="ok",
        cpu=["x86_64", "GenuineIntel"],
    )
    default = expect(build(entry))
    assert default.certain and default.busbw_gbps == pytest.approx(24 * 0.75 * 0.8)
    wide = expect(build({**entry, "env": {"NCCL_P2P_LEVEL": "SYS"}}))
    assert not wide.certain and wide.high_gbps == pytest.approx(24 * 0.8)
    assert wide.busbw_gbps == pytest.approx(default.busbw_gbps)  # the low end: the host-memory figure
    assert "NCCL_P2P_LEVEL=SYS widens" in wide.basis and "nccl-tests#74" in wide.basis
    # A variable that cuts P2P stays out of the expectation: it is the fault GD601 must see.
    cut = expect(build({**entry, "cpu": ["x86_64", "AuthenticAMD"], "env": {"NCCL_P2P_LEVEL": "PIX"}}))
    assert cut.busbw_gbps == pytest.approx(24.0) and cut.certain  # P2P across AMD sockets: no SYS factor


def test_an_uncertain_expectation_says_what_would_make_it_certain_in_its_json() -> None:
    e = expect(build(PAIRS))  # four pairs on two sockets
    assert e.high_gbps == pytest.approx(2 * 24 * 0.75 * 0.8)
    out = e.to_json()
    assert out["certain"] is False and out["would_make_it_certain"] and "expected_busbw_high_gbps" in out
    assert e.figure().count("-") == 1 and e.figure().endswith("GB/s")


def test_virtualization_missing_or_bare_changes_nothing() -> None:
    entry = dict(id="b", gpu="NVIDIA A10G", cc="8.6", count=2, fabric="pcie", pcie=[4, 16], p2p="not_supported")
    s = build(entry)
    for virt in (
        Missing("no_permission"),
        Virtualization(hypervisor=False),
        Virtualization(hypervisor=Missing("unsupported")),
    ):
        assert expect(replace(s, host=replace(s.host, virtualization=virt))).certain
