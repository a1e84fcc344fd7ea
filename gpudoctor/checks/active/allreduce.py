"""GD6 (NCCL/collectives): all-reduce bandwidth sweep, judged against the machine's links.

Active: runs in the same ranks and process group as the DDP sanity run (active_common).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from gpudoctor.checks.active.common import PLATEAU, describe, plan, skip_finding, world_size
from gpudoctor.engine import CheckContext, Code, check
from gpudoctor.findings import Finding, Status
from gpudoctor.knowledge.busbw import plateau
from gpudoctor.knowledge.expectations import Expectation, expected_busbw, user_expectation

if TYPE_CHECKING:
    from gpudoctor.launch.workload_results import AllreduceRow

BANDWIDTH = Code(
    "GD601",
    "allreduce-busbw",
    "All-reduce bus bandwidth reaches what a healthy machine of this kind reaches",
    what="Sweeps all-reduce message sizes across one rank per visible GPU (8 MiB up to 8 GiB on "
    "GPUs, as far as free memory and the time budget allow, stopping once busbw has flattened; "
    "small sizes on CPU), with warm-up and timed iterations, and reports algbw and busbw as "
    "nccl-tests defines them (busbw = algbw x 2(n-1)/n). The plateau (the best busbw among the "
    "largest sizes swept) is compared with `--min-busbw`, or with the healthy figure for this GPU "
    "model, interconnect (NVSwitch, NVLink mesh, NVLink bridge, PCIe) and NCCL algorithm (ring or "
    "NVLink SHARP), never with the links that happen to be up (docs/active-checks.md lists the "
    "model and its sources; GD407 states the figure before any run). Below 0.8 of it warns, below "
    "0.5 fails. On CPU (gloo), and across nodes (torchrun/srun on several nodes, where the network "
    "between them caps busbw), GD601 reports the figures without a hardware verdict unless "
    "`--min-busbw` is given; across nodes GD680 judges them against the NICs' rate.",
    why="A machine whose GPUs talk at a fraction of their link speed trains slower in proportion "
    "to its communication share, without any error: a link trained down, NVLink missing, a "
    "transport disabled by an NCCL_* variable, P2P redirected by ACS/IOMMU.",
    fix="Look at the topology (GD4) and environment (NCCL_P2P_DISABLE, NCCL_SHM_DISABLE, "
    "NCCL_NVLS_ENABLE) findings; compare `nvidia-smi topo -m` and `nvidia-smi nvlink -s` with what "
    "the machine should have; run `gpudoctor bench allreduce --max-bytes 8G` to see the whole "
    "curve (small sizes never reach the peak).",
)
WRONG = Code(
    "GD602",
    "allreduce-wrong-values",
    "All-reduce sums are exact",
    what="Before timing each size, fills every rank's buffer with a known pattern, all-reduces it "
    "once and counts the elements that differ from the exact sum (nccl-tests' #wrong). Each rank "
    "also checks the values it sent against its own pattern, so a wrong sum names the rank (and "
    "GPU) that contributed wrong values, or says that every input was right and the sum went "
    "wrong on the way.",
    why="A wrong sum is silent corruption: training goes on with wrong gradients.",
    fix="Re-run; a repeated failure points at hardware: run the health checks (GD8) and a GPU "
    "memory test on the named GPU, and take it out of service if it repeats. When every input was "
    "right, suspect the links between the GPUs (NVLink/PCIe error counters) or a broken "
    "NCCL/driver install (reinstall, match versions).",
)
NOT_RUN = Code(
    "GD603",
    "allreduce-not-completed",
    "The all-reduce sweep ran to the end",
    what="The sweep runs in spawned ranks with a deadline; this finding says which rank (and GPU) "
    "failed or did not answer when the sweep could not complete.",
    why="An all-reduce that cannot complete here will hang or crash a training run the same way.",
    fix="See the DDP check's GD71x findings for the cause of the named rank's failure (port, "
    "fabric manager, /dev/shm, exclusive mode, timeout).",
)
CODES = [BANDWIDTH, WRONG, NOT_RUN]


def _gib(size: int) -> str:
    for unit, div in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= div:
            return f"{size / div:g} {unit}"
    return f"{size} B"


def sweep_table(data: Mapping[str, Any]) -> dict[str, Any]:
    rows = [
        [
            _gib(r["bytes"]),
            r["count"],
            r["iters"],
            f"{r['time_us']:.1f}",
            f"{r['algbw_gbps']:.2f}",
            f"{r['busbw_gbps']:.2f}",
            r["wrong"],
        ]
        for r in data["rows"]
    ]
    return {
        "title": f"all-reduce sweep ({data['backend']}, {data['world_size']} ranks, {data['dtype']} sum)",
        "columns": ["size", "count", "iters", "time us", "algbw GB/s", "busbw GB/s", "#wrong"],
        "rows": rows,
    }


def verdict(best: float, expect: Expectation, warn_ratio: float, fail_ratio: float) -> Status:
    """Pass, warn or fail a measured busbw against the expectation. An uncertain expectation (a range
    with no published evidence behind it) is judged at its low end and never fails a run."""
    if expect.link == "user":
        return Status.PASS if best >= expect.busbw_gbps else Status.FAIL
    ratio = best / expect.busbw_gbps
    if ratio < fail_ratio and expect.certain:
        return Status.FAIL
    return Status.WARN if ratio < warn_ratio else Status.PASS


def _labels(result: Any, ranks: list[int]) -> str:
    by_rank = {r.rank: r for r in result.ranks}
    return ", ".join(by_rank[r].label if r in by_rank else f"rank {r}" for r in ranks)


def wrong_finding(result: Any, rows: list[AllreduceRow]) -> Finding:
    bad_rows = [r for r in rows if r["wrong"]]
    wrong = sum(r["wrong"] for r in bad_rows)
    sizes = [_gib(r["bytes"]) for r in bad_rows]
    senders = sorted({rank for r in bad_rows for rank in r.get("bad_input_ranks", [])})
    receivers = sorted({rank for r in bad_rows for rank, n in enumerate(r.get("wrong_by_rank", [])) if n})
    gpus = {r.rank: r.gpu for r in result.ranks}
    msg = f"{wrong} wrong element(s) after all-reduce at size(s) {', '.join(sizes)}"
    evidence: dict[str, Any] = {"wrong": wrong, "sizes": sizes}
    subject = "host"
    if senders:
        msg += f": {_labels(result, senders)} sent values that differ from its pattern"
        evidence["ranks"] = senders
        evidence["gpus"] = [gpus.get(r) for r in senders]
        if len(senders) == 1:
            subject = f"rank:{senders[0]}"
    elif receivers:
        msg += f": every rank sent the right values; {_labels(result, receivers)} received wrong sums"
        evidence["received_wrong_ranks"] = receivers
        evidence["gpus"] = [gpus.get(r) for r in receivers]
    return Finding(WRONG.code, Status.FAIL, subject, msg, WRONG.fix, evidence)


@check("allreduce", "All-reduce bandwidth", codes=CODES, active=True, shares="active")
def allreduce(ctx: CheckContext) -> tuple[list[Finding], dict]:
    p = plan(ctx)
    if p.skip:
        return [skip_finding(ctx, CODES[0], p, "all-reduce sweep")], {}
    if world_size(ctx, p) < 2:
        what = "one visible GPU" if p.device == "cuda" else "one CPU rank"
        return [
            Finding(
                BANDWIDTH.code,
                Status.SKIP,
                "host",
                f"all-reduce sweep skipped: {what}, nothing to all-reduce across",
                "Make more GPUs visible (CUDA_VISIBLE_DEVICES) to measure the links between them.",
                {"ranks": world_size(ctx, p)},
            )
        ], {}
    result = ctx.run("active")
    data = result.results("allreduce")
    if data is None:
        if result.setup_error is not None:
            msg = f"all-reduce sweep did not start: {result.setup_error['message']}"
        else:
            msg = f"all-reduce sweep did not complete: {describe(result.suspects()) or 'a rank'} failed"
            first = next(iter(result.suspects()), None)
            if first is not None and first.error:
                msg += f" ({first.error[:200]})"
        return [Finding(NOT_RUN.code, Status.FAIL, "host", msg, NOT_RUN.fix, {"launch": result.to_json()})], {}
    findings = []
    details = {"tables": [sweep_table(data)], "sweep": data}
    if any(r["wrong"] for r in data["rows"]):
        findings.append(wrong_finding(result, data["rows"]))
    else:
        findings.append(
            Finding(
                WRONG.code,
                Status.PASS,
                "host",
                f"all-reduce sums exact at {len(data['rows'])} size(s)",
                "",
                {"wrong": 0},
            )
        )
    if not data["rows"]:
        findings.append(
            Finding(
                BANDWIDTH.code,
                Status.SKIP,
                "host",
                "no message size fits in free GPU memory",
                "",
                {"skipped": data["skipped_sizes"]},
            )
        )
        return findings, details
    best, judged = plateau(data["rows"])
    evidence: dict[str, Any] = {
        "measured_busbw_gbps": best["busbw_gbps"],
        "at_bytes": best["bytes"],
        "plateau_sizes": judged,
        "ranks": data["world_size"],
        "backend": data["backend"],
        "nodes": result.node_count,
    }
    if data.get("stopped"):
        evidence["stopped"] = data["stopped"]
    among = f", best of {_gib(judged[0])} to {_gib(judged[-1])}" if len(judged) > 1 else ""
    where = (
        f"plateau busbw {best['busbw_gbps']:.2f} GB/s at {_gib(best['bytes'])}{among} over {data['world_size']} ranks"
    )
    opts = ctx.options
    expect: Expectation | None = None
    if opts.min_busbw_gbps is not None:
        expect = user_expectation(opts.min_busbw_gbps)
    elif result.node_count > 1:
        # The links between nodes (network), not this node's NVLink/PCIe, cap busbw.
        findings.append(
            Finding(
                BANDWIDTH.code,
                Status.PASS,
                "host",
                f"{where} on {result.node_count} nodes: the network between the nodes caps it; "
                "GD680 judges it against the NICs (and isolates a slow node), --min-busbw sets your own bar",
                "",
                evidence,
            )
        )
        return findings, details
    elif data["device"] == "cuda":
        expect = expected_busbw(ctx.snapshot, p.gpus)
    if data["device"] != "cuda" and expect is None:
        findings.append(
            Finding(
                BANDWIDTH.code,
                Status.PASS,
                "host",
                f"{where} (CPU/gloo: reported without a hardware verdict)",
                "",
                evidence,
            )
        )
        return findings, details
    if expect is None:
        findings.append(
            Finding(
                BANDWIDTH.code,
                Status.PASS,
                "host",
                f"{where} (no verdict: this machine's link facts are unknown; set --min-busbw)",
                "",
                evidence,
            )
        )
        return findings, details
    ratio = best["busbw_gbps"] / expect.busbw_gbps if expect.busbw_gbps else float("inf")
    evidence.update(expect.to_json())
    evidence["ratio"] = round(ratio, 3)
    evidence["warn_below_ratio"] = opts.busbw_warn_ratio
    evidence["fail_below_ratio"] = opts.busbw_fail_ratio
    status = verdict(best["busbw_gbps"], expect, opts.busbw_warn_ratio, opts.busbw_fail_ratio)
    message = f"{where}; expected {expect.figure()} ({expect.basis}), ratio {ratio:.2f}"
    if not expect.certain:
        message += f" (an estimate, not failed against: {expect.unknown} would make it certain)"
    largest = judged[-1]
    if data["device"] == "cuda" and expect.link != "user" and largest < PLATEAU["from_bytes"]:
        # Small messages never reach the peak: without a size of 1 GiB or more, only a warning.
        evidence["largest_bytes"] = largest
        message += f"; the sweep reached only {_gib(largest)} (free memory or time), below the 1 GiB plateau"
        status = Status.WARN if status is Status.FAIL else status
    findings.append(
        Finding(BANDWIDTH.code, status, "host", message, "" if status is Status.PASS else BANDWIDTH.fix, evidence)
    )
    return findings, details
