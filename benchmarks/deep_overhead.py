"""What level 3 costs beyond the load it was asked for (--duration), on CPU ranks.

Measures, alternating, in one run (median of --repeat runs each):
  floor:     the minimal 2-rank gloo job of benchmarks/active_overhead.py (spawn, import torch,
             join, one all-reduce, exit) plus the seconds of load level 3 plans for --duration D
             (D of GEMM, D/5 of all-reduce, D/5 of memory test): the least such a run can take;
  gpudoctor: `gpudoctor check --device cpu --ranks 2 --level 3 --duration D --json --select
             deep_load,deep_sdc,deep_memory` (probe, deep run, judging and report included).
Prints the ratio gpudoctor / floor and the seconds over the floor.
Usage: python benchmarks/deep_overhead.py [--duration 10] [--repeat 3]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).parent
_spec = importlib.util.spec_from_file_location("active_overhead", HERE / "active_overhead.py")
assert _spec is not None and _spec.loader is not None
active_overhead = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(active_overhead)


def planned_load(duration: float) -> float:
    from gpudoctor.checks.deep.common import budget

    return budget(("deep_gemm", "deep_allreduce", "deep_memory"), duration, gpus=0, pairs=0).total_s


def gpudoctor(duration: float) -> float:
    start = time.perf_counter()
    args = ["check", "--device", "cpu", "--ranks", "2", "--level", "3", "--duration", f"{duration:g}", "--json"]
    args += ["--select", "deep_load,deep_sdc,deep_memory"]
    out = subprocess.run([sys.executable, "-m", "gpudoctor", *args], capture_output=True, text=True, timeout=600)
    elapsed = time.perf_counter() - start
    doc = json.loads(out.stdout)
    if doc.get("exit_code") != 0:
        raise SystemExit(f"gpudoctor check --level 3 failed: {out.stdout[-2000:]}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.pop("MASTER_PORT", None)
    os.environ.pop("GPUDOCTOR_FAULT", None)
    active_overhead.minimal()  # warm the page cache for torch's files
    load = planned_load(args.duration)
    floors, docs = [], []
    for _ in range(args.repeat):
        floors.append(active_overhead.minimal() + load)
        docs.append(gpudoctor(args.duration))
    f, g = statistics.median(floors), statistics.median(docs)
    print(f"planned load for --duration {args.duration:g}: {load:.1f} s (GEMM, all-reduce, memory test)")
    print(f"floor (minimal 2-rank job + load) : median {f:.2f} s  ({', '.join(f'{x:.2f}' for x in floors)})")
    print(f"gpudoctor check --level 3          : median {g:.2f} s  ({', '.join(f'{x:.2f}' for x in docs)})")
    print(f"ratio {g / f:.2f}, {g - f:.1f} s over the floor")


if __name__ == "__main__":
    main()
