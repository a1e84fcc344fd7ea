"""docs/snapshot-format.md stays true: its example loads and it names every field."""

from __future__ import annotations

import dataclasses
import re

import pytest

from gpudoctor import snapshot as snap
from tests.paths import REPO

DOC = (REPO / "docs" / "snapshot-format.md").read_text(encoding="utf-8")


def example() -> str:
    after = DOC.split("<!-- snapshot-example -->", 1)[1]
    return re.search(r"```json\n(.*?)```", after, re.DOTALL).group(1)


def test_hand_written_example_loads_and_reads_as_documented() -> None:
    machine = snap.loads(example())
    assert [g.name for g in machine.gpus] == ["NVIDIA GeForce RTX 4090"] * 2
    assert machine.gpu(0).nvlinks == snap.Missing("unsupported")
    assert machine.gpu(0).vbios == snap.Missing("not_collected")  # left out
    assert machine.host.cgroup_memory_limit_bytes is None
    assert machine.pair(1, 0).pcie_level == "PHB"
    assert machine.env == {"CUDA_VISIBLE_DEVICES": "1,0"}
    assert snap.loads(snap.dumps(machine)) == machine


@pytest.mark.parametrize(
    "cls",
    [
        snap.Snapshot,
        snap.Gpu,
        snap.NvLink,
        snap.NvLinkErrors,
        snap.SramEcc,
        snap.RemapHistogram,
        snap.MigDevice,
        snap.RemappedRows,
        snap.FabricInfo,
        snap.GpuProcess,
        snap.GpuPair,
        snap.Driver,
        snap.Host,
        snap.XidEvent,
        snap.PortStatus,
        snap.Software,
    ],
    ids=lambda c: c.__name__,
)
def test_every_field_is_documented(cls: type) -> None:
    undocumented = [f.name for f in dataclasses.fields(cls) if f"`{f.name}`" not in DOC and f'"{f.name}"' not in DOC]
    assert undocumented == []


def test_every_missing_reason_is_documented() -> None:
    for reason in snap.MISSING_REASONS:
        assert f"`{reason}`" in DOC
