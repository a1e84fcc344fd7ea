"""Silent-data-corruption verdicts: who is named when digests of identical work disagree, and the
digest itself (exact, device-independent, sensitive to every bit)."""

from __future__ import annotations

from typing import Any

import torch

from gpudoctor.checks.deep.sdc import judge_allreduce, judge_gemm
from gpudoctor.findings import Finding, Status
from gpudoctor.workloads.deep_common import digest, flip_bit

GOOD, BAD, OTHER = "a" * 32, "b" * 32, "c" * 32


def gemm_row(rank: int, own: str, *, distinct: int = 1, device: str = "NVIDIA H100 80GB HBM3") -> dict[str, Any]:
    change = {"t": 12.5, "iteration": 400, "digest": own} if distinct > 1 else None
    return {
        "rank": rank,
        "gpu": rank,
        "device": device,
        "sm_count": 132,
        "toolkit": "torch 2.13.0, CUDA 12.8",
        "dtype": "bfloat16",
        "n": 8192,
        "sdc": {"checks": 40, "digest": own, "distinct": distinct, "mismatches": distinct - 1, "first_change": change},
    }


def failing(findings: list[Finding]) -> list[tuple[str, str]]:
    return [(f.code, f.subject) for f in findings if f.status is Status.FAIL]


def test_the_gpu_whose_result_differs_from_the_majority_is_named() -> None:
    rows = [gemm_row(0, GOOD), gemm_row(1, GOOD), gemm_row(2, BAD), gemm_row(3, GOOD)]
    findings = judge_gemm(rows)
    assert failing(findings) == [("GD860", "gpu:2")]
    (f,) = [x for x in findings if x.code == "GD860"]
    assert f.message == (
        "GPU 2 computed different bits from identical work than the 3 other rank(s) on NVIDIA H100 80GB HBM3 "
        "(the other 3 agree)"
    )
    assert f.evidence["digests"]["2"] == BAD


def test_with_two_gpus_the_one_whose_own_results_changed_is_named() -> None:
    findings = judge_gemm([gemm_row(0, GOOD), gemm_row(1, BAD, distinct=2)])
    assert failing(findings) == [("GD861", "gpu:1"), ("GD860", "gpu:1")]
    recompute = next(f for f in findings if f.code == "GD861")
    assert recompute.message == (
        "GPU 1 got 2 different results from 40 recomputations of identical work "
        "(first change 12.5 s into the load, iteration 400)"
    )


def test_two_stable_gpus_that_disagree_are_both_named_and_it_says_so() -> None:
    findings = judge_gemm([gemm_row(0, GOOD), gemm_row(1, BAD)])
    assert failing(findings) == [("GD860", "gpu:0"), ("GD860", "gpu:1")]
    assert all("cannot be told apart" in f.message for f in findings if f.code == "GD860")


def test_only_gpus_of_the_same_model_are_compared() -> None:
    findings = judge_gemm([gemm_row(0, GOOD), gemm_row(1, OTHER, device="NVIDIA L40S")])
    assert failing(findings) == []
    (f,) = [x for x in findings if x.code == "GD860"]
    assert f.status is Status.SKIP and "nothing to compare GPU 0, GPU 1 with" in f.message


def test_agreeing_gpus_pass_both_comparisons() -> None:
    findings = judge_gemm([gemm_row(r, GOOD) for r in range(8)])
    assert [(f.code, f.status) for f in findings] == [("GD861", Status.PASS), ("GD860", Status.PASS)]
    assert findings[1].message == "8 rank(s) computed bit-identical GEMM results"


def reduce_row(rank: int, *, wrong: int = 0, final: str = GOOD) -> dict[str, Any]:
    first = {"iteration": 3, "index": 4099, "expected": -198.0, "got": -214.0, "wrong": 1} if wrong else None
    return {
        "rank": rank,
        "gpu": None,
        "device": "cpu",
        "iterations": 50,
        "bytes": 1 << 20,
        "wrong_iterations": wrong,
        "wrong_elements": wrong,
        "first": first,
        "digest": final,
    }


def test_the_rank_that_received_a_wrong_sum_is_named_with_the_first_wrong_element() -> None:
    findings = judge_allreduce([reduce_row(0), reduce_row(1, wrong=47, final=BAD), reduce_row(2)])
    assert failing(findings) == [("GD862", "rank:1")]
    assert findings[0].message == (
        "rank 1 received 47 wrong element(s) in 47 of 50 results "
        "(first: iteration 3, element 4099, -214.0 instead of -198.0)"
    )


def test_a_reduction_wrong_on_every_rank_is_a_host_finding() -> None:
    findings = judge_allreduce([reduce_row(r, wrong=5, final=BAD) for r in range(3)])
    assert failing(findings) == [("GD862", "host")]
    assert "wrong on every rank" in findings[0].message


def test_a_final_result_whose_bits_differ_from_the_majority_is_named_even_when_sums_check() -> None:
    findings = judge_allreduce([reduce_row(0), reduce_row(1), reduce_row(2, final=OTHER)])
    assert failing(findings) == [("GD862", "rank:2")]
    assert "bits differ" in findings[0].message


def test_exact_sums_everywhere_pass() -> None:
    (f,) = judge_allreduce([reduce_row(r) for r in range(4)])
    assert f.status is Status.PASS
    assert f.message == "50 all-reduces of 1 MiB exact on 4 rank(s), final results bit-identical"


def test_the_digest_sees_every_single_bit_and_nothing_else() -> None:
    gen = torch.Generator().manual_seed(7)
    a = torch.rand(258, 129, generator=gen).to(torch.bfloat16)  # not a whole number of digest rows
    reference = digest(a)
    assert digest(a.clone()) == reference
    for word in (0, 1023, 1024, a.numel() // 2 - 1):
        for bit in (0, 15, 31):
            b = a.clone()
            flip_bit(b, word, bit)
            assert digest(b) != reference, (word, bit)
            flip_bit(b, word, bit)
            assert digest(b) == reference
    # Same bits under another dtype or shape are another tensor.
    assert digest(a.view(torch.int16)) != reference
    assert digest(a.reshape(129, 258)) != reference
    # An odd number of bytes is padded to whole words, not refused.
    assert digest(torch.arange(7, dtype=torch.uint8)) != digest(torch.arange(8, dtype=torch.uint8))


def test_the_digest_of_a_deterministic_cpu_gemm_is_the_same_every_time() -> None:
    gen = torch.Generator().manual_seed(20240611)
    x, y = torch.rand(96, 96, generator=gen), torch.rand(96, 96, generator=gen)
    assert len({digest(x @ y) for _ in range(5)}) == 1
