"""Which GPUs a run sees (GD201-205): CUDA_VISIBLE_DEVICES that drops GPUs, and fewer GPUs than
the launcher starts ranks; on variants of a recorded machine through the in-process CLI."""

from __future__ import annotations

import pytest

from tests.helpers.cli import check_variant
from tests.helpers.snapshots import load, with_env


def test_fewer_gpus_than_local_world_size_fails(capsys, tmp_path) -> None:  # type: ignore[no-untyped-def]
    snap = with_env(load("h100_sxm_8x"), CUDA_VISIBLE_DEVICES="0,1,2,3", LOCAL_WORLD_SIZE="8")
    r = check_variant(capsys, tmp_path, snap)
    assert r.exit_code == 1
    geo = r.one("GD203")
    assert geo["status"] == "fail"
    assert geo["message"] == "LOCAL_WORLD_SIZE=8 starts 8 ranks on this node but only 4 GPU(s) are visible"


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"SLURM_NTASKS_PER_NODE": "8(x2)"}, 8),
        ({"WORLD_SIZE": "6"}, 6),
        ({"WORLD_SIZE": "16", "SLURM_NNODES": "2"}, None),  # multi-node: WORLD_SIZE is not per node
        ({"SLURM_GPUS_ON_NODE": "2"}, 2),
    ],
)
def test_launch_geometry_sources(env: dict[str, str], expected: int | None) -> None:
    from gpudoctor.checks.visibility import expected_local_ranks

    got = expected_local_ranks(env)
    assert (got[0] if got else None) == expected


@pytest.mark.parametrize(
    ("cvd", "visible", "problem"),
    [
        ("", 0, "empty"),
        ("0,1,1", 0, "duplicate"),
        ("0,1,9,2", 2, "out_of_range"),
        ("0 1", 1, "trailing_junk"),
    ],
)
def test_cuda_visible_devices_that_drop_gpus_warn(capsys, tmp_path, cvd: str, visible: int, problem: str) -> None:  # type: ignore[no-untyped-def]
    r = check_variant(capsys, tmp_path, with_env(load("h100_sxm_8x"), CUDA_VISIBLE_DEVICES=cvd))
    dropped = r.one("GD204")
    assert dropped["status"] == "warn" and dropped["evidence"]["problem"] == problem
    seen = r.one("GD201")
    if visible == 0:
        assert seen["status"] == "fail" and r.exit_code == 1
        # the GPU checks say why they have nothing to do instead of failing too
        assert r.one("GD301")["message"] == "no visible GPUs to check: see GD201"
    else:
        assert seen["evidence"]["visible"] == visible
