"""`gpudoctor bench allreduce` (the sweep printed whole), and what every bench shares: the failure
path of a rank that dies, and running without numpy (here for `bench collectives`; `bench scaling`'s
run without numpy is tests/cli/test_bench_scaling.py's)."""

from __future__ import annotations

import pytest

from tests.conftest import leftover_ranks
from tests.helpers.bench_docs import bench_doc
from tests.helpers.cli import run_cli
from tests.helpers.processes import GpudoctorCli, hiding


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--device", "cpu", "--min-bytes", "12Q"], "cannot read size '12Q'"),
        (["--device", "cpu", "--min-bytes", "100"], "size '100' is too small"),
        (["--ranks", "3"], "--ranks needs --device cpu"),
    ],
)
def test_bad_sizes_and_options_are_one_line_usage_errors(
    capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    r = run_cli(capsys, "bench", "allreduce", *args)
    assert r.exit_code == 2 and message in r.err and r.err.count("\n") == 1


@pytest.mark.slow
def test_bench_allreduce_on_cpu_prints_the_sweep(
    capsys: pytest.CaptureFixture[str], gpudoctor_cli: GpudoctorCli
) -> None:
    r = run_cli(capsys, "bench", "allreduce", "--device", "cpu", "--ranks", "2", "--max-bytes", "256K", "--json")
    assert r.exit_code == 0
    doc = bench_doc(r.out)
    assert [row["bytes"] for row in doc["results"]["allreduce"]["rows"]] == [64 << 10, 128 << 10, 256 << 10]
    assert all(row["wrong"] == 0 for row in doc["results"]["allreduce"]["rows"])
    # One shape for every bench (issue 24): the report (command, exit code, summary, findings) plus `results`.
    assert doc["command"] == "bench allreduce" and doc["exit_code"] == 0
    assert [(f["code"], f["status"]) for c in doc["checks"] for f in c["findings"]] == [("GD602", "pass")]
    # Another bench, run where numpy cannot be imported: torch's all_gather_object needs it, the ranks
    # gather JSON instead (workloads/rank.py). (A test of its own ran `bench collectives` without
    # numpy; this run answers it.)
    other = gpudoctor_cli(
        *("bench", "collectives", "--device", "cpu", "--ranks", "2", "--max-bytes", "64K", "--json"),
        env=hiding("numpy"),
        timeout=200,
    )
    assert "Numpy is not available" not in other.stdout + other.stderr
    assert other.returncode == 0, other.stderr[-2000:]
    collectives = bench_doc(other.stdout)
    assert collectives["results"]["launch"]["ranks"][1]["state"] == "done"
    assert set(collectives) == set(doc)
    assert set(doc["results"]) == {"allreduce", "launch"}
    assert leftover_ranks(within=5.0) == []


@pytest.mark.slow
@pytest.mark.parametrize(
    ("args", "code"),
    [
        (["collectives", "--max-bytes", "64K"], "GD653"),
        (["scaling", "--model", "cnn"], "GD725"),
    ],
)
def test_a_rank_that_dies_is_named_and_nothing_is_left_behind(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, args: list[str], code: str
) -> None:
    monkeypatch.setenv("GPUDOCTOR_FAULT", "1:exit")
    r = run_cli(capsys, "bench", *args, "--device", "cpu", "--ranks", "2", "--json")
    assert r.exit_code == 1
    doc = bench_doc(r.out)
    (finding,) = [f for c in doc["checks"] for f in c["findings"]]
    assert finding["code"] == code and finding["status"] == "fail"
    assert "rank 1" in finding["message"] and "exited with status 17" in finding["message"]
    assert leftover_ranks(within=5.0) == []
