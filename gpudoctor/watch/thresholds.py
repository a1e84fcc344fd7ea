"""The thresholds `watch` judges by: one frozen set, the policy file's [watch] table in kebab-case.

Apart from the analysis that reads them, so the window (which keeps its totals for one set) and the
policy reader need not import the rules.
"""

from __future__ import annotations

from dataclasses import dataclass


# Every threshold below is gpudoctor's heuristic (not a published figure), tuned on the synthetic and
# recorded runs in tests/fixtures/recordings and on real gloo jobs in the tests; each can be overridden.
@dataclass(frozen=True)
class Thresholds:
    window_s: float = 30.0
    min_samples: int = 5  # fewer than this in the window: too early to judge balance
    # No balance verdict before this many seconds of watching (data loading, compilation, NCCL set-up
    # look like imbalance). None: 60 s or the first full window, whichever is later.
    warmup_s: float | None = None
    idle_util: float = 5.0  # every GPU below this mean utilization: idle, not "balanced"
    straggler_gap: float = 15.0  # utilization points away from the median of the others
    straggler_share: float = 0.8  # ...in this share of the window's samples
    mem_gap_share: float = 0.15  # extra memory, as a share of the GPU's total
    mem_ratio: float = 1.25  # ...and at least this times the median of the others
    starve_util: float = 50.0  # every GPU below this at once is a dip
    starve_share: float = 0.3  # dips in this share of the window
    starve_cpu: float = 85.0  # host CPU busy % during the dips
    hung_util: float = 95.0
    hung_power_share: float = 0.25  # power below this share of the limit while "busy"
    hung_idle_w: float = 100.0  # used when the power limit is unknown
    hung_min_s: float = 20.0
    throttle_share: float = 0.5
    # Training steps (gpudoctor.step()).
    rank_slow_ratio: float = 1.2  # a rank's mean step time vs the median of the others'
    rank_late_share: float = 0.1  # a rank ends its steps this share of the step time after the others...
    rank_late_min_s: float = 0.005  # ...and at least this late (timer noise)
    rank_late_hits: float = 0.8  # ...in this share of its comparable steps
    rank_wait_share: float = 0.2  # one rank waits this share of its steps for input...
    rank_wait_ratio: float = 2.0  # ...and this many times the others' median
    input_wait_share: float = 0.25  # the median rank waits this share of its steps for input
    hang_after_s: float | None = None  # no step finished for this long; None: max(60 s, 10x the median step)
    hang_min_s_steps: float = 60.0
    hang_step_factor: float = 10.0
    # The job's life (gpudoctor/watch/job.py): ranks not joined, or joined and not at step 1, this long;
    # torchrun alone this long. The bound within which a hang before step 1 is named.
    join_after_s: float = 30.0

    # The job's data, loss and resources (GD940-GD949, gpudoctor/watch/data_codes.py).
    overlap_share: float = 0.05  # GD940: a rank's sampled indices also read by another rank in one epoch
    loss_min_steps: int = 20  # GD946: finite losses per rank in the window before ranks are compared
    loss_min_intervals: int = 10  # ...and samples in which it and another rank both reported losses
    loss_gap_share: float = 0.25  # ...a gap of this share of the larger mean loss
    loss_side_share: float = 0.9  # ...on the same side of the others' median in this share of the samples
    stray_mem_mib: float = 64.0  # GD947: memory on a GPU that is not the rank's own
    outside_share: float = 0.2  # GD948: a rank's time outside both the step and next(loader)
    outside_ratio: float = 2.0  # ...this many times the others' median

    @property
    def warmup(self) -> float:
        return max(60.0, self.window_s) if self.warmup_s is None else self.warmup_s


DEFAULT = Thresholds()
