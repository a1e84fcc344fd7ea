"""Redaction's worst case, as a ratio to its ordinary case: `redact.text` on adversarial 4 KiB texts
(long runs of name characters, `a-a-a-...`, `x:x:x:...`, unterminated quotes, base64) against the
same function on an ordinary 4 KiB command line.

    .venv/bin/python benchmarks/redact_worst.py [--repeat 5]

Why: gpudoctor redacts other users' command lines and environment values (cut to 4 KiB first,
`redact.MAX_TEXT`), and another user chooses them. Before the name patterns could only start at
the beginning of a run, `"a" * 4096` took about 200 ms, quadratic in the length (review5).
Each text is timed `--repeat` times, the best kept, interleaved with the floor.

Target: every adversarial text at most 10x the ordinary line (a heuristic bar: linear work with a
different constant). Exits 1 when missed.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpudoctor.safety.redact import MAX_TEXT, text  # noqa: E402

TARGET_RATIO = 10.0
ORDINARY = (
    "torchrun --nproc-per-node 8 --rdzv-endpoint=10.0.0.1:29500 train.py --model Meta-Llama-3.1-8B "
    "--lr 3e-4 --batch-size 64 --data /mnt/datasets/shard-000123/train.jsonl --bf16 --seed 1234 "
)
ADVERSARIAL = {
    "a run of letters": "a" * MAX_TEXT,
    "a-a-a-...": "a-" * (MAX_TEXT // 2),
    "dashes": "-" * MAX_TEXT,
    "CamelCase_joined": "_".join(["TransformerEncoderLayerWithRotaryEmbedding"] * 100),
    "x:x:x:...": "x:" * (MAX_TEXT // 2),
    "@x:x:x:...": "@" + "x:" * (MAX_TEXT // 2),
    "a= 'a= '...": "a= '" * (MAX_TEXT // 4),
    "k=v,k=v,...": "k=v," * (MAX_TEXT // 4),
    "base64url": "QUJDRGVmZ2hpams_LW5vcHFyc3R1dnd4eXo0NTY3ODk" * 100,
    "a:b@a:b@...": "a:b@" * (MAX_TEXT // 4),
    "Name: Name: ...": "Name: " * (MAX_TEXT // 6),
    ",a:,a:...@": (",a:" * (MAX_TEXT // 3))[: MAX_TEXT - 1] + "@",  # review6
    "password: x, ...": "password: x, " * (MAX_TEXT // 13),
}


def best(value: str, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        text(value)
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    ordinary = (ORDINARY * (MAX_TEXT // len(ORDINARY) + 1))[:MAX_TEXT]
    worst = 0.0
    print(f"{'text (4 KiB)':22s} {'ms':>8s} {'x ordinary':>11s}")
    for name, value in ADVERSARIAL.items():
        floor = best(ordinary, args.repeat)
        took = best(value[:MAX_TEXT], args.repeat)
        worst = max(worst, took / floor)
        print(f"{name:22s} {took * 1000:8.2f} {took / floor:11.2f}")
    print(f"{'ordinary command line':22s} {best(ordinary, args.repeat) * 1000:8.2f}")
    ok = worst <= TARGET_RATIO
    print(f"worst: {worst:.2f}x the ordinary line (target <= {TARGET_RATIO:g}x): {'met' if ok else 'MISSED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
