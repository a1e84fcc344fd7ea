"""Test-only interpreter hooks, active when this directory is on PYTHONPATH (never in a real run).

GPUDOCTOR_TEST_HIDE="numpy,torch": those packages look uninstalled to this interpreter, as after
`pip install gpudoctor` without them: `import` fails, importlib.util.find_spec answers None and
importlib.metadata finds no distribution. (Raising from a finder would not do: find_spec must
answer None, as torch._dynamo asks it for numpy.)

GPUDOCTOR_TEST_SLOW_IMPORT="<module>:<file>": importing <module> first creates <file>, then waits
60 s, so a test can send a signal while gpudoctor is starting up, at a known point.
"""

from __future__ import annotations

import os
import sys
import time
from importlib.machinery import PathFinder

_HIDDEN = tuple(m for m in os.environ.get("GPUDOCTOR_TEST_HIDE", "").split(",") if m)
_SLOW = os.environ.get("GPUDOCTOR_TEST_SLOW_IMPORT", "")


def _hidden(name: str) -> bool:
    return any(name == m or name.startswith(m + ".") for m in _HIDDEN)


class _Finder(PathFinder):
    @classmethod
    def find_spec(cls, name, path=None, target=None):  # type: ignore[no-untyped-def,override]
        if _hidden(name):
            return None
        if _SLOW and name == _SLOW.split(":", 1)[0]:
            with open(_SLOW.split(":", 1)[1], "w") as ready:
                ready.write(str(os.getpid()))
            time.sleep(60)
        return PathFinder.find_spec(name, path, target)

    @classmethod
    def find_distributions(cls, context=None):  # type: ignore[no-untyped-def,override]
        from importlib.metadata import DistributionFinder

        found = PathFinder.find_distributions(context or DistributionFinder.Context())
        return (d for d in found if not _hidden((d.metadata["Name"] or "").replace("-", "_").lower()))


if _HIDDEN or _SLOW:
    sys.meta_path[:] = [_Finder if f is PathFinder else f for f in sys.meta_path]
