"""Run `gpudoctor check` as N torchrun "nodes" on this machine (one torchrun per node, static
rendezvous on a free local port), each with its own environment; return every node's JSON report."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.conftest import REPO

TORCHRUN = shutil.which("torchrun", path=str(Path(sys.executable).parent))
_DROP = ("MASTER_PORT", "RANK", "WORLD_SIZE", "NCCL_IB_HCA", "GPUDOCTOR_FAULT")


def _free_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def run_nodes(
    tmp: Path, nodes: int, env_of: Callable[[int], dict[str, str]], check_args: list[str], wait_s: float
) -> list[dict[str, Any]]:
    assert TORCHRUN is not None
    port = _free_port()
    procs = []
    for node in range(nodes):
        env = {k: v for k, v in os.environ.items() if k not in _DROP}
        env.update(OMP_NUM_THREADS="1", **env_of(node))
        cmd = [TORCHRUN, "--nnodes", str(nodes), "--node-rank", str(node), "--nproc-per-node", "1"]
        cmd += ["--master-addr", "127.0.0.1", "--master-port", port, "-m", "gpudoctor", "check", *check_args]
        with open(tmp / f"node{node}.json", "w") as out:
            procs.append(subprocess.Popen(cmd, env=env, cwd=REPO, stdout=out, stderr=subprocess.DEVNULL))
    try:
        for p in procs:
            p.wait(timeout=wait_s)
    finally:
        for p in procs:
            p.kill()
            p.wait()
    return [json.loads((tmp / f"node{n}.json").read_text()) for n in range(nodes)]
