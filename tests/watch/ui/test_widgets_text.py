"""The GPU rows' utilization history, character by character."""

from __future__ import annotations

from collections import deque

from gpudoctor.watch.ui.widgets import BLOCKS, sparkline


def test_the_history_is_one_block_per_sample_from_the_baseline_to_full_newest_on_the_right() -> None:
    assert sparkline([0, 50, 100], 10) == "▁▄█"  # zero keeps the baseline: a flat-lined GPU stays visible
    assert sparkline(deque(range(0, 101, 10)), 4) == sparkline([70, 80, 90, 100], 4)  # the last `width`
    assert sparkline([5, 7, 19, 43, 56, 69, 81, 94], 8) == "▁▁▂▃▄▆▆█"  # eighths of 100%, rounded
    assert sparkline([-3, 140, 19.0], 8) == "▁█▂"  # out of range clamped; a fraction is rounded the same way
    assert sparkline([1, 2], 0) == ""
    every = sparkline(list(range(101)), 101)
    assert len(every) == 101 and set(every) == set(BLOCKS)
    assert list(every) == sorted(every, key=BLOCKS.index)  # never lower for more utilization
