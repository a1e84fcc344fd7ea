"""Under torchrun every local rank runs gpudoctor; only local rank 0 prints the report."""

from __future__ import annotations

import json

from gpudoctor.findings import CheckResult, Finding, Report, Status
from gpudoctor.render.text import render_report
from tests.helpers.processes import GpudoctorCli
from tests.paths import CONTAINER, H100

# The whole environment of a rank a launcher started (nothing of the test run's).
LAUNCHED = {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "PATH": "/usr/bin:/bin"}


def test_a_local_rank_other_than_0_prints_no_report_but_keeps_its_exit_code(gpudoctor_cli: GpudoctorCli) -> None:
    quiet = gpudoctor_cli("check", "--snapshot", CONTAINER, "--json", env={**LAUNCHED, "LOCAL_RANK": "1"})
    assert quiet.stdout == ""
    assert quiet.returncode == 1  # the 32 GB container fails GD501 on this rank too
    assert "local rank 0 prints the report" in quiet.stderr
    assert "\n" == quiet.stderr[-1] and quiet.stderr.count("\n") == 1


def test_local_rank_0_prints_the_one_json_document(gpudoctor_cli: GpudoctorCli) -> None:
    loud = gpudoctor_cli("check", "--snapshot", H100, "--json", env={**LAUNCHED, "RANK": "2", "LOCAL_RANK": "0"})
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
