"""What `gpudoctor report` costs against reading and parsing its file, and per GPU reading by width.

    .venv/bin/python benchmarks/report_cost.py [--hours 24] [--repeat 3]

Targets (issue 22): `report` of a recording at most 3x reading and parsing the file (json.loads of
every line, the floor, measured in the same run on the same file); 8 GPUs x 24 hours at the default
1 s interval in under 10 s. Issue 24: the cost per GPU reading linear in GPUs per line (it was
quadratic: a line of 32,000 GPUs cost 30 s).

The recording is a synthetic straggler run (gpudoctor.watch.synthetic: 8 GPUs, one training rank per
GPU, processes every 5 samples), written as `watch --record` writes it. `report` is timed in this
process (the summary of gpudoctor.watch.summary.summarize_recording, what the command prints) as CPU
time (time.process_time), so the machine's load slows it and its floor alike; the load average is
printed beside the figures. Per reading: samples of 8, 1,000 and 32,000 GPUs parsed (Sample.parse) and
judged (SummaryBuilder.add), which `report` does per line; a recording refuses lines of more than
MAX_GPUS GPUs (gpudoctor.watch.bounds), so these are timed beneath that bound. Exit 1 when a target
is missed.

Beside the floor, a lean reader (`lean_s`, not gpudoctor's code): the least a Python reader of the file
can do and still hold a window, what any `report` must do before it judges anything. Per line json.loads;
per reading one pass over its fields against a table made once (a number, in range), no object made; each
value added to a running sum per (reading, field) and taken out when it leaves a 30-sample window. No text,
no verdict, no span. What it costs over the floor is spent before the first rule runs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections import deque
from pathlib import Path

from gpudoctor.watch.model import Sample
from gpudoctor.watch.recording import RecordWriter
from gpudoctor.watch.summary import SummaryBuilder, summarize_recording
from gpudoctor.watch.synthetic import synthetic_run, synthetic_sample
from gpudoctor.watch.thresholds import Thresholds

TARGET_RATIO = 3.0
TARGET_DAY_S = 10.0
TARGET_LINEAR = 2.0  # per-reading cost at 32,000 GPUs over that at 8: 1.0 is linear; quadratic was ~4000
WIDTHS = {8: 2000, 1000: 20, 32000: 2}  # GPUs per line -> samples timed


def write_day(path: Path, hours: float) -> int:
    n = int(hours * 3600)
    writer = RecordWriter(str(path), {"interval": 1.0, "source": "benchmark"})
    for i in range(n):
        writer.write(synthetic_sample("straggler", i, 1.7e9 + i, 8, 3, ranks=True))
    writer.close()
    return n


def floor_s(path: Path) -> float:
    t = time.process_time()
    with path.open(encoding="utf-8") as f:
        for line in f:
            json.loads(line)
    return time.process_time() - t


# The lean reader's tables: the fields of a GPU and a rank reading that hold numbers, and a range (one for
# all: a check against the true ranges costs the same two comparisons).
_LEAN_GPU = dict.fromkeys(
    ("index", "util", "mem_util", "mem_used", "mem_total", "power", "power_limit", "temp", "sm_clock", "pcie_rx",
     "pcie_tx", "throttle"),
    (0, 2**64),
)  # fmt: skip
_LEAN_RANK = dict.fromkeys(
    ("pid", "rank", "steps", "step_s", "step_max", "wait_s", "last_step", "last_end"), (0, 2**64)
)


def lean_s(path: Path, window: int = 30) -> float:
    """CPU time of the lean reader (module docstring) over the file."""
    t = time.process_time()
    sums = [[0.0] * 16 for _ in range(64)]
    held: deque[list[list[float]]] = deque()
    with path.open(encoding="utf-8") as f:
        f.readline()
        for line in f:
            doc = json.loads(line)
            kept, i = [], 0
            for table, readings in ((_LEAN_GPU, doc["gpus"]), (_LEAN_RANK, doc.get("ranks", ()))):
                for reading in readings:
                    row, values, j = sums[i], [], 0
                    for key, value in reading.items():
                        bound = table.get(key)
                        if bound is None:
                            continue
                        if type(value) not in (int, float):
                            raise ValueError(key)
                        value = value if bound[0] <= value <= bound[1] else 0
                        row[j] += value
                        values.append(value)
                        j += 1
                    kept.append(values)
                    i += 1
            held.append(kept)
            if len(held) > window:
                for row, values in zip(sums, held.popleft(), strict=False):  # the first readings' rows
                    for j, value in enumerate(values):
                        row[j] -= value
    return time.process_time() - t


def report_s(path: Path) -> float:
    t = time.process_time()
    summary = summarize_recording(str(path))
    elapsed = time.process_time() - t
    assert summary.samples and not summary.unreadable
    return elapsed


def per_reading_us(n_gpus: int, n: int) -> tuple[float, float]:
    """(parse, judge) CPU time per GPU reading for `n` samples of `n_gpus` GPUs."""
    docs = [s.to_json() for s in synthetic_run("straggler", n, n_gpus=n_gpus, seed=3, ranks=True)]
    texts = [json.dumps(d) for d in docs]
    t = time.process_time()
    samples = [Sample.parse(json.loads(text), []) for text in texts]
    parse = time.process_time() - t
    builder = SummaryBuilder("bench", Thresholds(warmup_s=0))
    t = time.process_time()
    for s in samples:
        builder.add(s)
    judge = time.process_time() - t
    readings = n * n_gpus
    return 1e6 * parse / readings, 1e6 * judge / readings


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hours", type=float, default=24.0, help="length of the 8-GPU recording at 1 s")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    load = os.getloadavg()
    print(
        f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} on {os.cpu_count()} CPUs; CPU time, "
        f"median of {args.repeat} (min..max)"
    )
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "day.jsonl"
        t = time.process_time()
        n = write_day(path, args.hours)
        size = path.stat().st_size
        print(
            f"recording: {n} samples of 8 GPUs ({args.hours:g} h at 1 s), {size / 2**20:.0f} MiB, "
            f"written in {time.process_time() - t:.1f} s"
        )
        floors, leans, reports = [], [], []
        for _ in range(args.repeat):
            floors.append(floor_s(path))
            leans.append(lean_s(path))
            reports.append(report_s(path))
    floor, lean, report = statistics.median(floors), statistics.median(leans), statistics.median(reports)
    ratio = report / floor
    day = report * 24 / args.hours
    print(f"floor (json.loads of every line): {floor:.2f} s ({min(floors):.2f}..{max(floors):.2f})")
    print(
        f"report:                           {report:.2f} s ({min(reports):.2f}..{max(reports):.2f}), "
        f"{1000 * report / n:.3f} ms a sample"
    )
    print(
        f"lean reader (no judging):         {lean:.2f} s ({min(leans):.2f}..{max(leans):.2f}), "
        f"{lean / floor:.2f}x the floor; 8 GPUs x 24 h: {lean * 24 / args.hours:.1f} s"
    )
    verdict = "OK" if ratio <= TARGET_RATIO else "OVER"
    print(f"report / floor: {ratio:.2f} (target <= {TARGET_RATIO:g}) {verdict}")
    ok &= ratio <= TARGET_RATIO
    verdict = "OK" if day <= TARGET_DAY_S else "OVER"
    scaled = "" if args.hours == 24 else f" (scaled from {args.hours:g} h)"
    print(f"8 GPUs x 24 h: {day:.1f} s{scaled} (target < {TARGET_DAY_S:g} s) {verdict}")
    ok &= day <= TARGET_DAY_S
    costs = {}
    for width, samples in WIDTHS.items():
        runs = [per_reading_us(width, samples) for _ in range(args.repeat)]
        parse = statistics.median(r[0] for r in runs)
        judge = statistics.median(r[1] for r in runs)
        costs[width] = parse + judge
        print(f"{width:>6} GPUs a line: parse {parse:.2f} us + judge {judge:.2f} us a GPU reading ({samples} samples)")
    linear = costs[32000] / costs[8]
    verdict = "OK" if linear <= TARGET_LINEAR else "OVER"
    print(
        f"per-reading cost 32,000 vs 8 GPUs a line: {linear:.2f} (1.0 = linear; target <= {TARGET_LINEAR:g}) {verdict}"
    )
    ok &= linear <= TARGET_LINEAR
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
