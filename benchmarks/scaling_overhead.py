"""What `gpudoctor bench scaling` costs over the least a script can do to get the same figures.

Measures, alternating, in one run (median of --repeat runs each):
  minimal: a script that trains the same models (gpudoctor's own `build_model`, the CPU default
           sizes and batch) for the same number of optimizer steps, first in one process (the
           1-rank baseline), then in two gloo processes with DistributedDataParallel: two torch
           imports in a row, no timing, no verification, nothing reported;
  gpudoctor: `gpudoctor bench scaling --device cpu --ranks 2 --json` (both models on 1 and 2 ranks:
           the timed split, the gradient all-reduce measurement, the verdicts and the report).
Target: gpudoctor <= 2.0 x minimal.   Usage: python benchmarks/scaling_overhead.py [--repeat 5]

It also prints how well the step split adds up (`accounted`: (input + compute + communication) /
step on the rank that sets the pace, median over the runs): within 10 % of 1.0 on an idle machine.
That figure depends on the machine's load, so it is measured here, not asserted by a test (the test
asserts that a split off by more is flagged, GD726).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time

from gpudoctor.checks.active.scaling import DEFAULT_SIZES, DEFAULT_STEPS

RANK = """
import json, os, sys, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from gpudoctor.workloads.scaling import build_model, loss_of, make_batches

rank, world, port, steps = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
sizes = json.loads(sys.argv[5])
if world > 1:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
for name, size in sizes.items():
    torch.manual_seed(0)
    model = build_model(name, size)
    net = DDP(model) if world > 1 else model
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    batches = make_batches(name, size, size["batch"], 4, pin=False)
    for i in range(steps):
        x, y = batches[i % 4]
        loss_of(net(x), y).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
if world > 1:
    dist.destroy_process_group()
os._exit(0)  # as gpudoctor's ranks do: gloo's teardown at interpreter exit can abort ("terminate called")
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def minimal(steps: int) -> float:
    """1 rank, then 2 ranks: the same models for the same optimizer steps."""
    sizes = json.dumps(DEFAULT_SIZES["cpu"])
    start = time.perf_counter()
    for world in (1, 2):
        port = str(free_port())
        procs = [
            subprocess.Popen([sys.executable, "-c", RANK, str(r), str(world), port, str(steps), sizes])
            for r in range(world)
        ]
        codes = [p.wait(timeout=300) for p in procs]
        if any(codes):
            raise SystemExit(f"minimal script failed: {codes}")
    return time.perf_counter() - start


def gpudoctor() -> tuple[float, dict]:
    start = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-m", "gpudoctor", "bench", "scaling", "--device", "cpu", "--ranks", "2", "--json"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    elapsed = time.perf_counter() - start
    doc = json.loads(out.stdout)
    if doc.get("exit_code") != 0 or not doc.get("results", {}).get("summary"):
        raise SystemExit(f"gpudoctor bench scaling failed: {out.stdout[-2000:]} {out.stderr[-2000:]}")
    return elapsed, doc


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.pop("MASTER_PORT", None)
    warmup, measured = DEFAULT_STEPS["cpu"]
    # gpudoctor's optimizer steps per model and rank count: warm-up, one bare warm-up, then the
    # measured DDP steps interleaved with as many bare ones.
    steps = warmup + 1 + 2 * measured
    minimal(steps)  # warm the page cache for torch's files so neither side pays the cold start
    mins, docs, split = [], [], {}
    for _ in range(args.repeat):
        mins.append(minimal(steps))
        took, doc = gpudoctor()
        docs.append(took)
        for row in doc["results"]["summary"]:
            split.setdefault((row["model"], row["gpus"]), []).append(row["accounted"])
    m, g = statistics.median(mins), statistics.median(docs)
    runs = ", ".join(f"{x:.2f}" for x in mins)
    print(f"minimal: both models, {steps} steps on 1 rank then 2 : median {m:.2f} s  ({runs})")
    runs = ", ".join(f"{x:.2f}" for x in docs)
    print(f"gpudoctor bench scaling --device cpu --ranks 2  : median {g:.2f} s  ({runs})")
    print(f"ratio {g / m:.2f} (target <= 2.00)")
    for (model, ranks), values in sorted(split.items()):
        mid = statistics.median(values)
        runs = ", ".join(f"{v:.3f}" for v in values)
        print(
            f"split accounted, {model} on {ranks} rank(s): median {mid:.3f} ({runs}); "
            f"within 10 %: {abs(mid - 1) <= 0.1}"
        )


if __name__ == "__main__":
    main()
