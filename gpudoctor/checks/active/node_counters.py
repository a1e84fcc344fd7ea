"""RDMA error counters before and after the active run, on this node and on the others (GD443)."""

from __future__ import annotations

from typing import Any

from gpudoctor.checks.active.node_codes import COUNTERS_GROWING
from gpudoctor.engine.context import CheckContext
from gpudoctor.findings import Finding, Status
from gpudoctor.knowledge.nic_ports import network_of, port_views
from gpudoctor.snapshot import RDMA_ERROR_COUNTERS

GROW_FAILS = ("link_downed", "link_error_recovery")


def growth_findings(
    before: dict[str, dict[str, int]], after: dict[str, dict[str, int]], subject: str, where: str
) -> list[Finding]:
    out = []
    compared = 0
    for port in sorted(set(before) & set(after)):
        rose = {k: after[port][k] - before[port].get(k, 0) for k in after[port] if k in before[port]}
        if any(d < 0 for d in rose.values()):
            continue  # cleared in between: no growth to tell
        compared += 1
        rose = {k: d for k, d in rose.items() if d > 0}
        stuck = [k for k, v in before[port].items() if v >= (1 << RDMA_ERROR_COUNTERS.get(k, 64)) - 1]
        if not rose:
            continue
        status = Status.FAIL if any(k in GROW_FAILS for k in rose) else Status.WARN
        text = ", ".join(f"{k} +{d}" for k, d in rose.items())
        out.append(
            Finding(
                COUNTERS_GROWING.code,
                status,
                subject,
                f"{where}{port.replace(':', ' port ')}: {text} during the run",
                COUNTERS_GROWING.fix,
                {"port": port, "before": before[port], "after": after[port], "saturated_before": stuck},
            )
        )
    if not out and compared:
        out.append(
            Finding(
                COUNTERS_GROWING.code,
                Status.PASS,
                subject,
                f"{where}error counters of {compared} RDMA port(s) unchanged over the run",
                "",
                {},
            )
        )
    return out


def received_counters(data: dict[str, Any]) -> dict[str, dict[str, dict[str, int]]]:
    """The RDMA counters each node read after the run, held to their shape; a node's that are not left out."""
    from gpudoctor.knowledge.node_facts import COUNTERS, Malformed

    out = {}
    raw = data.get("counters_after") if isinstance(data.get("counters_after"), dict) else {}
    for key, value in raw.items():
        try:
            out[key] = COUNTERS(value, "counters_after")
        except Malformed:
            continue
    return out


def remote_growth(
    facts: dict[str, dict[str, Any]], after: dict[str, dict[str, dict[str, int]]], labels: dict[str, str], mine: str
) -> list[Finding]:
    """GD443 for the other nodes: the ports whose counters rose, one pass line for all the rest."""
    out: list[Finding] = []
    checked = 0
    for key, f in facts.items():
        before = f.get("counters") or {}
        if key == mine or not before or key not in after:
            continue
        checked += 1
        grew = growth_findings(before, after[key], f"node:{labels[key]}", f"node {labels[key]} ")
        out += [g for g in grew if g.status is not Status.PASS]
    if checked and not out:
        out.append(
            Finding(
                COUNTERS_GROWING.code,
                Status.PASS,
                "host",
                f"RDMA error counters of the other {checked} node(s) unchanged over the run",
                "",
                {},
            )
        )
    return out


def network_facts_counters(ctx: CheckContext) -> dict[str, dict[str, int]]:
    return {v.key: v.port.counters for v in port_views(network_of(ctx.snapshot)) if isinstance(v.port.counters, dict)}
