"""The nodes compared, pure: which node differs from the majority in a fact (driver, NCCL, GPUs,
NVLinks, NIC firmware, rails, MTU, GPUDirect RDMA: GD460-GD463), which node's own figure is low
against the median of nodes measured alike (GD683), and the other nodes' findings, grouped. One
definition for both callers: the torchrun/srun `nodes` check (facts gathered to rank 0) and
`gpudoctor fleet` (facts read from saved snapshots and reports, gpudoctor/fleet.py)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Collection
from typing import Any

from gpudoctor.checks.active.node_codes import (
    FIRMWARE_DIFFERS,
    GPUS_DIFFER,
    INTRA_SLOW,
    NETWORK_DIFFERS,
    STACK_DIFFERS,
)
from gpudoctor.engine.codes import Code
from gpudoctor.findings import Finding, Status
from gpudoctor.knowledge.odd_one_out import odd_one_out
from gpudoctor.knowledge.pair_isolation import SLOW_RATIO
from gpudoctor.knowledge.units import listed

# The node-facts fields compared (knowledge/node_facts.py FACTS; host, capacity, counters and
# findings are not facts to agree on).
FIELDS = ("driver", "cuda", "nccl", "torch", "gpus", "vbios", "nvlinks", "nics", "mtu", "ethernet", "gpudirect")


def labels_for(nodes: list[dict[str, Any]]) -> dict[str, str]:
    """Node key -> the name a report uses: the hostname, or host#node-rank where hosts repeat."""
    hosts = Counter(n["host"] for n in nodes)
    return {n["key"]: n["host"] if hosts[n["host"]] == 1 else n["key"] for n in nodes}


def value_text(value: Any) -> str:
    if value == ():
        return "none"
    if isinstance(value, tuple):
        return (
            ", ".join(f"{n}x {m}" for m, n in value)
            if value and isinstance(value[0], tuple)
            else "/".join(map(str, value))
        )
    return "unknown" if value is None else str(value)


MAX_GROUPS_SHOWN = 6  # values a tie's message names (all are in its evidence)


def compare(
    code: Code, what: str, values: dict[str, Any], status: Status, why: str | Callable[[Any], str] = "", hint: str = ""
) -> list[Finding]:
    """Findings naming the nodes whose `what` differs from the majority's (or every group on a tie);
    `why`: what it means, or a function of the odd value that says it (a node with none of them)."""
    because = why if callable(why) else (lambda value: why)
    split = odd_one_out(values)
    if not split.differs:
        return []
    if split.majority is not None:
        alike, total = len(split.groups[split.majority]), len(values)
        # "the other 3" of 4 other nodes would say the fourth has the majority's value too
        others = f"the other {alike} node(s)" if alike == total - 1 else f"{alike} of the other {total - 1} nodes"
        return [
            Finding(
                code.code,
                status,
                f"node:{node}",
                f"node {node} has {what} {value_text(value)}, {others} {value_text(split.majority)}{because(value)}",
                hint or code.fix,
                {"field": what, "value": value_text(value), "majority": value_text(split.majority)},
            )
            for node, value in split.odd.items()
        ]
    groups = list(split.groups.items())
    parts = "; ".join(f"{value_text(v)} on {listed(m)}" for v, m in groups[:MAX_GROUPS_SHOWN])
    parts += f"; +{len(groups) - MAX_GROUPS_SHOWN} more value(s)" if len(groups) > MAX_GROUPS_SHOWN else ""
    first = next(iter(split.groups.values()))[0]
    return [
        Finding(
            code.code,
            status,
            f"node:{first}",
            f"nodes differ in {what}, no majority: {parts}{'' if callable(why) else why}",
            hint or code.fix,
            {"field": what, "groups": {value_text(v): m for v, m in split.groups.items()}},
        )
    ]


def comparison_findings(facts: dict[str, dict[str, Any]], fields: Collection[str] | None = None) -> list[Finding]:
    """The nodes that differ from the majority in each fact; `fields`: the node-facts fields every
    node recorded (None: all; a saved report records fewer than a snapshot, node_record.REPORTED),
    the others are not compared (an unknown value is no difference)."""
    out: list[Finding] = []
    wanted = set(FIELDS if fields is None else fields)
    if "nccl" in wanted:
        nccl = {n: f.get("nccl") for n, f in facts.items()}
        out += compare(STACK_DIFFERS, "NCCL", nccl, Status.FAIL, ": NCCL refuses to start across NCCL versions")
    for field, what in (("driver", "driver"), ("cuda", "CUDA (driver)"), ("torch", "torch")):
        if field in wanted:
            out += compare(STACK_DIFFERS, what, {n: f.get(field) for n, f in facts.items()}, Status.WARN)
    out += _gpus_differ(facts, wanted)
    out += _network_differs(facts, wanted)
    if not out:
        out.append(_alike(facts, wanted))
    return out


def _gpus_differ(facts: dict[str, dict[str, Any]], wanted: set[str]) -> list[Finding]:
    out: list[Finding] = []
    if "gpus" not in wanted:
        return out
    models = {n: tuple(sorted(set(f.get("gpus") or []))) for n, f in facts.items()}
    paces = ": the slowest node paces every step"
    out += compare(GPUS_DIFFER, "GPU models", models, Status.FAIL, lambda v: paces if v else ": it sees no GPU")
    if not odd_one_out(models).differs:
        counts = {n: len(f.get("gpus") or []) for n, f in facts.items()}
        out += compare(GPUS_DIFFER, "GPU count", counts, Status.WARN)
    links = {n: tuple(sorted(x for x in f.get("nvlinks") or [] if x is not None)) for n, f in facts.items()}
    if "nvlinks" in wanted:
        out += compare(GPUS_DIFFER, "active NVLinks per GPU", links, Status.WARN, ": see that node's GD402")
    return out


def _network_differs(facts: dict[str, dict[str, Any]], wanted: set[str]) -> list[Finding]:
    out: list[Finding] = []
    kinds = sorted({nic.get("hca_type") or "?" for f in facts.values() for nic in f.get("nics") or []})
    kinds = kinds if "nics" in wanted else []
    for kind in kinds:
        fw = {
            n: tuple(
                sorted(
                    {nic.get("fw_ver") or "?" for nic in f.get("nics") or [] if (nic.get("hca_type") or "?") == kind}
                )
            )
            for n, f in facts.items()
        }
        out += compare(FIRMWARE_DIFFERS, f"{kind} NIC firmware", fw, Status.WARN)
    if "vbios" in wanted:
        vbios = {n: tuple(f.get("vbios") or []) for n, f in facts.items()}
        out += compare(FIRMWARE_DIFFERS, "GPU VBIOS", vbios, Status.WARN)
    if "nics" in wanted:
        per_node_rails = {n: rails(f) for n, f in facts.items()}
        out += compare(
            NETWORK_DIFFERS, "RDMA rails", per_node_rails, Status.FAIL, ": the node with less paces every collective"
        )
    if "mtu" in wanted:
        mtus = {n: tuple(sorted(set((f.get("mtu") or {}).values()))) for n, f in facts.items()}
        out += compare(NETWORK_DIFFERS, "RDMA interface MTU", mtus, Status.WARN)
    if "ethernet" in wanted:
        ether = {n: tuple(sorted(f.get("ethernet") or [])) for n, f in facts.items()}
        out += compare(NETWORK_DIFFERS, "Ethernet links (Mb/s, MTU)", ether, Status.WARN)
    if "gpudirect" in wanted:
        gdr = {n: f.get("gpudirect") for n, f in facts.items()}
        out += compare(NETWORK_DIFFERS, "GPUDirect RDMA", gdr, Status.WARN)
    return out


def _alike(facts: dict[str, dict[str, Any]], wanted: set[str]) -> Finding:
    """The pass line: what every node has in common (the facts compared)."""
    one = next(iter(facts.values()), {})
    parts = [f"driver {value_text(one.get('driver'))}"]
    parts += [f"NCCL {one.get('nccl')}", f"torch {one.get('torch')}"] if {"nccl", "torch"} <= wanted else []
    parts.append(f"{len(one.get('gpus') or [])} GPU(s)")
    parts += [f"RDMA rails {value_text(rails(one))}"] if "nics" in wanted else []
    return Finding(
        STACK_DIFFERS.code,
        Status.PASS,
        "host",
        f"{len(facts)} nodes alike: {', '.join(parts)}",
        "",
        {"nodes": len(facts)},
    )


def rails(facts: dict[str, Any]) -> tuple[Any, ...]:
    """A node's active RDMA ports as (link layer, rate) counts: what the node can carry."""
    ports = Counter(
        (q.get("link_layer") or "?", q.get("rate_gbps"))
        for nic in facts.get("nics") or []
        for q in nic.get("ports") or []
        if q.get("state") == "ACTIVE"
    )
    return tuple(sorted(((f"{layer} {rate:g} Gb/s" if rate else layer), n) for (layer, rate), n in ports.items()))


def forwarded(facts: dict[str, dict[str, Any]], labels: dict[str, str], skip: str, hint: str = "") -> list[Finding]:
    """The other nodes' findings that are not a pass, one finding per code and status; `hint` (with
    {node}) says where the details are."""
    grouped: dict[tuple[str, str], list[tuple[str, dict[str, str]]]] = {}
    for key, f in facts.items():
        if key == skip:
            continue
        for item in f.get("findings") or []:
            grouped.setdefault((item["code"], item["status"]), []).append((labels.get(key, key), item))
    out = []
    for (code, status), items in sorted(grouped.items()):
        nodes = sorted({node for node, _ in items})
        node, first = items[0]
        where = f"on node {node}" if len(nodes) == 1 else f"on {len(nodes)} nodes ({listed(nodes)})"
        extra = len(items) - len(nodes)  # several findings of this code on one node
        more = f" (+{extra} more {code} finding(s))" if extra > 0 else ""
        out.append(
            Finding(
                code,
                Status(status),
                f"node:{node}",
                f"{where}: {first['message']}{more}",
                (hint or "run `gpudoctor check` on {node} for the details and hints").format(node=node),
                {"nodes": nodes, "findings": [dict(i, node=n) for n, i in items[:20]]},
            )
        )
    return out


def intra_ratios(intra: dict[str, dict[str, Any]]) -> dict[str, float]:
    """Each node's own figure relative to the median of the nodes measured the same way."""
    import statistics  # lazy: check --quick does not pay for its import

    out = {}
    shapes: dict[tuple[str, int], list[str]] = {}
    for key, v in intra.items():
        shapes.setdefault((v["kind"], v["ranks"]), []).append(key)
    for keys in shapes.values():
        mid = statistics.median(intra[k]["gbps"] for k in keys)
        for k in keys:
            out[k] = intra[k]["gbps"] / mid if mid > 0 else 1.0
    return out


def intra_findings(
    intra: dict[str, dict[str, Any]], labels: dict[str, str], ratios: dict[str, float] | None = None
) -> list[Finding]:
    """GD683 for each node whose own figure is below SLOW_RATIO of the median of the nodes measured
    alike (`intra`: node -> {"kind", "ranks", "gbps"}; `ratios`: intra_ratios(intra), if known)."""
    out = []
    for node, ratio in sorted((intra_ratios(intra) if ratios is None else ratios).items()):
        if ratio < SLOW_RATIO:
            v = intra[node]
            out.append(
                Finding(
                    INTRA_SLOW.code,
                    Status.WARN,
                    f"node:{labels.get(node, node)}",
                    f"node {labels.get(node, node)}'s own "
                    f"{'memory copy' if v['kind'] == 'copy' else 'all-reduce'} ran at {v['gbps']:.3g} GB/s, "
                    f"{ratio:.2f} of the other nodes'",
                    INTRA_SLOW.fix,
                    {"node": node, **v, "ratio": round(ratio, 3)},
                )
            )
    return out
