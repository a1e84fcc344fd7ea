"""What `gpudoctor.step()` and `gpudoctor.watch_loader()` cost a training loop.

    .venv/bin/python benchmarks/step_overhead.py [--calls 200000] [--repeats 5]

Targets (issue 9, issue 20): a step call under 1 us when nothing watches (no GPUDOCTOR_STEPS), with or
without the data it may carry; under 5 us watched, with the new data: a float loss and 64 sample indices
(`step(loss=, samples=, epoch=)`). Each figure is the best of --repeats runs of --calls calls, in a fresh
interpreter, beside a floor measured in the same run: the same loop calling an empty Python function with
the same arguments (so building the arguments is not counted as gpudoctor's). Calls are timed in the
process's CPU time (time.process_time: all its threads, under watch the beat thread that `import
gpudoctor` starts included; wall time on a shared machine measures the neighbours' turns). Watched, a real watcher's
channel receives the records (a datagram per 50 ms of steps at most: the figure averages over all calls).
The indices given to step(samples=) are digested at those flushes, at most DIGEST_RATE a second
(gpudoctor/training_data.py): this loop gives far more, so its figure is the step's own path plus that
capped digest, which is the cost a training loop pays at any rate.

With torch installed it also measures `watch_loader`: iterating a DataLoader (64 indices a batch, a data
set whose items cost nothing, so that gpudoctor's part shows) through the wrapper against the bare loader,
per batch and per index. The exit code is 0 when the targets hold.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

LOOP = """
import json, random, sys, time
import gpudoctor
calls, repeats = int(sys.argv[1]), int(sys.argv[2])
step = gpudoctor.step
rng = random.Random(0)
pool = list(range(64 * 1000))
rng.shuffle(pool)
batches = [pool[i:i + 64] for i in range(0, len(pool), 64)]  # 64,000 distinct indices: the sample settles

def empty(input_wait=None, loss=None, samples=None, epoch=None):  # the signature of step()
    return None

def best(fn):
    fn(0)
    out = []
    for _ in range(repeats):
        t = time.process_time()
        for i in range(calls):
            fn(i)
        out.append((time.process_time() - t) / calls * 1e6)
    return min(out)

def block(i):
    with step():
        pass

figures = {
    "floor": best(lambda i: empty()),
    "call": best(lambda i: step()),
    "with": best(block),
    "floor_data": best(lambda i: empty(loss=0.5, samples=batches[i % 1000], epoch=0)),
    "call_data": best(lambda i: step(loss=0.5, samples=batches[i % 1000], epoch=0)),
    "call_loss": best(lambda i: step(loss=0.5)),
}
try:
    import torch
    from torch.utils.data import DataLoader, Dataset
except ImportError:
    torch = None
if torch is not None:
    class Free(Dataset):
        def __len__(self):
            return 64 * 200
        def __getitem__(self, i):
            return i
    loader = DataLoader(Free(), batch_size=64, shuffle=True, collate_fn=lambda b: b)
    watched = gpudoctor.watch_loader(loader)
    def epoch(it):
        t = time.perf_counter()
        for _ in it:
            pass
        return (time.perf_counter() - t) / len(loader) * 1e6
    bare = min(epoch(loader) for _ in range(repeats))
    wrapped = min(epoch(watched) for _ in range(repeats))
    figures.update(loader_bare=bare, loader_watched=wrapped)
print(json.dumps(figures))
"""


def run(calls: int, repeats: int, env: dict[str, str]) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, "-c", LOOP, str(calls), str(repeats)], capture_output=True, text=True, env=env, check=True
    )
    return json.loads(out.stdout.splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=200_000)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    from gpudoctor.watch.steps import StepChannel

    base = {k: v for k, v in os.environ.items() if k != "GPUDOCTOR_STEPS"}
    base["OMP_NUM_THREADS"] = "1"
    quiet = run(args.calls, args.repeats, base)
    channel = StepChannel(accept=lambda pid: True)
    try:
        watched = run(args.calls, args.repeats, {**base, **channel.env})
    finally:
        channel.close()
    load = os.getloadavg()
    print(f"{args.calls} calls, best of {args.repeats}; load average {load[0]:.2f} on {os.cpu_count()} CPUs")
    print(f"floor (an empty function call):                    {quiet['floor']:.3f} us")
    print(f"floor with the data's arguments:                   {quiet['floor_data']:.3f} us")
    print("(over the floor; in brackets, in empty calls: a figure that carries across machines and load)")
    print("                                                    unwatched            watched")
    rows = [
        ("gpudoctor.step()", "call", "floor"),
        ("with gpudoctor.step():", "with", "floor"),
        ("gpudoctor.step(loss=0.5)", "call_loss", "floor"),
        ("step(loss=0.5, samples=<64 indices>, epoch=0)", "call_data", "floor_data"),
    ]
    for label, key, floor in rows:
        q, w = quiet[key] - quiet[floor], watched[key] - watched[floor]
        print(f"{label:<50}  {q:7.3f} us ({q / quiet['floor']:4.1f})  {w:7.3f} us ({w / watched['floor']:5.1f})")
    if "loader_bare" in watched:
        extra = watched["loader_watched"] - watched["loader_bare"]
        print(
            f"DataLoader, 64 indices a batch: bare {watched['loader_bare']:.1f} us a batch, through watch_loader "
            f"{watched['loader_watched']:.1f} us: +{extra:.2f} us a batch, {1000 * extra / 64:.0f} ns an index "
            f"({100 * extra / watched['loader_bare']:.1f}% of a batch that costs nothing else)"
        )
        same = quiet["loader_watched"] - quiet["loader_bare"]
        print(f"unwatched, watch_loader returns the loader itself: {same:+.2f} us a batch (timer noise)")
    ok = (
        quiet["call"] - quiet["floor"] < 1.0
        and quiet["with"] - quiet["floor"] < 1.0
        and watched["with"] - watched["floor"] < 5.0
        and quiet["call_data"] - quiet["floor_data"] < 1.0
        and watched["call_data"] - watched["floor_data"] < 5.0
    )
    print(
        "targets: unwatched < 1 us (both forms), watched < 5 us (with, and with loss and 64 indices):",
        "met" if ok else "NOT met",
    )
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
