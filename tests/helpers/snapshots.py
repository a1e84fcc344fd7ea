"""The recorded machines in tests/fixtures/ as snapshots, and variants of them.

Tests receive `load` as the `snapshot_of` fixture (tests/conftest.py); the functions are here for
module-level helpers and parametrize lists, which run before any fixture."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from gpudoctor import snapshot as snap
from tests.paths import FIXTURES

FIXTURE_NAMES = sorted(p.stem for p in FIXTURES.glob("*.json"))
SnapshotOf = Callable[..., snap.Snapshot]  # the type of the `snapshot_of` fixture: load


def fixture(name: str) -> Path:
    """tests/fixtures/NAME.json (NAME may name a subfolder: "faults/gpu_fallen_off_bus")."""
    return FIXTURES / f"{name}.json"


def load(name: str, **env: str) -> snap.Snapshot:
    """The snapshot in tests/fixtures/NAME.json, with `env` set in its environment."""
    snapshot = snap.load(fixture(name))
    return with_env(snapshot, **env) if env else snapshot


def write_variant(tmp_path: Path, snapshot: snap.Snapshot, name: str = "variant") -> str:
    path = tmp_path / f"{name}.json"
    snap.write(snapshot, path)
    return str(path)


def with_env(snapshot: snap.Snapshot, **env: str) -> snap.Snapshot:
    return replace(snapshot, env={**snapshot.env, **env})


def with_gpu(snapshot: snap.Snapshot, index: int, **changes: Any) -> snap.Snapshot:
    """GPU `index` with its fields `changes` changed."""
    gpus = [replace(g, **changes) if g.index == index else g for g in snapshot.gpus]
    return replace(snapshot, gpus=gpus)
