"""Collectives beyond all-reduce: nccl-tests' busbw, the verdicts on recorded figures, the rank that
sends wrong data named, `check --collectives`, and real gloo runs of `bench collectives`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpudoctor.checks import context
from gpudoctor.checks.active.collectives import Judging, collectives, judge, suspects
from gpudoctor.engine import CheckContext, CheckOptions
from gpudoctor.findings import Status
from gpudoctor.knowledge.busbw import busbw_factor, parse_ops
from gpudoctor.knowledge.expectations import expected_busbw
from gpudoctor.launch.results import LaunchResult, RankOutcome
from tests.conftest import leftover_ranks
from tests.helpers.bench_docs import bench_doc
from tests.helpers.cli import run_cli
from tests.helpers.findings import by_code
from tests.helpers.snapshots import SnapshotOf, load

H100 = load("h100_sxm_8x")


def sweep_rows(busbw: list[float], factor: float, wrong_cells: list[list[int]] | None = None) -> list[dict]:
    rows = []
    for i, b in enumerate(busbw):
        cells = wrong_cells if (wrong_cells and i == 0) else []
        rows.append(
            {
                "bytes": (8 << 20) << i,
                "count": 1,
                "iters": 20,
                "time_us": 100.0,
                "algbw_gbps": b / factor,
                "busbw_gbps": b,
                "wrong": sum(c[2] for c in cells),
                "wrong_cells": cells,
                "wrong_sums": [],
            }
        )
    return rows


def recorded(
    ops: dict[str, list[float]], world: int = 8, pairs: list[dict] | None = None, cells: dict | None = None
) -> dict[str, Any]:
    cells = cells or {}
    return {
        "world_size": world,
        "backend": "nccl",
        "device": "cuda",
        "dtype": "float32",
        "ops": {
            op: {
                "rows": sweep_rows(b, busbw_factor(op, world), cells.get(op)),
                "skipped_sizes": [],
                "busbw_factor": busbw_factor(op, world),
            }
            for op, b in ops.items()
        },
        "pairs": None if pairs is None else {"bytes": 256 << 20, "count": 1, "iters": 5, "rows": pairs},
    }


def pair(a: int, b: int, busbw: float, cells: list[list[int]] | None = None) -> dict:
    return {"a": a, "b": b, "time_us": 1.0, "algbw_gbps": busbw, "busbw_gbps": busbw, "wrong_cells": cells or []}


def gpu_judging(fixture: str) -> Judging:
    s = load(fixture)
    return Judging([g.index for g in s.gpus], s)


# --- nccl-tests' definitions (tests/reference/nccl_tests_busbw.md) ---


@pytest.mark.parametrize(
    ("op", "n", "factor"),
    [
        ("allreduce", 8, 1.75),  # 2(n-1)/n
        ("allreduce", 2, 1.0),
        ("allgather", 8, 0.875),  # (n-1)/n
        ("reducescatter", 4, 0.75),
        ("alltoall", 8, 0.875),
        ("alltoall", 2, 0.5),
        ("broadcast", 8, 1.0),  # 1
        ("sendrecv", 2, 1.0),
    ],
)
def test_busbw_factors_are_nccl_tests_own(op: str, n: int, factor: float) -> None:
    assert busbw_factor(op, n) == pytest.approx(factor)


def test_unknown_collective_has_no_factor() -> None:
    with pytest.raises(ValueError):
        busbw_factor("gather", 8)


@pytest.mark.parametrize(
    ("text", "ops"),
    [
        ("allgather,reducescatter", ("allgather", "reducescatter")),
        ("reduce-scatter, all_gather", ("allgather", "reducescatter")),
        ("fsdp", ("allgather", "reducescatter")),
        ("a2a,p2p", ("alltoall", "sendrecv")),
        ("all-reduce, all-gather, send/recv", ("allgather", "sendrecv")),  # the policy file's spelling
        ("all", ("allgather", "reducescatter", "alltoall", "broadcast", "sendrecv")),
    ],
)
def test_collective_names_are_read_in_any_common_spelling(text: str, ops: tuple[str, ...]) -> None:
    assert parse_ops(text) == ops


@pytest.mark.parametrize("names", [["alltoall"], ["all-gather", "send/recv"], ["fsdp"], ["all"], ["all-reduce"]])
def test_the_policy_reads_collectives_as_the_command_line_does(tmp_path: Path, names: list[str]) -> None:
    # One option table (engine/options.py) for both doors: `--collectives alltoall` was accepted on the
    # command line and refused in a policy file before it.
    from gpudoctor import policy

    path = tmp_path / "gpudoctor.toml"
    path.write_text(f"collectives = {names!r}\n".replace("'", '"'))
    assert policy.load(path).collectives == parse_ops(",".join(names))


def test_an_unknown_collective_name_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="'gather'"):
        parse_ops("allgather,gather")


# --- who sent wrong data ---


def test_a_source_wrong_at_every_receiver_is_the_sender() -> None:
    who = suspects({(0, 2), (1, 2), (2, 2), (3, 2)})
    assert who.senders == [2] and who.receivers == [] and who.links == []


def test_a_receiver_wrong_from_several_sources_is_the_receiver() -> None:
    who = suspects({(3, 0), (3, 1), (3, 2)})
    assert who.senders == [] and who.receivers == [3]


def test_one_wrong_path_names_the_path_not_a_rank() -> None:
    who = suspects({(0, 1)})
    assert who.named == [] and who.links == [(1, 0)]
    assert "rank 1 -> rank 0" in who.describe(lambda r: f"rank {r}")


def test_wrong_sums_with_right_contributions_name_the_reduction() -> None:
    who = suspects(set(), reductions=[2])
    assert who.reductions == [2] and who.named == [2]


# --- verdicts on recorded figures ---


def test_published_h200_allgather_and_reducescatter_pass_the_nvlink4_model() -> None:
    # ml-engineering, 8x H200 at 16 GiB: all-gather 361.4, reduce-scatter 362.9 GB/s (ring);
    # tests/reference/collectives_h200_ml_engineering.md. H200 and H100 share NVLink 4 x 18.
    how = gpu_judging("h100_sxm_8x")
    findings, _ = judge(recorded({"allgather": [200.0, 361.4], "reducescatter": [210.0, 362.9]}), how)
    (ag,) = by_code(findings, "GD650")
    (rs,) = by_code(findings, "GD651")
    assert ag.status is Status.PASS and rs.status is Status.PASS
    # The link bound without NVLink SHARP (expected_busbw's collective="allgather"), not NVLS's.
    ring = expected_busbw(H100, list(range(8)), collective="allgather")
    nvls = expected_busbw(H100, list(range(8)))
    assert ag.evidence["expected_busbw_gbps"] == pytest.approx(ring.busbw_gbps, abs=0.01)
    assert ring.busbw_gbps < 361.4 < nvls.busbw_gbps
    assert "NVLink 4" in ag.evidence["basis"]
    assert ag.evidence["measured_busbw_gbps"] == 361.4 and ag.evidence["busbw_factor"] == "(n-1)/n"


@pytest.mark.parametrize(("share", "status"), [(1.03, Status.PASS), (0.66, Status.WARN), (0.39, Status.FAIL)])
def test_allgather_on_a100_is_judged_like_allreduce(share: float, status: Status, snapshot_of: SnapshotOf) -> None:
    bound = expected_busbw(snapshot_of("a100_sxm_8x"), list(range(8)), collective="allgather")
    best = round(share * bound.busbw_gbps, 2)
    findings, details = judge(recorded({"allgather": [40.0, best]}), gpu_judging("a100_sxm_8x"))
    (f,) = by_code(findings, "GD650")
    assert f.status is status
    assert f.evidence["ratio"] == pytest.approx(share, abs=1e-3)
    assert (f.hint != "") is (status is not Status.PASS)
    table = details["tables"][0]
    assert table["columns"][5] == "busbw GB/s" and table["rows"][1][5] == f"{best:.2f}"
    assert "busbw = algbw x (n-1)/n" in table["title"]


def test_alltoall_and_broadcast_are_reported_without_a_verdict() -> None:
    findings, _ = judge(recorded({"alltoall": [5.0], "broadcast": [3.0]}), gpu_judging("h100_sxm_8x"))
    figures = by_code(findings, "GD655")
    assert [f.status for f in figures] == [Status.PASS, Status.PASS]
    assert all("without a verdict" in f.message for f in figures)
    assert "all-to-all best busbw 5.00 GB/s" in figures[0].message


def test_on_cpu_there_is_no_hardware_verdict() -> None:
    data = recorded({"allgather": [0.3]}, world=2) | {"backend": "gloo", "device": "cpu"}
    (ag,) = by_code(judge(data, Judging(no_verdict="CPU/gloo"))[0], "GD650")
    assert ag.status is Status.PASS and "no hardware verdict: CPU/gloo" in ag.message
    assert "expected_busbw_gbps" not in ag.evidence


def test_a_corrupting_rank_fails_and_is_named_with_its_gpu() -> None:
    # Rank 5 garbles what it sends: every receiver of its all-gather chunk, and of its send/recv.
    cells = {"allgather": [[r, 5, 1] for r in range(8)], "reducescatter": [[r, 5, 1] for r in range(8)]}
    pairs = [pair(4, 5, 300.0, [[4, 5, 1]]), pair(5, 6, 300.0, [[6, 5, 1]]), pair(0, 1, 300.0)]
    how = Judging([0, 1, 2, 3, 4, 5, 6, 7], H100)
    findings, _ = judge(recorded({"allgather": [300.0], "reducescatter": [300.0]}, pairs=pairs, cells=cells), how)
    (f,) = by_code(findings, "GD652")
    assert f.status is Status.FAIL and f.subject == "rank:5"
    assert "rank 5 (GPU 5) sends wrong data" in f.message
    assert f.evidence["senders"] == [5]
    assert f.evidence["wrong_by_collective"] == {"all-gather": 8, "reduce-scatter": 8, "send/recv": 2}


def test_exact_results_pass_and_say_what_was_verified() -> None:
    findings, _ = judge(recorded({"allgather": [300.0, 350.0]}, pairs=[pair(0, 1, 300.0)]), gpu_judging("h100_sxm_8x"))
    (f,) = by_code(findings, "GD652")
    assert f.status is Status.PASS
    assert f.message == "every result exact: 1 collective(s) at 2 size(s), 1 send/recv pair(s)"


def test_a_slow_pcie_pair_is_judged_against_its_own_link(snapshot_of: SnapshotOf) -> None:
    # 4x RTX 4090 on PCIe Gen4 x16: each pair against expected_busbw of those two GPUs (send/recv).
    pcie = snapshot_of("rtx4090_pcie_4x")
    bound = expected_busbw(pcie, [0, 3], collective="sendrecv").busbw_gbps
    shares = {(0, 1): 0.95, (0, 2): 0.6, (0, 3): 0.33, (1, 2): 1.0, (1, 3): 1.02, (2, 3): 1.05}
    pairs = [pair(a, b, round(share * bound, 3)) for (a, b), share in shares.items()]
    findings, details = judge(recorded({}, world=4, pairs=pairs), gpu_judging("rtx4090_pcie_4x"))
    found = {f.subject: f for f in by_code(findings, "GD654")}
    assert set(found) == {"pair:0-2", "pair:0-3"}
    assert found["pair:0-2"].status is Status.WARN and found["pair:0-3"].status is Status.FAIL
    assert found["pair:0-3"].evidence["expected_busbw_gbps"] == pytest.approx(bound, abs=0.01)
    assert found["pair:0-3"].evidence["path"] == "NODE"
    (table,) = details["tables"]
    assert table["rows"][2][:2] == ["GPU 0 <-> GPU 3", "NODE"] and table["rows"][2][5] == "0.33"


def test_pairs_all_near_their_link_give_one_pass() -> None:
    pairs = [pair(0, 1, 17.5), pair(2, 3, 19.0)]
    (f,) = by_code(judge(recorded({}, world=4, pairs=pairs), gpu_judging("rtx4090_pcie_4x"))[0], "GD654")
    assert f.status is Status.PASS and "slowest GPU 0 <-> GPU 1 17.50 GB/s" in f.message


# --- the check (judging a launch that already happened) ---


def ctx_with(data: dict | None, ops: tuple[str, ...], state: str = "done") -> CheckContext:
    s = load("h100_sxm_8x")
    results = {"collectives": data} if data is not None else {}
    ranks = [RankOutcome(r, r, r, state=state, results=dict(results), phase="collectives") for r in range(8)]
    if state != "done":  # rank 3 failed during a send/recv; the others were stopped after it
        for r in ranks:
            r.state = "aborted"
        ranks[3].state, ranks[3].error, ranks[3].phase = "error", "RuntimeError: NCCL error", "sendrecv:3-4"
    result = LaunchResult("cuda", "nccl", 8, ranks, 1.0, "tcpstore:port0")
    return CheckContext(s, CheckOptions(collectives=ops), shared=lambda name: result)


def test_check_without_the_option_says_how_to_ask_for_the_collectives() -> None:
    (f,), _ = collectives(ctx_with(None, ()))
    assert f.code == "GD650" and f.status is Status.SKIP
    assert "--collectives allgather,reducescatter" in f.message


@pytest.mark.parametrize("names", [("allgather", "reducescatter"), ("all-reduce", "all-gather", "reduce-scatter")])
def test_check_judges_the_shared_run_with_the_machine_model(names: tuple[str, ...]) -> None:
    # --collectives gives canonical names, a policy file's `collectives` list its own spelling.
    # 8x H100: all-gather at 250 GB/s is 0.71 of the ring bound (warn), reduce-scatter at 340 passes.
    findings, details = collectives(ctx_with(recorded({"allgather": [250.0], "reducescatter": [340.0]}), names))
    assert {f.code: f.status for f in findings} == {"GD652": Status.PASS, "GD650": Status.WARN, "GD651": Status.PASS}
    assert len(details["tables"]) == 2


def test_check_names_the_rank_that_failed_and_its_pair() -> None:
    (f,), _ = collectives(ctx_with(None, ("sendrecv",), state="aborted"))
    assert f.code == "GD653" and f.status is Status.FAIL
    assert "rank 3 (GPU 3)" in f.message and "send/recv between ranks 3-4" in f.message


def test_check_with_one_visible_gpu_skips(snapshot_of: SnapshotOf) -> None:
    s = snapshot_of("single_gpu")
    (f,), _ = collectives(context(s, CheckOptions(collectives=("allgather",))))
    assert f.status is Status.SKIP and "one visible GPU" in f.message


# --- the CLI: usage errors (no ranks started) ---


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["bench", "collectives", "--device", "cpu", "--ops", "gather"], "--ops: unknown collective 'gather'"),
        (["bench", "collectives", "--ranks", "2"], "--ranks needs --device cpu"),
        (["bench", "collectives", "--device", "cpu", "--min-bytes", "8M", "--max-bytes", "1M"], "smaller than"),
        (["check", "--collectives", "allgather,bogus"], "unknown collective 'bogus'"),
    ],
)
def test_bad_options_are_one_line_usage_errors(
    capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    r = run_cli(capsys, *args)
    assert r.exit_code == 2
    assert message in r.err and r.err.count("\n") == 1 and "Traceback" not in r.err


# --- real ranks on CPU (gloo) ---


@pytest.mark.slow
def test_bench_collectives_on_three_cpu_ranks_is_exact_and_nccl_tests_shaped(
    capsys: pytest.CaptureFixture[str],
) -> None:
    r = run_cli(capsys, "bench", "collectives", "--device", "cpu", "--ranks", "3", "--max-bytes", "256K", "--json")
    assert r.exit_code == 0, r.out
    doc = bench_doc(r.out)
    data = doc["results"]["collectives"]
    assert set(data["ops"]) == {"allgather", "reducescatter", "alltoall", "broadcast"}
    for op, sweep in data["ops"].items():
        assert [row["bytes"] for row in sweep["rows"]] == [65280, 130560, 261888]  # whole rows on 3 ranks
        for row in sweep["rows"]:
            assert row["wrong"] == 0 and row["wrong_cells"] == []
            assert row["algbw_gbps"] == pytest.approx(row["bytes"] / (row["time_us"] * 1e3), rel=1e-3)
            assert row["busbw_gbps"] == pytest.approx(row["algbw_gbps"] * busbw_factor(op, 3), rel=1e-3)
    assert [(p["a"], p["b"]) for p in data["pairs"]["rows"]] == [(0, 1), (0, 2), (1, 2)]
    statuses = {f["code"]: f["status"] for c in doc["checks"] for f in c["findings"]}
    assert statuses == {"GD652": "pass", "GD650": "pass", "GD651": "pass", "GD655": "pass", "GD654": "pass"}
    assert leftover_ranks(within=5.0) == []


@pytest.mark.slow
def test_a_garbling_rank_is_caught_in_every_collective_and_named(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPUDOCTOR_FAULT", "1:garble")
    r = run_cli(capsys, "bench", "collectives", "--device", "cpu", "--ranks", "3", "--max-bytes", "64K", "--json")
    assert r.exit_code == 1
    doc = bench_doc(r.out)
    data = doc["results"]["collectives"]
    for op, sweep in data["ops"].items():
        (row,) = sweep["rows"]
        assert row["wrong"] > 0, op
        assert {source for _, source, _ in row["wrong_cells"]} == {1}, op  # every wrong cell came from rank 1
    for p in data["pairs"]["rows"]:
        other = p["a"] if p["b"] == 1 else p["b"]
        expected = [[other, 1]] if 1 in (p["a"], p["b"]) else []  # [receiver, source]
        assert [c[:2] for c in p["wrong_cells"]] == expected
    (wrong,) = [f for c in doc["checks"] for f in c["findings"] if f["code"] == "GD652"]
    assert wrong["status"] == "fail" and wrong["subject"] == "rank:1"
    assert "rank 1 sends wrong data" in wrong["message"]
    assert leftover_ranks(within=5.0) == []


@pytest.mark.slow
def test_check_collectives_runs_in_the_shared_ranks(capsys: pytest.CaptureFixture[str]) -> None:
    r = run_cli(
        capsys, "check", "--device", "cpu", "--ranks", "2", "--select", "collectives", "--collectives", "fsdp", "--json"
    )
    assert r.exit_code == 0
    assert r.statuses() == {"GD650": {"pass"}, "GD651": {"pass"}, "GD652": {"pass"}}
    assert "no hardware verdict: CPU/gloo" in r.one("GD650")["message"]
    assert leftover_ranks(within=5.0) == []


def test_a_reported_bandwidth_keeps_six_significant_digits() -> None:
    # A loaded CPU host measured 0.000434466 GB/s; round(x, 6) kept 0.000434, less precise than the
    # timing it came from, and the algbw no longer matched bytes / time.
    from gpudoctor.knowledge.busbw import figure

    assert figure(0.00043446611697624976) == 0.000434466
    assert figure(234.56789012) == 234.568 and figure(0.0) == 0.0
