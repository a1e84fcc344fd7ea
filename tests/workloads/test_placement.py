"""The rank-side guard (gpudoctor/workloads/placement.py): a collective's tensors where NCCL needs
them, checked on CPU; TF32 through the current torch switches; no process group for a one-rank probe."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

from gpudoctor.launch.results import Task  # noqa: E402
from gpudoctor.launch.supervise import launch  # noqa: E402
from gpudoctor.workloads import placement  # noqa: E402
from gpudoctor.workloads.placement import CHECK_ENV, PlacementError, guarded  # noqa: E402
from gpudoctor.workloads.precision import exact_fp32, tf32_convolutions  # noqa: E402
from gpudoctor.workloads.rank import needs_group  # noqa: E402

CPU = torch.device("cpu")
AUDIT = {CHECK_ENV: "1"}


@pytest.fixture
def one_rank(tmp_path: Path) -> Iterator[None]:
    """A one-rank gloo group in this process."""
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1, timeout=timedelta(seconds=30))
    try:
        yield
    finally:
        dist.destroy_process_group()


@pytest.mark.usefixtures("one_rank")
def test_a_host_output_list_is_refused_on_gloo_as_nccl_would_need() -> None:
    # The DDP sanity run's gather before the fix: the input moved to the device, the outputs made
    # like a host tensor. NCCL writes such outputs through a host pointer: an illegal access on 2+ GPUs.
    real = dist.all_gather
    with guarded(CPU, "gloo", AUDIT):
        first = torch.tensor([3, 1, 4], dtype=torch.int64)
        firsts = [torch.empty_like(first)]
        with pytest.raises(
            PlacementError, match=r"dist\.all_gather at test_placement\.py:\d+: tensor 0 was made on the host"
        ):
            dist.all_gather(firsts, first.to(CPU))
        with pytest.raises(PlacementError):
            dist.all_reduce(torch.ones(2).to(CPU).cpu())  # .cpu() brings it back to the host
        placed = torch.tensor([3, 1, 4], dtype=torch.int64, device=CPU)
        outs = [torch.empty_like(placed)]
        dist.all_gather(outs, placed)  # both on the rank's device: fine
        assert outs[0].tolist() == [3, 1, 4]
        # What autograd and DDP make is not the guard's to second-guess.
        w = torch.ones(3, device=CPU, requires_grad=True)
        (w * 2).sum().backward()
        dist.all_reduce(w.grad)
    assert dist.all_gather is real, "the collectives are restored"
    dist.all_gather([torch.empty(1)], torch.ones(1))  # no guard outside a rank's workloads


@pytest.mark.usefixtures("one_rank")
def test_without_the_audit_gloo_collectives_are_not_wrapped() -> None:
    real = dist.all_reduce
    with guarded(CPU, "gloo", {}):
        assert dist.all_reduce is real
        dist.all_reduce(torch.ones(1))


@pytest.mark.usefixtures("one_rank")
def test_under_nccl_a_tensor_off_the_ranks_gpu_is_refused_before_nccl_sees_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dist, "get_backend", lambda group=None: "nccl")
    calls: list[str] = []
    monkeypatch.setattr(dist, "all_gather", lambda *a, **k: calls.append("all_gather"))
    with guarded(torch.device("cuda", 0), "nccl", {}):
        with pytest.raises(PlacementError, match="tensor 0 is on cpu, not this rank's cuda:0"):
            dist.all_gather([torch.empty(2)], torch.empty(2))
    assert calls == []  # refused before the collective ran


def test_tf32_is_set_through_the_current_switches() -> None:
    matmul, conv = torch.backends.cuda.matmul, torch.backends.cudnn.conv
    before = matmul.fp32_precision, conv.fp32_precision
    try:
        exact_fp32(torch)
        assert (matmul.fp32_precision, conv.fp32_precision) == ("ieee", "ieee")
        tf32_convolutions(torch)
        assert conv.fp32_precision == "tf32" and matmul.fp32_precision == "ieee"
    finally:
        matmul.fp32_precision, conv.fp32_precision = before


def test_tf32_falls_back_to_the_flags_on_a_torch_without_the_switches() -> None:
    class Flags:
        allow_tf32 = True

    class OldTorch:  # torch before 2.9: no fp32_precision, no cudnn.conv
        class backends:  # noqa: N801
            class cuda:  # noqa: N801
                matmul = Flags()

            cudnn = Flags()

    exact_fp32(OldTorch)
    assert OldTorch.backends.cuda.matmul.allow_tf32 is False and OldTorch.backends.cudnn.allow_tf32 is False


def test_a_one_rank_link_probe_makes_no_process_group() -> None:
    assert not needs_group(["link_pcie", "link_p2p"], 1)
    assert needs_group(["link_pcie"], 2) and needs_group(["link_pcie", "ddp"], 1)
    # End to end on CPU: a P2P probe with no pair needs no GPU; the rank is ready without a group.
    result = launch([Task("link_p2p", {"gpus": [], "pairs": []})], device="cpu", ranks=1, timeout_s=120, run_s=30)
    assert result.ok, [r.to_json() for r in result.ranks]
    assert result.results("link_p2p") == {"pairs": [], "bytes": 64 << 20, "iters": 5}


def test_every_collective_the_workloads_call_is_guarded() -> None:
    import re

    from tests.paths import REPO

    called = {
        m
        for p in (REPO / "gpudoctor" / "workloads").glob("*.py")
        for m in re.findall(r"\bdist\.([a-z_]+)\(", p.read_text(encoding="utf-8"))
    }
    setup = {"init_process_group", "destroy_process_group", "new_group", "split_group", "get_backend", "FileStore"}
    setup |= {"get_rank", "get_world_size", "barrier", "is_initialized"}
    assert called - setup - set(placement.COLLECTIVES) == set()
