"""A fake `pynvml` for end-to-end tests of `gpudoctor watch` following a real job (never in a real run).

With this directory first on PYTHONPATH, `import pynvml` in gpudoctor finds this module instead of
nvidia-ml-py. It answers as two H200s (tests/fakes/live_nvml.py's readings) whose compute processes are
what the job's own ranks wrote into the directory named by GPUDOCTOR_TEST_NVML_PROCS: one <pid>.json per
process, {"pid": PID, "gpus": {"0": MiB, ...}} (tests/fixtures/jobs/data_job.py --placement); each time it
tells of a process it makes a <pid>.seen file beside, which the job removes and waits for before it exits. The PIDs are
the ranks' real PIDs, so gpudoctor resolves them, follows them in the job's tree and matches them to the
ranks' step records as it would on a GPU machine.
"""

from __future__ import annotations

import json
import os
from types import SimpleNamespace
from typing import Any

from tests.fakes.live_nvml import LiveNvml  # pynvml's own names (NVMLError, constants) come from its view

H200_MIB = 143771  # nvidia-smi's total for an H200 (141 GB HBM3e)


class RanksOnGpus(LiveNvml):
    """Two H200s; the processes on each are the ranks that say they are there."""

    def __init__(self) -> None:
        super().__init__()
        self.live(1).xids.clear()  # LiveNvml's GPU 1 has an XID 79 pending: a healthy machine here

    # Handles are the strict fake's (tests/fakes/nvml_c.py), not indices: each answer asks for the index.
    def nvmlDeviceGetName(self, h: Any) -> str:
        self.nvmlDeviceGetIndex(h)
        return "NVIDIA H200"

    def nvmlDeviceGetUUID(self, h: Any) -> str:
        return f"GPU-{self.nvmlDeviceGetIndex(h):08x}-0000-0000-0000-000000000000"

    def nvmlDeviceGetMemoryInfo(self, h: Any, version: int | None = None) -> Any:
        self.nvmlDeviceGetIndex(h)
        return SimpleNamespace(used=31000 * 2**20, total=H200_MIB * 2**20, reserved=0, free=(H200_MIB - 31000) * 2**20)

    def nvmlDeviceGetComputeRunningProcesses(self, h: Any) -> list[Any]:
        index = self.nvmlDeviceGetIndex(h)
        folder = os.environ.get("GPUDOCTOR_TEST_NVML_PROCS", "")
        out = []
        for name in sorted(os.listdir(folder)) if folder else ():
            if not name.endswith(".json"):
                continue  # a <pid>.seen mark of ours
            try:
                with open(os.path.join(folder, name)) as f:
                    doc = json.load(f)
            except (OSError, ValueError):
                continue  # a rank still writing its file
            mib = doc.get("gpus", {}).get(str(index))
            if mib:
                out.append(SimpleNamespace(pid=int(doc["pid"]), usedGpuMemory=int(mib) * 2**20))
                # Told to gpudoctor: data_job.py waits for fresh marks after its training before it exits, as a
                # real job holds its memory to the end (a short job on a loaded machine could end unseen).
                open(os.path.join(folder, f"{doc['pid']}.seen"), "a").close()
        return out


_LIB = RanksOnGpus()


def __getattr__(name: str) -> Any:
    return getattr(_LIB, name)
