"""GD0 (gpudoctor itself): is PyTorch installed where the active checks will run it? (static)."""

from __future__ import annotations

from gpudoctor.engine import CheckContext, Code, check
from gpudoctor.findings import Finding, Status
from gpudoctor.snapshot import Missing

TORCH_MISSING = Code(
    "GD002",
    "torch-missing",
    "PyTorch is installed in the Python gpudoctor runs in",
    what="Looks for the torch package in the Python environment gpudoctor runs in (its distribution "
    "metadata, else torch/version.py), without importing it.",
    why="The active checks (all-reduce sweep, DDP sanity run, link probes) run torch in spawned ranks "
    "with the same Python: without torch every rank fails at its first import, and a training job "
    "started from this environment fails the same way.",
    fix="Install PyTorch into this environment, e.g. `python -m pip install torch` (on a GPU machine, "
    "the build for your CUDA version from https://pytorch.org/get-started/locally/), or run "
    "gpudoctor from the environment you train with. `gpudoctor check --quick` runs the static "
    "checks without torch.",
)


@check("torch_install", "PyTorch installed", codes=[TORCH_MISSING])
def torch_install(ctx: CheckContext) -> list[Finding]:
    version = ctx.snapshot.software.torch
    if not isinstance(version, Missing):
        return [
            Finding(TORCH_MISSING.code, Status.PASS, "host", f"torch {version} is installed", "", {"torch": version})
        ]
    if version.reason != "unsupported":  # could not tell (a broken installation is its own message)
        return [
            Finding(
                TORCH_MISSING.code,
                Status.WARN,
                "host",
                f"cannot tell whether torch is installed: {version.detail or version.reason}",
                TORCH_MISSING.fix,
                {"torch": {"missing": version.reason, "detail": version.detail}},
            )
        ]
    # Without workloads (--quick, a recorded snapshot) nothing here needs torch yet: say it, do not fail.
    status = Status.WARN if ctx.options.quick else Status.FAIL
    needs = "the training run needs it" if ctx.options.quick else "the active checks and the training run need it"
    return [
        Finding(
            TORCH_MISSING.code,
            status,
            "host",
            f"PyTorch is not installed in this Python: {needs}",
            TORCH_MISSING.fix,
            {"torch": {"missing": version.reason, "detail": version.detail}},
        )
    ]
