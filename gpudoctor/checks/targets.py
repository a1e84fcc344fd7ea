"""Which GPUs a check judges: those the run will use."""

from __future__ import annotations

from gpudoctor.engine import CheckContext
from gpudoctor.snapshot import Gpu


def target_gpus(ctx: CheckContext) -> list[Gpu]:
    """The GPUs the run will use (CUDA_VISIBLE_DEVICES resolved), in CUDA order."""
    return list(ctx.visible.gpus)
