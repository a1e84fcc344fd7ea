"""Run `gpudoctor check` as N torchrun "nodes" on this machine (one torchrun per node, static
rendezvous on a free local port), each with its own environment; return every node's JSON report."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.helpers.processes import clean_env, free_port
from tests.paths import REPO

TORCHRUN = shutil.which("torchrun", path=str(Path(sys.executable).parent))


def run_nodes(
    tmp: Path, nodes: int, env_of: Callable[[int], dict[str, str]], check_args: list[str], wait_s: float
) -> list[dict[str, Any]]:
    assert TORCHRUN is not None
    port = str(free_port())
    procs = []
    for node in range(nodes):
        env = clean_env(**env_of(node))
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
