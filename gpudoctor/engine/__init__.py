"""The check framework: codes, the registry, the context a check reads, selection and the runner.

What a check module needs is here: `from gpudoctor.engine import CheckContext, Code, check`.
The engine names no check and no command: the checks package fills a registry
(`gpudoctor.checks.registry()`), the catalogue adds the codes of other commands.

The names load on first use: `gpudoctor.engine.options` (the option table the command line is
made from) must not pull the snapshot model into every command's start-up.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpudoctor.engine.codes import Code
    from gpudoctor.engine.context import CheckContext, CheckOptions
    from gpudoctor.engine.registry import Check, Registry, check
    from gpudoctor.engine.selection import Selection, SelectionError

__all__ = ["Check", "CheckContext", "CheckOptions", "Code", "Registry", "Selection", "SelectionError", "check"]

_HOME = {
    "Code": "codes",
    "CheckContext": "context",
    "CheckOptions": "context",
    "Check": "registry",
    "Registry": "registry",
    "check": "registry",
    "Selection": "selection",
    "SelectionError": "selection",
}


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module 'gpudoctor.engine' has no attribute {name!r}")
    value = getattr(import_module(f"gpudoctor.engine.{_HOME[name]}"), name)
    globals()[name] = value
    return value
