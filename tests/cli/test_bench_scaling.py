"""`gpudoctor bench scaling`: the verdicts on recorded figures (published scaling, each cause of a
low efficiency), the options, and real gloo runs whose step split adds up."""

from __future__ import annotations

from typing import Any

import pytest

from gpudoctor.checks.active import scaling
from gpudoctor.checks.active.scaling import Machine, Thresholds, judge, summarize
from gpudoctor.findings import Status
from gpudoctor.knowledge.expectations import expected_busbw
from gpudoctor.launch.results import LaunchResult, RankOutcome
from tests.conftest import leftover_ranks
from tests.helpers.bench_docs import bench_doc, split_unflagged
from tests.helpers.cli import run_cli
from tests.helpers.processes import GpudoctorCli, hiding
from tests.helpers.snapshots import load

CONFIG = {"steps": 20, "warmup": 5, "accum": 1, "amp": "off", "bucket_cap_mb": 25.0}
H100 = load("h100_sxm_8x")
PCIE = load("rtx4090_pcie_4x")


def row(rank: int, input_ms: float, compute_ms: float, comm_ms: float, step_ms: float | None = None) -> dict:
    step = input_ms + compute_ms + comm_ms if step_ms is None else step_ms
    return {
        "rank": rank,
        "input_ms": input_ms,
        "compute_ms": compute_ms,
        "comm_ms": comm_ms,
        "step_ms": step,
        "step_median_ms": step,
        "step_ms_max": step,
        "accounted": (input_ms + compute_ms + comm_ms) / step,
        "peak_mem_bytes": None,
    }


def record(runs: dict[int, list[dict]], batch: int = 64, grad: dict | None = None, model: str = "cnn") -> dict:
    return {
        "model": model,
        "sizes": {"batch": batch},
        "params": 25_000_000,
        "runs": [{"gpus": k, "ranks": rows, "grad_allreduce": grad if k > 1 else None} for k, rows in runs.items()],
    }


def data(*records: dict, device: str = "cuda") -> dict[str, Any]:
    return {
        "device": device,
        "backend": "nccl",
        "world_size": 8,
        "counts": [],
        "config": CONFIG,
        "models": list(records),
    }


def even(k: int, input_ms: float, compute_ms: float, comm_ms: float) -> list[dict]:
    return [row(r, input_ms, compute_ms, comm_ms) for r in range(k)]


def codes(findings: list) -> dict[str, list]:
    out: dict[str, list] = {}
    for f in findings:
        out.setdefault(f.code, []).append(f)
    return out


# --- published figures (tests/reference/scaling_published.md) ---


@pytest.mark.parametrize(
    ("what", "one", "many", "gpus"),
    [
        ("ResNet-50 TF32, DGX A100", 938, 7248, 8),
        ("ResNet-50 mixed, DGX A100", 2470, 16621, 8),
        ("ResNet-50 mixed, DGX-1", 1200, 8322, 8),
        ("Transformer TF32, DGX A100", 51057, 347936, 8),
        ("Transformer mixed, DGX A100", 82059, 551599, 8),
        ("Transformer mixed, DGX-1", 32942, 214656, 8),
        ("Transformer mixed, DGX-1, 4 GPUs", 32942, 109726, 4),
    ],
)
def test_published_scaling_figures_pass_the_default_thresholds(what: str, one: float, many: float, gpus: int) -> None:
    # The same per-GPU batch: step time = batch / per-GPU throughput.
    batch = 256
    rec = record(
        {1: even(1, 0.0, batch / one * 1e3, 0.0), gpus: even(gpus, 0.0, batch * gpus / many * 1e3, 0.0)}, batch
    )
    (s1, sk) = summarize(rec, CONFIG)
    assert sk.speedup == pytest.approx(many / one, rel=1e-6)
    assert sk.efficiency == pytest.approx(many / one / gpus, rel=1e-6)
    assert sk.samples_per_s == pytest.approx(many, rel=1e-6)
    (f,) = codes(judge(data(rec), Machine(list(range(gpus)), H100), Thresholds())[0])["GD720"]
    assert f.status is Status.PASS, what
    assert f.evidence["source"].startswith("NVIDIA DeepLearningExamples")


@pytest.mark.parametrize(("speedup", "status"), [(6.6, Status.PASS), (6.0, Status.WARN), (3.5, Status.FAIL)])
def test_efficiency_on_8_gpus_warns_below_080_and_fails_below_050(speedup: float, status: Status) -> None:
    rec = record({1: even(1, 0.0, 100.0, 0.0), 8: even(8, 0.0, 100.0, 800.0 / speedup - 100.0)})
    (f, *_) = judge(data(rec), Machine(list(range(8)), H100), Thresholds())[0]
    assert f.code == "GD720" and f.status is status
    assert f.evidence["efficiency"] == pytest.approx(speedup / 8, abs=1e-4)


def test_thresholds_are_overridable() -> None:
    rec = record({1: even(1, 0.0, 100.0, 0.0), 2: even(2, 0.0, 100.0, 17.6)})  # efficiency 0.85
    (f, *_) = judge(data(rec), Machine([0, 1], H100), Thresholds(warn=0.9, fail=0.6))[0]
    assert f.status is Status.WARN and ", below 0.90" in f.message and f.evidence["warn_below"] == 0.9


# --- the cause of a low efficiency ---


def test_communication_bound_names_the_busbw_the_links_and_what_accumulation_buys() -> None:
    grad = {"bytes": 268_000_000, "time_ms": 40.0, "busbw_gbps": 11.7}
    rec = record({1: even(1, 1.0, 100.0, 0.0), 4: even(4, 1.0, 100.0, 40.0)}, grad=grad, model="transformer")
    findings, tables, rows = judge(data(rec), Machine([0, 1, 2, 3], PCIE), Thresholds())
    found = codes(findings)
    (eff,) = found["GD720"]
    assert eff.status is Status.WARN and "lost mostly to communication (40.0 ms of a 141.0 ms step)" in eff.message
    (comm,) = found["GD721"]
    assert comm.status is Status.WARN
    assert "40.0 ms of each 141.0 ms step (28%)" in comm.message
    assert "256 MiB of gradients all-reduce in 40.0 ms at 11.70 GB/s busbw over NODE" in comm.message
    # 4x RTX 4090 on PCIe Gen4 x16: 11.7 GB/s is below 0.8 of what expected_busbw gives them.
    expect = expected_busbw(PCIE, [0, 1, 2, 3])
    assert comm.evidence["expected_busbw_gbps"] == pytest.approx(expect.busbw_gbps, abs=0.01)
    assert comm.evidence["busbw_ratio"] == pytest.approx(11.7 / expect.busbw_gbps, abs=1e-3)
    assert comm.evidence["busbw_ratio"] < 0.8
    assert "the links are slow (see GD601)" in comm.message
    # Projection: per micro-batch 101 ms of work + 40/N ms of all-reduce, against 101 ms on one GPU.
    projected = comm.evidence["projected_efficiency"]
    assert projected["1"] == pytest.approx(101 / 141, abs=1e-3)
    assert projected["8"] == pytest.approx(101 / 106, abs=1e-3)
    assert "8 micro-batches per all-reduce would bring efficiency to 0.95 (projected)" in comm.message
    (summary,) = [r for r in rows if r["gpus"] == 4]
    assert summary["cause"] == "communication" and summary["contributions_ms"]["communication"] == 40.0
    assert tables[1]["columns"] == ["GPUs", "N=1", "N=2", "N=4", "N=8"]


def test_communication_over_healthy_links_says_the_links_are_fine() -> None:
    grad = {"bytes": 268_000_000, "time_ms": 2.0, "busbw_gbps": 0.95 * expected_busbw(H100, list(range(8))).busbw_gbps}
    rec = record({1: even(1, 1.0, 20.0, 0.0), 8: even(8, 1.0, 20.0, 10.0)}, grad=grad)
    (comm,) = codes(judge(data(rec), Machine(list(range(8)), H100), Thresholds())[0])["GD721"]
    assert "the links run as they should" in comm.message and "over NV18" in comm.message


def test_a_straggler_gpu_is_named_by_its_nvml_index() -> None:
    # Rank 2 (GPU 6) computes 180 ms; the others 100 ms and wait ~80 ms in the all-reduce.
    rows = [row(0, 1.0, 100.0, 85.0), row(1, 1.0, 100.0, 85.0), row(2, 1.0, 180.0, 5.0), row(3, 1.0, 100.0, 85.0)]
    rec = record({1: even(1, 1.0, 100.0, 0.0), 4: rows})
    findings = judge(data(rec), Machine([4, 5, 6, 7], H100), Thresholds())[0]
    (f,) = codes(findings)["GD723"]
    assert f.status is Status.WARN and f.subject == "gpu:6"
    assert "GPU 6 (rank 2) is a straggler" in f.message and "1.79x the other ranks' median" in f.message
    assert "GD721" not in codes(findings)  # the others' waiting is not mistaken for slow links


def test_a_rank_barely_slower_is_not_called_a_straggler() -> None:
    rows = [row(0, 0.0, 100.0, 60.0), row(1, 0.0, 110.0, 50.0)]  # 1.10x: under the 1.15x bar
    s = summarize(record({1: even(1, 0.0, 100.0, 0.0), 2: rows}), CONFIG)[1]
    assert s.straggler_ratio == pytest.approx(1.1) and s.cause() == "communication"


def test_input_bound() -> None:
    rec = record({1: even(1, 1.0, 50.0, 0.0), 2: even(2, 30.0, 50.0, 2.0)})
    (f,) = codes(judge(data(rec), Machine([0, 1], H100), Thresholds())[0])["GD722"]
    assert "input bound" in f.message and "29.00 ms more than on one GPU" in f.message


def test_compute_contention() -> None:
    rec = record({1: even(1, 0.0, 100.0, 0.0), 2: even(2, 0.0, 150.0, 2.0)})
    (f,) = codes(judge(data(rec), Machine([0, 1], H100), Thresholds())[0])["GD724"]
    assert "150.0 ms per step against 100.0 ms alone (1.50x)" in f.message


def test_on_cpu_ranks_there_is_no_verdict_but_the_cause_is_still_named() -> None:
    rec = record({1: even(1, 0.0, 10.0, 0.0), 2: even(2, 0.0, 10.0, 20.0)}, batch=8)
    findings = judge(data(rec, device="cpu"), Machine(), Thresholds(verdict=False))[0]
    found = codes(findings)
    assert found["GD720"][0].status is Status.PASS and "no verdict unless --warn-below" in found["GD720"][0].message
    assert (
        found["GD721"][0].status is Status.PASS and "cnn on 2 ranks is communication bound" in found["GD721"][0].message
    )
    assert found["GD727"][0].status is Status.SKIP and "DataParallel skipped on CPU ranks" in found["GD727"][0].message


def test_dataparallel_on_one_gpu_or_under_a_launcher_says_why_it_is_skipped() -> None:
    rec = record({1: even(1, 0.0, 10.0, 0.0)})
    (one,) = codes(judge(data(rec), Machine([0], H100), Thresholds())[0])["GD727"]
    assert one.status is Status.SKIP and "needs 2 or more GPUs" in one.message
    rec = record({1: even(1, 0.0, 10.0, 0.0), 2: even(2, 0.0, 10.0, 1.0)})
    (launched,) = codes(judge(data(rec), Machine(), Thresholds())[0])["GD727"]
    assert "under torchrun/srun" in launched.message


def test_a_split_that_does_not_add_up_within_10_percent_is_flagged() -> None:
    rows = [row(0, 1.0, 60.0, 10.0, step_ms=100.0), row(1, 1.0, 60.0, 10.0, step_ms=100.0)]  # 71 %
    rec = record({1: [row(0, 1.0, 95.0, 0.0, step_ms=100.0)], 2: rows})
    (f,) = codes(judge(data(rec), Machine([0, 1], H100), Thresholds())[0])["GD726"]
    assert f.status is Status.WARN and "on 2 GPUs" in f.message and "account for 71% of the measured step" in f.message


def test_one_gpu_has_nothing_to_scale_to() -> None:
    (f,) = codes(judge(data(record({1: even(1, 1.0, 50.0, 0.0)})), Machine([3]), Thresholds())[0])["GD720"]
    assert f.status is Status.SKIP and "one GPU visible" in f.message


def test_dataparallel_beside_ddp_shows_gpu0_memory_imbalance() -> None:
    gib = 1 << 30
    rec = record({1: even(1, 0.0, 100.0, 0.0), 4: even(4, 0.0, 100.0, 5.0)}, batch=64)
    rec["dataparallel"] = {"gpus": 4, "step_ms": 300.0, "peak_mem_bytes": [9 * gib, 3 * gib, 3 * gib, 3 * gib]}
    for r in rec["runs"][1]["ranks"]:
        r["peak_mem_bytes"] = 4 * gib
    findings, tables, _ = judge(data(rec), Machine([0, 1, 2, 3], H100), Thresholds())
    (f,) = codes(findings)["GD727"]
    # DataParallel: 4 x 64 samples per 300 ms step = 853.3/s; DDP: 4 x 64 per 105 ms = 2438.1/s.
    assert "DataParallel 853.3 samples/s against DDP 2,438.1 (DDP 2.86x)" in f.message
    assert "GPU 0 9 GiB against 3 GiB on the others (3.00x)" in f.message and "DDP 4 GiB at most per GPU" in f.message
    assert any(t["title"].startswith("cnn: DataParallel peak memory") for t in tables)


def test_a_failed_run_names_the_rank_and_what_it_was_training() -> None:
    ranks = [RankOutcome(0, 0, 0, state="aborted"), RankOutcome(1, 1, 1, state="exited", exit_code=17)]
    ranks[1].phase, ranks[1].error = "scaling transformer on 2 GPUs", "exited with status 17 in phase ..."
    result = LaunchResult("cuda", "nccl", 2, ranks, 1.0, "tcpstore:port0")
    f = scaling.not_completed(result, lambda r: Machine([0, 1]).label(r.rank))
    assert f.code == "GD725" and f.subject == "rank:1"
    assert "GPU 1 (rank 1) failed during scaling transformer on 2 GPUs" in f.message


# --- the CLI: usage errors (no ranks started) ---


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--device", "cpu", "--ranks", "2", "--counts", "1,3"], "--counts: 3 is not between 1 and the 2 rank(s)"),
        (["--device", "cpu", "--counts", "two"], "--counts: cannot read 'two'"),
        (["--device", "cpu", "--cnn-size", "depth=3,colour=2"], "--cnn-size: cannot read 'colour=2'"),
        (["--device", "cpu", "--cnn-size", "depth=0"], "--cnn-size: depth must be at least 1"),
        (["--device", "cpu", "--transformer-size", "width=66"], "width must be a multiple of heads"),
        (
            ["--device", "cpu", "--warn-below", "0.5", "--fail-below", "0.7"],
            "--fail-below 0.7 is above --warn-below 0.5",
        ),
        (["--ranks", "2"], "--ranks needs --device cpu"),
        (["--device", "cpu", "--bucket-mb", "0"], "--bucket-mb"),
        (["--device", "cpu", "--amp", "fp8"], "--amp"),
    ],
)
def test_bad_options_are_one_line_usage_errors(
    capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    r = run_cli(capsys, "bench", "scaling", *args)
    assert r.exit_code == 2
    assert message in r.err and r.err.count("\n") == 1 and "Traceback" not in r.err


# --- real ranks on CPU (gloo) ---


@pytest.mark.slow
def test_bench_scaling_on_two_cpu_ranks_reports_both_models_and_the_split_adds_up(
    gpudoctor_cli: GpudoctorCli,
) -> None:
    """Run where numpy cannot be imported: torch's all_gather_object needs it, the ranks gather JSON
    instead (workloads/rank.py). (A test of its own ran `bench scaling` without numpy; this run answers it.)"""
    # The CPU default of 12 measured steps: what is asserted holds at any count and any load (the split
    # adds up or GD726 says it does not); figures belong to benchmarks/scaling_overhead.py.
    args = ("bench", "scaling", "--device", "cpu", "--ranks", "2", "--json")
    r = gpudoctor_cli(*args, env=hiding("numpy"), timeout=400)
    assert "Numpy is not available" not in r.stdout + r.stderr
    assert r.returncode == 0, r.stderr[-2000:]
    doc = bench_doc(r.stdout)
    assert doc["command"] == "bench scaling"
    assert doc["results"]["launch"]["ranks"][1]["state"] == "done"
    summary = doc["results"]["summary"]
    assert [(s["model"], s["gpus"]) for s in summary] == [
        ("cnn", 1),
        ("cnn", 2),
        ("transformer", 1),
        ("transformer", 2),
    ]
    findings = [f for c in doc["checks"] for f in c["findings"]]
    # Input, compute (bare module) and communication (comm hook) are measured apart; on the rank that
    # sets the pace they add up to the step, or the report says for that model that they do not (GD726).
    assert split_unflagged(doc) == []
    for s in summary:
        assert s["accounted"] > 0 and min(s["input_ms"], s["compute_ms"], s["comm_ms"]) >= 0.0
        assert s["samples_per_s"] == pytest.approx(s["gpus"] * 8 * 1000 / s["step_ms"], rel=1e-3)
        assert s["comm_ms"] == 0.0 if s["gpus"] == 1 else s["comm_ms"] > 0.0
    for model in doc["results"]["scaling"]["models"]:
        two = model["runs"][1]
        assert two["gpus"] == 2 and [r["rank"] for r in two["ranks"]] == [0, 1]
        assert two["grad_allreduce"]["bytes"] == model["params"] * 4
    assert {f["code"] for f in findings} >= {"GD720", "GD727"}
    assert leftover_ranks(within=5.0) == []


@pytest.mark.slow
def test_a_straggler_rank_is_named_in_the_text_report_and_progress_shows_on_stderr(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPUDOCTOR_FAULT", "1:slow")
    r = run_cli(capsys, "bench", "scaling", "--device", "cpu", "--ranks", "2", "--model", "transformer", "--steps", "8")
    assert r.exit_code == 0  # CPU ranks: no verdict, the cause is still named
    assert "GD723 rank:1" in r.out and "rank 1 is a straggler" in r.out
    assert "transformer (" in r.out and "samples/s" in r.out  # the table
    assert "running scaling transformer on 2 ranks" in r.err
    assert leftover_ranks(within=5.0) == []
