"""What `watch` spends judging one sample, by GPUs and by window length.

    .venv/bin/python benchmarks/watch_analysis.py [--repeat 5]

Targets (issue 22): the per-sample cost linear in GPUs and ranks and independent of the window's
length; 256 GPUs (and 256 ranks) at 10 Hz under 10% of one core headless. Measured as CPU time of the
process (time.process_time) over every sample of a synthetic straggler run with step records, fed to
the summary builder that the dashboard, the headless mode and `report` all use. The floor, measured in
the same run on the same samples: writing each sample as the recording does (Sample.to_json and
json.dumps), which watch pays for every sample it records. Each figure is the median of --repeat runs,
with the spread (min..max); the load average is printed beside them.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable

from gpudoctor.watch.model import Sample
from gpudoctor.watch.summary import SummaryBuilder
from gpudoctor.watch.synthetic import synthetic_run
from gpudoctor.watch.thresholds import Thresholds

INTERVAL = 0.1  # 10 Hz
TARGET_256_SHARE = 10.0  # % of one core at 10 Hz


def per_sample_ms(run: Callable[[], None], n: int, repeat: int) -> tuple[float, float, float]:
    times = []
    for _ in range(repeat):
        t = time.process_time()
        run()
        times.append(1000 * (time.process_time() - t) / n)
    return statistics.median(times), min(times), max(times)


def judge(samples: list[Sample], window_s: float) -> Callable[[], None]:
    def run() -> None:
        builder = SummaryBuilder("bench", Thresholds(warmup_s=0, window_s=window_s))
        for s in samples:
            builder.add(s)

    return run


def floor(samples: list[Sample]) -> Callable[[], None]:
    def run() -> None:
        for s in samples:
            json.dumps(s.to_json())

    return run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--samples", type=int, default=600, help="samples per run (60 s at 10 Hz)")
    args = ap.parse_args()
    print(f"load average {os.getloadavg()[0]:.2f}, {os.cpu_count()} CPUs; median of {args.repeat} (min..max)")
    print(f"{'GPUs':>5} {'window':>7} {'judge ms':>9} {'spread':>13} {'floor ms':>9} {'ratio':>6} {'per GPU us':>10}")
    per_gpu = {}
    for n_gpus in (8, 64, 256):
        samples = synthetic_run("straggler", args.samples, n_gpus=n_gpus, interval=INTERVAL, seed=3, ranks=True)
        base, _, _ = per_sample_ms(floor(samples), len(samples), args.repeat)
        for window_s in (5.0, 30.0):
            ms, lo, hi = per_sample_ms(judge(samples, window_s), len(samples), args.repeat)
            per_gpu[n_gpus, window_s] = 1000 * ms / n_gpus
            print(
                f"{n_gpus:>5} {window_s:>6.0f}s {ms:>9.3f} {lo:>6.3f}..{hi:<6.3f} {base:>9.3f} {ms / base:>6.2f}"
                f" {per_gpu[n_gpus, window_s]:>10.2f}"
            )
        if n_gpus == 256:
            share = 100 * ms / 1000 / INTERVAL
            verdict = "OK" if share < TARGET_256_SHARE else "OVER"
            target = f"target < {TARGET_256_SHARE:.0f}%"
            print(f"256 GPUs at 10 Hz, 30 s window: {share:.1f}% of one core ({target}) {verdict}")
    print(f"per-GPU cost 256 vs 8 GPUs (1.0 = linear): {per_gpu[256, 30.0] / per_gpu[8, 30.0]:.2f}")
    print(f"window 30 s vs 5 s at 256 GPUs (1.0 = independent of length): {per_gpu[256, 30.0] / per_gpu[256, 5.0]:.2f}")


if __name__ == "__main__":
    main()
