"""Recordings shipped with gpudoctor (`sample:NAME`), `watch --demo`, the warm-up, idle GPUs."""

from __future__ import annotations

import json
import time
from pathlib import Path

import jsonschema
import pytest
import tomllib

from gpudoctor.watch.recording import read_recording, recording_path, shipped_samples
from gpudoctor.watch.summary import render_text, summarize
from gpudoctor.watch.synthetic import DEMOS, synthetic_run
from gpudoctor.watch.thresholds import Thresholds
from tests.helpers.processes import GpudoctorCli
from tests.paths import REPO, shipped_schema

SCHEMA = shipped_schema("watch_summary")


def test_every_demo_ships_as_a_recording_and_is_package_data() -> None:
    assert shipped_samples() == sorted(DEMOS)
    config = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert "samples/*.jsonl.gz" in config["tool"]["setuptools"]["package-data"]["gpudoctor.watch"]
    rec = read_recording(recording_path("sample:straggler"))
    assert rec.damage is None and len(rec.samples) == 180 and rec.samples[0].ranks  # 3 minutes, with ranks


@pytest.mark.parametrize(
    ("name", "codes"),
    [
        ("straggler", {"GD901": [3], "GD909": []}),
        ("hung", {"GD904": [5], "GD911": []}),
        ("starved", {"GD903": list(range(8)), "GD910": []}),
        ("throttle", {"GD905": [2], "GD906": [2]}),
        ("xid", {"GD907": [6]}),
        ("lost", {"GD907": [7], "GD908": [7], "GD904": [7], "GD911": []}),
        ("balanced", {}),
    ],
)
def test_report_of_each_shipped_recording(name: str, codes: dict[str, list[int]], gpudoctor_cli: GpudoctorCli) -> None:
    r = gpudoctor_cli("report", f"sample:{name}", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    jsonschema.validate(doc, SCHEMA)
    assert {v["code"]: v["gpus"] for v in doc["verdicts"]} == codes
    text = gpudoctor_cli("report", f"sample:{name}").stdout
    assert all(code in text for code in codes)


def test_an_unknown_sample_is_a_usage_error_naming_those_there_are(gpudoctor_cli: GpudoctorCli) -> None:
    r = gpudoctor_cli("report", "sample:nope")
    assert r.returncode == 2 and "no shipped recording 'sample:nope'; there are: sample:balanced" in r.stderr


def test_replay_of_a_shipped_recording(gpudoctor_cli: GpudoctorCli) -> None:
    r = gpudoctor_cli("watch", "--replay", "sample:xid", "--speed", "1000", "--no-tui")
    assert r.returncode == 0, r.stderr
    assert "GD907 xid-event" in r.stdout and "XID 48" in r.stdout


def test_balance_verdicts_wait_for_the_warm_up_and_the_warmup_option_moves_it(gpudoctor_cli: GpudoctorCli) -> None:
    run = synthetic_run("straggler", 90)
    default = summarize(run, "x")
    assert [(sp.verdict.code, sp.start - run[0].t) for sp in default.spans] == [("GD901", 60.0)]
    assert [sp.start - run[0].t for sp in summarize(run, "x", Thresholds(warmup_s=0)).spans] == [4.0]
    r = gpudoctor_cli("report", "sample:straggler", "--warmup", "100", "--json")
    doc = json.loads(r.stdout)
    assert doc["warmup_s"] == 100 and {v["start_s"] for v in doc["verdicts"]} == {100.0}
    short = summarize(run[:40], "x")
    text = render_text(short)
    # A straggler shorter than the warm-up was never judged: no claim that the GPUs stayed balanced.
    assert short.spans == [] and "verdicts: none yet: balance is judged after a 60 s warm-up" in text
    assert "stayed balanced" not in text and "this run lasted 39 s" in text


def test_an_idle_job_is_idle_not_balanced() -> None:
    summary = summarize(synthetic_run("idle", 90), "x")
    assert summary.idle and summary.balance_score is None and summary.spans == []
    text = render_text(summary)
    assert "GPUs stayed balanced" not in text and "the GPUs were idle" in text
    assert "balance score: n/a (every GPU stayed below 5% utilization: idle)" in text
    assert summary.to_json()["idle"] is True


def test_demo_plays_live_with_the_gpus_asked_for(gpudoctor_cli: GpudoctorCli) -> None:
    start = time.monotonic()
    r = gpudoctor_cli("watch", "--demo", "straggler", "--gpus", "32", "--speed", "50", "--duration", "3", "--no-tui")
    assert r.returncode == 0, r.stderr
    assert time.monotonic() - start < 30
    assert "32 GPUs" in r.stdout and "32 ranks" in r.stdout and "(demo straggler)" in r.stdout
    assert "GD901 straggler" in r.stdout and "GD909 slow-rank" in r.stdout  # 3 s at 50x: past the warm-up
    r = gpudoctor_cli("watch", "--demo", "--duration", "1", "--no-tui")  # default scenario
    assert r.returncode == 0 and "(demo straggler)" in r.stdout
    for bad in (("--gpus", "0"), ("--gpus", "0,1"), ("--gpus", "500")):
        r = gpudoctor_cli("watch", "--demo", "xid", *bad, "--no-tui")
        assert r.returncode == 2 and "with --demo, --gpus is how many GPUs to simulate" in r.stderr
    r = gpudoctor_cli("watch", "--demo", "nope")
    assert r.returncode == 2 and "'nope' is not one of" in r.stderr


def test_the_policy_files_watch_table_sets_the_thresholds_and_options_win(
    tmp_path: Path, gpudoctor_cli: GpudoctorCli
) -> None:
    (tmp_path / "gpudoctor.toml").write_text("[watch]\nwarmup-s = 10\nstraggler-gap = 50\n")

    def report(*args: str) -> dict:  # type: ignore[type-arg]
        r = gpudoctor_cli("report", "sample:straggler", "--json", *args, cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout)

    found = report()  # GPU 3 runs ~40 points low: under a 50-point gap, no GD901; rank 3 still late
    assert found["warmup_s"] == 10 and [(v["code"], v["start_s"]) for v in found["verdicts"]] == [("GD909", 10.0)]
    assert report("--warmup", "30")["warmup_s"] == 30  # an option given wins over the file
    assert {v["code"] for v in report("--no-config")["verdicts"]} == {"GD901", "GD909"}
    (tmp_path / "gpudoctor.toml").write_text("[watch]\nwarmup = 10\n")
    r = gpudoctor_cli("watch", "--demo", "--no-tui", "--duration", "1", cwd=tmp_path)
    assert r.returncode == 2 and "watch.warmup: unknown key (did you mean 'warmup-s'?)" in r.stderr


def test_a_threshold_beyond_a_day_is_a_usage_error_not_a_309_digit_warm_up(gpudoctor_cli: GpudoctorCli) -> None:
    """--warmup 1e308 printed "judged after a 1000...0 s warm-up" (309 digits). Thresholds in seconds are
    at most a day (gpudoctor.watch.bounds.MAX_THRESHOLD_S), on the command line and in the policy file."""
    for command in (("report", "sample:balanced"), ("watch", "--demo", "--no-tui", "--duration", "1")):
        for option in ("--warmup", "--hang-after", "--join-after"):
            if command[0] == "report" and option != "--warmup":
                continue
            r = gpudoctor_cli(*command, option, "1e308")
            assert r.returncode == 2 and "is not in the range" in r.stderr and "86400" in r.stderr, r.stderr
    r = gpudoctor_cli("report", "sample:balanced", "--warmup", "86400")
    assert r.returncode == 0 and "after a 86400 s warm-up" in r.stdout, r.stdout
