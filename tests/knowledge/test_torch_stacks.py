"""What a rank's stack says it is doing (gpudoctor/knowledge/torch_stacks.py) and torchrun's command line
(gpudoctor/knowledge/launchers.py), on real py-spy dumps of real gloo jobs (tests/fixtures/stacks/README.md)."""

from __future__ import annotations

import pytest

from gpudoctor.knowledge import torch_stacks
from gpudoctor.knowledge.launchers import is_torchrun, torchrun_plan
from gpudoctor.probe.stacks import parse
from tests.paths import FIXTURES

STACKS = FIXTURES / "stacks"


@pytest.mark.parametrize(
    ("name", "kind", "own"),
    [
        ("rank_prepares_before_init", torch_stacks.OTHER, ("prepare", "life.py")),
        ("rank_waits_in_init", torch_stacks.JOIN, ("main", "life.py")),
        ("rank_waits_in_backward", torch_stacks.BACKWARD, ("main", "life.py")),
        ("rank_evaluates_between_steps", torch_stacks.OTHER, ("evaluate", "life.py")),
        ("torchrun_waits_for_nodes", torch_stacks.RENDEZVOUS, None),
        ("torchrun_runs_its_ranks", torch_stacks.OTHER, None),
    ],
)
def test_real_stacks_say_where_the_process_is(name: str, kind: str, own: tuple[str, str] | None) -> None:
    stack = parse((STACKS / f"{name}.json").read_bytes())
    assert stack.note == "" and stack.frames
    assert torch_stacks.classify(stack.frames) == kind
    i = torch_stacks.own_frame(stack.frames, stack.files)
    assert (None if i is None else stack.frames[i][:2]) == own


def test_importing_decides_whatever_module_is_being_imported() -> None:
    frames = [
        ("_call_with_frames_removed", "<frozen importlib._bootstrap>", 241),
        ("<module>", "torch/utils/data/_utils/__init__.py", 53),  # a loader file, but it is being imported
        ("<module>", "train.py", 3),
    ]
    assert torch_stacks.classify(frames) == torch_stacks.IMPORTING


def test_damaged_py_spy_output_is_a_note_not_a_crash() -> None:
    assert parse(b"not json").note
    assert parse(b"[]").note
    assert parse(b'[{"thread_name": "MainThread", "frames": [{"name": 3}]}]').note


@pytest.mark.parametrize(
    ("argv", "nnodes", "nproc", "world"),
    [
        (["torchrun", "--nnodes", "2", "--nproc-per-node", "4", "train.py", "--nnodes", "9"], "2", 4, 8),
        (["/venv/bin/python", "-m", "torch.distributed.run", "--nproc_per_node=2", "--standalone", "t.py"], "1", 2, 2),
        (["python3", "/venv/bin/torchrun", "--nnodes=1:4", "--nproc-per-node", "gpu", "t.py"], "1:4", None, None),
        (["torchrun", "--rdzv-endpoint", "host:29400", "--nnodes", "3", "t.py"], "3", 1, 3),
    ],
)
def test_torchruns_options_are_read_up_to_the_script(
    argv: list[str], nnodes: str, nproc: int | None, world: int | None
) -> None:
    plan = torchrun_plan(argv)
    assert plan is not None
    assert (plan.nnodes, plan.nproc, plan.world) == (nnodes, nproc, world)


def test_other_commands_are_not_torchrun() -> None:
    for argv in (["python", "train.py"], ["python", "-m", "torch.utils.bottleneck"], ["bash", "-c", "torchrun x"], []):
        assert not is_torchrun(argv) and torchrun_plan(argv) is None
