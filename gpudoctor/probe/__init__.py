"""The probe: the only code that reads NVML, procfs/sysfs and the environment.

`collect()` returns a `Snapshot`; nothing it reads can raise past it. Importing this package
costs nothing (`check --quick` imports probe.environment's names): the readers load in collect().
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpudoctor.probe.nvml import Nvml
    from gpudoctor.snapshot import Snapshot


def collect(nvml: Nvml | None = None, environ: Mapping[str, str] | None = None) -> Snapshot:
    """Read this machine into a Snapshot. `nvml` and `environ` are injectable for tests."""
    from gpudoctor.probe.machine import collect_machine
    from gpudoctor.probe.nvml import Nvml

    return collect_machine(nvml or Nvml(), environ)
