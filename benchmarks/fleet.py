"""`gpudoctor fleet` on many nodes, the retests' pair selection and rank 0's gather: linear in nodes?

    .venv/bin/python benchmarks/fleet.py [--nodes 100,300,1000] [--repeat 3]

Run from the repository root. Three rows (issue 22), each against a floor measured in the same run:

1. fleet: N node snapshots (tests/fixtures/network/h100_ib_healthy.json, an 8x H100 node with 8 IB
   rails, 72 kB of JSON; node 7 with another driver) saved in a directory; the figure is the CPU time
   (process_time) of gpudoctor.api.fleet_report([DIR]) (listing, reading, decoding, judging), the
   floor the CPU time of reading and json.loads of the same files. Per-node cost and the ratio to the
   floor are printed per N: linear cost keeps both flat. Exit 1 if 1,000 nodes take 20 s or more
   of CPU (user+sys of this process: on a shared host the wall time is the load's; it is printed
   beside) or the per-node cost at the largest N is over 1.5x that at the smallest.
2. pair selection: pair_isolation.disjoint_batches (6 batches, the retests' budget) on P random
   pairs of P/2 nodes, per pair, against the first version (quadratic in pairs: kept as the tests'
   oracle) and against the floor of one pass over the pairs.
3. gather: the bytes rank 0 receives in workloads/nodes.py gather_json (receive_sizes, what it
   allocates and receives), against the sum of the payloads and against the padded gather it replaced
   (world size - 1 payloads of the largest's size). The live exchange is tested with gloo ranks in
   tests/workloads/test_nodes_groups.py; this row counts bytes, it does not time a network.
Median of --repeat runs with min..max; the load average is printed beside them.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
NODE = ROOT / "tests" / "fixtures" / "network" / "h100_ib_healthy.json"
LIMIT_S = 20.0
GROWTH = 1.5


def load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def spread(values: list[float], scale: float = 1.0, unit: str = "") -> str:
    values = [v * scale for v in values]
    return f"{statistics.median(values):.3g}{unit} ({min(values):.3g}..{max(values):.3g})"


def write_fleet(directory: Path, n: int) -> None:
    doc = json.loads(NODE.read_text())
    for i in range(n):
        doc["host"]["hostname"] = f"node-{i:05d}"
        doc["driver"]["driver_version"] = "535.129.03" if i == 7 else "550.54.15"
        (directory / f"node-{i:05d}.json").write_text(json.dumps(doc))


def cpu(fn: Callable[[], Any]) -> tuple[float, float, Any]:
    t0, w0 = time.process_time(), time.perf_counter()
    out = fn()
    return time.process_time() - t0, time.perf_counter() - w0, out


def floor(directory: Path) -> int:
    return sum(len(json.loads(p.read_text())) for p in sorted(directory.glob("*.json")))


def fleet_row(sizes: list[int], repeat: int) -> bool:
    from gpudoctor.api import fleet_report

    print(f"fleet: CPU s per node, median of {repeat} (min..max); load {load()}")
    print(f"{'nodes':>6} {'fleet ms/node':>22} {'floor ms/node':>22} {'ratio':>18} {'CPU s':>8} {'wall s':>8}")
    per_node: dict[int, float] = {}
    ok = True
    with tempfile.TemporaryDirectory() as tmp:  # imports and first-call costs out of the figures
        write_fleet(Path(tmp), 8)
        fleet_report([tmp], use_config=False)
    for n in sizes:
        with tempfile.TemporaryDirectory() as tmp:
            directory = Path(tmp)
            write_fleet(directory, n)
            figures, floors, walls = [], [], []
            for _ in range(repeat):
                f_cpu, _, _ = cpu(lambda directory=directory: floor(directory))
                g_cpu, g_wall, report = cpu(
                    lambda directory=directory: fleet_report([str(directory)], use_config=False)
                )
                floors.append(f_cpu / n)
                figures.append(g_cpu / n)
                walls.append(g_wall)
            odd = [f.subject for f in report.findings if f.code == "GD460" and f.status.value == "warn"]
            assert odd == ["node:node-00007"], odd  # the benchmark judges what it times
        ratios = [g / f for g, f in zip(figures, floors, strict=True)]
        per_node[n] = statistics.median(figures)
        total = statistics.median(figures) * n
        print(
            f"{n:>6} {spread(figures, 1000):>22} {spread(floors, 1000):>22} {spread(ratios):>18} "
            f"{total:>8.2f} {statistics.median(walls):>8.2f}"
        )
        if n >= 1000 and total >= LIMIT_S:
            print(f"FAIL: {n} nodes took {total:.1f} s of CPU (limit {LIMIT_S:g} s)")
            ok = False
    first, last = per_node[sizes[0]], per_node[sizes[-1]]
    growth = last / first
    print(f"per-node cost at {sizes[-1]} nodes / at {sizes[0]}: {growth:.2f} (limit {GROWTH:g})")
    if growth > GROWTH:
        print("FAIL: the per-node cost grows with the node count")
        ok = False
    return ok


def pairs_row(repeat: int) -> None:
    from gpudoctor.knowledge.pair_isolation import disjoint_batches
    from tests.knowledge.test_pair_isolation import oracle  # the first version, the tests' oracle

    print(f"\npair selection (6 batches): CPU us per pair, median of {repeat}; load {load()}")
    print(f"{'pairs':>6} {'disjoint_batches':>22} {'first version':>22} {'floor':>18} {'ratio to floor':>16}")
    for p in (1000, 3000, 10000):
        rng = random.Random(p)
        nodes = [f"n{i}" for i in range(p // 2)]
        pairs = [tuple(rng.sample(nodes, 2)) for _ in range(p)]
        new, old, flo = [], [], []
        for _ in range(repeat):
            new.append(cpu(lambda pairs=pairs: disjoint_batches(pairs, 6))[0] / p)  # type: ignore[arg-type]
            flo.append(cpu(lambda pairs=pairs: [(a, b) for a, b in pairs])[0] / p)
            if p <= 3000:  # the first version takes seconds beyond
                old.append(cpu(lambda pairs=pairs: oracle(pairs, 6))[0] / p)  # type: ignore[arg-type]
        assert disjoint_batches(pairs, 6) == oracle(pairs, 6) if p <= 3000 else True  # type: ignore[arg-type]
        ratio = [a / b for a, b in zip(new, flo, strict=True)]
        print(
            f"{p:>6} {spread(new, 1e6):>22} {spread(old, 1e6) if old else '(not run)':>22} "
            f"{spread(flo, 1e6):>18} {spread(ratio):>16}"
        )


def gather_row() -> None:
    from gpudoctor.knowledge.node_facts import MAX_PAYLOAD_BYTES
    from gpudoctor.workloads.nodes import receive_sizes

    print("\ngather to rank 0: bytes received (one node's local rank 0 sends facts, the others `null`)")
    print(f"{'ranks':>6} {'received':>14} {'sum of payloads':>16} {'ratio':>6} {'padded gather':>14}")
    rng = random.Random(1)
    for world, per_node in ((16, 8), (64, 8), (8000, 8)):
        lengths = [rng.randint(3_000, 12_000) if r % per_node == 0 else 4 for r in range(world)]
        lengths[world // 2] = 400_000  # one node with a large payload (many forwarded findings, NICs)
        got = sum(receive_sizes(lengths, 0, MAX_PAYLOAD_BYTES))
        sent = sum(lengths[1:])
        padded = (world - 1) * max(lengths)
        print(f"{world:>6} {got:>14,} {sent:>16,} {got / sent:>6.2f} {padded:>14,}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", default="100,300,1000")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    ok = fleet_row([int(n) for n in args.nodes.split(",")], args.repeat)
    pairs_row(args.repeat)
    gather_row()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
