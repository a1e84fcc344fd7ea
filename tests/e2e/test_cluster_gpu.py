"""The cross-node workload on real GPUs with NCCL (skipped without two GPUs): one "node" per GPU under
torchrun, so the NCCL path (communicators split per round with torch's split_group) runs for real."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import GPU_COUNT
from tests.helpers.torchrun_nodes import TORCHRUN, run_nodes

pytestmark = [pytest.mark.gpu, pytest.mark.slow]


@pytest.mark.skipif(TORCHRUN is None, reason="no torchrun")
def test_one_gpu_per_node_under_torchrun_names_the_slowed_node(tmp_path: Path) -> None:
    nodes = min(4, GPU_COUNT)
    if nodes < 2:
        pytest.skip("needs two GPUs")

    def env_of(node: int) -> dict[str, str]:
        return {"CUDA_VISIBLE_DEVICES": str(node), "GPUDOCTOR_FAULT": "node1:slownet" if nodes >= 3 else ""}

    doc = run_nodes(tmp_path, nodes, env_of, ["--select", "nodes", "--json", "--timeout", "300"], wait_s=420)[0]
    findings = [f for c in doc["checks"] if c["name"] == "nodes" for f in c["findings"]]
    codes = {f["code"] for f in findings}
    assert "GD684" not in codes and "GD680" in codes, findings
    if nodes >= 3:
        [slow] = [f for f in findings if f["code"] == "GD681"]
        assert slow["subject"].endswith("#1")
