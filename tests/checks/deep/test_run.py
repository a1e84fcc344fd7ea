"""Level 3 run for real on CPU ranks with gloo: a rank corrupting its results on purpose
(GPUDOCTOR_FAULT=<rank>:sdc) is named by the GEMM comparison, the all-reduce check and the
memory test, in text, JSON and JUnit; a rank that hangs is named within the deadline and no
process is left."""

from __future__ import annotations

import json
import time
from pathlib import Path

import jsonschema
import junitparser
import pytest

from gpudoctor.checks import context
from gpudoctor.checks.deep.load import deep_load
from gpudoctor.checks.deep.memory import deep_memory
from gpudoctor.checks.deep.sdc import deep_sdc
from gpudoctor.engine import CheckOptions
from gpudoctor.findings import Status
from gpudoctor.launch.supervise import KILL_SEQUENCE_S
from gpudoctor.snapshot import Snapshot
from tests.helpers.processes import HANG_TIMEOUT_S, GpudoctorCli, clean_env, cut_hangs
from tests.paths import shipped_schema

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("no_orphans")]
SCHEMA = shipped_schema("report")
EMPTY = Snapshot(1, "2026-01-01T00:00:00+00:00", [])


def test_a_rank_corrupting_its_results_is_named_by_every_deep_comparison(
    tmp_path: Path, gpudoctor_cli: GpudoctorCli
) -> None:
    junit = tmp_path / "deep.xml"
    args = ["check", "--device", "cpu", "--ranks", "3", "--level", "3", "--duration", "2", "--json"]
    args += ["--select", "deep_load,deep_sdc,deep_memory", "--junit", str(junit)]
    out = gpudoctor_cli(*args, env=clean_env(GPUDOCTOR_FAULT="1:sdc"), timeout=240)
    doc = json.loads(out.stdout)
    jsonschema.validate(doc, SCHEMA)
    assert out.returncode == 1, out.stderr
    found = {(f["code"], f["status"], f["subject"]) for c in doc["checks"] for f in c["findings"]}
    failing = {x for x in found if x[1] == "fail"}
    assert failing == {
        ("GD860", "fail", "rank:1"),  # its GEMM bits differ from the other two ranks'
        ("GD861", "fail", "rank:1"),  # and from its own first result
        ("GD862", "fail", "rank:1"),  # its all-reduce results are wrong
        ("GD865", "fail", "rank:1"),  # its memory read back a flipped bit
    }
    assert ("GD850", "pass", "host") in found  # CPU ranks: figures without a verdict
    memtest = next(f for c in doc["checks"] for f in c["findings"] if f["code"] == "GD865")
    assert memtest["evidence"]["first"]["pattern"] == "walking ones bit 0"
    assert memtest["evidence"]["first"]["offset"] == 12345 * 4
    assert int(memtest["evidence"]["first"]["got"], 16) == 1 | 1 << 7
    assert "first at address 0x" in memtest["message"]
    # The same verdicts in JUnit, read by a reader we did not write: one failing case per failing finding.
    failed = sorted(
        case.name
        for suite in junitparser.JUnitXml.fromfile(str(junit))
        for case in suite
        if any(type(r).__name__ == "Failure" for r in case.result)
    )
    assert failed == ["GD860 rank:1", "GD861 rank:1", "GD862 rank:1", "GD865 rank:1"]
    assert "level 3: deep_gemm, deep_allreduce, deep_memory on 3 rank(s)" not in out.stderr  # --json: quiet


def test_a_hanging_rank_is_named_within_the_deadline_and_the_tests_after_it_say_why_they_did_not_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("GPUDOCTOR_FAULT", "1:hang")
    monkeypatch.delenv("MASTER_PORT", raising=False)
    launches = cut_hangs(monkeypatch)  # the hang is cut HANG_RUN_S after the join, not at the whole deadline
    progress: list[str] = []
    opts = CheckOptions(device="cpu", ranks=2, level=3, duration_s=1.0, timeout_s=HANG_TIMEOUT_S)
    ctx = context(EMPTY, opts, progress=progress.append)
    ctx.planned = ("deep_load", "deep_sdc", "deep_memory")
    start = time.monotonic()
    load_findings, _ = deep_load(ctx)
    elapsed = time.monotonic() - start
    deadline = HANG_TIMEOUT_S + 3.0 * 1.25  # --timeout plus the planned load (1 s each) x 1.25
    assert elapsed < deadline + KILL_SEQUENCE_S + 1.0
    assert [r.timed_out for r in launches] == ["run"]  # one run, for the three checks
    assert [(f.code, f.status, f.subject) for f in load_findings] == [("GD855", Status.FAIL, "rank:1")]
    assert f"did not answer within the {deadline:g} s deadline" in load_findings[0].message
    assert load_findings[0].evidence["others_stopped"] == [0]
    sdc_findings, _ = deep_sdc(ctx)  # the same run, not a second one
    memory_findings, _ = deep_memory(ctx)
    for f in sdc_findings + memory_findings:
        assert f.status is Status.SKIP
        assert "the deep run stopped before its tests (rank 1; see deep_load)" in f.message
    assert progress[0].startswith("level 3: deep_gemm, deep_allreduce, deep_memory on 2 rank(s)")
