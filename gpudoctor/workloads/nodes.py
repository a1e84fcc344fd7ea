"""Across nodes (under torchrun/srun): gather every node's facts, time the inter-node all-reduce,
and when it is low, find the slow node or pair with pairwise tests in rounds of disjoint pairs.

Steps, in every rank (the same decisions everywhere, from the same gathered numbers):

1. A gather (JSON, to every rank) of who is where (a node is hostname + node rank), of each node's NIC
   expectation, so every rank takes the same decisions, and of how each rank makes process groups
   (`group_state`): ranks that would name a subgroup differently skip steps 3 and 4 and say why.
2. The whole group's all-reduce at one size (nccl-tests' busbw), each iteration timed, the group's
   time the slowest rank's, the figure the median iteration. (Node and pair figures below take the
   best iteration instead: a slow link is slow every time, a scheduling hiccup only once.)
3. Each node's own figure, all nodes at once in their own groups: all-reduce over the node's ranks
   (several ranks), or a device memory copy (one rank), to tell a slow node from a slow network.
4. When there are 3+ nodes and the whole-group figure is below `low_ratio` x the NICs' expectation
   (or there is no expectation, e.g. on CPU): `rounds` rounds of disjoint node pairs (the circle
   method of a round-robin, so every node meets a different partner each round and N nodes take
   `rounds` rounds, not N-1), all pairs of a round at once; a pair slow while both its nodes are
   fast with others is measured again before it is blamed (gpudoctor/knowledge/pair_isolation.py).
5. Each node's facts (`params["facts"]`, built by its parent from its snapshot) and its RDMA port
   error counters read again now (probe/network.py) gathered to rank 0 only, from the node's
   local rank 0.
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import time
from pathlib import Path
from typing import Any

from gpudoctor.knowledge.node_facts import DROPPED, MAX_PAYLOAD_BYTES
from gpudoctor.knowledge.pair_isolation import RETESTS, analyse, disjoint_batches, merged, retested
from gpudoctor.launch.faults import Faults
from gpudoctor.workloads.rank import RankContext, decoded

SLOW_FACTOR = 10.0  # the slownet/slownode faults make a timed step take this many times as long (test-only)


def node_rank_from_env() -> int:
    for name in ("GROUP_RANK", "SLURM_NODEID"):
        value = os.environ.get(name, "").strip()
        if value.isdigit():
            return int(value)
    return 0


def circle_rounds(n: int, rounds: int) -> list[list[tuple[int, int]]]:
    """The first `rounds` rounds of a round-robin tournament of n players (circle method): each
    round pairs every player with a new partner; with n odd, one player sits out per round."""
    players: list[int | None] = list(range(n)) + ([None] if n % 2 else [])
    m = len(players)
    out = []
    for _ in range(min(rounds, m - 1)):
        pairs = []
        for i in range(m // 2):
            a, b = players[i], players[m - 1 - i]
            if a is not None and b is not None:
                pairs.append((min(a, b), max(a, b)))
        out.append(sorted(pairs))
        players = [players[0], players[-1], *players[1:-1]]
    return out


def busbw(size: int, seconds: float, ranks: int) -> float:
    return size / seconds / 1e9 * (2.0 * (ranks - 1) / ranks) if ranks > 1 and seconds > 0 else 0.0


class _Timer:
    """Timed all-reduces and copies on this rank's device, with the test-only delays."""

    def __init__(self, ctx: RankContext, size: int, warmup: int, iters: int, faults: Faults) -> None:
        import torch

        self.ctx = ctx
        self.size = size
        self.warmup = warmup
        self.iters = iters
        self.buf = torch.ones(size // 4, dtype=torch.float32, device=ctx.device)
        self.slow_inter = faults.has("slownet") or faults.has("slownode")
        self.slow_intra = faults.has("slownode")

    def _slowed(self, inter: bool, t0: float) -> None:
        """The test-only faults: a link (or node) at 1/SLOW_FACTOR of its speed. The rank waits
        (SLOW_FACTOR - 1) x what the step took; its peers wait for it in the next collective."""
        if self.slow_inter if inter else self.slow_intra:
            time.sleep((time.perf_counter() - t0) * (SLOW_FACTOR - 1))

    def allreduce(self, group: Any, inter: bool) -> tuple[float, float]:
        """The group's median and best iteration times (each iteration's time the slowest rank's).
        The best one is what the links can do: a slow link is slow every time, a hiccup once."""
        import torch
        import torch.distributed as dist

        times = []
        for i in range(self.warmup + self.iters):
            self.ctx.sync()
            t0 = time.perf_counter()
            dist.all_reduce(self.buf, group=group)
            self.ctx.sync()
            self._slowed(inter, t0)
            if i >= self.warmup:
                times.append(time.perf_counter() - t0)
        t = torch.tensor(times, dtype=torch.float64, device=self.ctx.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
        return statistics.median(t.tolist()), min(t.tolist())

    def copy_gbps(self) -> float:
        """Device memory copy, GB/s of bytes copied (read and written once), best iteration."""
        import torch

        dst = torch.empty_like(self.buf)
        times = []
        for i in range(self.warmup + self.iters):
            self.ctx.sync()
            t0 = time.perf_counter()
            dst.copy_(self.buf)
            self.ctx.sync()
            self._slowed(False, t0)
            if i >= self.warmup:
                times.append(time.perf_counter() - t0)
        return self.size / min(times) / 1e9


def group_mode() -> str:
    """How this rank makes subgroups: "local" (new_group with local synchronization: no device
    bound), "split" (one ncclCommSplit for all groups: NCCL bound to a device) or "every" (an
    older torch without split_group: every rank makes every group)."""
    import torch.distributed as dist
    from torch.distributed import distributed_c10d

    if getattr(distributed_c10d._get_default_group(), "bound_device_id", None) is None:
        return "local"
    return "split" if hasattr(dist, "split_group") else "every"


def subgroup(groups: list[list[int]], rank: int, world: int) -> Any:
    """This rank's group among the disjoint `groups` (None when it is in none of them).

    Every rank calls this at the same points. torch names a group it makes with local
    synchronization, or with split_group, from its ranks and the number of groups this process
    already holds (`_hash_ranks_to_str`): a rank that sat a call out would hold one group fewer
    and name its next group differently from its partner's, and the two would wait for each
    other's keys until the timeout. So the ranks in no group each get a group of their own, and
    every rank makes exactly one group per call.

    "split" (`group_mode`): with new_group every rank would join a split per group, N/2
    collectives a round; "local": only each group's members call new_group.
    """
    import torch.distributed as dist

    placed = {r for g in groups for r in g}
    mode = group_mode()
    if mode == "local":
        mine = next((g for g in groups if rank in g), [rank])
        made = dist.new_group(sorted(mine), use_local_synchronization=True)
    elif mode == "split":
        made = dist.split_group(
            split_ranks=[sorted(g) for g in groups] + [[r] for r in range(world) if r not in placed]
        )
    else:  # every rank makes every group, named from a count they all share
        every = [dist.new_group(g) for g in groups]
        made = next((m for g, m in zip(groups, every, strict=True) if rank in g), None)
    return made if rank in placed else None  # a group of its own only keeps the count even


def group_state() -> str:
    """`group_mode` and how many groups this rank holds: ranks whose states differ would name the
    same group differently (an odd torch version on one node, a group another task made on some
    ranks only) and wait for each other until the deadline."""
    from torch.distributed import distributed_c10d

    return f"{group_mode()}/{len(distributed_c10d._world.pg_names)}"


def member(m: Any, rank: int) -> dict[str, Any]:
    """What rank `rank` said about itself, held to the shape this module sends: every rank judges
    the same gathered list alike, so a malformed one stops them all with the same one-line error."""
    from gpudoctor.knowledge.node_facts import MAX_TEXT

    ok = (
        isinstance(m, dict)
        and m.get("rank") == rank
        and all(isinstance(m.get(k), str) and len(m[k]) <= MAX_TEXT for k in ("key", "host", "groups"))
        and isinstance(m.get("node_rank"), int)
        and not isinstance(m.get("node_rank"), bool)
        and (m.get("expected") is None or (isinstance(m["expected"], int | float) and 0 < m["expected"] < 1e6))
    )
    if not ok:
        raise ValueError(f"rank {rank} sent a description of itself gpudoctor cannot use: {str(m)[:200]}")
    return m


def leader_entries(received: list[Any], keys: list[str]) -> dict[str, dict[str, Any]]:
    """Each node's entry (facts, counters) by node key, as its local rank 0 sent it; an entry that
    is not from the node its sender belongs to, or was dropped (too large, not JSON), carries
    `{DROPPED: why}` as its facts, which the check reports."""
    out: dict[str, dict[str, Any]] = {}
    for sender, entry in enumerate(received):
        if entry is None:
            continue
        key = keys[sender]
        if isinstance(entry, dict) and DROPPED in entry:
            out[key] = {"facts": entry}
        elif isinstance(entry, dict) and entry.get("key") == key:
            out[key] = entry
        else:
            out[key] = {"facts": {DROPPED: f"rank {sender} sent an entry that is not its node's"}}
    return out


def _nodes(members: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One entry per node, in node-rank order: key, host, node_rank, ranks."""
    nodes: dict[str, dict[str, Any]] = {}
    for m in sorted(members, key=lambda m: m["rank"]):
        node = nodes.setdefault(
            m["key"], {"key": m["key"], "host": m["host"], "node_rank": m["node_rank"], "ranks": []}
        )
        node["ranks"].append(m["rank"])
    return sorted(nodes.values(), key=lambda n: (n["node_rank"], n["host"]))


def receive_sizes(lengths: list[int], dst: int, limit: int) -> list[int]:
    """The bytes `dst` receives from each rank in `gather_json`: its payload at its own size, none
    from itself or from a rank whose payload is over `limit` (nobody sends that one)."""
    return [n if peer != dst and 0 < n <= limit else 0 for peer, n in enumerate(lengths)]


def gather_json(ctx: RankContext, obj: Any, dst: int = 0, limit: int = MAX_PAYLOAD_BYTES) -> list[Any] | None:
    """Every rank's JSON-able `obj` at rank `dst` only (None elsewhere): the one-way counterpart of
    RankContext.all_gather_json (JSON in uint8 tensors: no numpy, no unpickling what peers send; a
    payload over `limit` bytes, or not JSON, arrives as `{DROPPED: why}`).

    The sizes go to every rank first (8 bytes a rank), then each payload travels alone at its own
    size (batched point-to-point: dist.gather needs tensors of one size, which padded every payload
    to the largest and made `dst` receive world size x the largest). `dst` receives the sum of the
    payloads; one over `limit` is sent by nobody (every rank decides alike from the sizes)."""
    import torch
    import torch.distributed as dist

    payload = json.dumps(obj, separators=(",", ":")).encode("utf-8")
    size = torch.tensor([len(payload)], dtype=torch.int64, device=ctx.device)
    sizes = [torch.zeros_like(size) for _ in range(ctx.world_size)]
    dist.all_gather(sizes, size)
    lengths = [int(s.item()) for s in sizes]
    if ctx.rank != dst:
        if 0 < len(payload) <= limit:
            mine = torch.frombuffer(bytearray(payload), dtype=torch.uint8).to(ctx.device)
            # A batch of one: under NCCL a batched send uses the group's communicator (not one per
            # pair of ranks), as dst's batched receives do (torch's batch_isend_irecv docs).
            for work in dist.batch_isend_irecv([dist.P2POp(dist.isend, mine, dst)]):
                work.wait()
        return None
    parts: list[Any] = [None] * ctx.world_size
    ops = []
    for peer, n in enumerate(receive_sizes(lengths, dst, limit)):
        if not n:
            continue
        parts[peer] = torch.empty(n, dtype=torch.uint8, device=ctx.device)
        ops.append(dist.P2POp(dist.irecv, parts[peer], peer))
    for work in dist.batch_isend_irecv(ops) if ops else []:
        work.wait()
    parts[dst] = torch.frombuffer(bytearray(payload), dtype=torch.uint8)  # its own, judged like the others'
    empty = torch.empty(0, dtype=torch.uint8)
    return [decoded(empty if t is None else t, n, limit) for t, n in zip(parts, lengths, strict=True)]


def _counters_now() -> dict[str, dict[str, int]] | None:
    from gpudoctor.probe.network import network_root, read_counters

    try:
        return read_counters(network_root(os.environ, Path("/")))
    except Exception:  # noqa: BLE001  (a sysfs oddity must not cost the measurements)
        return None


def run(ctx: RankContext, params: dict[str, Any]) -> dict[str, Any]:

    t_start = time.perf_counter()
    node_rank = node_rank_from_env()
    host = socket.gethostname()
    key = f"{host}#{node_rank}"
    faults = Faults(ctx.rank, node=node_rank)
    # Who is where (small, to every rank: the decisions below are taken alike everywhere).
    me = {
        "key": key,
        "host": host,
        "node_rank": node_rank,
        "rank": ctx.rank,
        "expected": params.get("expected_gbps"),
        "groups": group_state(),
    }
    gathered = [member(m, i) for i, m in enumerate(ctx.all_gather_json(me))]
    nodes = _nodes(gathered)
    mine = next(n for n in nodes if n["key"] == key)
    expectations = [m["expected"] for m in gathered]
    expected = None if any(e is None for e in expectations) else min(expectations)
    out: dict[str, Any] = {"node": key, "nodes": nodes, "expected_gbps": expected}
    size = int(params.get("bytes", 1 << 20))
    timer = _Timer(ctx, size, int(params.get("warmup", 1)), int(params.get("iters", 5)), faults)
    out.update({"bytes": size, "iters": timer.iters})
    if len(nodes) >= 2:
        ctx.progress(f"inter-node all-reduce over {len(nodes)} nodes")
        t, _ = timer.allreduce(None, inter=True)
        out["full"] = {"ranks": ctx.world_size, "time_s": t, "busbw_gbps": busbw(size, t, ctx.world_size)}
        states = sorted({str(m.get("groups")) for m in gathered})
        if len(states) == 1:
            out["intra"] = _intra(ctx, timer, nodes, mine)
            out["isolation"] = _isolate(ctx, timer, nodes, out["full"]["busbw_gbps"], expected, params)
        else:  # subgroups would not meet: say so rather than wait for the deadline
            why = f"the ranks make process groups differently ({', '.join(states)}: torch versions or earlier groups)"
            out["intra"] = {}
            out["isolation"] = {"ran": False, "skipped": True, "why": why, "rounds": [], "retests": []}
    # Every node's facts and counters (read now, after the traffic) to rank 0 only: kilobytes a
    # node, sent by its local rank 0.
    after = _counters_now() if ctx.local_rank == 0 else None
    sent = {"key": key, "facts": params.get("facts"), "counters": after} if ctx.local_rank == 0 else None
    received = gather_json(ctx, sent, dst=0)
    if received is not None:  # the report's rank
        leaders = leader_entries(received, [m["key"] for m in gathered])
        out["facts"] = {n["key"]: (leaders.get(n["key"]) or {}).get("facts") for n in nodes}
        out["counters_after"] = {k: r["counters"] for k, r in leaders.items() if r.get("counters") is not None}
    else:
        out["counters_after"] = {key: after} if after is not None else {}
    out["elapsed_s"] = time.perf_counter() - t_start
    return out


def _intra(ctx: RankContext, timer: _Timer, nodes: list[dict[str, Any]], mine: dict[str, Any]) -> dict[str, Any]:
    """Every node's own figure, measured at the same time on all nodes."""

    several = [n["ranks"] for n in nodes if len(n["ranks"]) > 1]
    group = subgroup(several, ctx.rank, ctx.world_size) if several else None
    if len(mine["ranks"]) > 1:
        _, best = timer.allreduce(group, inter=False)
        value, kind = busbw(timer.size, best, len(mine["ranks"])), "allreduce_busbw"
    else:
        value, kind = timer.copy_gbps(), "copy"
    gathered = ctx.all_gather_json([mine["key"], kind, value] if ctx.rank == mine["ranks"][0] else None)
    found = {g[0]: {"kind": g[1], "gbps": g[2]} for g in gathered if g}
    return {n["key"]: {**found[n["key"]], "ranks": len(n["ranks"])} for n in nodes if n["key"] in found}


def _isolate(
    ctx: RankContext,
    timer: _Timer,
    nodes: list[dict[str, Any]],
    full_gbps: float,
    expected: float | None,
    params: dict[str, Any],
) -> dict[str, Any]:
    low_ratio = float(params.get("low_ratio", 0.8))
    if len(nodes) < 3:
        return {"ran": False, "why": "two nodes: the whole-group test is the pair test", "rounds": [], "retests": []}
    if expected and full_gbps >= low_ratio * float(expected):
        why = f"whole-group busbw at or above {low_ratio:g} x the expected"
        return {"ran": False, "why": why, "rounds": [], "retests": []}
    index = {n["key"]: i for i, n in enumerate(nodes)}
    schedule = circle_rounds(len(nodes), int(params.get("rounds", 3)))
    rounds = []
    for r, pairs in enumerate(schedule):
        ctx.progress(f"pairwise node tests, round {r + 1} of {len(schedule)}")
        rounds.append(_pair_round(ctx, timer, nodes, pairs))
    # A pair slow while both its nodes are fast elsewhere is measured again before it is blamed;
    # a re-test can raise the typical figure and so make other pairs suspects: test those too,
    # within as many batches of disjoint pairs as there were rounds.
    retests: list[dict[str, Any]] = []
    budget = RETESTS * len(schedule)
    while budget > 0:
        done = retested(retests, RETESTS)
        suspects = [p for p, _ in analyse(merged(rounds, retests)).slow_pairs if p not in done]
        batches = disjoint_batches(suspects, budget)
        if not batches:
            break
        for batch in batches:
            ctx.progress(f"testing {len(batch)} slow pair(s) again")
            retests += _pair_round(ctx, timer, nodes, [(index[a], index[b]) for a, b in batch])
        budget -= len(batches)
    why = "no bandwidth expectation (CPU or unknown NICs)" if not expected else "whole-group busbw below expectation"
    return {"ran": True, "why": why, "rounds": rounds, "retests": retests}


def _pair_round(
    ctx: RankContext, timer: _Timer, nodes: list[dict[str, Any]], pairs: list[tuple[int, int]]
) -> list[dict[str, Any]]:
    """All-reduce in every pair of nodes at once (disjoint pairs), every rank gets every result."""

    group = subgroup([sorted(nodes[a]["ranks"] + nodes[b]["ranks"]) for a, b in pairs], ctx.rank, ctx.world_size)
    result = None
    for a, b in pairs:
        members = nodes[a]["ranks"] + nodes[b]["ranks"]
        if ctx.rank in members:
            _, best = timer.allreduce(group, inter=True)
            if ctx.rank == min(members):
                result = {"nodes": [nodes[a]["key"], nodes[b]["key"]], "time_s": best}
                result["busbw_gbps"] = busbw(timer.size, best, len(members))
    return [g for g in ctx.all_gather_json(result) if g]
