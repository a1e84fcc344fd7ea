"""The probe: the only code that reads NVML, procfs/sysfs and the environment.

`collect()` returns a `Snapshot`; nothing it reads can raise past it.
"""

from __future__ import annotations

from collections.abc import Mapping

from gpudoctor.probe.nvml import Nvml
from gpudoctor.snapshot import Snapshot


def collect(nvml: Nvml | None = None, environ: Mapping[str, str] | None = None) -> Snapshot:
    """Read this machine into a Snapshot. `nvml` and `environ` are injectable for tests."""
    from gpudoctor.probe.machine import collect_machine

    return collect_machine(nvml or Nvml(), environ)
