"""Level 3 on real GPUs (skipped without one): a short run of every deep check, NVML sampled, and
the sdc fault named on a GPU rank."""

from __future__ import annotations

import pytest

from gpudoctor.checks import context
from gpudoctor.checks.deep.links import deep_links
from gpudoctor.checks.deep.load import deep_load
from gpudoctor.checks.deep.memory import deep_memory
from gpudoctor.checks.deep.sdc import deep_sdc
from gpudoctor.engine import CheckContext, CheckOptions
from gpudoctor.findings import Status
from gpudoctor.probe import collect

pytestmark = [pytest.mark.gpu, pytest.mark.slow]


def deep_context(**options: object) -> CheckContext:
    ctx = context(collect(), CheckOptions(device="cuda", level=3, duration_s=10.0, timeout_s=300, **options))  # type: ignore[arg-type]
    ctx.planned = ("deep_load", "deep_sdc", "deep_memory", "deep_links")
    return ctx


def test_every_deep_check_runs_on_the_visible_gpus_with_nvml_readings() -> None:
    ctx = deep_context(mem_share=0.5)
    load, details = deep_load(ctx)
    assert not [f for f in load if f.code == "GD855"], [f.message for f in load]
    assert details["nvml_readings"] >= 5
    gemm = details["gemm"]
    assert gemm["dtype"] in ("bfloat16", "float16", "float32")
    assert all(r["tflops_sustained"] > 0 and r["sdc"]["checks"] >= 3 for r in gemm["rows"])
    for judge in (deep_sdc, deep_memory, deep_links):
        findings, _ = judge(ctx)
        assert not [f for f in findings if f.status in (Status.ERROR,)], [f.message for f in findings]
    sdc, _ = deep_sdc(ctx)
    assert all(f.status in (Status.PASS, Status.SKIP) for f in sdc), [f.message for f in sdc]
    memory, _ = deep_memory(ctx)
    assert [f.status for f in memory if f.code == "GD865"] == [Status.PASS], [f.message for f in memory]


def test_a_gpu_rank_corrupting_its_results_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUDOCTOR_FAULT", "0:sdc")
    ctx = deep_context(mem_share=0.2)
    ctx.planned = ("deep_sdc", "deep_memory")
    sdc, _ = deep_sdc(ctx)
    assert ("GD861", Status.FAIL) in [(f.code, f.status) for f in sdc]
    memory, _ = deep_memory(ctx)
    (bad,) = [f for f in memory if f.code == "GD865"]
    assert bad.status is Status.FAIL and bad.subject == f"gpu:{ctx.visible.nvml_indices[0]}"
