"""The inter-node bandwidth judged (GD680), the slow node or pair from the pairwise rounds (GD681,
GD682) and the nodes table of rank 0's report: what the `nodes` workload measured."""

from __future__ import annotations

from collections import Counter
from typing import Any

from gpudoctor.checks.active.node_codes import INTERNODE_BUSBW, SLOW_NODE, SLOW_PAIR
from gpudoctor.checks.active.node_comparison import intra_findings, intra_ratios, rails, value_text
from gpudoctor.engine.context import CheckContext
from gpudoctor.findings import Finding, Status
from gpudoctor.knowledge.pair_isolation import SLOW_RATIO, Analysis, analyse, merged, retested


def isolation_of(data: dict[str, Any]) -> Analysis:
    """The pairwise rounds' verdict, each pair at the better of its round and its retest."""
    iso = data.get("isolation") or {}
    retests = iso.get("retests") or []
    return analyse(merged(iso.get("rounds") or [], retests), confirmed=retested(retests))


def _diagnosis(ratio: float | None) -> str:
    if ratio is None:
        return "its own figure is unknown"
    if ratio < SLOW_RATIO:
        return f"its own intra-node figure is low too ({ratio:.2f} of the others'): the node itself"
    return f"its own intra-node figure is normal ({ratio:.2f} of the others'): its network (NIC, cable, switch port)"


def bandwidth_findings(ctx: CheckContext, data: dict[str, Any], labels: dict[str, str], cpu: bool) -> list[Finding]:
    out = []
    full = data["full"]
    facts = data.get("facts") or {}
    caps = [f.get("capacity") for f in facts.values()]
    expected = None if cpu or not caps or any(c is None for c in caps) else min(c["expected_gbps"] for c in caps)
    basis = None if expected is None else min(caps, key=lambda c: c["expected_gbps"])["basis"]
    where = (
        f"inter-node all-reduce {full['busbw_gbps']:.2f} GB/s busbw over {len(labels)} nodes ({full['ranks']} ranks)"
    )
    evidence: dict[str, Any] = {"measured_busbw_gbps": round(full["busbw_gbps"], 4), "bytes": data["bytes"]}
    opts = ctx.options
    if expected is None:
        why = "CPU/gloo" if cpu else "no RDMA rails to model (TCP sockets)"
        out.append(
            Finding(INTERNODE_BUSBW.code, Status.PASS, "host", f"{where} ({why}: no hardware verdict)", "", evidence)
        )
        low = True
    else:
        from gpudoctor.knowledge.network_expectation import NET_SOURCE

        ratio = full["busbw_gbps"] / expected
        evidence.update(
            {"expected_busbw_gbps": round(expected, 3), "basis": basis, "source": NET_SOURCE, "ratio": round(ratio, 3)}
        )
        status = (
            Status.FAIL
            if ratio < opts.busbw_fail_ratio
            else Status.WARN
            if ratio < opts.busbw_warn_ratio
            else Status.PASS
        )
        low = status is not Status.PASS
        out.append(
            Finding(
                INTERNODE_BUSBW.code,
                status,
                "host",
                f"{where}; expected {expected:.1f} GB/s ({basis}), ratio {ratio:.2f}",
                "" if status is Status.PASS else INTERNODE_BUSBW.fix,
                evidence,
            )
        )
    ratios = intra_ratios(data.get("intra") or {})
    iso = data.get("isolation") or {}
    analysis = isolation_of(data)
    for node in analysis.slow_nodes:
        e = analysis.per_node[node]
        out.append(
            Finding(
                SLOW_NODE.code,
                Status.FAIL,
                f"node:{labels.get(node, node)}",
                f"node {labels.get(node, node)} is slow with every partner: {e.slow} of {e.tests} pair tests "
                f"below {SLOW_RATIO:g} of the typical pair ({e.worst:.3g} vs {analysis.typical:.3g} GB/s); "
                f"{_diagnosis(ratios.get(node))}",
                SLOW_NODE.fix,
                {
                    "node": node,
                    **vars(e),
                    "typical_pair_gbps": analysis.typical,
                    "intra_ratio": ratios.get(node),
                },
            )
        )
    for (a, b), bw in analysis.slow_pairs:
        la, lb = labels.get(a, a), labels.get(b, b)
        out.append(
            Finding(
                SLOW_PAIR.code,
                Status.FAIL,
                f"node:{la},{lb}",
                f"nodes {la} and {lb} are slow together ({bw:.3g} vs a typical pair of {analysis.typical:.3g} GB/s) "
                "but fast with their other partners: the fabric between them",
                SLOW_PAIR.fix,
                {"nodes": [a, b], "busbw_gbps": bw, "typical_pair_gbps": analysis.typical},
            )
        )
    if len(labels) == 2 and low and expected is not None:
        out += _two_nodes(labels, ratios)
    elif iso.get("ran") and not analysis.slow_nodes and not analysis.slow_pairs:
        out.append(
            Finding(
                SLOW_NODE.code,
                Status.PASS,
                "host",
                f"{sum(len(r) for r in iso['rounds'])} pair tests in {len(iso['rounds'])} round(s): no node or pair "
                f"below {SLOW_RATIO:g} of the typical pair ({analysis.typical:.3g} GB/s)",
                "",
                {"typical_pair_gbps": analysis.typical, "retested": len(iso.get("retests") or [])},
            )
        )
    elif iso.get("skipped"):
        out.append(Finding(SLOW_NODE.code, Status.SKIP, "host", f"pairwise tests not run: {iso.get('why')}", "", {}))
    elif not iso.get("ran") and len(labels) > 2:
        out.append(Finding(SLOW_NODE.code, Status.PASS, "host", f"pairwise tests not needed: {iso.get('why')}", "", {}))
    out += intra_findings(data.get("intra") or {}, labels, ratios)
    return out


def _two_nodes(labels: dict[str, str], ratios: dict[str, float]) -> list[Finding]:
    a, b = list(labels)
    slow = [k for k in (a, b) if ratios.get(k, 1.0) < SLOW_RATIO]
    if len(slow) == 1:
        node = slow[0]
        return [
            Finding(
                SLOW_NODE.code,
                Status.FAIL,
                f"node:{labels[node]}",
                f"node {labels[node]} is the likely cause: {_diagnosis(ratios.get(node))}",
                SLOW_NODE.fix,
                {"node": node, "intra_ratio": ratios.get(node)},
            )
        ]
    return [
        Finding(
            SLOW_PAIR.code,
            Status.FAIL,
            f"node:{labels[a]},{labels[b]}",
            f"the link between {labels[a]} and {labels[b]} is slow and neither node's own figure is low: with two "
            "nodes a pair test cannot tell which side; add a third node to isolate it",
            SLOW_PAIR.fix,
            {"nodes": [a, b]},
        )
    ]


def nodes_table(data: dict[str, Any], labels: dict[str, str]) -> dict[str, Any]:
    facts = data.get("facts") or {}
    intra = data.get("intra") or {}
    per_node = isolation_of(data).per_node
    rows = []
    for n in data["nodes"]:
        f = facts.get(n["key"]) or {}
        gpus = Counter(f.get("gpus") or [])
        i = intra.get(n["key"])
        p = per_node.get(n["key"])
        rows.append(
            [
                n["node_rank"],
                labels[n["key"]],
                len(n["ranks"]),
                ", ".join(f"{c}x {m}" for m, c in gpus.items()) or "-",
                f.get("driver") or "-",
                f.get("nccl") or "-",
                value_text(rails(f)) or "-",
                "-" if i is None else f"{i['gbps']:.3g}",
                "-" if p is None else f"{p.slow}/{p.tests} slow, best {p.best:.3g}",
            ]
        )
    return {
        "title": f"nodes ({data['bytes'] >> 20} MiB all-reduce)" if data["bytes"] >= 1 << 20 else "nodes",
        "columns": ["node", "host", "ranks", "GPUs", "driver", "NCCL", "rails", "own GB/s", "pair tests GB/s"],
        "rows": rows,
    }
