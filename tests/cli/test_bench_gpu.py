"""The real NCCL path of `bench scaling` and `bench collectives` on GPUs (skipped without one)."""

from __future__ import annotations

import json

import pytest

from tests.conftest import leftover_ranks, usable_gpus
from tests.helpers.bench_docs import split_unflagged
from tests.helpers.cli import run_cli

pytestmark = [pytest.mark.gpu, pytest.mark.slow]


def test_bench_scaling_one_gpu_path(capsys: pytest.CaptureFixture[str]) -> None:
    r = run_cli(
        capsys, "bench", "scaling", "--device", "cuda", "--counts", "1", "--steps", "10", "--no-dataparallel", "--json"
    )
    assert r.exit_code == 0, r.err
    doc = json.loads(r.out)
    for row in doc["results"]["summary"]:
        assert row["gpus"] == 1 and row["samples_per_s"] > 0 and row["comm_ms"] == 0.0
    assert split_unflagged(doc) == []  # within 10 %, or GD726 says it is not (a loaded host: issue 24)
    for model in doc["results"]["scaling"]["models"]:
        assert model["runs"][0]["ranks"][0]["peak_mem_bytes"] > 0
    assert leftover_ranks(within=5.0) == []


def test_bench_scaling_and_dataparallel_on_every_gpu(capsys: pytest.CaptureFixture[str]) -> None:
    if usable_gpus() < 2:
        pytest.skip("needs 2 or more GPUs")
    r = run_cli(capsys, "bench", "scaling", "--device", "cuda", "--model", "transformer", "--json")
    assert r.exit_code in (0, 1), r.err
    doc = json.loads(r.out)
    (model,) = doc["results"]["scaling"]["models"]
    dp = model["dataparallel"]
    assert dp["gpus"] == usable_gpus() and len(dp["peak_mem_bytes"]) == dp["gpus"]
    assert split_unflagged(doc) == []  # within 10 %, or GD726 says it is not (a loaded host: issue 24)
    assert leftover_ranks(within=5.0) == []


def test_bench_collectives_on_every_gpu_is_exact(capsys: pytest.CaptureFixture[str]) -> None:
    if usable_gpus() < 2:
        pytest.skip("needs 2 or more GPUs")
    r = run_cli(capsys, "bench", "collectives", "--device", "cuda", "--max-bytes", "64M", "--json")
    doc = json.loads(r.out)
    statuses = {f["code"]: f["status"] for c in doc["checks"] for f in c["findings"] if f["code"] == "GD652"}
    assert statuses == {"GD652": "pass"}
    assert leftover_ranks(within=5.0) == []
