"""Link probes: judging measured PCIe/P2P numbers, hang -> finding, skip without a GPU, real GPU path."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import pytest

from gpudoctor.checks import registry
from gpudoctor.checks.active import link_probes as lp
from gpudoctor.engine import CheckContext, CheckOptions, Selection
from gpudoctor.engine.runner import run_one
from gpudoctor.findings import Status
from gpudoctor.snapshot import GpuPair, Snapshot
from tests.helpers.snapshots import SnapshotOf, load


def with_iommu(s: Snapshot) -> Snapshot:
    return replace(s, host=replace(s.host, iommu_cmdline=["intel_iommu=on"], iommu_groups=112))


def pcie_p2p_box() -> Snapshot:
    """The 4x RTX 4090 box, but with NVML reporting P2P OK (as it does on a Threadripper/Xeon PCIe switch)."""
    s = load("rtx4090_pcie_4x")
    pairs = [replace(p, p2p_read="ok", p2p_write="ok", pcie_level="PIX") for p in s.pairs]
    return with_iommu(replace(s, pairs=pairs))


# --- PCIe under load -----------------------------------------------------------------------


def test_a_link_at_its_maximum_under_load_passes(snapshot_of: SnapshotOf) -> None:
    gpu = snapshot_of("h100_sxm_8x").gpu(0)
    f = lp.judge_pcie(gpu, 5, 16, 53.1)
    assert f.status is Status.PASS and f.subject == "gpu:0"
    assert f.evidence["h2d_gbps"] == 53.1


def test_one_generation_down_under_load_warns_with_the_bandwidth_lost(snapshot_of: SnapshotOf) -> None:
    gpu = snapshot_of("h100_sxm_8x").gpu(3)
    f = lp.judge_pcie(gpu, 4, 16)
    assert f.status is Status.WARN
    assert "Gen4 x16" in f.message and "Gen5 x16" in f.message and "50%" in f.message


@pytest.mark.parametrize(("gen", "width"), [(4, 4), (1, 16), (3, 8)])
def test_a_link_at_a_quarter_of_its_bandwidth_or_less_fails(gen: int, width: int, snapshot_of: SnapshotOf) -> None:
    gpu = snapshot_of("rtx4090_pcie_4x").gpu(1)  # Gen4 x16 capable
    f = lp.judge_pcie(gpu, gen, width)
    assert f.status is Status.FAIL
    assert f.evidence["bandwidth_ratio"] <= 0.26


def test_an_unreadable_link_is_a_skip_not_a_verdict(snapshot_of: SnapshotOf) -> None:
    f = lp.judge_pcie(snapshot_of("h100_sxm_8x").gpu(0), None, None)
    assert f.status is Status.SKIP


# --- P2P vs host-staged --------------------------------------------------------------------


def test_pcie_p2p_faster_than_host_staged_passes() -> None:
    f = lp.judge_p2p(pcie_p2p_box(), 0, 1, 24.8, 11.9)
    assert f.status is Status.PASS and f.subject == "pair:0-1"


def test_p2p_slower_than_host_staged_fails_and_names_the_iommu_settings() -> None:
    f = lp.judge_p2p(pcie_p2p_box(), 1, 2, 2.1, 11.5)  # ACS redirect: a few GB/s
    assert f.status is Status.FAIL
    assert "ACS/IOMMU" in f.message and "intel_iommu=on" in f.message
    assert f.evidence["kernel_cmdline_iommu"] == "intel_iommu=on" and f.evidence["iommu_groups"] == 112
    assert "iommu=pt" in f.hint


def test_p2p_a_little_slower_than_host_staged_warns() -> None:
    assert lp.judge_p2p(pcie_p2p_box(), 0, 3, 9.0, 11.0).status is Status.WARN


def test_nvlink_pair_no_faster_than_host_memory_warns(snapshot_of: SnapshotOf) -> None:
    f = lp.judge_p2p(snapshot_of("h100_sxm_8x"), 0, 5, 40.0, 30.0)
    assert f.status is Status.WARN and "NV18" in f.message


def test_nvlink_pair_far_above_host_memory_passes(snapshot_of: SnapshotOf) -> None:
    assert lp.judge_p2p(snapshot_of("h100_sxm_8x"), 0, 5, 310.0, 25.0).status is Status.PASS


def test_wrong_data_from_a_peer_copy_fails_whatever_the_speed() -> None:
    f = lp.judge_p2p(pcie_p2p_box(), 0, 1, 25.0, 12.0, data_ok=False)
    assert f.status is Status.FAIL and "wrong data" in f.message


def test_pairs_probed_are_those_nvml_calls_p2p_capable(snapshot_of: SnapshotOf) -> None:
    s = snapshot_of("rtx4090_pcie_4x")  # GeForce: chipset_not_supported everywhere
    assert lp.p2p_pairs(s, s.gpus) == []
    s = replace(s, pairs=[replace(p, p2p_read="ok", p2p_write="ok") if (p.a, p.b) == (0, 2) else p for p in s.pairs])
    assert lp.p2p_pairs(s, s.gpus) == [(0, 2)]
    h = snapshot_of("h100_sxm_8x")
    assert len(lp.p2p_pairs(h, h.gpus)) == 28  # NVLink to every peer


# --- the launch, judged: results, hang, failure ---------------------------------------------


@dataclass
class FakeRank:
    phase: str = "done"
    state: str = "done"
    error: str = ""
    error_kind: str | None = None


@dataclass
class FakeResult:
    data: dict[str, Any] = field(default_factory=dict)
    ranks: list[FakeRank] = field(default_factory=lambda: [FakeRank()])
    timed_out: str | None = None
    deadline_s: float = 50.0
    setup_error: dict[str, Any] | None = None

    def results(self, task: str) -> dict[str, Any] | None:
        return self.data.get(task)


def test_measurements_from_the_rank_become_per_gpu_and_per_pair_findings() -> None:
    s = pcie_p2p_box()
    result = FakeResult(
        {
            "link_pcie": {
                "gpus": [{"gpu": i, "gen": 4, "width": 16 if i != 2 else 8, "h2d_gbps": 24.0} for i in range(4)]
            },
            "link_p2p": {
                "pairs": [
                    {"a": 0, "b": 1, "p2p_gbps": 25.0, "staged_gbps": 12.0},
                    {"a": 2, "b": 3, "p2p_gbps": 1.5, "staged_gbps": 12.0},
                ]
            },
        }
    )
    findings = lp.judge_launch(s, s.gpus, [(0, 1), (2, 3)], result)
    got = {(f.code, f.subject): f.status for f in findings}
    assert got[("GD420", "gpu:0")] is Status.PASS
    assert got[("GD420", "gpu:2")] is Status.WARN
    assert got[("GD421", "pair:0-1")] is Status.PASS
    assert got[("GD421", "pair:2-3")] is Status.FAIL


def test_a_copy_killed_at_the_deadline_is_reported_as_a_hang_of_that_pair() -> None:
    s = pcie_p2p_box()
    result = FakeResult(
        {"link_pcie": {"gpus": [{"gpu": i, "gen": 4, "width": 16} for i in range(4)]}},
        ranks=[FakeRank(phase="p2p:1-3", state="hung")],
        timed_out="run",
        deadline_s=51.0,
    )
    findings = lp.judge_launch(s, s.gpus, [(0, 1), (1, 3)], result)
    (hang,) = [f for f in findings if f.code == "GD422"]
    assert hang.status is Status.FAIL and hang.subject == "pair:1-3"
    assert "51 s" in hang.message and "intel_iommu=on" in hang.message


def test_a_rank_that_crashed_before_measuring_is_an_error_not_a_pass(snapshot_of: SnapshotOf) -> None:
    s = snapshot_of("h100_sxm_8x")
    result = FakeResult(
        {}, ranks=[FakeRank(phase="cuda_init", state="error", error="CUDA error: system not yet initialized")]
    )
    findings = lp.judge_launch(s, s.gpus, lp.p2p_pairs(s, s.gpus), result)
    assert [f.status for f in findings] == [Status.ERROR]
    assert "system not yet initialized" in findings[0].message


def test_a_launch_that_could_not_start_is_a_skip_naming_why(snapshot_of: SnapshotOf) -> None:
    s = snapshot_of("h100_sxm_8x")
    result = FakeResult(setup_error={"kind": "port_in_use", "message": "MASTER_PORT 29500 is already in use"})
    (f,) = lp.judge_launch(s, s.gpus, [], result)
    assert f.status is Status.SKIP and "29500" in f.message


# --- the check itself, on this machine -----------------------------------------------------


def test_without_a_driver_the_probes_skip_with_a_reason(snapshot_of: SnapshotOf) -> None:
    ctx = CheckContext(snapshot_of("no_driver"))
    result = run_one(registry().checks["link_probes"], ctx, Selection())
    (f,) = result.findings
    assert f.status is Status.SKIP and "GD101" in f.message


def test_device_cpu_skips_the_probes(snapshot_of: SnapshotOf) -> None:
    ctx = CheckContext(snapshot_of("h100_sxm_8x"), CheckOptions(device="cpu"))
    (f,) = run_one(registry().checks["link_probes"], ctx, Selection()).findings
    assert f.status is Status.SKIP and "--device cpu" in f.message


def test_link_probes_are_active_so_quick_and_snapshots_never_run_them() -> None:
    assert registry().checks["link_probes"].active


def test_link_probes_register_their_workloads() -> None:
    from gpudoctor.workloads import WORKLOADS

    assert WORKLOADS["link_pcie"] == "gpudoctor.workloads.link_probes:pcie"
    assert WORKLOADS["link_p2p"] == "gpudoctor.workloads.link_probes:p2p"


@pytest.mark.gpu
def test_real_gpus_are_probed_end_to_end() -> None:
    from gpudoctor.probe import collect

    ctx = CheckContext(collect(), CheckOptions(timeout_s=120))
    findings = run_one(registry().checks["link_probes"], ctx, Selection()).findings
    pcie = [f for f in findings if f.code == "GD420" and f.subject.startswith("gpu:")]
    assert len(pcie) == len(ctx.visible.gpus)
    for f in pcie:
        assert f.status in (Status.PASS, Status.WARN, Status.FAIL)
        assert f.evidence["gen_under_load"] >= 1 and f.evidence["h2d_gbps"] > 0
    assert not [f for f in findings if f.status is Status.ERROR], [f.message for f in findings]
    for f in findings:
        if f.code == "GD421" and f.subject.startswith("pair:"):
            assert f.evidence["p2p_gbps"] > 0 and f.evidence["staged_gbps"] > 0


def test_gpu_pair_fixture_shape_is_what_the_probes_expect(snapshot_of: SnapshotOf) -> None:
    # p2p_pairs reads NVML's verdicts from snapshot.pairs, which must cover every GPU pair
    s = snapshot_of("rtx4090_pcie_4x")
    assert {(p.a, p.b) for p in s.pairs} == {(a, b) for a in range(4) for b in range(a + 1, 4)}
    assert all(isinstance(p, GpuPair) for p in s.pairs)


def test_the_probes_run_budget_starts_when_the_rank_is_ready() -> None:
    machine = load("h100_sxm_8x")
    # One GPU: 22 s of probing after torch and CUDA are up, within a launch bounded by --timeout.
    assert lp.run_budget(CheckContext(machine, CheckOptions(timeout_s=120)), 1, 0) == 22.0
    assert lp.run_budget(CheckContext(machine, CheckOptions(timeout_s=10)), 8, 28) == 10.0
