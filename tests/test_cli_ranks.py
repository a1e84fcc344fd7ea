"""Under torchrun every local rank runs gpudoctor; only local rank 0 prints the report."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from gpudoctor.findings import CheckResult, Finding, Report, Status
from gpudoctor.render.text import render_report

FIXTURES = Path(__file__).parent / "fixtures"
LAUNCHED = {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "PATH": "/usr/bin:/bin"}


def run(env: dict[str, str], fixture: str) -> subprocess.CompletedProcess[str]:
    args = ["check", "--snapshot", str(FIXTURES / fixture), "--json"]
    return subprocess.run(
        [sys.executable, "-m", "gpudoctor", *args], env=env, capture_output=True, text=True, timeout=60
    )


def test_a_local_rank_other_than_0_prints_no_report_but_keeps_its_exit_code() -> None:
    quiet = run({**LAUNCHED, "LOCAL_RANK": "1"}, "container_32gb_8gpu.json")
    assert quiet.stdout == ""
    assert quiet.returncode == 1  # the 32 GB container fails GD501 on this rank too
    assert "local rank 0 prints the report" in quiet.stderr
    assert "\n" == quiet.stderr[-1] and quiet.stderr.count("\n") == 1


def test_local_rank_0_prints_the_one_json_document() -> None:
    loud = run({**LAUNCHED, "RANK": "2", "LOCAL_RANK": "0"}, "h100_sxm_8x.json")
    assert loud.returncode == 0
    assert json.loads(loud.stdout)["exit_code"] == 0


def test_node_rows_render_as_a_table() -> None:
    from rich.console import Console

    nodes = [
        {"hostname": "node-a", "node_rank": 0, "ranks": [0, 1], "gpus": [0, 1], "status": "ok"},
        {"hostname": "node-b", "node_rank": 1, "ranks": [2, 3], "gpus": [0, 1], "status": "timeout"},
    ]
    result = CheckResult("ddp", "DDP", [Finding("GD701", Status.PASS, "host", "joined")], 0.1)
    report = Report("check", "live", "now", "0", "node-a", [result], nodes=nodes)
    console = Console(record=True, width=120, color_system=None)
    render_report(report, console)
    text = console.export_text()
    assert "node-b" in text and "2,3" in text and "timeout" in text
    assert "{" not in text  # not a raw dict
