"""`gpudoctor lint`'s cost as a script grows: the time to lint a script against the time Python's
own parser takes on it (the floor: lint cannot be cheaper than `ast.parse`), at N and 4N copies of
each shape. Linear work keeps the ratio; quadratic work multiplies it by about 4.

    .venv/bin/python benchmarks/lint_cost.py [--n 400] [--repeat 3]

Shapes: a real script (pytorch/examples imagenet/main.py) repeated with its functions renamed,
and adversarial ones a user (or a generated file) could hand lint: one long function of writes,
one variable assigned and read thousands of times, thousands of unpassed DistributedSamplers,
thousands of if/else pairs of torch.load, a chain of functions each calling the next, many DDP calls.

Target: at 4N, lint/parse at most 2x its value at N for every shape (a heuristic bar for linear
work under a noisy machine), and lint's read limit (2 MiB) bounds the rest.
Exits 1 when missed.
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpudoctor.lint import lint_paths  # noqa: E402

TARGET_GROWTH = 2.0
HEAD = "import os, torch, torch.distributed as dist\nfrom torch.nn.parallel import DistributedDataParallel as DDP\n"
HEAD += "from torch.utils.data import DataLoader, DistributedSampler\ndist.init_process_group('nccl')\n"
IMAGENET = Path(__file__).resolve().parent.parent / "tests/reference/scripts/pytorch-examples/imagenet/main.py"


def real(n: int) -> str:
    text = IMAGENET.read_text()
    names = re.findall(r"^def (\w+)", text, re.M) + re.findall(r"^class (\w+)", text, re.M)
    copies = []
    for i in range(max(1, n // 50)):
        copy = text
        for name in names:
            copy = re.sub(rf"\b{name}\b", f"{name}_{i}", copy)
        copies.append(copy)
    return "\n".join(copies)


SHAPES: dict[str, Callable[[int], str]] = {
    "imagenet repeated": real,
    "one function of writes": lambda n: (
        HEAD + "def f():\n" + "".join(f"    torch.save(m, 'c{i}.pt')\n" for i in range(n)) + "f()\n"
    ),
    "a variable assigned n times": lambda n: (
        HEAD + "".join(f"rank = int(os.environ['RANK']) + {i}\nx{i} = t.to(rank)\n" for i in range(n))
    ),
    "unpassed samplers": lambda n: (
        HEAD
        + "".join(f"s{i} = DistributedSampler(ds)\n" for i in range(n))
        + "".join("l = DataLoader(ds)\n" for _ in range(n))
    ),
    "if/else pairs of loads": lambda n: (
        HEAD
        + "".join(
            f"if a == {i}:\n    torch.load('x')\nelse:\n    torch.load('x', map_location='cpu')\n" for i in range(n)
        )
    ),
    "a chain of calls": lambda n: (
        HEAD
        + "".join(f"def f{i}():\n    torch.save(m, 'c.pt')\n    f{i + 1}()\n" for i in range(n))
        + f"def f{n}(): pass\nf0()\n"
    ),
    "many DDP calls": lambda n: HEAD + "model = Net().cuda()\n" + "".join("d = DDP(model)\n" for _ in range(n)),
}


def best(func: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        func()
        times.append(time.perf_counter() - t0)
    return min(times)


def ratio(source: str, repeat: int, folder: Path) -> tuple[float, float]:
    path = folder / "script.py"
    path.write_text(source)
    parse = best(lambda: ast.parse(source), repeat)
    lint = best(lambda: lint_paths([path]), repeat)
    return lint / parse, lint


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=400)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    missed = []
    print(f"{'shape':30} {'lint/parse @N':>14} {'@4N':>8} {'growth':>7} {'lint @4N':>9}")
    with tempfile.TemporaryDirectory() as tmp:
        for name, make in SHAPES.items():
            small, _ = ratio(make(args.n), args.repeat, Path(tmp))
            large, seconds = ratio(make(4 * args.n), args.repeat, Path(tmp))
            growth = large / small
            print(f"{name:30} {small:14.1f} {large:8.1f} {growth:7.2f} {seconds:8.2f}s")
            if growth > TARGET_GROWTH:
                missed.append(name)
    if missed:
        print(f"missed (growth over {TARGET_GROWTH}x from N to 4N): {', '.join(missed)}")
        return 1
    print(f"every shape within {TARGET_GROWTH}x from N to 4N")
    return 0


if __name__ == "__main__":
    sys.exit(main())
