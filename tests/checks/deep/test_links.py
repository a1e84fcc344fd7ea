"""Host-link and device-to-device verdicts against the PCIe/NVLink expectation, calibrated on
published nvbandwidth and p2pBandwidthLatencyTest readings (tests/reference/deep-host-links.md)."""

from __future__ import annotations

from typing import Any

from gpudoctor.checks.deep.links import judge_d2d, judge_host, judge_shared
from gpudoctor.findings import Status
from tests.helpers.findings import verdicts
from tests.helpers.snapshots import load

# NVIDIA/nvbandwidth#15, 8x RTX 4090 (PCIe Gen4): host_to_device_memcpy_ce and device_to_host_memcpy_ce.
NVBANDWIDTH_4090_H2D = [25.50, 24.26, 23.90, 26.30, 26.28, 26.38, 26.09, 26.31]
NVBANDWIDTH_4090_D2H = [26.77, 26.47, 26.25, 26.63, 27.10, 27.11, 27.11, 26.83]


def host_row(gpu: int, h2d: float, d2h: float, *, at_once: tuple[float, float] | None = None) -> dict[str, Any]:
    alone = {"h2d_pinned": h2d, "d2h_pinned": d2h, "h2d_pageable": None, "d2h_pageable": None}
    h2d_now, d2h_now = at_once or (h2d, d2h)
    return {
        "rank": gpu,
        "gpu": gpu,
        "device": "NVIDIA GeForce RTX 4090",
        "alone": alone,
        "at_once": {**alone, "h2d_pinned": h2d_now, "d2h_pinned": d2h_now},
    }


def test_published_rtx4090_host_copies_pass_against_pcie_gen4_x16() -> None:
    rows = [host_row(i, NVBANDWIDTH_4090_H2D[i], NVBANDWIDTH_4090_D2H[i]) for i in range(4)]
    findings = judge_host(load("rtx4090_pcie_4x"), rows)
    assert verdicts(findings) == [("GD430", "pass", "host")]
    assert "GPU 2 H2D 23.9 / D2H 26.2 GB/s pinned (76% of PCIe Gen4 x16 = 31.5 GB/s)" in findings[0].message


def test_a_gpu_copying_at_a_fraction_of_its_link_is_named() -> None:
    rows = [host_row(0, 25.5, 26.8), host_row(1, 12.9, 13.0), host_row(2, 7.9, 8.1), host_row(3, 26.3, 26.6)]
    findings = judge_host(load("rtx4090_pcie_4x"), rows)
    assert verdicts(findings)[:2] == [("GD430", "warn", "gpu:1"), ("GD430", "fail", "gpu:2")]
    assert findings[1].message == (
        "GPU 2 copies to/from host memory at 7.9 GB/s alone, 25% of its PCIe Gen4 x16 = 31.5 GB/s "
        "(H2D 7.9 / D2H 8.1 GB/s pinned)"
    )
    assert findings[1].evidence["ratio"] == 0.251


def test_a_gpu_sharing_its_switch_loses_bandwidth_only_when_all_copy_at_once() -> None:
    snap = load("a100_sxm_8x")  # GPUs 0 and 1 behind one PCIe switch (PXB)
    rows = [host_row(0, 25.9, 26.0, at_once=(11.0, 12.5)), host_row(1, 25.8, 26.1, at_once=(12.0, 12.9))]
    rows += [host_row(g, 25.9, 26.0, at_once=(24.9, 25.1)) for g in (2, 3)]
    findings = judge_shared(snap, rows)
    assert verdicts(findings) == [("GD431", "warn", "gpu:0"), ("GD431", "warn", "gpu:1")]
    assert findings[0].message == (
        "GPU 0 keeps 42% of its H2D bandwidth when all GPUs copy at once (11.0 of 25.9 GB/s): "
        "it shares a PCIe switch with GPU 1"
    )
    assert findings[0].evidence["switch_mates"] == [1]
    # Alone they were fine: the alone verdict does not see it.
    assert [f.status for f in judge_host(snap, rows)] == [Status.PASS]


def test_a_drop_without_a_shared_switch_blames_the_host() -> None:
    rows = [host_row(g, 26.0, 26.0, at_once=(9.0, 25.0)) for g in range(2)]
    findings = judge_shared(load("rtx4090_pcie_4x"), rows)
    assert all("the host (root complex or memory) caps it" in f.message for f in findings)


def test_gpus_that_keep_their_bandwidth_at_once_pass_with_the_total() -> None:
    rows = [host_row(g, 26.0, 26.0, at_once=(22.0, 23.0)) for g in range(4)]
    (f,) = judge_shared(load("rtx4090_pcie_4x"), rows)
    assert f.status is Status.PASS and f.message.startswith("all 4 GPUs copying at once: 88.0 GB/s H2D in all")
    assert judge_shared(load("rtx4090_pcie_4x"), rows[:1])[0].status is Status.SKIP


def pair(a: int, b: int, ab: float, ba: float) -> dict[str, Any]:
    return {"a": a, "b": b, "peer_access": True, "a_to_b_gbps": ab, "b_to_a_gbps": ba}


def test_published_hgx_h100_p2p_rates_pass_against_18_links_at_nccls_rate() -> None:
    # NVIDIA/nccl#1264, HGX H100 SXM, unidirectional P2P writes GPU 0 -> 1, 2, 3: 371.02, 376.65, 376.60.
    findings = judge_d2d(load("h100_sxm_8x"), [pair(0, 1, 371.02, 376.0), pair(0, 2, 376.65, 375.9)])
    assert verdicts(findings) == [("GD432", "pass", "host")]
    assert findings[0].message == "device-to-device: 0-1 371 GB/s (100%); 0-2 376 GB/s (101%)"


def test_a_pair_far_below_its_link_is_named_and_the_acs_like_rate_fails() -> None:
    findings = judge_d2d(load("h100_sxm_8x"), [pair(0, 1, 200.0, 380.0), pair(2, 3, 120.0, 118.0)])
    assert verdicts(findings) == [("GD432", "warn", "pair:0-1"), ("GD432", "fail", "pair:2-3")]
    assert findings[0].message == (
        "GPU 0 <-> 1 (NV18): device-to-device copies at 200.0 GB/s, 54% of 18 NVLinks x 20.6 GB/s (NCCL's "
        "per-link rate) = 370.8 GB/s"
    )
    # On PCIe the expectation is the slower GPU's link: P2P redirected through the CPU as in
    # NVIDIA/nccl#814 (9.9 GB/s) is under 0.35 of Gen4 x16.
    (pcie,) = judge_d2d(load("rtx4090_pcie_4x"), [pair(0, 1, 9.9, 10.2)])
    assert (pcie.status, pcie.evidence["basis"]) == (Status.FAIL, "PCIe Gen4 x16 = 31.5 GB/s")


def test_no_p2p_pair_is_a_skip() -> None:
    (f,) = judge_d2d(load("rtx4090_pcie_4x"), [])
    assert f.status is Status.SKIP
