"""The one error classifier (gpudoctor/knowledge/known_errors.py) on real output of failing jobs that
torch printed, not on texts written here (tests/fixtures/runtime_errors/README.md says where each is from)."""

from __future__ import annotations

import pytest

from gpudoctor.knowledge.known_errors import BY_KIND, KINDS, VICTIMS, classify, identify
from tests.paths import FIXTURES

LOGS = FIXTURES / "runtime_errors"


def log(name: str) -> str:
    return (LOGS / f"{name}.log").read_text(encoding="utf-8")


@pytest.mark.parametrize(
    ("name", "kind", "detail"),
    [
        ("gpu_oom", "oom", "tried to allocate 9313.23 GiB, on GPU 0"),
        ("gpu_ordinal_set_device", "invalid_device", ""),
        ("gpu_dup", "duplicate_gpu", "rank 1 and rank 0 both on CUDA device 60"),
        ("unused_param", "unused_parameters", "parameter indices 2 3"),
        ("port_in_use", "port_in_use", "port 29612"),
        ("uneven_inputs", "peer_lost", ""),
        ("world_size_mismatch", "timeout", "1/2 clients joined"),
        ("torchrun_overwrites_port", "timeout", "could not reach the store at 127.0.0.1, 29614"),
        ("sampler_and_shuffle", "sampler_shuffle", ""),
        ("sampler_no_pg", "no_process_group", ""),
        ("gloo_exit_abort", "cpp_abort", ""),
    ],
)
def test_real_failures_are_known_with_what_they_say(name: str, kind: str, detail: str) -> None:
    found = identify(log(name))
    assert found is not None
    assert (found.kind, found.detail) == (kind, detail)
    assert found.fix and found.title
    assert not found.line.startswith("[rank")  # torch's prefix is not part of the line shown


def test_a_duplicate_gpu_is_named_before_the_nccl_error_around_it() -> None:
    text = log("gpu_dup")
    assert "NCCL error in:" in text and "ncclInvalidUsage" in text
    assert classify(text) == "duplicate_gpu"
    assert classify(text.replace("Duplicate GPU detected", "")) == "nccl_error"


def test_victims_are_marked_and_the_kinds_of_gpudoctors_own_ranks_stay() -> None:
    assert VICTIMS == {"peer_lost", "timeout"}  # launch/results.py treats these two as victims too
    for kind in ("port_in_use", "fabric_manager", "devices_busy", "shm", "oom"):  # checks/active/ddp.py KIND_CODE
        assert kind in BY_KIND
    assert len({k.kind for k in KINDS}) == len(KINDS)


def test_a_traceback_with_nothing_known_is_not_classified() -> None:
    text = log("rank1_crash_norecord")
    assert "RuntimeError: boom on rank 1" in text
    assert identify(text) is None
