"""Decoding a snapshot file's text, as a ratio to `json.loads` of the same text.

    .venv/bin/python benchmarks/snapshot_decode.py [--gpus 8,64] [--runs 21] [--loops 20]

Run from the repository root. The figure is `gpudoctor.snapshot.loads(text)`: the JSON parsed,
every value decoded and checked, the facts checked against each other (what `check --snapshot`,
`diff` and `fleet` pay per file). The floor is `json.loads(text)` of the same text, which any
reader of the file pays. The 8-GPU text is tests/fixtures/h100_sxm_8x.json; larger nodes are grown
from it by tests/helpers/scaled.py (every pair listed: the text grows as N^2). Both are timed in
CPU time (process_time), interleaved (floor, figure, floor, ...), --loops calls per run; the
ratio is of the medians of --runs runs, with the spread (min..max) of each and the load average.

Target (issue 22): at most 3x the floor at every size. Exits 1 when missed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests.helpers, run as a script

from gpudoctor import snapshot  # noqa: E402
from tests.helpers.scaled import scaled_node  # noqa: E402

FIXTURE = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "h100_sxm_8x.json"
TARGET_RATIO = 3.0


def per_call(fn: object, text: str, loops: int) -> float:
    start = time.process_time()
    for _ in range(loops):
        fn(text)  # type: ignore[operator]
    return (time.process_time() - start) / loops


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", default="8,64")
    ap.add_argument("--runs", type=int, default=21)
    ap.add_argument("--loops", type=int, default=20)
    args = ap.parse_args()
    base = json.loads(FIXTURE.read_text())
    ok = True
    print(f"snapshot.loads(text) / json.loads(text), CPU time, {args.runs} runs of {args.loops} calls")
    for n in (int(g) for g in args.gpus.split(",")):
        text = FIXTURE.read_text() if n == 8 else json.dumps(scaled_node(base, n), indent=2)
        snapshot.loads(text)  # the decoders are built once, on first use: not timed
        floor: list[float] = []
        figure: list[float] = []
        loops = max(1, args.loops * 8 // n)
        for _ in range(args.runs):
            floor.append(per_call(json.loads, text, loops))
            figure.append(per_call(snapshot.loads, text, loops))
        f, g = statistics.median(floor), statistics.median(figure)
        ratio = g / f
        ok = ok and ratio <= TARGET_RATIO
        print(
            f"  {n:>4} GPUs ({len(text) / 1e3:.0f} kB): json.loads {f * 1e3:.2f} ms "
            f"({min(floor) * 1e3:.2f}..{max(floor) * 1e3:.2f})  snapshot.loads {g * 1e3:.2f} ms "
            f"({min(figure) * 1e3:.2f}..{max(figure) * 1e3:.2f})  = {ratio:.2f}x the floor"
            f" (target <= {TARGET_RATIO:g}x)"
        )
    print(f"  load average {os.getloadavg()[0]:.2f}")
    print("  OK" if ok else "  NOT OK")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
