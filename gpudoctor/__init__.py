"""gpudoctor: is this machine ready for multi-GPU PyTorch training, and is the run balanced?

The Python API (gpudoctor/api.py), imported on first use so that `import gpudoctor` stays light:

    import gpudoctor
    gpudoctor.preflight(expect_gpus=8)   # raises gpudoctor.PreflightError listing what fails
    report = gpudoctor.run_checks(quick=True)

and the training-step API (gpudoctor/training_step.py, standard library only: no torch, click or
textual), which `gpudoctor watch -- COMMAND` listens to:

    for batch in gpudoctor.watch_loader(loader):   # what each rank reads, time inside next(loader)
        with gpudoctor.step() as step:
            step.loss(train_step(batch))             # NaN/inf, ranks that disagree
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from gpudoctor.version import __version__

if os.environ.get("GPUDOCTOR_STEPS"):  # under `gpudoctor watch -- COMMAND`: say when this process joins
    from gpudoctor.training_step import arrive

    arrive()

if TYPE_CHECKING:
    from gpudoctor.api import PreflightError, diff_report, preflight, run_checks
    from gpudoctor.errors import UserError
    from gpudoctor.training_step import step, watch_loader

__all__ = [
    "PreflightError",
    "UserError",
    "__version__",
    "diff_report",
    "preflight",
    "run_checks",
    "step",
    "watch_loader",
]

_API = {"run_checks", "preflight", "PreflightError", "diff_report"}


def __getattr__(name: str) -> Any:
    if name in ("step", "watch_loader"):
        from gpudoctor import training_step

        value = getattr(training_step, name)
        globals()[name] = value  # later lookups skip this function: step() is called once per training step
        return value
    if name in _API:
        from gpudoctor import api

        return getattr(api, name)
    if name == "UserError":
        from gpudoctor.errors import UserError

        return UserError
    raise AttributeError(f"module 'gpudoctor' has no attribute {name!r}")
