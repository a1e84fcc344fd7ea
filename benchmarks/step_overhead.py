"""What `gpudoctor.step()` costs a training loop, per call.

    .venv/bin/python benchmarks/step_overhead.py [--calls 1000000]

Target (issue 9): under 5 us a call when nothing watches (no GPUDOCTOR_STEPS). Measured in a fresh
interpreter each, against a floor measured in the same run: the same loop calling an empty Python
function. Also shown, for information: the `with gpudoctor.step():` form, and both forms while a
real watcher's channel receives them (a datagram per step at most every 50 ms: the figure is the
average over all calls).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

LOOP = """
import json, sys, time
import gpudoctor
n = int(sys.argv[1])
step = gpudoctor.step
def empty(input_wait=None):
    return None
def bench(fn):
    fn()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t) / n * 1e6
def block():
    with step():
        pass
print(json.dumps({"floor": bench(empty), "call": bench(step), "with": bench(block)}))
"""


def run(calls: int, env: dict[str, str]) -> dict[str, float]:
    out = subprocess.run([sys.executable, "-c", LOOP, str(calls)], capture_output=True, text=True, env=env, check=True)
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
    print(f"{args.calls} calls each; load average {load[0]:.2f} on {os.cpu_count()} CPUs")
    print(f"floor (an empty function call):         {quiet['floor']:.3f} us")
    print(f"gpudoctor.step(), nobody watching:      {quiet['call']:.3f} us (target < 5 us)")
    print(f"with gpudoctor.step(), nobody watching: {quiet['with']:.3f} us")
    print(f"gpudoctor.step(), watched:              {watched['call']:.3f} us")
    print(f"with gpudoctor.step(), watched:         {watched['with']:.3f} us")
    print(f"unwatched call / floor: {quiet['call'] / quiet['floor']:.1f}x")
    sys.exit(0 if quiet["call"] < 5.0 and quiet["with"] < 5.0 else 1)


if __name__ == "__main__":
    main()
