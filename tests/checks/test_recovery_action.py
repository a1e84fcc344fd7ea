"""The GPU recovery action NVML reports (GD828): what to do, and when it only warns."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gpudoctor.checks import recovery_action
from gpudoctor.engine import CheckContext
from gpudoctor.findings import Status
from tests.helpers.snapshots import SnapshotOf, with_gpu


@pytest.mark.parametrize(
    ("action", "status", "words"),
    [
        ("gpu_reset", Status.FAIL, "nvidia-smi -r -i 4"),
        ("node_reboot", Status.FAIL, "Reboot the node"),
        ("drain_p2p", Status.WARN, "UVM persistence"),  # DCGM's health watch warns on this one
        ("drain_and_reset", Status.FAIL, "reduced capacity"),
        ("action_9", Status.FAIL, "nvml.h"),  # a value this gpudoctor does not know: not a pass
    ],
)
def test_recovery_action_names_what_to_do(action: str, status: Status, words: str, snapshot_of: SnapshotOf) -> None:
    s = with_gpu(snapshot_of("h100_sxm_8x"), 4, recovery_action=action)
    (f,) = recovery_action.recovery_action(CheckContext(s))
    assert (f.code, f.status, f.subject) == ("GD828", status, "gpu:4")
    assert words in f.hint or words in f.message


def test_recovery_action_none_passes_and_unused_gpus_only_warn(snapshot_of: SnapshotOf) -> None:
    s = snapshot_of("h100_sxm_8x")
    s = replace(s, gpus=[replace(g, recovery_action="none") for g in s.gpus])
    (f,) = recovery_action.recovery_action(CheckContext(s))
    assert f.status is Status.PASS and "GPU 0, 1, 2, 3, 4, 5, 6, 7" in f.message
    s = replace(with_gpu(s, 7, recovery_action="gpu_reset"), env={"CUDA_VISIBLE_DEVICES": "0"})
    (f,) = recovery_action.recovery_action(CheckContext(s))
    assert f.status is Status.WARN and "does not use" in f.message
