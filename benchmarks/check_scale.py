"""`check --quick` on snapshots of many GPUs: is its cost linear in the snapshot's size?

    .venv/bin/python benchmarks/check_scale.py [--gpus 8,32,64,128] [--repeat 3]

Target (issue 24): cost linear in the input. A node of N GPUs behind NVSwitches is made from
tests/fixtures/h100_sxm_8x.json (tests/helpers/scaled.py: every pair listed, as the probe records them:
N(N-1)/2 pairs, so the input itself grows as N^2 and the floor with it). Run from the repository root. The floor,
measured in the same run on the same document: json.loads of the snapshot's text, which any reader of
it pays. The figure is the in-process time of gpudoctor.api.run_checks(snapshot=..., use_config=False)
(decoding included) over the floor; linear cost keeps that ratio flat as N grows. Median of --repeat
runs with min..max; the load average is printed beside them.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

from gpudoctor import api
from gpudoctor.snapshot import from_jsonable
from tests.helpers.scaled import scaled_node

FIXTURE = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "h100_sxm_8x.json"


def timed(fn: Any, repeat: int) -> tuple[float, float, float]:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times), min(times), max(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", default="8,32,64,128")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    base = json.loads(FIXTURE.read_text())
    api.run_checks(snapshot=from_jsonable(base), use_config=False)  # imports and registry, once
    print(f"load average {os.getloadavg()[0]:.2f}; median of {args.repeat} (min..max)")
    print(f"{'GPUs':>5} {'pairs':>6} {'check s':>8} {'spread':>15} {'floor s':>8} {'ratio':>7}")
    ratios = {}
    for n in (int(x) for x in args.gpus.split(",")):
        text = json.dumps(scaled_node(base, n))
        floor, _, _ = timed(lambda text=text: json.loads(text), args.repeat)

        def check(text: str = text) -> None:
            api.run_checks(snapshot=from_jsonable(json.loads(text)), use_config=False)

        took, lo, hi = timed(check, args.repeat)
        ratios[n] = took / floor
        print(f"{n:>5} {n * (n - 1) // 2:>6} {took:>8.3f} {lo:>7.3f}..{hi:<7.3f} {floor:>8.4f} {ratios[n]:>7.1f}")
    first, last = min(ratios), max(ratios)
    print(f"ratio at {last} GPUs over ratio at {first} (1.0 = linear in the input): {ratios[last] / ratios[first]:.2f}")


if __name__ == "__main__":
    main()
