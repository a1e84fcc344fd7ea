"""How much the active checks cost over the least a 2-rank gloo job can do.

Measures, alternating, in one run (median of --repeat runs each):
  minimal: a script that spawns 2 ranks (plain subprocesses, no torch in the parent), joins a
           gloo group, all-reduces once and exits (the fastest form of it);
  mp.spawn: the same with torch.multiprocessing.spawn, as PyTorch's tutorials write it;
  minimal DDP: the minimal script plus wrapping a one-layer model in DistributedDataParallel
           and one training step: the least any DDP job pays (DDP's constructor imports
           torch._dynamo, about 1.6 s of CPU per rank with torch 2.13);
  gpudoctor: `gpudoctor check --device cpu --ranks 2 --select allreduce,ddp --json` (the DDP
           sanity run plus the all-reduce sweep, probe and report included).
Target: gpudoctor <= 1.3 x minimal.   Usage: python benchmarks/active_overhead.py [--repeat 5]
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

RANK = """
import os, sys, torch, torch.distributed as dist
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:" + sys.argv[2], rank=int(sys.argv[1]), world_size=2)
t = torch.ones(1024)
dist.all_reduce(t)
assert t[0].item() == 2
dist.destroy_process_group()
"""


RANK_DDP = """
import os, sys, torch, torch.distributed as dist
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:" + sys.argv[2], rank=int(sys.argv[1]), world_size=2)
t = torch.ones(1024)
dist.all_reduce(t)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 1))
model(torch.ones(4, 8)).sum().backward()
dist.destroy_process_group()
"""


SPAWN = """
import os, torch, torch.distributed as dist, torch.multiprocessing as mp

def run(rank, port):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    t = torch.ones(1024)
    dist.all_reduce(t)
    dist.destroy_process_group()

if __name__ == "__main__":
    import sys
    mp.spawn(run, args=(sys.argv[1],), nprocs=2)
"""


def spawn_script() -> float:
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".py") as script:  # spawn re-imports __main__ from a file
        script.write(SPAWN)
        script.flush()
        start = time.perf_counter()
        subprocess.run([sys.executable, script.name, str(free_port())], check=True, timeout=120)
        return time.perf_counter() - start


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def minimal(script: str = RANK) -> float:
    start = time.perf_counter()
    port = str(free_port())
    procs = [subprocess.Popen([sys.executable, "-c", script, str(r), port]) for r in range(2)]
    codes = [p.wait(timeout=120) for p in procs]
    if any(codes):
        raise SystemExit(f"minimal script failed: {codes}")
    return time.perf_counter() - start


def gpudoctor() -> float:
    start = time.perf_counter()
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpudoctor",
            "check",
            "--device",
            "cpu",
            "--ranks",
            "2",
            "--select",
            "allreduce,ddp",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    elapsed = time.perf_counter() - start
    doc = json.loads(out.stdout)
    if doc.get("exit_code") != 0:
        raise SystemExit(f"gpudoctor check failed: {out.stdout[-2000:]}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.pop("MASTER_PORT", None)
    minimal()  # warm the page cache for torch's files so neither side pays the cold start
    mins, spawns, ddps, docs = [], [], [], []
    for _ in range(args.repeat):
        mins.append(minimal())
        spawns.append(spawn_script())
        ddps.append(minimal(RANK_DDP))
        docs.append(gpudoctor())
    m, s, g = statistics.median(mins), statistics.median(spawns), statistics.median(docs)
    d = statistics.median(ddps)
    print(f"minimal 2-rank gloo all-reduce : median {m:.2f} s  ({', '.join(f'{x:.2f}' for x in mins)})")
    print(f"same with mp.spawn             : median {s:.2f} s  ({', '.join(f'{x:.2f}' for x in spawns)})")
    print(f"minimal script + one DDP step  : median {d:.2f} s  ({', '.join(f'{x:.2f}' for x in ddps)})")
    print(f"gpudoctor allreduce + ddp      : median {g:.2f} s  ({', '.join(f'{x:.2f}' for x in docs)})")
    print(f"ratio vs minimal {g / m:.2f}, vs mp.spawn {g / s:.2f} (target <= 1.30), vs minimal DDP {g / d:.2f}")


if __name__ == "__main__":
    main()
