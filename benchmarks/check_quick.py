"""Wall time of `gpudoctor check --quick --snapshot tests/fixtures/h100_sxm_8x.json` as a fresh process.

    .venv/bin/python benchmarks/check_quick.py [--runs 15] [--snapshot FILE]

Prints median/min/max over N runs (after one warm-up run that fills the OS file cache), and
whether torch or textual got imported (one extra run records sys.modules at exit).
Target: median under 0.5 s. Exits 1 when torch was imported or the target is missed.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TARGET_S = 0.5

PROBE = (
    "import atexit, sys\n"
    "atexit.register(lambda: print('IMPORTED', sorted(m for m in ('torch', 'textual') if m in sys.modules), "
    "file=sys.stderr))\n"
    "from gpudoctor.cli import run\n"
    "run(sys.argv[1:])\n"
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--snapshot", default=str(REPO / "tests/fixtures/h100_sxm_8x.json"))
    args = parser.parse_args()
    cmd = [sys.executable, "-m", "gpudoctor", "check", "--quick", "--snapshot", args.snapshot, "--json"]

    subprocess.run(cmd, capture_output=True, cwd=REPO, check=False)  # warm-up
    times = []
    for _ in range(args.runs):
        start = time.perf_counter()
        p = subprocess.run(cmd, capture_output=True, cwd=REPO, check=False)
        times.append(time.perf_counter() - start)
        if p.returncode not in (0, 1):
            print(f"gpudoctor exited {p.returncode}: {p.stderr.decode().strip()}", file=sys.stderr)
            return 2

    probe = subprocess.run(
        [sys.executable, "-c", PROBE, *cmd[3:]], capture_output=True, text=True, cwd=REPO, check=False
    )
    line = next((ln for ln in probe.stderr.splitlines() if ln.startswith("IMPORTED")), "IMPORTED ?")
    imported = line.removeprefix("IMPORTED ").strip()

    median = statistics.median(times)
    print(f"gpudoctor check --quick --snapshot {Path(args.snapshot).name}: {args.runs} fresh processes")
    print(f"  median {median:.3f} s   min {min(times):.3f} s   max {max(times):.3f} s   (target < {TARGET_S} s)")
    print(f"  heavy modules imported: {imported}  (torch imported: {'torch' in imported})")
    ok = median < TARGET_S and "torch" not in imported
    print("  OK" if ok else "  NOT OK")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
