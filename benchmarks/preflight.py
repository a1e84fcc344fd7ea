"""What `gpudoctor.preflight()` costs at the top of a training script, as a ratio to `import torch`.

    .venv/bin/python benchmarks/preflight.py [--runs 15] [--snapshot FILE]

Times fresh processes, after one warm-up run each that fills the OS file cache:
  preflight: `import gpudoctor; gpudoctor.preflight(expect_gpus=8, snapshot=FILE)` (quick checks)
  floor:     `import torch`, which every training script pays anyway
and prints medians and the ratio preflight/floor, measured in the same run. With a live machine
(no --snapshot) the probe's NVML calls are included. Exits 1 when preflight imported torch or
costs more than the floor (target: ratio < 1).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

PREFLIGHT = (
    "import sys, gpudoctor\n"
    "snapshot = sys.argv[1] or None\n"
    "try:\n"
    "    gpudoctor.preflight(expect_gpus=8, snapshot=snapshot)\n"
    "except gpudoctor.PreflightError:\n"
    "    pass\n"
    "print('TORCH', 'torch' in sys.modules, file=sys.stderr)\n"
)
FLOOR = "import torch\n"


def median_s(code: str, args: list[str], runs: int) -> tuple[float, str]:
    cmd = [sys.executable, "-c", code, *args]
    subprocess.run(cmd, capture_output=True, cwd=REPO, check=False)  # warm-up
    times, err = [], ""
    for _ in range(runs):
        start = time.perf_counter()
        p = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, check=False)
        times.append(time.perf_counter() - start)
        if p.returncode != 0:
            raise SystemExit(f"{cmd[:3]} exited {p.returncode}: {p.stderr.strip()[-500:]}")
        err = p.stderr
    return statistics.median(times), err


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--snapshot", default=str(REPO / "tests/fixtures/h100_sxm_8x.json"), help="'' for live")
    args = parser.parse_args()
    pre, err = median_s(PREFLIGHT, [args.snapshot], args.runs)
    floor, _ = median_s(FLOOR, [], args.runs)
    torch_imported = "TORCH True" in err
    where = Path(args.snapshot).name if args.snapshot else "this machine (live probe)"
    print(f"gpudoctor.preflight(expect_gpus=8) on {where}: {args.runs} fresh processes each")
    print(f"  preflight (import gpudoctor + quick checks): median {pre:.3f} s")
    print(f"  floor (import torch):                        median {floor:.3f} s")
    print(f"  ratio preflight / import torch: {pre / floor:.2f}   (torch imported by preflight: {torch_imported})")
    ok = pre < floor and not torch_imported
    print("  OK" if ok else "  NOT OK")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
