"""A fake `pynvml` for end-to-end tests of `gpudoctor watch` following a real job (never in a real run).

With this directory first on PYTHONPATH, `import pynvml` in gpudoctor finds this module instead of
nvidia-ml-py. It answers as two H200s (tests/fakes/live_nvml.py's readings) whose compute processes are
what the job's own ranks wrote into the directory named by GPUDOCTOR_TEST_NVML_PROCS: one <pid>.json per
process, {"pid": PID, "gpus": {"0": MiB, ...}} (tests/fixtures/jobs/data_job.py --placement). The PIDs are
the ranks' real PIDs, so gpudoctor resolves them, follows them in the job's tree and matches them to the
ranks' step records as it would on a GPU machine.
"""

from __future__ import annotations

import json
import os
from types import SimpleNamespace
from typing import Any

from tests.fakes.live_nvml import LiveNvml, NVMLError  # noqa: F401  (NVMLError: pynvml's name for its errors)

H200_MIB = 143771  # nvidia-smi's total for an H200 (141 GB HBM3e)


class RanksOnGpus(LiveNvml):
    """Two H200s; the processes on each are the ranks that say they are there."""

    def __init__(self) -> None:
        super().__init__()
        self.pending_xids = []

    def nvmlDeviceGetName(self, h: int) -> bytes:
        return b"NVIDIA H200"

    def nvmlDeviceGetUUID(self, h: int) -> str:
        return f"GPU-{h:08x}-0000-0000-0000-000000000000"

    def nvmlDeviceGetMemoryInfo(self, h: int) -> Any:
        self._dev(h)
        return SimpleNamespace(used=31000 * 2**20, total=H200_MIB * 2**20)

    def nvmlDeviceGetComputeRunningProcesses(self, h: int) -> list[Any]:
        folder = os.environ.get("GPUDOCTOR_TEST_NVML_PROCS", "")
        out = []
        for name in sorted(os.listdir(folder)) if folder else ():
            try:
                with open(os.path.join(folder, name)) as f:
                    doc = json.load(f)
            except (OSError, ValueError):
                continue  # a rank still writing its file
            mib = doc.get("gpus", {}).get(str(h))
            if mib:
                out.append(SimpleNamespace(pid=int(doc["pid"]), usedGpuMemory=int(mib) * 2**20))
        return out


_LIB = RanksOnGpus()


def __getattr__(name: str) -> Any:
    return getattr(_LIB, name)
