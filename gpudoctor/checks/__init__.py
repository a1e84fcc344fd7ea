"""The checks of `gpudoctor check`: one module per area, static ones here, active/ (level 2: they
run workloads) and deep/ (level 3: under sustained load).

`registry()` builds the registry from MODULES, in the order their results are shown. A static
check reads only the snapshot; it never imports launch/ or workloads/ (tests/test_layers.py).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from importlib import import_module

from gpudoctor.engine.context import CheckContext, CheckOptions
from gpudoctor.engine.registry import Registry
from gpudoctor.snapshot import Snapshot

# Modules under gpudoctor/checks/, in the order their results are shown.
MODULES = (
    "driver_reachable",
    "torch_install",
    "driver_stack",
    "lost_gpus",
    "visibility",
    "expected",
    "launch_port",
    "identity",
    "topology",
    "link_errors",
    "memory_errors",
    "recovery_action",
    "xid_errors",
    "clocks",
    "ecc_mode",
    "idle_temperature",
    "gpu_modes",
    "nccl_env",
    "nccl_tuning",
    "host_memory",
    "host_resources",
    "network",
    "active.allreduce",
    "active.collectives",
    "active.ddp",
    "active.link_probes",
    "deep.load",
    "deep.sdc",
    "deep.memory",
    "deep.links",
    "active.nodes",
)


@cache
def registry() -> Registry:
    """The checks, in display order, with the starters of the runs they share."""
    from gpudoctor.checks.active.run import start_active_run
    from gpudoctor.checks.deep.common import start_deep_run

    modules = [import_module(f"gpudoctor.checks.{name}") for name in MODULES]
    return Registry.from_modules(modules, runs={"active": start_active_run, "deep": start_deep_run})


def context(
    snapshot: Snapshot, options: CheckOptions | None = None, progress: Callable[[str], None] | None = None
) -> CheckContext:
    """A context wired as the runner wires one (the registry, the plan of every check at the options'
    level, the shared runs), for calling a check function directly: a tool or a test."""
    from gpudoctor.engine.runner import wire
    from gpudoctor.engine.selection import Selection

    ctx = CheckContext(snapshot, options or CheckOptions(), progress=progress or (lambda message: None))
    wire(ctx, registry(), Selection().using(registry()))
    return ctx
