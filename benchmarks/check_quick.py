"""Start-up of `gpudoctor check --quick --snapshot <8-GPU fixture>`, as a ratio to `python -c "import click"`.

    .venv/bin/python benchmarks/check_quick.py [--runs 21] [--snapshot FILE]

Both commands run as fresh processes, interleaved (floor, json, text, floor, json, text, ...)
after one warm-up of each, so a busy machine slows them alike; the figure is the median of
each, and the ratio of the medians, in CPU time (user + system, which load distorts least: the
target is judged on it) and in wall time. The floor is the cheapest program that can parse our
command line at all: the interpreter plus click. Two gpudoctor outputs are timed: `--json`
(what CI gates read) and the default text report (rich). One extra run records whether torch
or textual got imported.

Target (issue 22, was issue 10's 3x): both at most 2x the floor, and no torch. Exits 1 when missed.
What keeps it there: the catalogue is read from a table (gpudoctor/catalogue_table.py), so only the
static checks' modules are imported; compare/, watch's and lint's codes, tomllib and socket are
imported only when used; the value types are `@record`s (gpudoctor/records.py), not dataclasses that
compile six methods each at import.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TARGET_RATIO = 2.0

PROBE = (
    "import atexit, sys\n"
    "atexit.register(lambda: print('IMPORTED', sorted(m for m in ('torch', 'textual', 'numpy') if m in sys.modules), "
    "file=sys.stderr))\n"
    "sys.argv[0] = 'gpudoctor'\n"
    "from gpudoctor.__main__ import main\n"
    "main()\n"
)


def _time(cmd: list[str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds: user + system) of one fresh process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, cwd=REPO, check=False)
    took = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if p.returncode not in (0, 1):
        raise SystemExit(f"{' '.join(cmd)} exited {p.returncode}: {p.stderr.decode().strip()}")
    return took, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=21)
    parser.add_argument("--snapshot", default=str(REPO / "tests/fixtures/h100_sxm_8x.json"))
    args = parser.parse_args()
    base = [sys.executable, "-m", "gpudoctor", "check", "--quick", "--snapshot", args.snapshot]
    commands = {
        "floor": [sys.executable, "-c", "import click"],
        "json": [*base, "--json"],
        "text": base,
    }
    # Bytecode as `pip install` leaves it: compiled once, up to date. The warm-up alone cannot
    # see to that where PYTHONDONTWRITEBYTECODE is set (then every edited module would be compiled
    # again in every timed run, which no installed gpudoctor does).
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(REPO / "gpudoctor")], check=True)
    for cmd in commands.values():
        _time(cmd)  # warm-up: fills the OS file cache
    wall: dict[str, list[float]] = {name: [] for name in commands}
    cpu: dict[str, list[float]] = {name: [] for name in commands}
    for _ in range(args.runs):
        for name, cmd in commands.items():
            took, used = _time(cmd)
            wall[name].append(took)
            cpu[name].append(used)

    probe = subprocess.run(
        [sys.executable, "-c", PROBE, *base[3:]], capture_output=True, text=True, cwd=REPO, check=False
    )
    line = next((ln for ln in probe.stderr.splitlines() if ln.startswith("IMPORTED")), "IMPORTED ?")
    imported = line.removeprefix("IMPORTED ").strip()

    print(
        f"gpudoctor check --quick --snapshot {Path(args.snapshot).name}: {args.runs} interleaved fresh processes each"
        f" (load average {os.getloadavg()[0]:.2f})"
    )
    ok = "torch" not in imported
    for label, times in (("CPU (user+sys)", cpu), ("wall", wall)):
        floor = statistics.median(times["floor"])
        print(f"  {label}:")
        for name in commands:
            median = statistics.median(times[name])
            spread = f"min {min(times[name]):.3f} s  max {max(times[name]):.3f} s"
            if name == "floor":
                print(f"    floor  python -c 'import click'   median {median:.3f} s  ({spread})")
                continue
            ratio = median / floor
            print(
                f"    {name:<5}  check --quick {'--json' if name == 'json' else '(text)':<8}  median {median:.3f} s"
                f"  ({spread})  = {ratio:.2f}x the floor (target <= {TARGET_RATIO:g}x)"
            )
            if times is cpu:  # the gate: CPU time is what a loaded machine distorts least
                ok = ok and ratio <= TARGET_RATIO
    print(f"  heavy modules imported: {imported}  (torch imported: {'torch' in imported})")
    print("  OK (CPU time)" if ok else "  NOT OK (CPU time)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
