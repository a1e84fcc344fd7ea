"""torchrun's command line, read from its process: is a process torchrun's agent, and how many nodes and
ranks per node it waits for (pure: the caller gives the argv).

torchrun (`torch.distributed.run`, also `python -m torch.distributed.run` and the deprecated
`torch.distributed.launch`) takes `--nnodes N` or `--nnodes MIN:MAX` (default 1) and `--nproc-per-node`
(`--nproc_per_node`; a number, or gpu/cpu/auto), both as `--opt value` or `--opt=value`, before the
training script (torch/distributed/run.py, `get_args_parser`). Its agent starts no rank until its
rendezvous has the nodes it asked for (`--nnodes`), so a node that never comes leaves it alone.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

MODULES = ("torch.distributed.run", "torch.distributed.launch")
SCRIPTS = ("torchrun",)
# torchrun's options that take a value (the next argument when not given as --opt=value): enough of
# them to find where the training script starts (torch/distributed/run.py, torch 2.x).
VALUED = {
    "--nnodes",
    "--nproc-per-node",
    "--nproc_per_node",
    "--rdzv-backend",
    "--rdzv_backend",
    "--rdzv-endpoint",
    "--rdzv_endpoint",
    "--rdzv-id",
    "--rdzv_id",
    "--rdzv-conf",
    "--rdzv_conf",
    "--max-restarts",
    "--max_restarts",
    "--monitor-interval",
    "--monitor_interval",
    "--start-method",
    "--start_method",
    "--role",
    "--log-dir",
    "--log_dir",
    "-r",
    "--redirects",
    "-t",
    "--tee",
    "--local-ranks-filter",
    "--local_ranks_filter",
    "--node-rank",
    "--node_rank",
    "--master-addr",
    "--master_addr",
    "--master-port",
    "--master_port",
    "--local-addr",
    "--local_addr",
    "--logs-specs",
    "--logs_specs",
}


@dataclass(frozen=True)
class TorchrunPlan:
    nnodes: str  # as given: "2", "1:4"
    min_nodes: int | None
    max_nodes: int | None
    nproc: int | None  # ranks per node when a number was given

    @property
    def world(self) -> int | None:
        """The ranks it starts in all, when the node count is fixed and the ranks per node a number."""
        if self.nproc is None or self.min_nodes is None or self.min_nodes != self.max_nodes:
            return None
        return self.min_nodes * self.nproc


def is_torchrun(argv: Sequence[str]) -> bool:
    """`torchrun ...`, `python -m torch.distributed.run ...` or `python .../bin/torchrun ...`."""
    if not argv:
        return False
    if os.path.basename(argv[0]) in SCRIPTS:
        return True
    for i, arg in enumerate(argv[1:3], start=1):
        if arg == "-m" and i + 1 < len(argv) and argv[i + 1] in MODULES:
            return True
        if os.path.basename(arg) in SCRIPTS:
            return True
    return False


def torchrun_plan(argv: Sequence[str]) -> TorchrunPlan | None:
    """What torchrun's options ask for, read up to the training script; None if `argv` is not torchrun."""
    if not is_torchrun(argv):
        return None
    options: dict[str, str] = {}
    args = list(argv[1:])
    i = 0
    while i < len(args):
        arg = args[i]
        if arg in ("-m", *MODULES) or os.path.basename(arg) in SCRIPTS:
            i += 1
            continue
        if not arg.startswith("-"):
            break  # the training script: what follows is its own
        name, eq, value = arg.partition("=")
        if not eq and name in VALUED and i + 1 < len(args):
            value = args[i + 1]
            i += 1
        options[name.replace("_", "-")] = value
        i += 1
    nnodes = options.get("--nnodes", "1")
    low, _, high = nnodes.partition(":")
    min_nodes = int(low) if low.isdigit() else None
    max_nodes = int(high) if high.isdigit() else (min_nodes if not high else None)
    nproc = options.get("--nproc-per-node", "1")
    return TorchrunPlan(nnodes, min_nodes, max_nodes, int(nproc) if nproc.isdigit() else None)
