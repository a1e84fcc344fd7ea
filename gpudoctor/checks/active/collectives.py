"""GD65x (collectives beyond all-reduce): all-gather and reduce-scatter (FSDP, ZeRO), all-to-all
(mixture-of-experts), broadcast and send/recv per pair (pipeline parallelism).

Active, and only when asked for: `check --collectives allgather,reducescatter` adds them to the
shared rank run (active_common); `gpudoctor bench collectives` runs every one of them. The
judging is pure functions over the workload's figures (`judge`), tested with recorded numbers.

Verdicts: all-gather and reduce-scatter best busbw against the machine's link bound
(`expectations.expected_busbw(..., collective=)`: the bound all-reduce is judged by, without
NVLink SHARP): in nccl-tests' busbw they run the same ring as all-reduce without NVLS, 361.4 and
362.9 GB/s against 367.2 for ring all-reduce on 8x H200 (ml-engineering network/README.md;
tests/reference/). `--min-busbw` in GB/s is not applied to them: with NVLS an all-reduce bar
(~480 GB/s on H100/H200) is one they cannot reach. Send/recv per pair against
`expected_busbw(the two GPUs, collective="sendrecv")` (busbw = algbw).
All-to-all and broadcast are reported without a verdict: no public calibration to judge by.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gpudoctor.checks.active.allreduce import sweep_table, verdict
from gpudoctor.checks.active.common import describe, interference_clause, plan, skip_finding, world_size
from gpudoctor.engine import CheckContext, Code, check
from gpudoctor.findings import Finding, Status, pair_subject
from gpudoctor.knowledge import interconnect as topology
from gpudoctor.knowledge.busbw import FACTOR_TEXT, TITLES, parse_ops
from gpudoctor.knowledge.expectations import Expectation, expected_busbw
from gpudoctor.knowledge.units import size
from gpudoctor.snapshot import Snapshot

if TYPE_CHECKING:
    from gpudoctor.launch.workload_results import CollectivesResult

ALLGATHER = Code(
    "GD650",
    "allgather-busbw",
    "All-gather bus bandwidth reaches what the links should give",
    what="Sweeps all-gather sizes across one rank per visible GPU (with `check --collectives allgather`, "
    "or `gpudoctor bench collectives`), every result verified element by element, and reports algbw "
    "and busbw as nccl-tests defines them (busbw = algbw x (n-1)/n, S = the gathered output). The "
    "best busbw is judged against the same link bound as all-reduce (GD601): all-gather runs NCCL's "
    "ring like all-reduce without NVLink SHARP and reaches the same busbw (361.4 GB/s against 367.2 "
    "for ring all-reduce on 8x H200, ml-engineering). Below 0.8 of it warns, below 0.5 fails. On "
    "CPU and across nodes the figures are reported without a hardware verdict.",
    why="FSDP and ZeRO-3 all-gather every layer's parameters before its forward and backward pass: "
    "a slow all-gather slows every step of a sharded run even when all-reduce looks fine.",
    fix="As for GD601: look at the topology (GD4) and NCCL environment findings, compare "
    "`nvidia-smi topo -m` with what the machine should have, and run `gpudoctor bench collectives` "
    "for the whole curve (small sizes never reach the peak).",
)
REDUCESCATTER = Code(
    "GD651",
    "reducescatter-busbw",
    "Reduce-scatter bus bandwidth reaches what the links should give",
    what="Sweeps reduce-scatter sizes (with `check --collectives reducescatter`, or `gpudoctor bench "
    "collectives`), every sum verified, and reports algbw and busbw as nccl-tests defines them "
    "(busbw = algbw x (n-1)/n, S = the input that is reduced). The best busbw is judged against the "
    "all-reduce link bound (362.9 GB/s against 367.2 for ring all-reduce on 8x H200, "
    "ml-engineering): below 0.8 of it warns, below 0.5 fails; no hardware verdict on CPU or across nodes.",
    why="FSDP and ZeRO reduce-scatter the gradients of every layer in the backward pass: its speed is "
    "part of every sharded training step.",
    fix="As for GD601 and GD650: topology and NCCL environment findings first, then `gpudoctor bench "
    "collectives` for the whole curve.",
)
WRONG = Code(
    "GD652",
    "collective-wrong-values",
    "Collective results are exact, and a rank that sends wrong data is named",
    what="Before timing each size, every rank fills what it sends with a pattern that says who sent it "
    "to whom, runs the collective once and counts the wrong elements per sender (nccl-tests' #wrong, "
    "attributed). Broadcast is verified from every root in turn and send/recv in both directions. A "
    "wrong reduce-scatter sum is traced by moving each rank's contributions once more with all-to-all. "
    "A rank whose data arrives wrong at two or more receivers is named as the sender of wrong data; "
    "one that gets wrong data from two or more senders is named as the receiver; otherwise the "
    "sender -> receiver paths are listed.",
    why="A collective that returns wrong data is silent corruption: sharded parameters or gradients "
    "are wrong and training goes on without an error.",
    fix="Take the named rank's GPU out of service and test it (GD8 health findings, a GPU memory test, "
    "`dcgmi diag -r 3`); when only one path is wrong, look at the link between the two GPUs "
    "(`nvidia-smi nvlink -e`, PCIe replay counters); reinstall a mismatched NCCL/driver if every "
    "rank is affected.",
)
NOT_RUN = Code(
    "GD653",
    "collectives-not-completed",
    "The collectives ran to the end",
    what="The collectives run in spawned ranks under the check's deadline; this finding names the rank "
    "(and GPU) that failed or did not answer, and the send/recv pair it was in when it stopped.",
    why="A collective that cannot complete here will hang or crash a sharded or pipelined run the same way.",
    fix="See the DDP check's GD71x findings for the named rank's cause (port, fabric manager, /dev/shm, "
    "exclusive mode, timeout); for a send/recv pair that hangs, the P2P findings (GD421, GD422).",
)
PAIRS = Code(
    "GD654",
    "sendrecv-pair-busbw",
    "Send/recv between each pair of GPUs reaches what their link should give",
    what="For every pair of ranks, one pair at a time, both GPUs send and receive the same bytes at once "
    "(nccl-tests' sendrecv on two GPUs; busbw = algbw), and the time is compared with what the link "
    "between those two GPUs should give (`expected_busbw` of the pair: NVLink links x rate, or the "
    "PCIe path, x NCCL's efficiency). Below 0.8 of it warns, below 0.5 fails. On CPU the figures are "
    "reported without a verdict.",
    why="Pipeline parallelism sends activations and gradients between neighbouring stages at every "
    "micro-batch: one slow hop sets the pace of the whole pipeline.",
    fix="Place consecutive pipeline stages on the fastest pairs (`nvidia-smi topo -m`); for a pair "
    "slower than its link, see the P2P findings (GD421: ACS/IOMMU) and NVLink errors (GD4).",
)
FIGURES = Code(
    "GD655",
    "collective-figures",
    "All-to-all and broadcast figures, reported without a verdict",
    what="Reports the best busbw of all-to-all (busbw = algbw x (n-1)/n, S = each rank's send buffer) "
    "and broadcast (busbw = algbw) as nccl-tests defines them, every result verified (GD652). There is "
    "no public calibration to judge these collectives by, so the figure is always a pass.",
    why="Mixture-of-experts layers all-to-all their tokens at every step, and broadcast is how weights "
    "and checkpoints reach every rank: their figures tell what those steps will cost here.",
    fix="Compare with another machine of the same kind, or with nccl-tests' alltoall_perf and "
    "broadcast_perf; a figure far below all-gather's on the same GPUs points at the topology (GD4).",
)
CODES = [ALLGATHER, REDUCESCATTER, WRONG, NOT_RUN, PAIRS, FIGURES]

JUDGED = {"allgather": ALLGATHER, "reducescatter": REDUCESCATTER}


@dataclass
class Suspects:
    """Who sent or received wrong data, from the [receiver, source] cells that were wrong."""

    senders: list[int] = field(default_factory=list)  # their data arrived wrong at 2+ receivers
    receivers: list[int] = field(default_factory=list)  # got wrong data from 2+ senders
    links: list[tuple[int, int]] = field(default_factory=list)  # (source, receiver) left unexplained
    reductions: list[int] = field(default_factory=list)  # reduce-scatter sums wrong, contributions right

    @property
    def named(self) -> list[int]:
        return sorted(set(self.senders) | set(self.receivers) | set(self.reductions))

    def describe(self, label: Any) -> str:
        parts = []
        if self.senders:
            parts.append(_join([label(s) for s in self.senders]) + " sends wrong data")
        if self.receivers:
            parts.append(_join([label(r) for r in self.receivers]) + " receives wrong data")
        if self.reductions:
            parts.append(
                _join([label(r) for r in self.reductions])
                + " got wrong reduce-scatter sums although every contribution arrived right"
            )
        if self.links:
            paths = ", ".join(f"{label(s)} -> {label(r)}" for s, r in self.links)
            parts.append(f"wrong data on {paths} (the sender, the receiver or the link between them)")
        return "; ".join(parts)


def _join(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def suspects(cells: Iterable[tuple[int, int]], reductions: Iterable[int] = ()) -> Suspects:
    """Name the ranks behind wrong (receiver, source) cells: a source wrong at two or more
    receivers sends wrong data; among the rest, a receiver wrong from two or more sources
    receives wrong data; what is left is a path."""
    cells = set(cells)
    receivers_of: dict[int, set[int]] = defaultdict(set)
    for r, s in cells:
        receivers_of[s].add(r)
    senders = sorted(s for s, rs in receivers_of.items() if len(rs) >= 2)
    rest = {(r, s) for r, s in cells if s not in senders}
    sources_of: dict[int, set[int]] = defaultdict(set)
    for r, s in rest:
        sources_of[r].add(s)
    receivers = sorted(r for r, ss in sources_of.items() if len(ss) >= 2)
    links = sorted((s, r) for r, s in rest if r not in receivers)
    return Suspects(senders, receivers, links, sorted(set(reductions)))


@dataclass(frozen=True)
class Judging:
    """What the figures are judged against (all optional: None means no verdict)."""

    gpus: list[int] = field(default_factory=list)  # NVML index per rank ([] on CPU)
    snapshot: Snapshot | None = None  # the machine: links, paths and the expectations from them
    no_verdict: str = ""  # why there is no hardware verdict, when there is none
    warn_ratio: float = 0.8
    fail_ratio: float = 0.5

    def label(self, rank: int) -> str:
        gpu = self.gpus[rank] if rank < len(self.gpus) else None
        return f"rank {rank}" + (f" (GPU {gpu})" if gpu is not None else "")

    def expect(self, op: str, ranks: list[int] | None = None) -> Expectation | None:
        """What `op` should reach on these ranks' GPUs (all of them by default); None: no verdict."""
        ranks = list(range(len(self.gpus))) if ranks is None else ranks
        if self.snapshot is None or self.no_verdict or not ranks or max(ranks) >= len(self.gpus):
            return None
        return expected_busbw(self.snapshot, [self.gpus[r] for r in ranks], collective=op)

    def pair_expect(self, a: int, b: int) -> Expectation | None:
        return self.expect("sendrecv", [a, b])

    def pair_name(self, a: int, b: int) -> str:
        if max(a, b) < len(self.gpus):
            return f"GPU {self.gpus[a]} <-> GPU {self.gpus[b]}"
        return f"rank {a} <-> rank {b}"

    def pair_path(self, a: int, b: int) -> str:
        if self.snapshot is None or max(a, b) >= len(self.gpus):
            return "-"
        return topology.link_label(self.snapshot, self.gpus[a], self.gpus[b])


def op_table(op: str, sweep: Mapping[str, Any], data: Mapping[str, Any]) -> dict[str, Any]:
    """The sweep of one collective, in the all-reduce sweep's columns."""
    table = sweep_table({**data, "rows": sweep["rows"]})
    table["title"] = (
        f"{TITLES[op]} ({data['backend']}, {data['world_size']} ranks, {data['dtype']}, "
        f"busbw = algbw x {FACTOR_TEXT[op]})"
    )
    return table


def pairs_table(pairs: Mapping[str, Any], how: Judging) -> dict[str, Any]:
    rows = []
    for r in pairs["rows"]:
        expect = how.pair_expect(r["a"], r["b"])
        rows.append(
            [
                how.pair_name(r["a"], r["b"]),
                how.pair_path(r["a"], r["b"]),
                f"{r['time_us']:.1f}",
                f"{r['busbw_gbps']:.2f}",
                "-" if expect is None else f"{expect.busbw_gbps:.1f}",
                "-" if expect is None else f"{r['busbw_gbps'] / expect.busbw_gbps:.2f}",
                sum(c[2] for c in r["wrong_cells"]),
            ]
        )
    return {
        "title": f"send/recv per pair ({size(pairs['bytes'])} each way at once, busbw = algbw)",
        "columns": ["pair", "path", "time us", "busbw GB/s", "expected GB/s", "ratio", "#wrong"],
        "rows": rows,
    }


def _best(rows: list[dict[str, Any]]) -> dict[str, Any]:
    return max(rows, key=lambda r: r["busbw_gbps"])


def _judge_wrong(data: Mapping[str, Any], how: Judging) -> Finding:
    by_op: dict[str, int] = {}
    cells: set[tuple[int, int]] = set()
    reductions: set[int] = set()
    sizes_checked = 0
    for op, sweep in data["ops"].items():
        for row in sweep["rows"]:
            sizes_checked += 1
            if row["wrong"]:
                by_op[TITLES[op]] = by_op.get(TITLES[op], 0) + row["wrong"]
            cells |= {(r, s) for r, s, _ in row["wrong_cells"]}
            reductions |= {r for r, _ in row["wrong_sums"]}
    pairs = (data.get("pairs") or {}).get("rows", [])
    for row in pairs:
        wrong = sum(c[2] for c in row["wrong_cells"])
        if wrong:
            by_op["send/recv"] = by_op.get("send/recv", 0) + wrong
        cells |= {(r, s) for r, s, _ in row["wrong_cells"]}
    checked = f"{len(data['ops'])} collective(s) at {sizes_checked} size(s)" + (
        f", {len(pairs)} send/recv pair(s)" if pairs else ""
    )
    if not by_op:
        return Finding(WRONG.code, Status.PASS, "host", f"every result exact: {checked}", "", {"wrong": 0})
    who = suspects(cells, reductions)
    named = who.named
    subject = f"rank:{named[0]}" if len(named) == 1 and not who.links else "host"
    counts = ", ".join(f"{op} {n}" for op, n in by_op.items())
    evidence = {
        "wrong_by_collective": by_op,
        "wrong_cells": sorted([list(c) for c in cells]),
        "senders": who.senders,
        "receivers": who.receivers,
        "links": [list(link) for link in who.links],
        "reductions": who.reductions,
        "gpus": how.gpus,
    }
    message = f"wrong element(s) in {counts} ({checked}): {who.describe(how.label)}"
    return Finding(WRONG.code, Status.FAIL, subject, message, WRONG.fix, evidence)


def _judge_busbw(op: str, sweep: Mapping[str, Any], data: Mapping[str, Any], how: Judging) -> Finding:
    code = JUDGED.get(op, FIGURES)
    title = TITLES[op]
    if not sweep["rows"]:
        return Finding(
            code.code,
            Status.SKIP,
            "host",
            f"{title}: no message size fits in free GPU memory",
            "",
            {"skipped": sweep["skipped_sizes"]},
        )
    best = _best(sweep["rows"])
    where = f"{title} best busbw {best['busbw_gbps']:.2f} GB/s at {size(best['bytes'])} over {data['world_size']} ranks"
    evidence: dict[str, Any] = {
        "collective": op,
        "measured_busbw_gbps": best["busbw_gbps"],
        "at_bytes": best["bytes"],
        "ranks": data["world_size"],
        "backend": data["backend"],
        "busbw_factor": FACTOR_TEXT[op],
    }
    if code is FIGURES:
        why = "no public calibration to judge it by"
        return Finding(code.code, Status.PASS, "host", f"{where} (reported without a verdict: {why})", "", evidence)
    expect = how.expect(op)
    if expect is None:
        why = how.no_verdict or "this machine's link facts are unknown"
        return Finding(code.code, Status.PASS, "host", f"{where} (no hardware verdict: {why})", "", evidence)
    ratio = best["busbw_gbps"] / expect.busbw_gbps if expect.busbw_gbps else float("inf")
    evidence |= expect.to_json() | {
        "ratio": round(ratio, 3),
        "warn_below_ratio": how.warn_ratio,
        "fail_below_ratio": how.fail_ratio,
    }
    status = verdict(best["busbw_gbps"], expect, how.warn_ratio, how.fail_ratio)
    message = f"{where}; expected {expect.busbw_gbps:.1f} GB/s ({expect.basis}), ratio {ratio:.2f}"
    return Finding(code.code, status, "host", message, "" if status is Status.PASS else code.fix, evidence)


def _judge_pairs(pairs: Mapping[str, Any], how: Judging) -> list[Finding]:
    rows = pairs.get("rows", [])
    if not rows:
        why = pairs.get("skipped", "no pair to measure")
        return [Finding(PAIRS.code, Status.SKIP, "host", f"send/recv pairs skipped: {why}", "", {})]
    out = []
    judged = 0
    for r in rows:
        expect = how.pair_expect(r["a"], r["b"])
        if expect is None:
            continue
        judged += 1
        ratio = r["busbw_gbps"] / expect.busbw_gbps if expect.busbw_gbps else float("inf")
        status = verdict(r["busbw_gbps"], expect, how.warn_ratio, how.fail_ratio)
        if status is Status.PASS:
            continue
        ga, gb = how.gpus[r["a"]], how.gpus[r["b"]]
        out.append(
            Finding(
                PAIRS.code,
                status,
                pair_subject(ga, gb),
                f"send/recv {how.pair_name(r['a'], r['b'])} ({how.pair_path(r['a'], r['b'])}): "
                f"{r['busbw_gbps']:.2f} GB/s, expected {expect.busbw_gbps:.1f} GB/s ({expect.basis}), "
                f"ratio {ratio:.2f}",
                PAIRS.fix,
                {
                    "measured_busbw_gbps": r["busbw_gbps"],
                    "bytes": pairs["bytes"],
                    "path": how.pair_path(r["a"], r["b"]),
                    **expect.to_json(),
                    "ratio": round(ratio, 3),
                    "warn_below_ratio": how.warn_ratio,
                    "fail_below_ratio": how.fail_ratio,
                },
            )
        )
    lo = min(rows, key=lambda r: r["busbw_gbps"])
    hi = max(rows, key=lambda r: r["busbw_gbps"])
    spread = (
        f"{len(rows)} pair(s) at {size(pairs['bytes'])}: slowest {how.pair_name(lo['a'], lo['b'])} "
        f"{lo['busbw_gbps']:.2f} GB/s, fastest {how.pair_name(hi['a'], hi['b'])} {hi['busbw_gbps']:.2f} GB/s"
    )
    evidence = {"pairs": len(rows), "slowest_busbw_gbps": lo["busbw_gbps"], "fastest_busbw_gbps": hi["busbw_gbps"]}
    if not judged:
        why = how.no_verdict or "this machine's link facts are unknown"
        return [
            Finding(PAIRS.code, Status.PASS, "host", f"send/recv {spread} (no hardware verdict: {why})", "", evidence)
        ]
    if not out:
        ok = f"send/recv {spread}; every pair at {how.warn_ratio:g} of its link's expectation or more"
        return [Finding(PAIRS.code, Status.PASS, "host", ok, "", evidence)]
    return out


def judge(data: CollectivesResult, how: Judging) -> tuple[list[Finding], dict[str, Any]]:
    """Findings and details tables for the collectives workload's result."""
    findings = [_judge_wrong(data, how)]
    tables = []
    for op, sweep in data["ops"].items():
        findings.append(_judge_busbw(op, sweep, data, how))
        tables.append(op_table(op, sweep, data))
    pairs = data.get("pairs")
    if pairs is not None:
        findings += _judge_pairs(pairs, how)
        if pairs.get("rows"):
            tables.append(pairs_table(pairs, how))
    return findings, {"tables": tables, "collectives": data}


def not_completed(result: Any) -> Finding:
    """GD653 for a launch that gave no collectives result: who failed, and in which pair."""
    if result.setup_error is not None:
        msg = f"collectives did not start: {result.setup_error['message']}"
    else:
        from gpudoctor.launch.protocol import PAIR_SENDRECV, pair_in_phase  # not at import: check --quick

        suspects_ = result.suspects()
        msg = f"collectives did not complete: {describe(suspects_) or 'a rank'} failed"
        first = next(iter(suspects_), None)
        pair = pair_in_phase(first.phase, PAIR_SENDRECV) if first is not None else None
        if pair is not None:
            msg += f" during send/recv between ranks {pair[0]}-{pair[1]}"
        if first is not None and first.error:
            msg += f" ({first.error[:200]})"
        msg += interference_clause(result)
    return Finding(NOT_RUN.code, Status.FAIL, "host", msg, NOT_RUN.fix, {"launch": result.to_json()})


def judging_for(ctx: CheckContext, gpus: list[int], device: str, nodes: int) -> Judging:
    """How `check` judges: the link model on one node with GPUs, no hardware verdict otherwise."""
    opts = ctx.options
    common = {"gpus": gpus, "warn_ratio": opts.busbw_warn_ratio, "fail_ratio": opts.busbw_fail_ratio}
    if device != "cuda":
        return Judging(**common, no_verdict="CPU/gloo")
    if nodes > 1:
        return Judging(**common, no_verdict=f"{nodes} nodes: the network between them caps busbw")
    return Judging(**common, snapshot=ctx.snapshot)


@check("collectives", "All-gather, reduce-scatter and other collectives", codes=CODES, active=True, shares="active")
def collectives(ctx: CheckContext) -> tuple[list[Finding], dict]:
    ops = parse_ops(",".join(ctx.options.collectives or ()))  # --collectives, or the policy's list
    if not ops:
        return [
            Finding(
                ALLGATHER.code,
                Status.SKIP,
                "host",
                "all-gather and reduce-scatter not measured: `--collectives allgather,reducescatter` "
                "judges the collectives FSDP and ZeRO use",
                "",
                {},
            )
        ], {}
    p = plan(ctx)
    if p.skip:
        return [skip_finding(ctx, CODES[0], p, "collectives")], {}
    if world_size(ctx, p) < 2:
        what = "one visible GPU" if p.device == "cuda" else "one CPU rank"
        return [
            Finding(ALLGATHER.code, Status.SKIP, "host", f"collectives skipped: {what}, nothing to shard across")
        ], {}
    result = ctx.run("active")
    data = result.results("collectives")
    if data is None:
        return [not_completed(result)], {}
    return judge(data, judging_for(ctx, p.gpus, data["device"], result.node_count))
