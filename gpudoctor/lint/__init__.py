"""`gpudoctor lint`: the mistakes of a multi-GPU training script that are visible in its code,
found with Python's `ast` before it runs; the script is never imported or executed.

The rules are pure functions over a parsed file (and the facts of the files linted with it):
a hard-coded MASTER_PORT, device_count() as the world size, mp.spawn under torchrun, the global
rank as a device index, data not sharded, set_epoch never called, random_split per rank, writes
every rank makes, torch.load without map_location, DDP on the default GPU, accumulation without
no_sync, clipping scaled gradients, DataParallel, BatchNorm at small per-GPU batches (GD750-GD763;
GD799 a file that cannot be read or parsed). docs/lint.md lists them.

This layer imports the nouns (findings, errors), safety (reading the files), and the engine's
codes only. `lint_paths` is the one entry other commands use (`gpudoctor watch` may lint the
script it is about to run, with the launcher it knows).
"""

from __future__ import annotations

from typing import Any

__all__ = ["lint_paths", "lint_report"]


def __getattr__(name: str) -> Any:
    """The entry points load the rules on first use: `explain` and `list-checks` need only the codes."""
    if name in __all__:
        from gpudoctor.lint import runner

        return getattr(runner, name)
    raise AttributeError(f"module 'gpudoctor.lint' has no attribute {name!r}")
