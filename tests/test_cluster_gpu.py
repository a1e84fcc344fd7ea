"""The cross-node workload on real GPUs with NCCL (skipped without two GPUs): one "node" per GPU under
torchrun, so the NCCL path (communicators split per round with torch's split_group) runs for real."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

pytestmark = [pytest.mark.gpu, pytest.mark.slow]


def _gpus() -> int:
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return int(pynvml.nvmlDeviceGetCount())
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # noqa: BLE001
        return 0


@pytest.mark.skipif(shutil.which("torchrun", path=str(Path(sys.executable).parent)) is None, reason="no torchrun")
def test_one_gpu_per_node_under_torchrun_names_the_slowed_node(tmp_path: Path) -> None:
    nodes = min(4, _gpus())
    if nodes < 2:
        pytest.skip("needs two GPUs")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    torchrun = str(Path(sys.executable).parent / "torchrun")
    procs = []
    for node in range(nodes):
        env = {k: v for k, v in os.environ.items() if k not in ("MASTER_PORT", "RANK", "WORLD_SIZE")}
        env.update(CUDA_VISIBLE_DEVICES=str(node), GPUDOCTOR_FAULT="node1:slownet" if nodes >= 3 else "")
        out = open(tmp_path / f"node{node}.json", "w")  # noqa: SIM115
        cmd = [torchrun, "--nnodes", str(nodes), "--node-rank", str(node), "--nproc-per-node", "1"]
        cmd += ["--master-addr", "127.0.0.1", "--master-port", port]
        cmd += ["-m", "gpudoctor", "check", "--select", "nodes", "--json", "--timeout", "300"]
        procs.append(subprocess.Popen(cmd, env=env, cwd=REPO, stdout=out, stderr=subprocess.DEVNULL))
        out.close()
    try:
        for p in procs:
            p.wait(timeout=420)
    finally:
        for p in procs:
            p.kill()
            p.wait()
    doc = json.loads((tmp_path / "node0.json").read_text())
    findings = [f for c in doc["checks"] if c["name"] == "nodes" for f in c["findings"]]
    codes = {f["code"] for f in findings}
    assert "GD684" not in codes and "GD680" in codes, findings
    if nodes >= 3:
        [slow] = [f for f in findings if f["code"] == "GD681"]
        assert slow["subject"].endswith("#1")
