"""Time inside next(loader), as a share of each rank's step time over a window (gpudoctor.watch_loader).

The step records measure the time between two steps (input wait, in the step API's words); the loader
wrapper measures the part of it spent inside next(loader). Both arrive per interval (the ranks flush
them together), so over a window their sums compare: what is left is other work between steps
(evaluation, logging, checkpointing: GD948), not the input pipeline.
"""

from __future__ import annotations

from gpudoctor.watch.window import Window, share_of


def loader_share(w: Window, key: tuple[int | None, int]) -> float | None:
    """A rank (rank, pid) that wraps its loader: time inside next(loader) / step time, over the window
    (both kept as the window's exact running totals: O(1), whatever the window's length); else None."""
    held = w.loader.get(key)
    rank = w.ranks.get(key)
    if held is None or rank is None or not rank.step_sum:
        return None
    return share_of(held[1], rank.step_sum)  # two exact sums: the ratio correctly rounded
