"""The memory test: every pattern finds a flipped bit at its address; the verdicts name the GPU
and the first failing address; ECC counters are read through NVML and compared."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from gpudoctor.checks.deep.memory import ecc_delta, judge_ecc, judge_patterns
from gpudoctor.findings import Status
from gpudoctor.snapshot import RemappedRows
from gpudoctor.workloads import deep_memory
from gpudoctor.workloads.deep_common import flip_bit
from tests.fakes.fake_nvml import FakeNvml
from tests.helpers.snapshots import load, with_gpu

PATTERNS = list(deep_memory._patterns(0))


def test_a_pass_has_walking_ones_and_zeros_address_and_random_patterns() -> None:
    names = [name for name, _ in PATTERNS]
    assert len(names) == 66
    assert names[0] == "walking ones bit 0" and names[63] == "walking zeros bit 31"
    assert names[64] == "address in address" and names[65] == "random (seed 8675309)"
    assert [v for _, v in PATTERNS[:32]] == [1 << b for b in range(31)] + [-(1 << 31)]
    # The second pass draws new random words.
    assert list(deep_memory._patterns(1))[-1][1] != PATTERNS[-1][1]


@pytest.mark.parametrize(
    "name", ["walking ones bit 31", "walking zeros bit 3", "address in address", "random (seed 8675309)"]
)
def test_every_pattern_reports_the_first_wrong_word_at_its_address(name: str) -> None:
    value = dict(PATTERNS)[name]
    chunks = [torch.empty(1 << 16, dtype=torch.int32) for _ in range(3)]
    write, expected = deep_memory._writer(value, torch.device("cpu"))
    for i, chunk in enumerate(chunks):
        write(chunk, i)
    assert deep_memory._check(chunks, expected) == (0, None)
    flip_bit(chunks[1], 777, 9)
    flip_bit(chunks[2], 5, 30)
    wrong, first = deep_memory._check(chunks, expected)
    assert wrong == 2
    assert first is not None
    assert first["offset"] == chunks[0].numel() * 4 + 777 * 4  # chunk order is the test's address order
    assert first["address"] == f"0x{chunks[1].data_ptr() + 777 * 4:x}"
    assert int(first["got"], 16) ^ int(first["expected"], 16) == 1 << 9


def test_address_in_address_words_hold_their_own_addresses() -> None:
    chunk = torch.empty(1 << 10, dtype=torch.int32)
    write, _ = deep_memory._writer("address", torch.device("cpu"))
    write(chunk, 0)
    words = chunk.view(torch.int64)
    assert int(words[0]) == chunk.data_ptr() and int(words[100]) == chunk.data_ptr() + 800


def row(rank: int, **extra: Any) -> dict[str, Any]:
    out = {
        "rank": rank,
        "gpu": rank,
        "device": "NVIDIA A100-SXM4-80GB",
        "bytes_wanted": 60 << 30,
        "bytes_tested": 60 << 30,
        "passes": 2,
        "patterns": 132,
        "seconds": 12.0,
        "errors": 0,
        "first": None,
        "wrong_patterns": {},
        "ecc_before": None,
        "ecc_after": None,
    }
    out.update(extra)
    return out


def test_a_failing_gpu_is_named_with_its_first_address_pattern_and_values() -> None:
    first = {
        "pattern": "walking zeros bit 7",
        "pass": 1,
        "offset": 1_073_741_828,
        "address": "0x7f3a00000004",
        "expected": "0xffffff7f",
        "got": "0xffffffff",
    }
    findings = judge_patterns([row(0), row(1, errors=3, first=first, wrong_patterns={"walking zeros bit 7": 3})])
    assert [(f.status, f.subject) for f in findings] == [(Status.FAIL, "gpu:1")]
    assert findings[0].message == (
        "GPU 1 memory test: 3 wrong word(s); first at address 0x7f3a00000004 (byte 1,073,741,828 of 60.00 GiB "
        "tested), pattern walking zeros bit 7: read 0xffffffff, wrote 0xffffff7f"
    )


def test_clean_gpus_pass_and_a_short_allocation_warns() -> None:
    (ok,) = judge_patterns([row(0), row(1)])
    assert (
        ok.status is Status.PASS
        and ok.message == "120.00 GiB verified on 2 rank(s): 66 patterns, at least 2 pass(es), 12 s"
    )
    (short,) = judge_patterns([row(0, bytes_tested=20 << 30)])
    assert short.status is Status.WARN and "only 20.00 GiB of the 60.00 GiB" in short.message


ECC_CLEAN = {
    "corrected_volatile": 4,
    "uncorrected_volatile": 0,
    "remapped_correctable": 0,
    "remapped_uncorrectable": 0,
    "remap_pending": False,
    "remap_failed": False,
}


def test_ecc_counters_that_rise_during_the_test_are_judged() -> None:
    after_unc = {**ECC_CLEAN, "uncorrected_volatile": 2, "remap_pending": True}
    after_corr = {**ECC_CLEAN, "corrected_volatile": 9}
    findings = judge_ecc(
        [
            row(0, ecc_before=ECC_CLEAN, ecc_after=ECC_CLEAN),
            row(1, ecc_before=ECC_CLEAN, ecc_after=after_unc),
            row(2, ecc_before=ECC_CLEAN, ecc_after=after_corr),
        ]
    )
    assert [(f.status, f.subject) for f in findings] == [(Status.FAIL, "gpu:1"), (Status.WARN, "gpu:2")]
    assert findings[0].message == (
        "GPU 1 during the memory test: 2 new uncorrected ECC error(s), "
        "a row remap pending (takes effect at the next GPU reset)"
    )
    assert findings[1].message == "GPU 2 corrected 5 ECC error(s) during the memory test (0 row(s) remapped)"
    assert ecc_delta(ECC_CLEAN, after_corr)["corrected_volatile"] == 5


def test_unreadable_ecc_is_a_skip_and_unchanged_counters_pass() -> None:
    (skip,) = judge_ecc([row(0)])
    assert skip.status is Status.SKIP and "ECC off?" in skip.message
    (cpu,) = judge_ecc([row(0, device="cpu", gpu=None)])
    assert cpu.message == "ECC counters not compared: CPU ranks"
    (ok,) = judge_ecc([row(0, ecc_before=ECC_CLEAN, ecc_after=ECC_CLEAN)])
    assert ok.status is Status.PASS


def test_ecc_counters_are_read_through_nvml(monkeypatch: pytest.MonkeyPatch) -> None:
    snap = with_gpu(
        load("a100_sxm_8x"),
        3,
        ecc_uncorrected_volatile=2,
        remapped_rows=RemappedRows(correctable=1, uncorrectable=0, pending=True, failed=False),
    )
    fake = FakeNvml(snap)
    monkeypatch.setattr("gpudoctor.probe.nvml.load_library", lambda: fake)
    counters = deep_memory.ecc_counters(3)
    # The fake records uncorrected counts only; the corrected total answers NOT_SUPPORTED.
    assert counters == {
        "corrected_volatile": None,
        "uncorrected_volatile": 2,
        "remapped_correctable": 1,
        "remapped_uncorrectable": 0,
        "remap_pending": True,
        "remap_failed": False,
    }
    assert fake.initialized == 0  # shut down again


def test_ecc_counters_are_none_without_nvml_or_without_that_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        "gpudoctor.probe.nvml.load_library", lambda: FakeNvml(load("a100_sxm_8x"), init_failure="no_driver")
    )
    assert deep_memory.ecc_counters(0) is None
    assert deep_memory.ecc_counters(None) is None  # a CPU rank
    monkeypatch.setattr("gpudoctor.probe.nvml.load_library", lambda: FakeNvml(load("a100_sxm_8x")))
    assert deep_memory.ecc_counters(42) is None
