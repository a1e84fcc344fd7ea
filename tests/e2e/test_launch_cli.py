"""gpudoctor interrupted or killed while ranks run leaves no rank behind; torchrun spans nodes."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import jsonschema
import psutil
import pytest

from tests.helpers.processes import clean_env, cmdline, free_port
from tests.paths import REPO, shipped_schema

pytestmark = pytest.mark.slow
SCHEMA = shipped_schema("report")


def rank_pids(parent: psutil.Process, want: int, within: float = 30.0) -> list[int]:
    """The PIDs of gpudoctor's ranks, once `want` of them have joined (so they are really running)."""
    end = time.monotonic() + within
    while time.monotonic() < end:
        kids = [p for p in parent.children(recursive=True) if "gpudoctor.workloads.rank" in " ".join(cmdline(p))]
        if len(kids) >= want:
            time.sleep(3.0)  # let them import torch and join
            return [p.pid for p in kids]
        time.sleep(0.1)
    raise AssertionError("ranks did not start")


def gone(pids: list[int], within: float = 8.0) -> bool:
    end = time.monotonic() + within
    while time.monotonic() < end:
        alive = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
        if not alive:
            return True
        time.sleep(0.1)
    return False


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL])
def test_no_rank_outlives_an_interrupted_or_killed_gpudoctor(sig: signal.Signals) -> None:
    """Also: an interrupted `--json` run still prints its one document, which says so (this case was a
    test of its own in test_cli_output.py with a run of its own: one run answers both)."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gpudoctor",
            "check",
            "--device",
            "cpu",
            "--ranks",
            "2",
            "--select",
            "ddp",
            "--timeout",
            "120",
            "--json",
        ],
        env=clean_env(GPUDOCTOR_FAULT="1:hang"),
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        pids = rank_pids(psutil.Process(proc.pid), 2)
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=15)
        assert gone(pids), f"ranks left after {sig.name}"
        if sig is not signal.SIGKILL:
            assert proc.returncode == 130
            doc = json.loads(out)
            jsonschema.validate(doc, SCHEMA)
            assert doc["error"]["kind"] == "interrupted"
            assert "Traceback" not in err
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.skipif(shutil.which("torchrun", path=str(Path(sys.executable).parent)) is None, reason="no torchrun")
def test_two_nodes_under_torchrun_give_one_report_with_two_node_rows(tmp_path: Path) -> None:
    torchrun = str(Path(sys.executable).parent / "torchrun")
    port = str(free_port())
    procs = []
    for node in (0, 1):
        out = open(tmp_path / f"node{node}.json", "w")  # noqa: SIM115
        procs.append(
            subprocess.Popen(
                [
                    torchrun,
                    "--nnodes",
                    "2",
                    "--node-rank",
                    str(node),
                    "--nproc-per-node",
                    "1",
                    "--master-addr",
                    "127.0.0.1",
                    "--master-port",
                    port,
                    "-m",
                    "gpudoctor",
                    "check",
                    "--device",
                    "cpu",
                    "--select",
                    "allreduce,ddp",
                    "--json",
                    "--timeout",
                    "60",
                ],
                env=clean_env(),
                cwd=REPO,
                stdout=out,
                stderr=subprocess.DEVNULL,
            )
        )
        out.close()
    try:
        for p in procs:
            p.wait(timeout=120)
    finally:
        for p in procs:
            p.kill()
    doc = json.loads((tmp_path / "node0.json").read_text())
    jsonschema.validate(doc, SCHEMA)
    assert doc["exit_code"] == 0
    assert [(n["node_rank"], n["ranks"], n["status"]) for n in doc["nodes"]] == [(0, [0], "ok"), (1, [1], "ok")]
    sweep = next(c for c in doc["checks"] if c["name"] == "allreduce")["details"]["sweep"]
    assert sweep["world_size"] == 2  # one all-reduce across both nodes
    assert json.loads((tmp_path / "node1.json").read_text())["nodes"] == []  # only rank 0 reports the nodes
