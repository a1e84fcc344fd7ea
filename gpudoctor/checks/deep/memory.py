"""GD86x (health under load), level 3: a GPU memory test and the ECC counters around it.

gpudoctor/workloads/deep_memory.py writes and verifies walking ones and zeros, address-in-address
and seeded random patterns over --mem-share of each GPU's free memory (a 16 MiB buffer on CPU
ranks), for a fifth of --duration and at least one full pass; the patterns follow DCGM's memtest
(level 4 of `dcgmi diag`: walking 1 bit, own address, random patterns). This check names the GPU
and the first failing address, and compares the GPU's ECC counters (read through NVML) before
and after the test.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gpudoctor.checks.deep.common import deep_data, subject, who, with_gpus
from gpudoctor.engine import CheckContext, Code, check
from gpudoctor.findings import Finding, Status

PATTERNS = Code(
    "GD865",
    "memtest-mismatch",
    "GPU memory holds every pattern written to it",
    what="Writes walking-ones, walking-zeros, address-in-address and seeded random patterns over a "
    "share of each GPU's free memory (--mem-share, default 0.8), each over the whole tested memory "
    "before reading any of it back, and verifies every word. The first wrong word is reported with "
    "its pattern, byte offset, device address, the value expected and the value read.",
    why="A memory cell or address line that loses or mixes bits corrupts whatever lives there: "
    "weights, activations, optimizer state. ECC corrects single bits on datacenter GPUs but not "
    "all faults, and consumer GPUs have no ECC.",
    fix="Take the GPU out of service; on datacenter GPUs reset it (row remapping takes effect at the "
    "reset, GD801) and test again; a GPU that still fails needs replacing.",
)
ECC_DELTA = Code(
    "GD866",
    "ecc-errors-during-memtest",
    "No ECC error appears while the memory test runs",
    what="Reads each GPU's volatile ECC error counters (corrected and uncorrected) and remapped rows "
    "through NVML before and after the memory test. New uncorrected errors or a pending or failed "
    "row remap fail; new corrected errors warn.",
    why="ECC errors that appear under a memory test show cells that are wearing out: the GPU "
    "corrected them this time, but a double-bit error crashes the job (XID 48/94/95).",
    fix="Reset the GPU so pending row remaps take effect (`nvidia-smi -r` with no process on it), "
    "then run the test again; rising counts or a failed remap mean the GPU needs replacing.",
)
NOT_DONE = Code(
    "GD867",
    "memtest-not-completed",
    "The GPU memory test ran to the end",
    what="The memory test runs in spawned ranks under a deadline; this finding names the rank and GPU "
    "that failed or stopped answering.",
    why="A GPU that crashes or hangs while its memory is read and written will do the same in training.",
    fix="Read the named rank's error in the evidence (an out-of-memory error means other processes "
    "hold the GPU's memory: lower --mem-share or stop them).",
)
CODES = [PATTERNS, ECC_DELTA, NOT_DONE]

GIB = 1 << 30


def _size(nbytes: int) -> str:
    return f"{nbytes / GIB:.2f} GiB" if nbytes >= GIB else f"{nbytes / (1 << 20):.0f} MiB"


def judge_patterns(rows: Sequence[Mapping[str, Any]]) -> list[Finding]:
    findings = []
    for r in rows:
        if not r["errors"]:
            continue
        first = r["first"] or {}
        findings.append(
            Finding(
                PATTERNS.code,
                Status.FAIL,
                subject(r),
                f"{who(r)} memory test: {r['errors']} wrong word(s); first at address {first.get('address')} "
                f"(byte {first.get('offset', 0):,} of {_size(r['bytes_tested'])} tested), pattern "
                f"{first.get('pattern')}: read {first.get('got')}, wrote {first.get('expected')}",
                PATTERNS.fix,
                {
                    "rank": r["rank"],
                    "first": first,
                    "errors": r["errors"],
                    "wrong_patterns": r["wrong_patterns"],
                    "bytes_tested": r["bytes_tested"],
                    "passes": r["passes"],
                },
            )
        )
    for r in rows:
        if r["bytes_tested"] < r["bytes_wanted"] and not r["errors"]:
            findings.append(
                Finding(
                    PATTERNS.code,
                    Status.WARN,
                    subject(r),
                    f"{who(r)}: only {_size(r['bytes_tested'])} of the {_size(r['bytes_wanted'])} wanted could be "
                    "allocated and tested",
                    "Stop other processes on the GPU, or lower --mem-share.",
                    {"bytes_tested": r["bytes_tested"], "bytes_wanted": r["bytes_wanted"]},
                )
            )
    if findings:
        return findings
    tested = sum(r["bytes_tested"] for r in rows)
    passes = min(r["passes"] for r in rows)
    seconds = max(r["seconds"] for r in rows)
    return [
        Finding(
            PATTERNS.code,
            Status.PASS,
            "host",
            f"{_size(tested)} verified on {len(rows)} rank(s): {rows[0]['patterns'] // max(rows[0]['passes'], 1)} "
            f"patterns, at least {passes} pass(es), {seconds:.0f} s",
            "",
            {"bytes_tested": {str(r["rank"]): r["bytes_tested"] for r in rows}},
        )
    ]


def ecc_delta(before: Mapping[str, Any] | None, after: Mapping[str, Any] | None) -> dict[str, Any]:
    """What changed between two ECC readings (fields either reading lacks are left out)."""
    if not before or not after:
        return {}
    out: dict[str, Any] = {}
    for key in ("corrected_volatile", "uncorrected_volatile", "remapped_correctable", "remapped_uncorrectable"):
        if before.get(key) is not None and after.get(key) is not None:
            out[key] = int(after[key]) - int(before[key])
    for key in ("remap_pending", "remap_failed"):
        if after.get(key) is not None:
            out[key] = bool(after[key]) and not bool(before.get(key))
    return out


def judge_ecc(rows: Sequence[Mapping[str, Any]]) -> list[Finding]:
    findings = []
    readable = 0
    for r in rows:
        delta = ecc_delta(r.get("ecc_before"), r.get("ecc_after"))
        if not delta:
            continue
        readable += 1
        evidence = {"before": r["ecc_before"], "after": r["ecc_after"], "delta": delta}
        bad = []
        if delta.get("uncorrected_volatile", 0) > 0:
            bad.append(f"{delta['uncorrected_volatile']} new uncorrected ECC error(s)")
        if delta.get("remapped_uncorrectable", 0) > 0:
            bad.append(f"{delta['remapped_uncorrectable']} row(s) remapped for uncorrectable errors")
        if delta.get("remap_pending"):
            bad.append("a row remap pending (takes effect at the next GPU reset)")
        if delta.get("remap_failed"):
            bad.append("a failed row remap")
        if bad:
            message = f"{who(r)} during the memory test: {', '.join(bad)}"
            findings.append(Finding(ECC_DELTA.code, Status.FAIL, subject(r), message, ECC_DELTA.fix, evidence))
        elif delta.get("corrected_volatile", 0) > 0 or delta.get("remapped_correctable", 0) > 0:
            message = (
                f"{who(r)} corrected {delta.get('corrected_volatile', 0)} ECC error(s) during the memory test "
                f"({delta.get('remapped_correctable', 0)} row(s) remapped)"
            )
            findings.append(Finding(ECC_DELTA.code, Status.WARN, subject(r), message, ECC_DELTA.fix, evidence))
    if findings:
        return findings
    if not readable:
        why = "CPU ranks" if all(r.get("device") == "cpu" for r in rows) else "NVML gave no ECC counters (ECC off?)"
        return [Finding(ECC_DELTA.code, Status.SKIP, "host", f"ECC counters not compared: {why}")]
    message = f"no new ECC error on {readable} GPU(s) during the memory test"
    return [Finding(ECC_DELTA.code, Status.PASS, "host", message)]


def memory_table(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    return {
        "title": "memory test per rank",
        "columns": ["rank", "gpu", "tested", "passes", "patterns", "s", "wrong words", "first address"],
        "rows": [
            [
                r["rank"],
                "-" if r.get("gpu") is None else r["gpu"],
                _size(r["bytes_tested"]),
                r["passes"],
                r["patterns"],
                f"{r['seconds']:.1f}",
                r["errors"],
                (r["first"] or {}).get("address", "-"),
            ]
            for r in rows
        ],
    }


@check("deep_memory", "GPU memory test (deep)", codes=CODES, active=True, level=3, shares="deep")
def deep_memory(ctx: CheckContext) -> tuple[list[Finding], dict[str, Any]]:
    got = deep_data(ctx, "deep_memory", "deep_memory", NOT_DONE, "the memory test", CODES[0])
    if isinstance(got, list):
        return got, {}
    run, data = got
    rows = with_gpus(data["rows"], run)
    return judge_patterns(rows) + judge_ecc(rows), {"tables": [memory_table(rows)], "memory": rows}
