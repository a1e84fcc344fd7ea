"""Which node or node pair is slow, from all-reduce figures of node pairs (torch-free: the `nodes`
workload uses it to pick the pairs to test again, the `nodes` check to judge).

A pair is slow below SLOW_RATIO x the typical pair, the typical pair being the upper quartile of
all pair figures: with few nodes the pairs of one slow node are half or more of all pairs (3
nodes: 2 of 3), which would drag a median down to their level. A node slow with every partner
(2 or more) is a slow node; a slow pair whose nodes are both fast elsewhere is the fabric between
them (NVIDIA/nccl#325). A slow pair is measured again before it is blamed: a slow link is slow
every time, a passing hiccup (another job's burst, a loaded CPU) is not. The 0.7 is a heuristic.
"""

from __future__ import annotations

from dataclasses import dataclass, field

SLOW_RATIO = 0.7

Pair = tuple[str, str]


@dataclass
class NodeRecord:
    tests: int = 0
    slow: int = 0
    worst: float = float("inf")
    best: float = 0.0


@dataclass
class Analysis:
    typical: float | None
    slow_nodes: list[str] = field(default_factory=list)
    slow_pairs: list[tuple[Pair, float]] = field(default_factory=list)
    per_node: dict[str, NodeRecord] = field(default_factory=dict)


def typical(values: list[float]) -> float:
    """The upper quartile, as statistics.quantiles(values, n=4, method="inclusive")[2] gives it
    (written out: importing statistics costs `check --quick` ~3 ms)."""
    data = sorted(values)
    if len(data) < 2:
        return data[0]
    m = len(data) - 1
    j, delta = divmod(3 * m, 4)
    return (data[j] * (4 - delta) + data[j + 1] * delta) / 4 if delta else float(data[j])


def analyse(tests: list[tuple[Pair, float]], confirmed: set[Pair] | None = None) -> Analysis:
    """`confirmed`: the pairs measured a second time; when given, only those can be named slow
    pairs (a pair that looks slow once is a suspect, not a verdict)."""
    if not tests:
        return Analysis(None)
    ref = typical([bw for _, bw in tests])
    per_node: dict[str, NodeRecord] = {}
    for pair, bw in tests:
        for node in pair:
            rec = per_node.setdefault(node, NodeRecord())
            rec.tests += 1
            rec.slow += bw < SLOW_RATIO * ref
            rec.worst = min(rec.worst, bw)
            rec.best = max(rec.best, bw)
    slow_nodes = sorted(n for n, r in per_node.items() if r.tests >= 2 and r.slow == r.tests)
    slow_pairs = [
        (p, bw)
        for p, bw in tests
        if bw < SLOW_RATIO * ref and not set(p) & set(slow_nodes) and (confirmed is None or p in confirmed)
    ]
    return Analysis(ref, slow_nodes, slow_pairs, per_node)


def disjoint_batches(pairs: list[Pair], limit: int) -> list[list[Pair]]:
    """Pairs split greedily into at most `limit` batches of disjoint pairs (one batch runs at once):
    each pair goes to the first batch holding neither of its nodes, a new batch while there are
    fewer than `limit`, else it is left out.

    Each node remembers the batches it is in, so finding a pair's batch looks at its two nodes'
    batches, not at every pair placed so far: O(pairs x min(limit, degree)), linear in pairs for
    the bounded `limit` the retests use (the first version compared each pair with every pair of
    every batch: quadratic in pairs; tests/knowledge/test_pair_isolation.py holds it as the oracle)."""
    batches: list[list[Pair]] = []
    taken: dict[str, set[int]] = {}  # node -> the batches holding it
    for pair in pairs:
        where = [taken.get(node, ()) for node in pair]
        i = 0
        while i < len(batches) and any(i in t for t in where):
            i += 1  # at most len(t_a) + len(t_b) steps: each skipped batch holds one of the nodes
        if i == len(batches):
            if len(batches) >= limit:
                continue
            batches.append([])
        batches[i].append(pair)
        for node in pair:
            taken.setdefault(node, set()).add(i)
    return batches


# How many times a suspect pair is measured again: it is blamed only if it stayed slow in its round
# and in each of them (a heuristic: on a shared CPU host one retest still caught a passing burst).
RETESTS = 2


def retested(retests: list[dict[str, object]], times: int = 1) -> set[Pair]:
    """The pairs measured again at least `times` times."""
    counts: dict[Pair, int] = {}
    for r in retests:
        pair = tuple(r["nodes"])  # type: ignore[arg-type]
        counts[pair] = counts.get(pair, 0) + 1  # type: ignore[index]
    return {p for p, n in counts.items() if n >= times}


def merged(rounds: list[list[dict[str, object]]], retests: list[dict[str, object]]) -> list[tuple[Pair, float]]:
    """Each tested pair's figure: the better of its round and its retest."""
    best: dict[Pair, float] = {}
    for result in [r for rnd in rounds for r in rnd]:
        pair = tuple(result["nodes"])  # type: ignore[arg-type]
        best[pair] = float(result["busbw_gbps"])  # type: ignore[arg-type]
    for result in retests:
        pair = tuple(result["nodes"])  # type: ignore[arg-type]
        best[pair] = max(best.get(pair, 0.0), float(result["busbw_gbps"]))  # type: ignore[arg-type]
    return list(best.items())  # type: ignore[arg-type]
