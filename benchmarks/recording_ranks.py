"""What `gpudoctor report` holds on a recording whose rank numbers change line to line, against the
same recording with the same ranks on every line (the floor, measured in the same run).

    .venv/bin/python benchmarks/recording_ranks.py [--lines 400] [--ranks 1000] [--repeat 1]

Each line holds 8 GPUs and `--ranks` training ranks (within the 4,096 a line may hold). In the crafted
file every line names new ranks (new numbers, new PIDs). `report` kept a row for every rank it had ever
seen and analysed every rank of its 30 s window each sample (400 lines of 1,000: 163 s of CPU and 959 MiB
at f8c5021, against 11 s and 53 MiB for the floor). It now holds at most MAX_RANKS rank rows
(gpudoctor.watch.bounds; the least recently seen fold into one "earlier ranks" row) and MAX_RANKS ranks
in the window (30 s, 30 lines here). What is left above the floor is the window's own: its 30 lines of
1,000 ranks each, where the floor's 30 lines name the same 1,000 (bounded by the window and a line, not
by the recording: --lines 800 peaks where 400 does). Target: crafted / floor peak RSS <= 2. CPU time is
told, not judged (a sample still costs its own ranks). `report` runs as a command (python -m gpudoctor);
its CPU time (user + sys) and peak RSS are the child's own (os.wait4), so the load slows it and its floor
alike; the load average is printed beside the figures. Exit 1 when the target is missed.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from gpudoctor.watch.model import RankReading
from gpudoctor.watch.recording import RecordWriter
from gpudoctor.watch.synthetic import synthetic_run

TARGET = 2.0


def write(path: Path, lines: int, per: int, moving: bool) -> None:
    writer = RecordWriter(str(path), {"interval": 1.0, "source": "benchmark"})
    for i, s in enumerate(synthetic_run("healthy", lines)):
        first = i * per if moving else 0
        ranks = tuple(
            RankReading(pid=100_000 + first + k, rank=first + k, steps=1, step_s=0.5, last_step=i + 1, last_end=s.t)
            for k in range(per)
        )
        writer.write(dataclasses.replace(s, ranks=ranks))
    writer.close()


def report(path: Path) -> tuple[float, float, int]:
    """(CPU seconds, peak RSS MiB, exit code) of `gpudoctor report --json FILE`."""
    cmd = [sys.executable, "-m", "gpudoctor", "report", "--json", str(path)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024, proc.returncode


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lines", type=int, default=400)
    ap.add_argument("--ranks", type=int, default=1000, help="ranks a line")
    ap.add_argument("--repeat", type=int, default=1)
    args = ap.parse_args()
    load = os.getloadavg()
    print(f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} on {os.cpu_count()} CPUs; median of {args.repeat}")
    runs: dict[str, list[tuple[float, float, int]]] = {"floor": [], "crafted": []}
    with tempfile.TemporaryDirectory() as tmp:
        files = {"floor": Path(tmp) / "same.jsonl", "crafted": Path(tmp) / "moving.jsonl"}
        for name, path in files.items():
            write(path, args.lines, args.ranks, moving=name == "crafted")
        for _ in range(args.repeat):
            for name, path in files.items():
                runs[name].append(report(path))
    for name, got in runs.items():
        cpu = [r[0] for r in got]
        rss = [r[1] for r in got]
        print(
            f"{name:>7}: CPU {statistics.median(cpu):.2f} s ({min(cpu):.2f}..{max(cpu):.2f}), peak RSS "
            f"{statistics.median(rss):.0f} MiB ({min(rss):.0f}..{max(rss):.0f}), exit {got[0][2]}"
        )
    cpu_ratio = statistics.median(r[0] for r in runs["crafted"]) / statistics.median(r[0] for r in runs["floor"])
    rss_ratio = statistics.median(r[1] for r in runs["crafted"]) / statistics.median(r[1] for r in runs["floor"])
    ok = rss_ratio <= TARGET and all(r[2] == 0 for got in runs.values() for r in got)
    verdict = "OK" if ok else "OVER"
    print(f"crafted / floor: peak RSS {rss_ratio:.2f} (target <= {TARGET:g}) {verdict}; CPU {cpu_ratio:.2f} (told)")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
