"""How the dashboard shares out its height, on every resize and whenever what must be shown changes.

Top to bottom: the status line, the host line, the GPUs, the training ranks (when the job publishes
steps), the verdicts (the balance figures and the event log), the processes, the keys. The status,
host and key lines come first, then the verdicts that hold now (never lost to the process table),
then the GPUs (one line each, or the compact mode where that does not fit; the list scrolls past
that), the ranks, the rest of the event log and its hints, and what is left to the processes.
A pure function of the counts: no widget is asked.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpudoctor.watch.ui.widgets import grid_height

MIN_PROCS = 4  # fewer lines than this for the process table: it is hidden
FIXED_LINES = 3  # the status, host and key lines
BORDER = 2  # a panel's top and bottom border


@dataclass(frozen=True)
class Heights:
    mode: str  # the GPU rows drawn: "full" (one a line) or "compact" (several a line)
    gpus: int  # each panel's height with its border; 0: hidden
    ranks: int
    verdicts: int
    procs: int
    gpus_scroll: bool  # the GPU rows need more than their panel has: the list scrolls
    hints: bool  # the event log has room for its hints


def share_heights(
    height: int,
    inner: int,
    *,
    n_gpus: int,
    n_ranks: int,
    n_events: int,
    n_active: int,
    any_procs: bool,
    mode: str,
) -> Heights:
    """The panels' heights for a screen `height` rows high whose panels are `inner` columns wide.

    `mode` is "auto" (the GPU rows chosen by height) or "full"/"compact" pinned by the `c` key;
    `n_events` verdicts are in the log, `n_active` of them hold now; `any_procs`: the job has processes
    to list (with no GPU and none, there is no process table)."""
    free = height - FIXED_LINES
    verdict_min = BORDER + 1 + max(1, n_active)  # the balance line and the verdicts that hold
    gpu_full = BORDER + 1 + n_gpus if n_gpus else 0  # a header line and a row per GPU
    gpu_compact = BORDER + grid_height(n_gpus, inner) if n_gpus else 0
    rank_need = BORDER + 1 + n_ranks if n_ranks else 0
    rank_min = min(rank_need, 5)
    if mode == "auto":
        mode = "full" if gpu_full <= free - verdict_min - rank_min else "compact"
    gpu_need = gpu_full if mode == "full" else gpu_compact
    gpu_h = max(min(gpu_need, free - verdict_min - rank_min), min(gpu_need, 4))
    rank_h = max(0, min(rank_need, free - verdict_min - gpu_h))
    left = free - gpu_h - rank_h
    extra_log = n_events - n_active
    verdict_h = max(verdict_min, min(left, verdict_min + extra_log + n_active))
    procs_h = left - verdict_h
    if not n_gpus and not any_procs:  # no GPU, and no job whose processes to list
        procs_h = 0
    elif procs_h < MIN_PROCS:
        verdict_h, procs_h = left, 0
    hints = verdict_h - 3 >= n_events + n_active
    return Heights(mode, gpu_h, rank_h, verdict_h, procs_h, gpu_need > gpu_h, hints)
