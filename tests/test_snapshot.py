"""Snapshot files: writing never destroys what is at the path; loading refuses impossible data."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest

from gpudoctor import snapshot as snap
from tests.helpers.snapshots import SnapshotOf
from tests.paths import FIXTURES


def test_a_symlink_at_the_output_path_is_refused_and_its_target_untouched(
    tmp_path: Path, snapshot_of: SnapshotOf
) -> None:
    (tmp_path / "target.json").write_text("precious")
    (tmp_path / "link.json").symlink_to("target.json")
    with pytest.raises(OSError, match="symbolic link"):
        snap.write(snapshot_of("h100_sxm_8x"), tmp_path / "link.json")
    assert (tmp_path / "target.json").read_text() == "precious"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.json", "target.json"]  # no temp file left


def test_writing_to_a_fifo_streams_into_it_instead_of_replacing_it(tmp_path: Path, snapshot_of: SnapshotOf) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    received: list[str] = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_text()))
    reader.start()
    snap.write(snapshot_of("h100_sxm_8x"), fifo)
    reader.join(timeout=10)
    assert fifo.is_fifo()
    assert len(snap.loads(received[0]).gpus) == 8


def test_a_failed_write_leaves_the_old_file_intact(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, snapshot_of: SnapshotOf
) -> None:
    target = tmp_path / "snap.json"
    target.write_text("old")

    def disk_full(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", disk_full)
    with pytest.raises(OSError, match="No space"):
        snap.write(snapshot_of("h100_sxm_8x"), target)
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["snap.json"]


def _doc() -> dict:
    return json.loads((FIXTURES / "h100_sxm_8x.json").read_text())


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_non_numbers_are_refused_at_load(constant: str) -> None:
    text = json.dumps(_doc()).replace('"power_limit_w": 700.0', f'"power_limit_w": {constant}', 1)
    assert constant in text
    with pytest.raises(snap.SnapshotError, match=f"{constant} is not a number JSON allows"):
        snap.loads(text)


def test_two_gpus_with_one_index_are_refused() -> None:
    doc = _doc()
    doc["gpus"][1]["index"] = 0
    with pytest.raises(snap.SnapshotError, match="two GPUs share the GPU index 0"):
        snap.from_jsonable(doc)


def test_a_snapshot_beyond_one_machine_is_refused_before_any_check_runs() -> None:
    """Hostile review M7: 1,024 GPUs took `check --snapshot` 49 s, a 1.3 MB CUDA_VISIBLE_DEVICES over 60 s."""
    doc = _doc()
    gpu = doc["gpus"][0]
    doc["gpus"] = [
        {**gpu, "index": i, "uuid": f"GPU-{i:08d}", "pci_bus_id": f"00000000:{i:04x}:00.0"} for i in range(257)
    ]
    doc["pairs"] = []
    with pytest.raises(snap.SnapshotError, match="257 GPUs: more than one machine holds"):
        snap.from_jsonable(doc)
    doc["gpus"] = doc["gpus"][:256]
    assert len(snap.from_jsonable(doc).gpus) == 256  # the bound itself is a machine
    doc = _doc()
    doc["env"]["CUDA_VISIBLE_DEVICES"] = "0," * 70_000
    with pytest.raises(snap.SnapshotError, match="CUDA_VISIBLE_DEVICES is 140000 characters long: longer than Linux"):
        snap.from_jsonable(doc)


def test_a_pair_naming_an_absent_gpu_is_refused() -> None:
    doc = _doc()
    doc["pairs"][0]["b"] = 42
    with pytest.raises(snap.SnapshotError, match="names a GPU that is not in the snapshot"):
        snap.from_jsonable(doc)
