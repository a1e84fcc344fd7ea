"""The real NCCL path on GPUs (skipped without one): DDP on every GPU, all-reduce from two."""

from __future__ import annotations

import pytest

from gpudoctor.checks import context
from gpudoctor.checks.active.allreduce import allreduce
from gpudoctor.checks.active.ddp import ddp_sanity
from gpudoctor.engine import CheckOptions
from gpudoctor.findings import Status
from gpudoctor.probe import collect

pytestmark = [pytest.mark.gpu, pytest.mark.slow]


def test_ddp_and_allreduce_on_the_visible_gpus() -> None:
    ctx = context(collect(), CheckOptions(device="cuda", timeout_s=300))
    ddp, _ = ddp_sanity(ctx)
    assert all(f.status is Status.PASS for f in ddp), [f.message for f in ddp]
    sweep, _ = allreduce(ctx)
    if ctx.visible.count < 2:
        (f,) = sweep
        assert f.status is Status.SKIP and "one visible GPU" in f.message
    else:
        wrong = [f for f in sweep if f.code == "GD602"]
        assert [f.status for f in wrong] == [Status.PASS]
        busbw = [f for f in sweep if f.code == "GD601"]
        assert busbw and busbw[0].evidence["measured_busbw_gbps"] > 0
