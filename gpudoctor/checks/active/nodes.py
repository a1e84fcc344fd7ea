"""GD46 (cross-node comparisons), GD68 (inter-node bandwidth, the slow node or pair) and GD443
(RDMA error counters growing during the run): the multi-node view, in global rank 0's report.

Active: under torchrun/srun the shared launch (active_common) runs the `nodes` workload after the
all-reduce and DDP tasks. Each node's parent sends its facts (`node_facts`, from its own snapshot
and its own static findings); rank 0 compares them, judges the inter-node all-reduce against what
the NICs should carry (network_expectation.py) and names the slow node or pair from the pairwise
rounds. On one node only the counter growth over the active run is judged.
"""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpudoctor.checks.active.common import Plan, not_run_message, plan, skip_finding
from gpudoctor.checks.targets import target_gpus
from gpudoctor.engine import check
from gpudoctor.engine.codes import Code
from gpudoctor.engine.context import CheckContext
from gpudoctor.engine.runner import run_one
from gpudoctor.engine.selection import Selection
from gpudoctor.findings import Finding, Status
from gpudoctor.knowledge.facts import facts_from_snapshot
from gpudoctor.knowledge.nic_ports import network_of, port_views
from gpudoctor.knowledge.node_facts import MAX_FORWARDED
from gpudoctor.knowledge.odd_one_out import odd_one_out
from gpudoctor.knowledge.pair_isolation import SLOW_RATIO, Analysis, analyse, merged, retested
from gpudoctor.knowledge.units import listed
from gpudoctor.snapshot import RDMA_ERROR_COUNTERS, known

if TYPE_CHECKING:  # launch loads when a run starts: check --quick never pays for it
    from gpudoctor.launch import LaunchResult, Task

COUNTERS_GROWING = Code(
    "GD443",
    "rdma-port-errors-growing",
    "InfiniBand/RoCE error counters do not grow during the run",
    what="Reads every RDMA port's error counters when gpudoctor starts and again after the active run "
    "(on every node under torchrun/srun) and reports those that rose: link_downed or link_error_recovery "
    "rising fails (the link went down or retrained while traffic ran), symbol_error, port_rcv_errors or "
    "excessive_buffer_overrun_errors rising warns. A counter already saturated cannot rise and is named.",
    why="A counter that rises under load is a link failing now, not an old event: NCCL connections over it "
    "fail ('IB completion with error', watchdog timeouts) or slow down with retransmissions. Which "
    "counter rises is a heuristic of what is wrong (symbol errors: signal quality; link downed: flaps).",
    fix="Drain the node; reseat or replace the cable/transceiver of the named port; look at the switch "
    "port's counters too (`ibqueryerrors`, `perfquery`); clear the counters (`perfquery -x`) and re-run.",
)
STACK_DIFFERS = Code(
    "GD460",
    "node-stack-differs",
    "Every node runs the same driver, CUDA, NCCL and torch",
    what="Compares, across the nodes of a torchrun/srun job, the NVIDIA driver, the CUDA version the driver "
    "supports, the NCCL torch bundles and the torch version, and names the nodes that differ from the "
    "majority.",
    why="NCCL refuses to start across different NCCL versions ('Mismatched NCCL version detected', "
    "src/init.cc: every rank fails at init). Different drivers or torch builds give different kernels "
    "and timings on one node: a slow or failing rank paces or breaks the whole job.",
    fix="Use one container image or environment on every node; upgrade or pin the odd node's driver and "
    "packages to the others'.",
)
GPUS_DIFFER = Code(
    "GD461",
    "node-gpus-differ",
    "Every node has the same GPUs",
    what="Compares the GPU models and counts of each node (the GPUs NVML sees, as every report's `facts` "
    "block lists them) and their active NVLinks.",
    why="A data-parallel step waits for the slowest rank: a node with slower GPUs paces every node, and a "
    "node with fewer GPUs than the others changes the world size the job was planned for.",
    fix="Schedule the job on identical nodes (a Slurm constraint or node selector on the GPU model), or "
    "hide the odd GPUs with CUDA_VISIBLE_DEVICES.",
)
FIRMWARE_DIFFERS = Code(
    "GD462",
    "node-firmware-differs",
    "NIC and GPU firmware are alike across nodes",
    what="Compares the RDMA NIC firmware (per HCA type) and the GPU VBIOS versions across nodes.",
    why="Fleets drift when a node is repaired or re-imaged: NIC firmware versions differ in link "
    "training, congestion control and bug fixes, so the odd node behaves differently on the fabric.",
    fix="Flash the odd node's NIC firmware (mlxfwmanager / mstflint) and GPU VBIOS to the fleet's version.",
)
NETWORK_DIFFERS = Code(
    "GD463",
    "node-network-differs",
    "Every node has the same NIC rails, rates, MTU and GPUDirect RDMA",
    what="Compares across nodes the RDMA rails (kind, count, rate), the MTU of the RDMA interfaces, the "
    "speed and MTU of the physical Ethernet interfaces that are up, and whether GPUDirect RDMA is available. "
    "Fewer or slower rails fail; the rest warns.",
    why="A node whose rails are fewer or slower carries less than the others and every collective waits "
    "for it; an MTU that differs across RoCE nodes drops or fragments packets; a node without "
    "GPUDirect RDMA stages its traffic through host memory.",
    fix="Bring the odd node to the fleet's configuration (cables, switch port speed, MTU, nvidia_peermem).",
)
FACTS_MISSING = Code(
    "GD464",
    "node-facts-missing",
    "Every node's facts reached rank 0",
    what="Checks that each node's gpudoctor sent its facts (driver, packages, GPUs, NICs, static findings) "
    "to global rank 0 in the gather of the `nodes` workload, in the shape gpudoctor sends them: facts over "
    "1 MiB, of another shape (a list where a text belongs, an endless text, a number that is not finite) "
    "count as not sent, and forwarded findings with a code this gpudoctor does not know are left out "
    "(gpudoctor/knowledge/node_facts.py).",
    why="A node that sent nothing, or nothing usable, cannot be compared: its differences would go unseen.",
    fix="Run gpudoctor the same way on every node (the same torchrun command, the same gpudoctor version).",
)
INTERNODE_BUSBW = Code(
    "GD680",
    "internode-busbw",
    "Inter-node all-reduce reaches what the NICs should carry",
    what="Times an all-reduce over every rank of the job (256 MiB on GPUs, 2 MiB on CPU; median iteration, "
    "the slowest rank's time) and compares its busbw with the NICs' line rate x 0.96 (the slowest node's "
    "rails; NVIDIA/nccl-tests#119: 24 GB/s per 200G NIC). Below 0.8 of it warns, below 0.5 fails. On CPU "
    "(gloo) and without RDMA rails the figure is reported without a verdict.",
    why="One slow link or node paces every collective of the job: the whole run slows by that factor.",
    fix="Read GD681/GD682 (which node or pair is slow), the GD44x findings of that node (ports, rates, "
    "locality, GPUDirect RDMA) and GD463 (nodes that differ).",
)
SLOW_NODE = Code(
    "GD681",
    "slow-node",
    "No node is slow in every pairwise test",
    what="When the inter-node all-reduce is low (or on CPU, where there is no expectation) and there are 3 "
    "or more nodes, runs all-reduce between node pairs, all disjoint pairs at once, for 3 rounds of the "
    "round-robin circle method (each node meets 3 partners, whatever the node count); a pair's figure is its "
    "best iteration, so a passing hiccup names nobody. A node whose every "
    "pair ran below 0.7 of the typical pair (the upper quartile of all pair results) is named (the 0.7 is a "
    "heuristic). Its own intra-node figure "
    "(all-reduce over its ranks, or a memory copy) tells a node problem from a network problem. With two "
    "nodes and a low inter-node figure (GD680), the node whose own figure is low is named.",
    why="The slow node paces the job; a node slow with every partner is the node's own NIC, cable, switch "
    "port or (if its intra-node figure is low too) the node itself. NCCL's maintainers isolate it the "
    "same way (NVIDIA/nccl#325: if 1<->3 and 2<->4 are good but 1<->2 is bad, it is the fabric).",
    fix="Drain the named node; look at its GD44x findings; swap its cable or switch port, or fix the node "
    "(GPU clocks, PCIe, GD4/GD8) when its intra-node figure is low too.",
)
SLOW_PAIR = Code(
    "GD682",
    "slow-pair",
    "No node pair is slow while both nodes are fast with others",
    what="From the same pairwise rounds: a pair that ran below 0.7 of the typical pair while neither node is "
    "slow with its other partners, measured again (the better figure counts) before it is named. With only "
    "two nodes, a low inter-node figure names the pair unless one node's own figure is low.",
    why="A pair that is slow only together is the fabric between them (a routing collision, a bad switch-"
    "to-switch link), not either node (NVIDIA/nccl#325).",
    fix="Check the switch path between the two nodes (UFM, ibdiagnet, the spine links' counters); with "
    "adaptive routing off, try enabling it.",
)
INTRA_SLOW = Code(
    "GD683",
    "node-intra-slow",
    "Every node's own figure is like the others'",
    what="Compares each node's intra-node figure (all-reduce over its own ranks, or a device memory copy "
    "with one rank per node), measured on all nodes at once, with the median of the nodes of the same "
    "shape; below 0.7 of it warns (a heuristic).",
    why="A node that is slow on its own (GPU clocks, a PCIe link trained down, NVLink down, a busy or "
    "throttled CPU) slows every step; its network may be fine.",
    fix="Run `gpudoctor check` on that node alone and read its GD4/GD5/GD8 findings.",
)
NOT_COMPLETED = Code(
    "GD684",
    "nodes-not-completed",
    "The cross-node tests ran to the end",
    what="Says which rank failed or did not answer when the cross-node workload (facts gather, inter-node "
    "all-reduce, pairwise rounds) could not complete.",
    why="A node that cannot take part in a collective here hangs or breaks a training job the same way.",
    fix="Read the named rank's error and the DDP findings (GD71x); a node that does not answer often has "
    "its network down (GD440) or is firewalled from the others.",
)
CODES = [
    COUNTERS_GROWING,
    STACK_DIFFERS,
    GPUS_DIFFER,
    FIRMWARE_DIFFERS,
    NETWORK_DIFFERS,
    FACTS_MISSING,
    INTERNODE_BUSBW,
    SLOW_NODE,
    SLOW_PAIR,
    INTRA_SLOW,
    NOT_COMPLETED,
]

GPU_BYTES = 256 << 20  # large enough for NICs' plateau (nccl-tests multi-node sweeps reach 8 GiB)
CPU_BYTES = 2 << 20
ROUNDS = 3
GROW_FAILS = ("link_downed", "link_error_recovery")


# --------------------------------------------------------------------------------------------
# What each node sends


def ranks_on_node(ctx: CheckContext, p: Plan) -> int:
    local = ctx.snapshot.env.get("LOCAL_WORLD_SIZE", "")
    return int(local) if local.isdigit() and int(local) > 0 else max(1, p.ranks)


def gpudirect_mode(ctx: CheckContext) -> str | None:
    from gpudoctor.knowledge.nic_ports import dmabuf_ready

    net = network_of(ctx.snapshot)
    if net is None or not known(net.gpudirect):
        return None
    peermem = getattr(net.gpudirect, "peermem", None)
    if isinstance(peermem, str):
        return peermem
    return "dma-buf" if dmabuf_ready(ctx.snapshot, net)[0] else "none"


def static_findings(ctx: CheckContext) -> list[dict[str, str]]:
    """This node's static findings that are not a pass: what rank 0 lists for the other nodes."""
    out = []
    assert ctx.registry is not None
    for chk in ctx.registry.checks.values():
        if chk.active:
            continue
        for f in run_one(chk, ctx, Selection()).findings:
            if f.status in (Status.WARN, Status.FAIL, Status.ERROR):
                out.append({"code": f.code, "status": f.status.value, "subject": f.subject, "message": f.message})
    return out[:MAX_FORWARDED]


def node_facts(ctx: CheckContext, p: Plan) -> dict[str, Any]:
    from gpudoctor.knowledge.network_expectation import node_capacity

    snap = ctx.snapshot
    gpus = target_gpus(ctx)
    net = network_of(snap)
    nics = []
    mtu: dict[str, int] = {}
    interfaces = {i.name: i for i in net.interfaces} if net and isinstance(net.interfaces, list) else {}
    for dev in net.rdma if net and isinstance(net.rdma, list) else []:
        ports = [
            {"port": q.port, "state": q.state, "rate_gbps": q.rate_gbps, "link_layer": q.link_layer} for q in dev.ports
        ]
        nics.append({"name": dev.name, "hca_type": dev.hca_type, "fw_ver": dev.fw_ver, "ports": ports})
        for name in dev.netdevs if isinstance(dev.netdevs, list) else []:
            if name in interfaces and isinstance(interfaces[name].mtu, int):
                mtu[name] = interfaces[name].mtu
    capacity = node_capacity(snap, gpus, ranks_on_node(ctx, p)) if p.device == "cuda" else None
    machine = facts_from_snapshot(snap)  # the facts every report carries (facts.py), for its GPUs and driver
    return _jsonable(
        {
            "host": snap.host.hostname,
            "driver": machine["driver_version"],
            "cuda": machine["cuda_driver_version"],
            "nccl": snap.software.torch_nccl,
            "torch": snap.software.torch,
            "gpus": [g["name"] for g in machine["gpus"]],
            "vbios": sorted({g["vbios"] for g in machine["gpus"] if g["vbios"]}),
            "nvlinks": [g["nvlinks_active"] for g in machine["gpus"]],
            "nics": nics,
            "mtu": mtu,
            "ethernet": ethernet_links(net),
            "gpudirect": gpudirect_mode(ctx),
            "capacity": capacity.to_json() if capacity else None,
            "counters": {v.key: v.port.counters for v in port_views(net) if isinstance(v.port.counters, dict)},
            "findings": static_findings(ctx),
        }
    )


def ethernet_links(net: Any) -> list[str]:
    """The node's physical Ethernet interfaces that are up, as "speed/MTU" (NCCL's socket
    transport and RoCE ride on them): what should be alike across nodes."""
    if net is None or not isinstance(net.interfaces, list):
        return []
    return sorted(
        f"{i.speed_mbps if isinstance(i.speed_mbps, int) else '?'} Mb/s MTU {i.mtu if isinstance(i.mtu, int) else '?'}"
        for i in net.interfaces
        if i.kind == "ether" and not i.virtual and i.operstate == "up"
    )


def _jsonable(value: Any) -> Any:
    """Missing values become None: what a node sends is plain JSON."""
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    return value if value is None or isinstance(value, str | int | float | bool) else None


def task(ctx: CheckContext, p: Plan) -> Task:
    """The `nodes` task of the shared launch (active_common.tasks_for adds it under a launcher)."""
    from gpudoctor.launch import Task

    facts = node_facts(ctx, p)
    capacity = facts.get("capacity") or {}
    return Task(
        "nodes",
        {
            "facts": facts,
            "bytes": GPU_BYTES if p.device == "cuda" else CPU_BYTES,
            "warmup": 2 if p.device == "cuda" else 1,
            "iters": 10 if p.device == "cuda" else 7,
            "rounds": ROUNDS,
            "expected_gbps": capacity.get("expected_gbps"),
            "low_ratio": ctx.options.busbw_warn_ratio,
        },
    )


# --------------------------------------------------------------------------------------------
# Judging what came back


def labels_for(nodes: list[dict[str, Any]]) -> dict[str, str]:
    """Node key -> the name a report uses: the hostname, or host#node-rank where hosts repeat."""
    hosts = Counter(n["host"] for n in nodes)
    return {n["key"]: n["host"] if hosts[n["host"]] == 1 else n["key"] for n in nodes}


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


def _value_text(value: Any) -> str:
    if value == ():
        return "none"
    if isinstance(value, tuple):
        return (
            ", ".join(f"{n}x {m}" for m, n in value)
            if value and isinstance(value[0], tuple)
            else "/".join(map(str, value))
        )
    return "unknown" if value is None else str(value)


def compare(
    code: Code, what: str, values: dict[str, Any], status: Status, why: str = "", hint: str = ""
) -> list[Finding]:
    """Findings naming the nodes whose `what` differs from the majority's (or every group on a tie)."""
    split = odd_one_out(values)
    if not split.differs:
        return []
    if split.majority is not None:
        others = len(split.groups[split.majority])
        return [
            Finding(
                code.code,
                status,
                f"node:{node}",
                f"node {node} has {what} {_value_text(value)}, the other {others} node(s) "
                f"{_value_text(split.majority)}{why}",
                hint or code.fix,
                {"field": what, "value": _value_text(value), "majority": _value_text(split.majority)},
            )
            for node, value in split.odd.items()
        ]
    parts = "; ".join(f"{_value_text(v)} on {listed(m)}" for v, m in split.groups.items())
    first = next(iter(split.groups.values()))[0]
    return [
        Finding(
            code.code,
            status,
            f"node:{first}",
            f"nodes differ in {what}, no majority: {parts}{why}",
            hint or code.fix,
            {"field": what, "groups": {_value_text(v): m for v, m in split.groups.items()}},
        )
    ]


def comparison_findings(facts: dict[str, dict[str, Any]]) -> list[Finding]:
    out: list[Finding] = []
    nccl = {n: f.get("nccl") for n, f in facts.items()}
    out += compare(STACK_DIFFERS, "NCCL", nccl, Status.FAIL, ": NCCL refuses to start across NCCL versions")
    for field, what in (("driver", "driver"), ("cuda", "CUDA (driver)"), ("torch", "torch")):
        out += compare(STACK_DIFFERS, what, {n: f.get(field) for n, f in facts.items()}, Status.WARN)
    models = {n: tuple(sorted(set(f.get("gpus") or []))) for n, f in facts.items()}
    out += compare(GPUS_DIFFER, "GPU models", models, Status.FAIL, ": the slowest node paces every step")
    if not odd_one_out(models).differs:
        counts = {n: len(f.get("gpus") or []) for n, f in facts.items()}
        out += compare(GPUS_DIFFER, "GPU count", counts, Status.WARN)
    links = {n: tuple(sorted(x for x in f.get("nvlinks") or [] if x is not None)) for n, f in facts.items()}
    out += compare(GPUS_DIFFER, "active NVLinks per GPU", links, Status.WARN, ": see that node's GD402")
    kinds = sorted({nic.get("hca_type") or "?" for f in facts.values() for nic in f.get("nics") or []})
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
    out += compare(
        FIRMWARE_DIFFERS, "GPU VBIOS", {n: tuple(f.get("vbios") or []) for n, f in facts.items()}, Status.WARN
    )
    rails = {n: _rails(f) for n, f in facts.items()}
    out += compare(NETWORK_DIFFERS, "RDMA rails", rails, Status.FAIL, ": the node with less paces every collective")
    mtus = {n: tuple(sorted(set((f.get("mtu") or {}).values()))) for n, f in facts.items()}
    out += compare(NETWORK_DIFFERS, "RDMA interface MTU", mtus, Status.WARN)
    ether = {n: tuple(sorted(f.get("ethernet") or [])) for n, f in facts.items()}
    out += compare(NETWORK_DIFFERS, "Ethernet links (Mb/s, MTU)", ether, Status.WARN)
    out += compare(NETWORK_DIFFERS, "GPUDirect RDMA", {n: f.get("gpudirect") for n, f in facts.items()}, Status.WARN)
    if not out:
        any_facts = next(iter(facts.values()), {})
        out.append(
            Finding(
                STACK_DIFFERS.code,
                Status.PASS,
                "host",
                f"{len(facts)} nodes alike: driver {any_facts.get('driver')}, NCCL {any_facts.get('nccl')}, "
                f"torch {any_facts.get('torch')}, {len(any_facts.get('gpus') or [])} GPU(s), "
                f"{_value_text(rails[next(iter(rails))])} rails",
                "",
                {"nodes": len(facts)},
            )
        )
    return out


def _rails(facts: dict[str, Any]) -> tuple[Any, ...]:
    """A node's active RDMA ports as (link layer, rate) counts: what the node can carry."""
    ports = Counter(
        (q.get("link_layer") or "?", q.get("rate_gbps"))
        for nic in facts.get("nics") or []
        for q in nic.get("ports") or []
        if q.get("state") == "ACTIVE"
    )
    return tuple(sorted(((f"{layer} {rate:g} Gb/s" if rate else layer), n) for (layer, rate), n in ports.items()))


def forwarded(facts: dict[str, dict[str, Any]], labels: dict[str, str], skip: str) -> list[Finding]:
    """The other nodes' static findings that are not a pass, one finding per code and status."""
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
                f"run `gpudoctor check` on {node} for the details and hints",
                {"nodes": nodes, "findings": [dict(i, node=n) for n, i in items[:20]]},
            )
        )
    return out


def isolation_of(data: dict[str, Any]) -> Analysis:
    """The pairwise rounds' verdict, each pair at the better of its round and its retest."""
    iso = data.get("isolation") or {}
    retests = iso.get("retests") or []
    return analyse(merged(iso.get("rounds") or [], retests), confirmed=retested(retests))


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
    for node, ratio in sorted(ratios.items()):
        if ratio < SLOW_RATIO:
            v = data["intra"][node]
            out.append(
                Finding(
                    INTRA_SLOW.code,
                    Status.WARN,
                    f"node:{labels.get(node, node)}",
                    f"node {labels.get(node, node)}'s own "
                    f"{'all-reduce' if v['kind'] != 'copy' else 'memory copy'} ran at {v['gbps']:.3g} GB/s, "
                    f"{ratio:.2f} of the other nodes'",
                    INTRA_SLOW.fix,
                    {"node": node, **v, "ratio": round(ratio, 3)},
                )
            )
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
                _value_text(_rails(f)) or "-",
                "-" if i is None else f"{i['gbps']:.3g}",
                "-" if p is None else f"{p.slow}/{p.tests} slow, best {p.best:.3g}",
            ]
        )
    return {
        "title": f"nodes ({data['bytes'] >> 20} MiB all-reduce)" if data["bytes"] >= 1 << 20 else "nodes",
        "columns": ["node", "host", "ranks", "GPUs", "driver", "NCCL", "rails", "own GB/s", "pair tests GB/s"],
        "rows": rows,
    }


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


def _not_completed(result: LaunchResult) -> Finding:
    msg = not_run_message(result, "cross-node tests")
    return Finding(NOT_COMPLETED.code, Status.FAIL, "host", msg, NOT_COMPLETED.fix, {"launch": result.to_json()})
