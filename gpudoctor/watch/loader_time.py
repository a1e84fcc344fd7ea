"""Time inside next(loader), as a share of each rank's step time over a window (gpudoctor.watch_loader).

The step records measure the time between two steps (input wait, in the step API's words); the loader
wrapper measures the part of it spent inside next(loader). Both arrive per interval (the ranks flush
them together), so over a window their sums compare: what is left is other work between steps
(evaluation, logging, checkpointing: GD948), not the input pipeline.
"""

from __future__ import annotations

from collections.abc import Sequence

from gpudoctor.watch.model import Sample


def loader_shares(win: Sequence[Sample]) -> dict[tuple[int | None, int], float]:
    """Per rank (rank, pid) that wraps its loader: time inside next(loader) / step time, over the window."""
    step_time: dict[tuple[int | None, int], float] = {}
    loader: dict[tuple[int | None, int], float] = {}
    for s in win:
        for r in s.ranks or ():
            if r.steps and r.step_s is not None:
                key = (r.rank, r.pid)
                step_time[key] = step_time.get(key, 0.0) + r.steps * r.step_s
        for d in s.data or ():
            if d.loader is not None and d.loader.batches:
                loader[d.key] = loader.get(d.key, 0.0) + d.loader.s
    return {key: min(1.0, t / step_time[key]) for key, t in loader.items() if step_time.get(key)}
