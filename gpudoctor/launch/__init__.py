"""Starting ranks and supervising them (the parent side of active checks; torch-free).

One concern a module:

    results           what a launch runs and returns: Task, RankOutcome, LaunchResult
    workload_results  the typed results of the workloads the checks read (TypedDicts of the JSON)
    protocol          the parent/rank protocol: the rank's spec, its events in order, the typed
                      writer (rank side), the reader and `apply` (parent side)
    environment       the device, torchrun/srun's variables, the spawned ranks' environment
    rundir            the ranks' private directory, its run lock and its rendezvous store
    supervise         launch(): spawn, watch against deadlines, stop, collect
    faults            faults injected into ranks for tests (GPUDOCTOR_FAULTS)

The public face below is loaded on first use (PEP 562), so importing one module of this package
(the rank imports `faults` and `protocol`) loads no other.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpudoctor.launch.environment import check_launcher_env, choose_device, launcher_env, torchrun_env
    from gpudoctor.launch.results import LaunchResult, RankOutcome, Task
    from gpudoctor.launch.supervise import launch

_FACE = {
    "launch": "supervise",
    "Task": "results",
    "LaunchResult": "results",
    "RankOutcome": "results",
    "choose_device": "environment",
    "torchrun_env": "environment",
    "launcher_env": "environment",
    "check_launcher_env": "environment",
}

__all__ = [
    "LaunchResult",
    "RankOutcome",
    "Task",
    "check_launcher_env",
    "choose_device",
    "launch",
    "launcher_env",
    "torchrun_env",
]


def __getattr__(name: str) -> Any:
    module = _FACE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(f"{__name__}.{module}"), name)
