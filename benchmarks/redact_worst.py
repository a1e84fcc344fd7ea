"""Redaction's worst case, as a ratio to its ordinary case: `redact.argv` and `redact.text` on
adversarial 4 KiB inputs (long runs of name characters, `a-a-a-...`, `x:x:x:...`, `a=a=...`,
unterminated quotes, base64, URL-shaped and option-shaped words) against the same functions on an
ordinary 4 KiB command line.

    .venv/bin/python benchmarks/redact_worst.py [--repeat 5]

Why: gpudoctor redacts other users' command lines (cut to 4 KiB first, `redact.MAX_TEXT`), and
another user chooses them. The deny-list this allow-list replaced had patterns with quadratic
corners (review5: `"a" * 4096` took about 200 ms). The allow-list reads each word once with
anchored patterns of bounded length. Each input is timed `--repeat` times, the best kept,
interleaved with the floor; each timing is of 10 calls.

Targets: every adversarial input at most 10x the ordinary line (a heuristic bar: linear work with a
different constant; an input of short words has more words per KiB than a command line), and
doubling an input at most triples its time (linear: 2x). Exits 1 when missed.
"""

from __future__ import annotations

import argparse
import sys
import timeit
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpudoctor.safety.redact import MAX_TEXT, argv, text  # noqa: E402

TARGET_RATIO = 10.0
TARGET_DOUBLING = 3.0  # time(4 KiB) / time(2 KiB) of the same input: 2 when linear, 4 when quadratic
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
    "a=a=a=...": "a=" * (MAX_TEXT // 2),
    "k=v,k=v,...": "k=v," * (MAX_TEXT // 4),
    "base64url": "QUJDRGVmZ2hpams_LW5vcHFyc3R1dnd4eXo0NTY3ODk" * 100,
    "a:b@a:b@...": "a:b@" * (MAX_TEXT // 4),
    "Name: Name: ...": "Name: " * (MAX_TEXT // 6),
    ",a:,a:...@": (",a:" * (MAX_TEXT // 3))[: MAX_TEXT - 1] + "@",
    "s://s://s://...": "s://" * (MAX_TEXT // 4),
    "1.1.1.1.1...": "1." * (MAX_TEXT // 2),
    "--a --a --a ...": "--a " * (MAX_TEXT // 4),
    "-p1 -p1 -p1 ...": "-p1 " * (MAX_TEXT // 4),
}


def best(*fns: Callable[[], object], repeat: int, number: int = 10) -> list[float]:
    """Per call, the best of `repeat` timings of `number` calls of each of `fns`, interleaved (a
    loaded machine adds time, never takes it, and slows all of them alike)."""
    times = [[timeit.timeit(fn, number=number) / number for fn in fns] for _ in range(repeat)]
    return [min(column) for column in zip(*times, strict=True)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    ordinary = (ORDINARY * (MAX_TEXT // len(ORDINARY) + 1))[:MAX_TEXT]
    worst = doubling = 0.0
    print(f"{'input (4 KiB)':22s} {'argv ms':>8s} {'x':>6s} {'text ms':>8s} {'x':>6s} {'4K/2K':>6s}")
    for name, value in ADVERSARIAL.items():
        value = value[:MAX_TEXT]
        cells, growth = [], 0.0
        for fn in (lambda v: argv(["prog", v]), text):
            floor, took, half = best(
                lambda: fn(ordinary),  # noqa: B023
                lambda: fn(value),  # noqa: B023
                lambda: fn(value[: MAX_TEXT // 2]),  # noqa: B023
                repeat=args.repeat,
            )
            worst = max(worst, took / floor)
            if took >= floor / 4:  # (a doubling of microseconds is noise, not growth)
                doubling = max(doubling, took / half)
                growth = max(growth, took / half)
            cells += [f"{took * 1000:8.2f}", f"{took / floor:6.2f}"]
        print(f"{name:22s} {' '.join(cells)} {growth:6.2f}" if growth else f"{name:22s} {' '.join(cells)}")
    floor_argv, floor_text = best(lambda: argv(["prog", ordinary]), lambda: text(ordinary), repeat=args.repeat)
    print(f"{'ordinary command line':22s} {floor_argv * 1000:8.2f} {'':6s} {floor_text * 1000:8.2f}")
    ok = worst <= TARGET_RATIO and doubling <= TARGET_DOUBLING
    print(
        f"worst: {worst:.2f}x the ordinary line (target <= {TARGET_RATIO:g}x), doubling the input "
        f"costs {doubling:.2f}x (linear: 2, target <= {TARGET_DOUBLING:g}): {'met' if ok else 'MISSED'}"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
