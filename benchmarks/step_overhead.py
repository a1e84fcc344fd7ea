"""What `gpudoctor.step()` costs a training loop, per call.

    .venv/bin/python benchmarks/step_overhead.py [--calls 1000000]

Targets (issues 9 and 20): under 1 us a call when nothing watches (no GPUDOCTOR_STEPS), under 5 us
while a real watcher's channel receives them (a datagram per step at most every 50 ms, and under watch
the beat thread that `import gpudoctor` starts: the figure is the average over all calls), both forms
(a plain call and `with gpudoctor.step():`). Measured in a fresh interpreter each, against a floor
measured in the same run: the same loop calling an empty Python function. Each figure is the process's
CPU time (time.process_time: all its threads, the beat thread included; wall time on a shared machine
measures the neighbours' turns), the best of REPEATS batches (as timeit advises).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

REPEATS = 20
LOOP = """
import json, sys, time
import gpudoctor
repeats = int(sys.argv[2])
n = int(sys.argv[1]) // repeats
step = gpudoctor.step
def empty(input_wait=None):
    return None
def bench(fn):
    fn()
    best = float("inf")
    for _ in range(repeats):
        t = time.process_time()
        for _ in range(n):
            fn()
        best = min(best, time.process_time() - t)
    return best / n * 1e6
def block():
    with step():
        pass
print(json.dumps({"floor": bench(empty), "call": bench(step), "with": bench(block)}))
"""


def run(calls: int, env: dict[str, str]) -> dict[str, float]:
    argv = [sys.executable, "-c", LOOP, str(calls), str(REPEATS)]
    out = subprocess.run(argv, capture_output=True, text=True, env=env, check=True)
    return json.loads(out.stdout)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=1_000_000)
    args = ap.parse_args()
    from gpudoctor.watch.steps import StepChannel

    base = {k: v for k, v in os.environ.items() if k != "GPUDOCTOR_STEPS"}
    quiet = run(args.calls, base)
    channel = StepChannel(accept=lambda pid: True)
    try:
        watched = run(args.calls, {**base, **channel.env})
    finally:
        channel.close()
    load = os.getloadavg()
    cpus = os.cpu_count()
    print(f"{args.calls} calls each, CPU time, best of {REPEATS} batches; load average {load[0]:.2f} on {cpus} CPUs")
    print(f"floor (an empty function call):         {quiet['floor']:.3f} us")
    print(f"gpudoctor.step(), nobody watching:      {quiet['call']:.3f} us (target < 1 us)")
    print(f"with gpudoctor.step(), nobody watching: {quiet['with']:.3f} us (target < 1 us)")
    print(f"gpudoctor.step(), watched:              {watched['call']:.3f} us (target < 5 us)")
    print(f"with gpudoctor.step(), watched:         {watched['with']:.3f} us (target < 5 us)")
    print(f"unwatched call / floor: {quiet['call'] / quiet['floor']:.1f}x")
    ok = max(quiet["call"], quiet["with"]) < 1.0 and max(watched["call"], watched["with"]) < 5.0
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
