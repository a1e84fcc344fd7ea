"""The job's verdicts (GD940-GD949) on real jobs: torchrun, two gloo ranks on the CPU, DDP, a real
DataLoader, under `gpudoctor watch --no-tui --json -- torchrun ...` (tests/fixtures/jobs/data_job.py makes
each mistake on demand, the way scripts make it). Without a GPU the watcher follows the ranks' records;
the GPU memory verdict reads the ranks' placement through a fake pynvml (tests/fakes/nvml_site)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.processes import GPUDOCTOR, GpudoctorCli, clean_env, reap
from tests.paths import FIXTURES, REPO, TESTS

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("no_orphans")]

JOB = FIXTURES / "jobs" / "data_job.py"
FAKE_NVML = TESTS / "fakes" / "nvml_site"


def watch_job(
    gpudoctor_cli: GpudoctorCli,
    *job: str,
    warmup: str = "600",
    text: bool = False,
    env: dict[str, str] | None = None,
    one_cpu: bool = False,
) -> tuple[int, list[dict[str, Any]] | str, str]:
    """`gpudoctor watch --no-tui [--json] -- torchrun --nproc-per-node 2 data_job.py JOB...`: exit code, the
    JSON lines (or the text), stderr. `one_cpu`: gpudoctor and the job may run on one CPU only."""
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(JOB), *job]
    args = ["watch", "--no-tui", "--interval", "0.25", "--process-interval", "0.5", "--warmup", warmup]
    cpu = min(os.sched_getaffinity(0))
    options: dict[str, Any] = {"preexec_fn": lambda: os.sched_setaffinity(0, {cpu})} if one_cpu else {}
    r = gpudoctor_cli(*args, *([] if text else ["--json"]), "--", *torchrun, env=env, timeout=400, **options)
    if text:
        return r.returncode, r.stdout, r.stderr
    return r.returncode, [json.loads(line) for line in r.stdout.splitlines()], r.stderr


def named(summary: dict[str, Any]) -> dict[str, list[int | None]]:
    return {v["code"]: [x["rank"] for x in v["ranks"]] for v in summary["verdicts"]}


def first_seen(lines: list[dict[str, Any]], code: str) -> float:
    """When a sample first carried the verdict (epoch s)."""
    return next(line["t"] for line in lines if any(v["code"] == code for v in line.get("verdicts", ())))


def epoch_end(marks: Path, epoch: int) -> float:
    for line in marks.read_text().splitlines():
        what, number, edge, t = line.split()
        if int(number) == epoch and edge == "end":
            return float(t)
    raise AssertionError(f"epoch {epoch} never ended: {marks.read_text()}")


@dataclass(frozen=True)
class Run:
    rc: int
    lines: list[dict[str, Any]]
    err: str
    marks: Path


def run_job(tmp: Path, release: str, *job: str, warmup: str = "600", env: dict[str, str] | None = None) -> Run:
    """`gpudoctor watch --no-tui --json -- torchrun ... data_job.py JOB...`, read as it runs. Rank 0 marks its
    epochs in tmp/marks; the ranks hold early in the second epoch (data_job.py --hold) until a sample
    carries the verdict `release`. So "called within the second epoch" holds by construction, at any load,
    when the verdict is called from part of the epoch; one that waited for the epoch's end would come after
    the ranks gave up holding (data_job.HOLD_S) and after that end."""
    marks, go = tmp / "marks", tmp / "go"
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(JOB), *job]
    torchrun += ["--marks", str(marks), "--hold", str(go)]
    args = ["watch", "--no-tui", "--json", "--interval", "0.25", "--process-interval", "0.5", "--warmup", warmup]
    proc = subprocess.Popen(
        [*GPUDOCTOR, *args, "--", *torchrun],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env=clean_env() if env is None else env,
    )
    err: list[str] = []
    drain = threading.Thread(target=lambda: err.append(proc.stderr.read() if proc.stderr else ""), daemon=True)
    drain.start()
    timer = threading.Timer(400, proc.kill)
    timer.start()
    lines = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            doc = json.loads(line)
            lines.append(doc)
            if not go.exists() and any(v["code"] == release for v in doc.get("verdicts", ())):
                go.touch()
        rc = proc.wait()
    finally:
        reap(proc, timer, drain)
    return Run(rc, lines, "".join(err), marks)


@pytest.fixture(scope="module")
def unsharded_apart_and_between_steps(tmp_path_factory: pytest.TempPathFactory) -> Run:
    """One job, three independent mistakes, read by two tests: no DistributedSampler, so every rank reads
    the whole data set (GD940, from the sample indices); rank 1's inputs scaled, so its loss stays apart
    (GD946, from the losses); rank 0 working 0.12 s between steps (GD948, from the step and loader times).
    None of the three reads what another one does. Without a warm-up, so that the two measurements are
    judged; GD940 is a fact, judged warm-up or not."""
    job = ("--sampler", "none", "--feed", "loader", "--diverge-rank", "1", "--outside-rank", "0")
    # 4 epochs, as GD946 had on its own: under load 2 gave too few losses to judge (CI-style run, stop 28)
    job += ("--outside-s", "0.12", "--epochs", "4", "--step-s", "0.1")
    return run_job(tmp_path_factory.mktemp("unsharded"), "GD940", *job, warmup="0")


@pytest.mark.parametrize(("sampler", "feed"), [("none", "loader"), ("unpassed", "samples")])
def test_ranks_reading_the_same_data_are_called_within_the_second_epoch(
    sampler: str, feed: str, tmp_path: Path, unsharded_apart_and_between_steps: Run
) -> None:
    """No DistributedSampler (or one built and not passed): every rank reads the whole data set. Seen
    through watch_loader, or through step(samples=, epoch=), before the second epoch ends."""
    if sampler == "none":  # the job of test_a_rank_whose_loss_stays_apart_and_a_rank_working_between_steps
        run = unsharded_apart_and_between_steps
        others = {"GD946": [0, 1], "GD948": [0]}
    else:
        run = run_job(tmp_path, "GD940", "--sampler", sampler, "--feed", feed, "--epochs", "2", "--step-s", "0.15")
        others = {}
    assert run.rc == 0, run.err[-3000:]
    summary = run.lines[-1]
    data = {code: ranks for code, ranks in named(summary).items() if code.startswith("GD94")}
    assert data == {"GD940": [0, 1], **others}, summary["verdicts"]  # no other data verdict on top
    (v,) = [v for v in summary["verdicts"] if v["code"] == "GD940"]
    # called on a partial epoch: the share is of what both had read by then (each reads all, in its own order)
    share = re.search(r"read the same samples in train epoch 0: (\d+)% of their sampled indices", v["message"])
    assert share and 5 <= int(share[1]) <= 100, v["message"]
    if feed == "loader":
        assert "(sampler: RandomSampler)" in v["message"]  # what the loader really used
    assert first_seen(run.lines, "GD940") <= epoch_end(run.marks, 1)


def test_missing_set_epoch_a_split_per_rank_and_eval_padding(tmp_path: Path) -> None:
    """DistributedSampler without set_epoch, random_split without a generator in unseeded ranks, and an
    evaluation set of 33 samples on 2 ranks (DistributedSampler pads one)."""
    job = ("--no-set-epoch", "--split", "per-rank", "--eval-size", "33", "--epochs", "2", "--step-s", "0.15")
    run = run_job(tmp_path, "GD941", *job)
    assert run.rc == 0, run.err[-3000:]
    lines, marks = run.lines, run.marks
    summary = lines[-1]
    assert named(summary) == {"GD941": [0, 1], "GD942": [0, 1], "GD943": [0, 1]}, summary["verdicts"]
    text = {v["code"]: v["message"] for v in summary["verdicts"]}
    assert "read train epoch 1 in the same order as epoch 0" in text["GD941"]
    assert "the sampler's epoch stayed 0: set_epoch() is not called" in text["GD941"]
    assert "evaluation samples are in rank" in text["GD942"]  # the leak, counted
    assert "34 samples of a 33-sample data set: 1 sample padded" in text["GD943"]
    assert first_seen(lines, "GD941") <= epoch_end(marks, 1)
    # the split overlaps (not disjoint shards), so GD940 is not called on top: the cause is the split
    assert "GD940" not in text


@pytest.fixture(scope="module")
def same_order_and_a_stray_context(tmp_path_factory: pytest.TempPathFactory) -> Run:
    """One job, two independent mistakes, read by two tests: the DistributedSampler's set_epoch is never
    called and the batches' sample indices reach gpudoctor through step(samples=, epoch=) (GD941); rank 1
    made a CUDA context on GPU 0 before set_device (GD947, from the fake NVML's process list). Neither
    verdict reads what the other does (the order of the indices; the GPUs each PID holds memory on)."""
    tmp = tmp_path_factory.mktemp("same_order_and_stray")
    placement = tmp / "placement"
    placement.mkdir()
    job = ("--no-set-epoch", "--feed", "samples", "--epochs", "2", "--step-s", "0.15")
    return run_job(tmp, "GD941", *job, "--placement", str(placement), "--stray", env=fake_nvml(placement))


def test_set_epoch_missing_is_called_from_step_samples_too(same_order_and_a_stray_context: Run) -> None:
    run = same_order_and_a_stray_context
    assert run.rc == 0, run.err[-3000:]
    assert named(run.lines[-1]) == {"GD941": [0, 1], "GD947": [1]}, run.lines[-1]["verdicts"]
    assert first_seen(run.lines, "GD941") <= epoch_end(run.marks, 1)


def test_uneven_shards_a_nan_loss_and_workers_beyond_the_cpus(gpudoctor_cli: GpudoctorCli) -> None:
    """Shards cut by hand (rank 0 one batch more), rank 1's fifth batch with a NaN, one DataLoader worker per
    rank on one CPU. The uneven epoch ends the job as it does without gpudoctor (gloo: a collective
    mismatch): the verdict came first, from the loaders' lengths."""
    job = ("--uneven", "--nan-rank", "1", "--nan-step", "5", "--workers", "1", "--epochs", "2")
    rc, lines, err = watch_job(gpudoctor_cli, *job, one_cpu=True)
    assert rc != 0  # the job itself fails at the end of its first epoch
    assert isinstance(lines, list)
    summary = lines[-1]
    found = named(summary)
    assert found["GD944"] == [0, 1] and found["GD945"] == [0, 1] and found["GD949"] == [0, 1], summary["verdicts"]
    text = {v["code"]: v for v in summary["verdicts"]}
    assert "different numbers of batches (rank 0 8, rank 1 7)" in text["GD944"]["message"]
    assert text["GD945"]["severity"] == "fail"
    assert text["GD945"]["message"].startswith(
        "rank 1's loss became NaN at step 5 (the first rank); then rank 0 at step 6"
    )
    assert "2 DataLoader workers" in text["GD949"]["message"] and "on 1 CPU" in text["GD949"]["message"]


def test_a_rank_whose_loss_stays_apart_and_a_rank_working_between_steps(unsharded_apart_and_between_steps: Run) -> None:
    """Rank 1's inputs scaled (normalized with its own statistics): its loss stays below rank 0's. Rank 0
    sleeps 0.12 s between steps (its evaluation or logging): rank 1 waits for it in the next all-reduce."""
    run = unsharded_apart_and_between_steps
    assert run.rc == 0, run.err[-3000:]
    summary = run.lines[-1]
    found = named(summary)
    assert found.get("GD946") == [0, 1] and found.get("GD948") == [0], summary["verdicts"]
    text = {v["code"]: v["message"] for v in summary["verdicts"]}
    assert text["GD946"].startswith("rank 0 and rank 1 disagree: mean loss")
    assert "rank 0 spends" in text["GD948"] and "outside next(loader)" in text["GD948"]
    assert "GD909" not in found and "GD910" not in found  # not the loader: no advice about workers


def test_a_clean_short_job_says_what_was_seen(tmp_path: Path, gpudoctor_cli: GpudoctorCli) -> None:
    """The clean job (DistributedSampler, set_epoch, a shared split, an even evaluation set), shorter than
    the warm-up, with each rank on its own (fake) GPU: no verdict, and the summary says what it saw."""
    placement = tmp_path / "placement"
    placement.mkdir()
    env = fake_nvml(placement)
    rc, text, err = watch_job(gpudoctor_cli, "--epochs", "2", "--placement", str(placement), text=True, env=env)
    assert rc == 0, err[-3000:]
    assert isinstance(text, str)
    assert "verdicts: none yet: balance is judged after a 600 s warm-up" in text
    assert "seen: train data (training): 2 epochs begun; samples in the last epoch per rank 0: 128, 1: 128" in text
    assert "seen: eval data (evaluation): 2 epochs begun" in text
    assert "seen: loss: 2 ranks reported, all finite" in text
    assert (
        "seen: rank 0 holds memory on GPU 0 30000 MiB" in text
        and "seen: rank 1 holds memory on GPU 1 30000 MiB" in text
    )


def test_a_context_on_another_ranks_gpu_is_named(same_order_and_a_stray_context: Run) -> None:
    """Rank 1 made a CUDA context on GPU 0 before set_device (518 MiB, as measured on an H200): named from
    NVML's process list with the PID its step records came from."""
    run = same_order_and_a_stray_context
    assert run.rc == 0, run.err[-3000:]
    summary = run.lines[-1]
    assert named(summary) == {"GD941": [0, 1], "GD947": [1]}, summary["verdicts"]
    (v,) = [v for v in summary["verdicts"] if v["code"] == "GD947"]
    assert v["gpus"] == [0]
    assert "holds 518 MiB on GPU 0 (rank 0's); its own GPU is GPU 1" in v["message"]
    pid = next(p["pid"] for p in summary["job"]["placement"] if p["rank"] == 1)
    assert v["ranks"] == [{"rank": 1, "pid": pid}]


def fake_nvml(placement: Path) -> dict[str, str]:
    path = os.pathsep.join(p for p in (str(FAKE_NVML), os.environ.get("PYTHONPATH", "")) if p)
    return clean_env(PYTHONPATH=path, GPUDOCTOR_TEST_NVML_PROCS=str(placement))
