"""GD86x (health under load), level 3: silent data corruption, caught by comparing identical work.

Two comparisons over the digests the ranks gathered (never whole tensors):

- GEMM (gpudoctor/workloads/deep_gemm.py): every GPU multiplied the same seeded matrices for the
  whole load and took a digest of its result at least three times. Across GPUs of the same
  model, SM count and toolkit the digests must be equal (cuBLAS: "By design, all cuBLAS API
  routines from a given toolkit version, generate the same bit-wise results at every run when
  executed on GPUs with the same architecture and the same number of SMs"); within one GPU,
  every recomputation must give the digest of the others (DCGM's diagnostic compares its
  repeated GEMM results the same way). The GPU that disagrees is named: the minority when there
  is a majority; with no majority (two GPUs), the one whose own results changed; otherwise all
  of them, saying the faulty one cannot be told apart.
- All-reduce (gpudoctor/workloads/deep_allreduce.py): every element of every iteration's result
  is checked against the exact sum on every rank, and the final results' digests compared.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from gpudoctor.checks.deep.common import deep_data, not_finished, subject, who, with_gpus
from gpudoctor.engine import CheckContext, Code, check
from gpudoctor.findings import Finding, Status

GEMM_PEERS = Code(
    "GD860",
    "sdc-gemm-disagrees",
    "GPUs of one model compute bit-identical results from identical work",
    what="During the sustained GEMM load every GPU multiplies the same seeded matrices in the same "
    "precision and shapes; the digests of their results (exact integer sums of the result's bits, "
    "hashed) are compared across GPUs of the same model, SM count and CUDA toolkit, for which cuBLAS "
    "promises bit-identical results. A GPU whose result differs from the others' is named.",
    why="Silent data corruption: a GPU that computes wrong numbers without any error corrupts "
    "gradients and weights, and training goes on. Cluster operators find such GPUs only by "
    "comparing identical work; no counter reports them.",
    fix="Take the named GPU out of service (CUDA_VISIBLE_DEVICES without it) and run `gpudoctor "
    "check --level 3 --select deep_sdc` again to confirm; report it to the vendor with the "
    "evidence. If every GPU disagrees with every other, check that they run the same driver.",
)
GEMM_SELF = Code(
    "GD861",
    "sdc-gemm-recompute-differs",
    "A GPU computes the same result every time it repeats identical work",
    what="Each GPU takes a digest of its GEMM result at least three times during the load; the "
    "inputs never change, so every digest must be the same. A GPU whose result changed between "
    "recomputations is named, with the first check that differed.",
    why="A result that changes from one run of identical work to the next is corruption that comes "
    "and goes with heat, power or a marginal chip: the most dangerous kind, since a short test "
    "may pass.",
    fix="Take the GPU out of service and have it replaced; run the deep checks with a longer "
    "--duration to see how often it happens.",
)
ALLREDUCE_SDC = Code(
    "GD862",
    "sdc-allreduce-wrong",
    "A long all-reduce run gives exact sums on every rank",
    what="Runs all-reduces for a fifth of --duration with integer-valued data whose sums are exact "
    "in float32; every rank checks every element of every result against the exact sum and takes "
    "a digest of its final result, and the digests are compared across ranks.",
    why="A wrong reduction is a wrong gradient on some or all ranks, silently; a rank whose result "
    "differs from the others' trains a different model from then on.",
    fix="Take the named rank's GPU out of service and run again; when every rank is wrong, suspect "
    "the interconnect or the NCCL/driver install (reinstall, match versions) and run the GD4 link "
    "checks.",
)
NOT_DONE = Code(
    "GD863",
    "sdc-test-not-completed",
    "The silent-data-corruption tests ran to the end",
    what="The GEMM and all-reduce tests run in spawned ranks under a deadline; this finding names "
    "the rank and GPU that failed or stopped answering before the digests could be compared.",
    why="A comparison that did not complete proves nothing about the GPUs it did not reach.",
    fix="Read the named rank's error in the evidence; when the GEMM load (deep_load) ran in the same "
    "run, its GD855 finding names the same rank.",
)
CODES = [GEMM_PEERS, GEMM_SELF, ALLREDUCE_SDC, NOT_DONE]


def _peer_key(row: Mapping[str, Any]) -> tuple[Any, ...]:
    return (row.get("device"), row.get("sm_count"), row.get("toolkit"), row.get("dtype"), row.get("n"))


def judge_gemm(rows: Sequence[Mapping[str, Any]]) -> list[Finding]:
    """GD860 (across GPUs) and GD861 (within a GPU) from the GEMM rows' "sdc" digests."""
    findings: list[Finding] = []
    unstable = {r["rank"] for r in rows if r["sdc"]["distinct"] > 1}
    for r in rows:
        if r["rank"] in unstable:
            change = r["sdc"]["first_change"]
            findings.append(
                Finding(
                    GEMM_SELF.code,
                    Status.FAIL,
                    subject(r),
                    f"{who(r)} got {r['sdc']['distinct']} different results from {r['sdc']['checks']} "
                    f"recomputations of identical work (first change {change['t']:.1f} s into the load, "
                    f"iteration {change['iteration']})",
                    GEMM_SELF.fix,
                    {"rank": r["rank"], **r["sdc"]},
                )
            )
    if not unstable:
        checks = min(r["sdc"]["checks"] for r in rows)
        findings.append(
            Finding(
                GEMM_SELF.code,
                Status.PASS,
                "host",
                f"every rank computed the same result in all its checks (at least {checks} each)",
            )
        )
    groups: dict[tuple[Any, ...], list[Mapping[str, Any]]] = {}
    for r in rows:
        groups.setdefault(_peer_key(r), []).append(r)
    compared = 0
    for key, members in groups.items():
        if len(members) < 2:
            continue
        compared += len(members)
        findings += _compare_group(key, members, unstable)
    if not any(f.code == GEMM_PEERS.code for f in findings):
        alone = [who(m[0]) for m in groups.values() if len(m) == 1]
        lone = f"; nothing to compare {', '.join(alone)} with (no other GPU of its model)" if alone else ""
        status = Status.PASS if compared else Status.SKIP
        message = f"{compared} rank(s) computed bit-identical GEMM results{lone}" if compared else f"not compared{lone}"
        findings.append(Finding(GEMM_PEERS.code, status, "host", message))
    return findings


def _compare_group(key: tuple[Any, ...], members: Sequence[Mapping[str, Any]], unstable: set[int]) -> list[Finding]:
    counts = Counter(m["sdc"]["digest"] for m in members)
    if len(counts) == 1:
        return []
    top, top_count = counts.most_common(1)[0]
    if top_count * 2 > len(members):
        odd = [m for m in members if m["sdc"]["digest"] != top]
        how = f"the other {top_count} agree"
    else:
        odd = [m for m in members if m["rank"] in unstable]
        how = "no majority; named because its own results changed during the load"
        if not odd:
            odd = list(members)
            how = "no majority and every result was stable: the faulty GPU cannot be told apart"
    return [
        Finding(
            GEMM_PEERS.code,
            Status.FAIL,
            subject(m),
            f"{who(m)} computed different bits from identical work than the {len(members) - 1} other "
            f"rank(s) on {key[0]} ({how})",
            GEMM_PEERS.fix,
            {
                "rank": m["rank"],
                "digest": m["sdc"]["digest"],
                "digests": {str(x["rank"]): x["sdc"]["digest"] for x in members},
                "peer_key": {"device": key[0], "sm_count": key[1], "toolkit": key[2], "dtype": key[3], "n": key[4]},
            },
        )
        for m in odd
    ]


def judge_allreduce(rows: Sequence[Mapping[str, Any]]) -> list[Finding]:
    """GD862: exact sums on every rank in every iteration, and the same final bits everywhere."""
    iterations = rows[0]["iterations"]
    wrong = [r for r in rows if r["wrong_elements"]]
    counts = Counter(r["digest"] for r in rows)
    top, top_count = counts.most_common(1)[0]
    differs = [r for r in rows if r["digest"] != top and top_count * 2 > len(rows)]
    if wrong and len(wrong) == len(rows):
        first = rows[0]["first"] or {}
        return [
            Finding(
                ALLREDUCE_SDC.code,
                Status.FAIL,
                "host",
                f"the all-reduce sum was wrong on every rank ({sum(r['wrong_iterations'] for r in rows)} "
                f"wrong results; first at iteration {first.get('iteration')}): the corruption happened before "
                "the result was shared (a reduction step or a link)",
                ALLREDUCE_SDC.fix,
                {"first": first, "iterations": iterations},
            )
        ]
    findings = []
    for r in sorted({r["rank"]: r for r in wrong + differs}.values(), key=lambda x: x["rank"]):
        first = r["first"] or {}
        what = (
            f"{r['wrong_elements']} wrong element(s) in {r['wrong_iterations']} of {iterations} results "
            f"(first: iteration {first.get('iteration')}, element {first.get('index')}, "
            f"{first.get('got')} instead of {first.get('expected')})"
            if r["wrong_elements"]
            else "a final result whose bits differ from the other ranks'"
        )
        findings.append(
            Finding(
                ALLREDUCE_SDC.code,
                Status.FAIL,
                subject(r),
                f"{who(r)} received {what}",
                ALLREDUCE_SDC.fix,
                {
                    "rank": r["rank"],
                    "wrong_elements": r["wrong_elements"],
                    "wrong_iterations": r["wrong_iterations"],
                    "first": r["first"],
                    "digest": r["digest"],
                    "majority_digest": top,
                },
            )
        )
    return findings or [
        Finding(
            ALLREDUCE_SDC.code,
            Status.PASS,
            "host",
            f"{iterations} all-reduces of {rows[0]['bytes'] / (1 << 20):g} MiB exact on {len(rows)} rank(s), "
            "final results bit-identical",
        )
    ]


def sdc_table(gemm: Sequence[Mapping[str, Any]], allreduce: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    reduced = {r["rank"]: r for r in allreduce}
    rows = []
    for r in gemm:
        a = reduced.get(r["rank"])
        rows.append(
            [
                r["rank"],
                "-" if r.get("gpu") is None else r["gpu"],
                r.get("device", ""),
                r["sdc"]["checks"],
                r["sdc"]["digest"][:12],
                r["sdc"]["mismatches"],
                "-" if a is None else a["iterations"],
                "-" if a is None else a["wrong_elements"],
            ]
        )
    return {
        "title": "silent data corruption: digests per rank",
        "columns": ["rank", "gpu", "device", "GEMM checks", "GEMM digest", "changed", "all-reduces", "wrong"],
        "rows": rows,
    }


@check("deep_sdc", "Silent data corruption (deep)", codes=CODES, active=True, level=3, shares="deep")
def deep_sdc(ctx: CheckContext) -> tuple[list[Finding], dict[str, Any]]:
    got = deep_data(ctx, "deep_sdc", "deep_gemm", NOT_DONE, "the GEMM comparison", CODES[0])
    if isinstance(got, list):
        return got, {}
    run, gemm = got
    gemm_rows = with_gpus(gemm["rows"], run)
    findings = judge_gemm(gemm_rows)
    reduce_rows: list[dict[str, Any]] = []
    if "deep_allreduce" not in run.tasks:
        message = "all-reduce comparison skipped: one rank, nothing to reduce"
        findings.append(Finding(ALLREDUCE_SDC.code, Status.SKIP, "host", message))
    elif (data := run.results("deep_allreduce")) is None:
        findings += not_finished(NOT_DONE, "deep_allreduce", "the long all-reduce run", run, "deep_sdc")
    else:
        reduce_rows = with_gpus(data["rows"], run)
        findings += judge_allreduce(reduce_rows)
    details = {"tables": [sdc_table(gemm_rows, reduce_rows)], "allreduce": reduce_rows}
    return findings, details
