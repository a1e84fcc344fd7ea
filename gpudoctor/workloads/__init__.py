"""Programs that run inside spawned ranks (they import torch; the parent never imports this
package's workload modules, only `WORKLOADS` and `known_errors`, which are torch-free).

A workload is one function `run(ctx: RankContext, params: dict) -> dict` in a module of this
package, listed in `WORKLOADS` by name. The launcher (`gpudoctor.launch.supervise`) starts the ranks, each
rank joins the process group once, then runs the requested workloads in order in that same group
and sends each one's JSON-able result back to the parent (gpudoctor/launch/protocol.py: a
workload reports only through `ctx.events`). A result that the parent reads in more than one
place has its type in gpudoctor/launch/workload_results.py. See docs/active-checks.md.
"""

from __future__ import annotations

# name -> "module:function" under gpudoctor.workloads; imported lazily inside the rank.
WORKLOADS: dict[str, str] = {
    "allreduce": "gpudoctor.workloads.allreduce:run",
    "ddp": "gpudoctor.workloads.ddp:run",
    "link_pcie": "gpudoctor.workloads.link_probes:pcie",
    "link_p2p": "gpudoctor.workloads.link_probes:p2p",
    "deep_gemm": "gpudoctor.workloads.deep_gemm:run",
    "deep_allreduce": "gpudoctor.workloads.deep_allreduce:run",
    "deep_memory": "gpudoctor.workloads.deep_memory:run",
    "deep_links": "gpudoctor.workloads.deep_links:run",
    "collectives": "gpudoctor.workloads.collectives:run",
    "scaling": "gpudoctor.workloads.scaling:run",
    "nodes": "gpudoctor.workloads.nodes:run",
}
