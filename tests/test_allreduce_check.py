"""The all-reduce verdict: measured vs the machine's expected busbw, skips, wrong sums."""

from __future__ import annotations

import pytest

from gpudoctor import snapshot as snap
from gpudoctor.checks.allreduce import allreduce
from gpudoctor.expectations import expected_busbw
from gpudoctor.findings import Status
from gpudoctor.launch import LaunchResult, RankOutcome
from gpudoctor.registry import CheckContext, CheckOptions
from tests.conftest import FIXTURES


def sweep(busbw: list[float], wrong: int = 0, world: int = 8) -> dict:
    rows = [
        {
            "bytes": (8 << 20) << i,
            "count": 0,
            "iters": 5,
            "time_us": 1.0,
            "algbw_gbps": b / 1.75,
            "busbw_gbps": b,
            "wrong": wrong if i == 0 else 0,
        }
        for i, b in enumerate(busbw)
    ]
    return {
        "rows": rows,
        "skipped_sizes": [],
        "world_size": world,
        "dtype": "float32",
        "op": "sum",
        "backend": "nccl",
        "device": "cuda",
        "busbw_factor": 1.75,
    }


def ctx_with(fixture: str, data: dict, nodes: int = 1, **options: object) -> CheckContext:
    s = snap.load(FIXTURES / f"{fixture}.json")
    world = data["world_size"]
    ranks = [RankOutcome(r, r, r, state="done", results={"allreduce": data}) for r in range(world)]
    per_node = world // nodes
    peers = [
        {"rank": r, "local_rank": r % per_node, "host": f"node{r // per_node}", "node_rank": r // per_node}
        for r in range(world)
    ]
    result = LaunchResult(
        "cuda",
        "nccl",
        world,
        ranks,
        1.0,
        "env" if nodes > 1 else "tcpstore:port0",
        peers=peers,
        under_launcher=nodes > 1,
    )
    # The launch already happened: judge its numbers.
    return CheckContext(s, CheckOptions(**options), active_run=result)  # type: ignore[arg-type]


def by_code(findings: list, code: str):  # type: ignore[no-untyped-def]
    return [f for f in findings if f.code == code]


@pytest.mark.parametrize(("best", "status"), [(236.0, Status.PASS), (150.0, Status.WARN), (90.0, Status.FAIL)])
def test_a100_nvswitch_busbw_is_judged_against_nvlink3_times_12_links(best: float, status: Status) -> None:
    findings, details = allreduce(ctx_with("a100_sxm_8x", sweep([40.0, 60.0, best])))
    (f,) = by_code(findings, "GD601")
    assert f.status is status
    assert f.evidence["expected_busbw_gbps"] == pytest.approx(234.0)
    assert f.evidence["ratio"] == pytest.approx(best / 234.0, abs=1e-3)
    assert "NVLink 3 x 12 links" in f.evidence["basis"]
    assert "superbench" in f.evidence["source"]
    assert details["tables"][0]["rows"][2][5] == f"{best:.2f}"


def test_user_min_busbw_overrides_the_model() -> None:
    findings, _ = allreduce(ctx_with("h100_sxm_8x", sweep([300.0]), min_busbw_gbps=350.0))
    (f,) = by_code(findings, "GD601")
    assert f.status is Status.FAIL and f.evidence["basis"] == "--min-busbw 350 GB/s"


def test_pcie_machine_expects_pcie_rates() -> None:
    s = snap.load(FIXTURES / "rtx4090_pcie_4x.json")
    expect = expected_busbw(s, [g.index for g in s.gpus])
    assert expect is not None and expect.link == "pcie"
    assert 5 < expect.busbw_gbps < 40


def test_a_wrong_sum_fails() -> None:
    findings, _ = allreduce(ctx_with("a100_sxm_8x", sweep([236.0], wrong=3)))
    (f,) = by_code(findings, "GD602")
    assert f.status is Status.FAIL and f.evidence["wrong"] == 3


def test_one_visible_gpu_skips_with_the_reason() -> None:
    s = snap.load(FIXTURES / "single_gpu.json")
    (f,), _ = allreduce(CheckContext(s, CheckOptions()))
    assert f.status is Status.SKIP and "one visible GPU" in f.message


def test_no_gpu_skips_and_points_at_cpu_mode() -> None:
    s = snap.load(FIXTURES / "no_driver.json")
    (f,), _ = allreduce(CheckContext(s, CheckOptions()))
    assert f.status is Status.SKIP and "--device cpu" in f.message


def test_across_nodes_the_network_caps_busbw_so_there_is_no_nvlink_verdict() -> None:
    findings, _ = allreduce(ctx_with("h100_sxm_8x", sweep([40.0, 45.0], world=16), nodes=2))
    (f,) = by_code(findings, "GD601")
    assert f.status is Status.PASS
    assert "no hardware verdict across nodes (network-bound); use --min-busbw" in f.message
    assert "expected_busbw_gbps" not in f.evidence and f.evidence["nodes"] == 2


def test_across_nodes_min_busbw_still_judges() -> None:
    findings, _ = allreduce(ctx_with("h100_sxm_8x", sweep([40.0, 45.0], world=16), nodes=2, min_busbw_gbps=50.0))
    (f,) = by_code(findings, "GD601")
    assert f.status is Status.FAIL and f.evidence["basis"] == "--min-busbw 50 GB/s"


def test_one_node_under_torchrun_keeps_the_nvlink_verdict() -> None:
    ctx = ctx_with("h100_sxm_8x", sweep([100.0]))
    ctx.active_run.under_launcher = True  # torchrun --nproc-per-node 8 on this node alone
    findings, _ = allreduce(ctx)
    (f,) = by_code(findings, "GD601")
    assert f.status is Status.FAIL and "expected_busbw_gbps" in f.evidence


def test_device_cuda_without_a_gpu_gives_the_uniform_skip() -> None:
    s = snap.load(FIXTURES / "no_driver.json")
    (f,), _ = allreduce(CheckContext(s, CheckOptions(device="cuda")))
    assert f.status is Status.SKIP and f.message == "no GPUs to check: see GD101"
