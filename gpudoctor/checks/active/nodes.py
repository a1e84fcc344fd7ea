"""GD46 (cross-node comparisons), GD68 (inter-node bandwidth, the slow node or pair) and GD443
(RDMA error counters growing during the run): the multi-node view, in global rank 0's report.

Active: under torchrun/srun the shared launch (active_common) runs the `nodes` workload after the
all-reduce and DDP tasks. Each node's parent sends its facts (`node_facts`, from its own snapshot
and its own static findings); rank 0 compares them, judges the inter-node all-reduce against what
the NICs should carry (network_expectation.py) and names the slow node or pair from the pairwise
rounds. On one node only the counter growth over the active run is judged.

The parts, each in its module: the codes (node_codes.py), what each node sends (node_task.py),
the facts compared across nodes (node_comparison.py, shared with `gpudoctor fleet`), the
bandwidth and the slow node or pair (node_bandwidth.py), the RDMA counters (node_counters.py).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpudoctor.checks.active.common import Plan, not_run_message, plan, skip_finding
from gpudoctor.checks.active.node_bandwidth import bandwidth_findings, nodes_table
from gpudoctor.checks.active.node_codes import CODES, FACTS_MISSING, NOT_COMPLETED, STACK_DIFFERS
from gpudoctor.checks.active.node_comparison import comparison_findings, forwarded, labels_for
from gpudoctor.checks.active.node_counters import (
    growth_findings,
    network_facts_counters,
    received_counters,
    remote_growth,
)
from gpudoctor.engine import check
from gpudoctor.engine.context import CheckContext
from gpudoctor.findings import Finding, Status
from gpudoctor.knowledge.units import listed

if TYPE_CHECKING:  # launch loads when a run starts: check --quick never pays for it
    from gpudoctor.launch import LaunchResult


def single_node(ctx: CheckContext, p: Plan) -> list[Finding]:
    """One node: the RDMA error counters before and after the shared active run."""
    from gpudoctor.probe.network import network_root, read_counters

    out = [
        Finding(
            STACK_DIFFERS.code,
            Status.SKIP,
            "host",
            "one node: nothing to compare (run under torchrun/srun on several nodes)",
            "",
            {},
        )
    ]
    before = network_facts_counters(ctx)
    if before:
        ctx.run("active")  # the run whose traffic the counters are read around (kept if it ran)
        after = read_counters(network_root(os.environ, Path("/")))
        out += growth_findings(before, after, "host", "")
    return out


@check("nodes", "Across nodes: facts, inter-node bandwidth, the slow node", codes=CODES, active=True, shares="active")
def nodes(ctx: CheckContext) -> tuple[list[Finding], dict[str, Any]]:
    p = plan(ctx)
    if p.skip:
        return [skip_finding(ctx, CODES[0], p, "cross-node checks")], {}
    from gpudoctor.launch import torchrun_env

    if not torchrun_env(os.environ):
        return single_node(ctx, p), {}
    result = ctx.run("active")
    data = result.results("nodes")
    if data is None:
        return [_not_completed(result)], {}
    labels = labels_for(data["nodes"])
    mine = data["node"]
    before = network_facts_counters(ctx)
    data = {**data, "counters_after": received_counters(data)}
    after = data["counters_after"].get(mine, {})
    findings = growth_findings(before, after, "host", "") if before and after else []
    if len(data["nodes"]) < 2:
        findings.append(
            Finding(
                STACK_DIFFERS.code, Status.SKIP, "host", "one node in the process group: nothing to compare", "", {}
            )
        )
        return findings, {}
    if "facts" not in data:
        findings.append(
            Finding(
                STACK_DIFFERS.code, Status.PASS, "host", "cross-node verdicts are in global rank 0's report", "", {}
            )
        )
        return findings, {}
    facts, problems = received_facts(data, labels, set(ctx.registry.codes) if ctx.registry else set())
    findings += problems
    data = {**data, "facts": facts}
    findings += comparison_findings({labels[k]: v for k, v in facts.items()})
    findings += bandwidth_findings(ctx, data, labels, p.device != "cuda")
    findings += remote_growth(facts, data["counters_after"], labels, mine)
    findings += forwarded(facts, labels, mine)
    return findings, {
        "tables": [nodes_table(data, labels)],
        "nodes_run": {k: v for k, v in data.items() if k != "facts"},
    }


def received_facts(
    data: dict[str, Any], labels: dict[str, str], known_codes: set[str]
) -> tuple[dict[str, dict[str, Any]], list[Finding]]:
    """The nodes' facts held to the shape gpudoctor sends (knowledge/node_facts.py), and GD464 for
    the nodes that sent none or none usable (a wrong type, a payload over the bound)."""
    from gpudoctor.knowledge.node_facts import Malformed, clean_facts

    facts: dict[str, dict[str, Any]] = {}
    missing, unusable, notes = [], {}, []
    raw = data.get("facts") if isinstance(data.get("facts"), dict) else {}
    for key in labels:
        value = raw.get(key)
        if value is None:
            missing.append(labels[key])
            continue
        try:
            facts[key], left = clean_facts(value, known_codes)
        except Malformed as exc:
            unusable[labels[key]] = str(exc)
            continue
        notes += [f"node {labels[key]}: {n}" for n in left]
    said = [(f"node:{missing[0]}", f"no facts from node(s) {listed(missing)}", missing)] if missing else []
    said += [(f"node:{n}", f"the facts node {n} sent are not usable: {why}", [n]) for n, why in unusable.items()]
    said += [("host", "; ".join(notes), [])] if notes else []
    out = [Finding(FACTS_MISSING.code, Status.WARN, s, m, FACTS_MISSING.fix, {"nodes": n}) for s, m, n in said]
    return facts, out


def _not_completed(result: LaunchResult) -> Finding:
    msg = not_run_message(result, "cross-node tests")
    return Finding(NOT_COMPLETED.code, Status.FAIL, "host", msg, NOT_COMPLETED.fix, {"launch": result.to_json()})
