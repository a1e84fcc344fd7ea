"""The all-reduce verdict: measured vs the machine's expected busbw, skips, wrong sums."""

from __future__ import annotations

import pytest

from gpudoctor.checks import context
from gpudoctor.checks.active.allreduce import allreduce
from gpudoctor.engine import CheckContext, CheckOptions
from gpudoctor.findings import Status
from gpudoctor.knowledge.expectations import expected_busbw
from gpudoctor.launch.results import LaunchResult, RankOutcome
from tests.helpers.findings import by_code
from tests.helpers.snapshots import SnapshotOf, load


def sweep(busbw: list[float], wrong: int = 0, world: int = 8, largest: int = 8 << 30) -> dict:
    """A sweep whose sizes double up to `largest`, one busbw each (the last is the largest size)."""
    sizes = [largest >> i for i in range(len(busbw))][::-1]
    rows = [
        {
            "bytes": size,
            "count": 0,
            "iters": 5,
            "time_us": 1.0,
            "algbw_gbps": b / 1.75,
            "busbw_gbps": b,
            "wrong": wrong if i == 0 else 0,
        }
        for i, (size, b) in enumerate(zip(sizes, busbw, strict=True))
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
    s = load(fixture)
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
    return CheckContext(s, CheckOptions(**options), shared=lambda name: result)  # type: ignore[arg-type]


@pytest.mark.parametrize(("best", "status"), [(236.0, Status.PASS), (150.0, Status.WARN), (90.0, Status.FAIL)])
def test_a100_nvswitch_busbw_is_judged_against_12_links_at_nccls_rate(best: float, status: Status) -> None:
    findings, details = allreduce(ctx_with("a100_sxm_8x", sweep([40.0, 60.0, best])))
    (f,) = by_code(findings, "GD601")
    assert f.status is status
    assert f.evidence["expected_busbw_gbps"] == pytest.approx(12 * 20.0 * 0.95)
    assert f.evidence["ratio"] == pytest.approx(best / 228.0, abs=1e-3)
    assert f.evidence["basis"].startswith("12 NVLink 3 links per GPU through NVSwitch")
    assert (f.evidence["fabric"], f.evidence["algorithm"]) == ("nvswitch", "ring")
    assert "superbench" in f.evidence["source"] and "topo.h" in f.evidence["source"]
    assert details["tables"][0]["rows"][2][5] == f"{best:.2f}"


def test_h100_hgx_is_judged_against_nvlink_sharp() -> None:
    findings, _ = allreduce(ctx_with("h100_sxm_8x", sweep([300.0, 330.0, 340.0])))
    (f,) = by_code(findings, "GD601")
    # ~370 GB/s is a ring figure: on an NVLS box it is 0.75 of the ~454 expected.
    assert f.status is Status.WARN and f.evidence["algorithm"] == "nvls"
    assert f.evidence["expected_busbw_gbps"] == pytest.approx(18 * 20.6 * 0.95 * 1.29, abs=0.01)


def test_the_verdict_judges_the_plateau_not_a_lucky_small_size() -> None:
    # A spike at 8 MiB (a timing glitch) must not stand for the machine: the largest sizes do.
    findings, _ = allreduce(ctx_with("h100_sxm_8x", sweep([500.0] + [100.0] * 6 + [300.0, 305.0, 302.0, 298.0])))
    (f,) = by_code(findings, "GD601")
    assert f.evidence["measured_busbw_gbps"] == 305.0 and f.evidence["at_bytes"] == 2 << 30
    assert f.evidence["plateau_sizes"] == [1 << 30, 2 << 30, 4 << 30, 8 << 30]
    assert f.status is Status.WARN and "best of 1 GiB to 8 GiB" in f.message


def test_a_sweep_cut_short_below_1_gib_warns_instead_of_failing() -> None:
    findings, _ = allreduce(ctx_with("a100_sxm_8x", sweep([30.0, 40.0, 50.0], largest=256 << 20)))
    (f,) = by_code(findings, "GD601")
    assert f.status is Status.WARN and "reached only 256 MiB" in f.message
    assert f.evidence["largest_bytes"] == 256 << 20


def test_user_min_busbw_overrides_the_model() -> None:
    findings, _ = allreduce(ctx_with("h100_sxm_8x", sweep([300.0]), min_busbw_gbps=350.0))
    (f,) = by_code(findings, "GD601")
    assert f.status is Status.FAIL and f.evidence["basis"] == "--min-busbw 350 GB/s"


def test_pcie_machine_expects_pcie_rates(snapshot_of: SnapshotOf) -> None:
    s = snapshot_of("rtx4090_pcie_4x")
    expect = expected_busbw(s, [g.index for g in s.gpus])
    assert expect is not None and expect.link == "pcie"
    # Gen4 x16 at NCCL's 24 GB/s, through host memory: GeForce offers no P2P.
    assert expect.busbw_gbps == pytest.approx(24 * 0.75) and "no P2P" in expect.basis


def test_a_wrong_sum_fails() -> None:
    findings, _ = allreduce(ctx_with("a100_sxm_8x", sweep([236.0], wrong=3)))
    (f,) = by_code(findings, "GD602")
    assert f.status is Status.FAIL and f.evidence["wrong"] == 3


def test_one_visible_gpu_skips_with_the_reason(snapshot_of: SnapshotOf) -> None:
    s = snapshot_of("single_gpu")
    (f,), _ = allreduce(context(s, CheckOptions()))
    assert f.status is Status.SKIP and "one visible GPU" in f.message


def test_no_gpu_skips_and_points_at_cpu_mode(snapshot_of: SnapshotOf) -> None:
    s = snapshot_of("no_driver")
    (f,), _ = allreduce(context(s, CheckOptions()))
    assert f.status is Status.SKIP and "--device cpu" in f.message


def test_across_nodes_the_network_caps_busbw_so_there_is_no_nvlink_verdict() -> None:
    findings, _ = allreduce(ctx_with("h100_sxm_8x", sweep([40.0, 45.0], world=16), nodes=2))
    (f,) = by_code(findings, "GD601")
    assert f.status is Status.PASS
    assert "the network between the nodes caps it; GD680 judges it against the NICs" in f.message
    assert "expected_busbw_gbps" not in f.evidence and f.evidence["nodes"] == 2


def test_across_nodes_min_busbw_still_judges() -> None:
    findings, _ = allreduce(ctx_with("h100_sxm_8x", sweep([40.0, 45.0], world=16), nodes=2, min_busbw_gbps=50.0))
    (f,) = by_code(findings, "GD601")
    assert f.status is Status.FAIL and f.evidence["basis"] == "--min-busbw 50 GB/s"


def test_one_node_under_torchrun_keeps_the_nvlink_verdict() -> None:
    ctx = ctx_with("h100_sxm_8x", sweep([100.0]))
    ctx.run("active").under_launcher = True  # torchrun --nproc-per-node 8 on this node alone
    findings, _ = allreduce(ctx)
    (f,) = by_code(findings, "GD601")
    assert f.status is Status.FAIL and "expected_busbw_gbps" in f.evidence


def test_device_cuda_without_a_gpu_gives_the_uniform_skip(snapshot_of: SnapshotOf) -> None:
    s = snapshot_of("no_driver")
    (f,), _ = allreduce(context(s, CheckOptions(device="cuda")))
    assert f.status is Status.SKIP and f.message == "no GPUs to check: see GD101"


def _wrong_rows(bad_inputs: list[int], received: list[int]) -> dict:
    data = sweep([236.0, 236.0])
    for row in data["rows"]:
        row.update(wrong=sum(received), wrong_by_rank=received, bad_input_ranks=bad_inputs)
    return data


def test_a_wrong_sum_names_the_rank_that_sent_wrong_values() -> None:
    findings, _ = allreduce(ctx_with("a100_sxm_8x", _wrong_rows([5], [1] * 8)))
    (f,) = by_code(findings, "GD602")
    assert (f.status, f.subject) == (Status.FAIL, "rank:5")
    assert "rank 5 (GPU 5) sent values that differ from its pattern" in f.message
    assert f.evidence["ranks"] == [5] and f.evidence["gpus"] == [5] and f.evidence["wrong"] == 16


def test_a_wrong_sum_with_every_input_right_names_the_ranks_that_received_it() -> None:
    findings, _ = allreduce(ctx_with("a100_sxm_8x", _wrong_rows([], [0, 0, 0, 4, 0, 0, 0, 0])))
    (f,) = by_code(findings, "GD602")
    assert f.subject == "host"
    assert "every rank sent the right values; rank 3 (GPU 3) received wrong sums" in f.message
    assert f.evidence["received_wrong_ranks"] == [3]


def test_the_sweep_stops_at_the_plateau_and_at_its_time_budget() -> None:
    from gpudoctor.launch import Task, launch

    sizes = [64 << 10, 256 << 10, 1 << 20, 4 << 20]
    # A gain no second size can reach: the sweep stops after two sizes however the loaded host times them.
    flat = {"sizes": sizes, "warmup": 0, "iters": 1, "plateau": {"from_bytes": 64 << 10, "gain": 1e9}}
    short = {"sizes": sizes, "warmup": 0, "iters": 1, "budget_s": 1e-9}
    result = launch([Task("allreduce", flat)], device="cpu", ranks=2, timeout_s=90)
    assert result.ok, result.to_json()
    plateau = result.results("allreduce")
    assert [r["bytes"] for r in plateau["rows"]] == sizes[:2] and plateau["stopped"] == "plateau"
    assert plateau["unswept_sizes"] == sizes[2:]
    result = launch([Task("allreduce", short)], device="cpu", ranks=2, timeout_s=90)
    assert result.ok, result.to_json()
    budget = result.results("allreduce")
    assert [r["bytes"] for r in budget["rows"]] == sizes[:1] and budget["stopped"] == "time budget"
