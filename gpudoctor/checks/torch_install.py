"""GD0 (gpudoctor itself): is PyTorch installed where the active checks will run it? (static)."""

from __future__ import annotations

from gpudoctor.engine import CheckContext, Code, check
from gpudoctor.findings import Finding, Status
from gpudoctor.snapshot import Missing

TORCH_MISSING = Code(
    "GD002",
    "torch-missing",
    "PyTorch is installed in the Python the ranks run in",
    what="Looks for the torch package in the Python the active checks' ranks run in, without importing "
    "it: the one gpudoctor runs in, or the interpreter named by `--python PATH` (your training "
    "environment's), whose torch, CUDA and NCCL versions the other checks then judge.",
    why="The active checks (all-reduce sweep, DDP sanity run, link probes) run torch in spawned ranks: "
    "without torch every rank fails at its first import, and a training job started from that "
    "environment fails the same way. gpudoctor itself does not need torch: `pip install gpudoctor` "
    "is the light install (watch, report, `check --quick`, preflight).",
    fix="Run the ranks in the environment you train with: `gpudoctor check --python /path/to/venv/bin/python` "
    "(gpudoctor need not be installed there). Or install torch beside gpudoctor: "
    "`pip install 'gpudoctor[torch]'`, or `python -m pip install torch` (on a GPU machine, the build for "
    "your CUDA version from https://pytorch.org/get-started/locally/). `gpudoctor check --quick` runs the "
    "static checks without torch.",
)


@check("torch_install", "PyTorch installed", codes=[TORCH_MISSING])
def torch_install(ctx: CheckContext) -> list[Finding]:
    version = ctx.snapshot.software.torch
    python = ctx.options.python
    where = f" in {python} (--python)" if python else ""
    evidence = {"python": python} if python else {}
    if not isinstance(version, Missing):
        return [
            Finding(
                TORCH_MISSING.code,
                Status.PASS,
                "host",
                f"torch {version} is installed{where}",
                "",
                {"torch": version, **evidence},
            )
        ]
    if version.reason != "unsupported":  # could not tell (a broken installation is its own message)
        return [
            Finding(
                TORCH_MISSING.code,
                Status.WARN,
                "host",
                f"cannot tell whether torch is installed{where}: {version.detail or version.reason}",
                TORCH_MISSING.fix,
                {"torch": {"missing": version.reason, "detail": version.detail}, **evidence},
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
            f"PyTorch is not installed {where.strip() or 'in this Python'}: {needs}",
            TORCH_MISSING.fix,
            {"torch": {"missing": version.reason, "detail": version.detail}, **evidence},
        )
    ]
