"""What a check reads: the snapshot, the run's options, and what the runner hands it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import field
from functools import cached_property
from typing import TYPE_CHECKING, Any

from gpudoctor.engine.options import DEFAULT_LEVEL
from gpudoctor.records import MutableRecord, mutable_record
from gpudoctor.snapshot import Snapshot

if TYPE_CHECKING:
    from gpudoctor.engine.registry import Registry
    from gpudoctor.knowledge.visible_gpus import Visibility


@mutable_record
class CheckOptions(MutableRecord):
    """The options of one check run, resolved (arguments, then the policy, then the defaults:
    gpudoctor/pipeline.py `check_options`). Their names, bounds and help live in the option table
    (engine/options.py); these are the values checks read."""

    expect_gpus: int | None = None
    quick: bool = False  # skip checks that run workloads (level 1)
    device: str = "auto"  # "auto", "cuda" or "cpu" for workloads
    ranks: int | None = None  # CPU ranks for --device cpu
    python: str | None = None  # the interpreter the ranks run in (--python); None: this one
    timeout_s: float = 120.0  # the whole of the active checks (at most options.MAX_TIMEOUT_S)
    min_busbw_gbps: float | None = None
    busbw_warn_ratio: float = 0.8  # measured/expected below this: warn
    busbw_fail_ratio: float = 0.5  # below this: fail
    ram_per_gpu_gb: float = 16.0
    allow_mig: bool = False
    # From a policy (gpudoctor/policy.py); None: the check's own default.
    expect_model: str | None = None  # every visible GPU's name contains this (GD010)
    min_shm_bytes: int | None = None  # /dev/shm wanted (GD510's shm_wanted otherwise)
    collectives: tuple[str, ...] | None = None  # the collectives `check` judges (issue 12)
    level: int = DEFAULT_LEVEL  # run the checks of this level and below (`quick` means 1)
    duration_s: float = 60.0  # how long level 3's load tests run
    mem_share: float = 0.8  # share of free GPU memory level 3's memory test writes and verifies


@mutable_record
class CheckContext(MutableRecord):
    snapshot: Snapshot
    options: CheckOptions = field(default_factory=CheckOptions)
    progress: Callable[[str], None] = lambda message: None  # active checks report here
    # Set by the runner for the run (engine/runner.py); a check reads them, never sets them.
    registry: Registry | None = None  # the checks of this run
    planned: tuple[str, ...] = ()  # the names of the checks this run runs (a shared launch starts only theirs)
    # Whether a code's findings reach the report (--select/--ignore), so a skip never sends the
    # reader to a finding the selection hid.
    shown: Callable[[str], bool] = lambda code: True
    shared: Callable[[str], Any] = field(default=lambda name: None, repr=False)  # the runner's shared runs

    @cached_property
    def visible(self) -> Visibility:
        """The GPUs the run will use, in CUDA order (CUDA_VISIBLE_DEVICES resolved)."""
        from gpudoctor.knowledge.visible_gpus import resolve  # lazy: keeps start-up light

        return resolve(self.snapshot)

    def run(self, name: str) -> Any:
        """The shared run `name` (one launch for the checks that read it): started by the runner
        the first time a check of this run asks, from the whole run's plan, then kept."""
        return self.shared(name)
