"""Measurements compared for regressions beyond a tolerance: all-reduce busbw where it is
bandwidth-bound (GD014), the DDP step time (GD015), P2P copy bandwidth per pair (GD016). Runs that
measured on another device, backend or number of ranks are not compared.
"""

from __future__ import annotations

import math
from typing import Any

from gpudoctor.compare.codes import BUSBW, DDP_STEP, P2P, finding
from gpudoctor.compare.sides import Side
from gpudoctor.findings import Finding, Status


def _pct(change: float) -> str:
    return f"{change:+.0%}"


def _size(n: int) -> str:
    for unit, div in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= div:
            return f"{n / div:g} {unit}"
    return f"{n} B"


def _comparable(base: dict[str, Any], cur: dict[str, Any], what: str) -> str:
    """Why two runs' measurements cannot be compared ('' when they can)."""
    for key, words in (("device", "device"), ("backend", "backend"), ("ranks", "ranks")):
        if base.get(key) is not None and cur.get(key) is not None and base[key] != cur[key]:
            return f"{what} not compared: the baseline ran {words} {base[key]}, this run {cur[key]}"
    return ""


def _change(now: float, before: float) -> float | None:
    """now / before - 1, or None when `before` is not above 0 or the ratio is no finite number."""
    if before <= 0:
        return None
    change = now / before - 1
    return change if math.isfinite(change) else None


def compare_busbw(base: dict[str, Any], cur: dict[str, Any], tolerance: float) -> Finding:
    """Judged where the sweep is bandwidth-bound, as GD601 judges it: the best busbw of the plateau.

    Small messages are latency-bound: their busbw is a few percent of the link's and swings with
    scheduling noise (a busy host, another job's launch), so one slow small size says nothing about
    the links. allreduce.plateau() picks the largest sizes (the last four doublings), and the best
    busbw among them on each side is compared: a link that went down lowers every size of the
    plateau; one slow repetition of one size does not decide. Every size stays in the evidence."""
    from gpudoctor.knowledge.busbw import plateau

    why = _comparable(base, cur, "busbw")
    if why:
        return finding(
            BUSBW, Status.SKIP, "host", why, {"baseline_ranks": base.get("ranks"), "ranks": cur.get("ranks")}
        )
    b = {s["bytes"]: s["busbw_gbps"] for s in base.get("sizes", [])}
    rows = []
    for s in cur.get("sizes", []):
        change = _change(s["busbw_gbps"], b[s["bytes"]]) if s["bytes"] in b else None
        if change is not None:
            rows.append(
                {
                    "bytes": s["bytes"],
                    "baseline_gbps": b[s["bytes"]],
                    "measured_gbps": s["busbw_gbps"],
                    "change": round(change, 4),
                }
            )
    evidence: dict[str, Any] = {"tolerance": tolerance, "backend": cur.get("backend"), "ranks": cur.get("ranks")}
    if not rows:
        return finding(
            BUSBW, Status.SKIP, "host", "busbw not compared: no message size measured on both sides", evidence
        )
    _, judged = plateau([{"bytes": r["bytes"], "busbw_gbps": r["measured_gbps"]} for r in rows])
    for r in rows:
        r["bandwidth_bound"] = r["bytes"] in judged
    evidence["sizes"] = rows
    tail = [r for r in rows if r["bandwidth_bound"]]
    best_b, best_c = max(r["baseline_gbps"] for r in tail), max(r["measured_gbps"] for r in tail)
    change = _change(best_c, best_b)
    evidence |= {"bandwidth_bound_bytes": judged, "baseline_best_gbps": best_b, "best_gbps": best_c}
    if change is not None:
        evidence["change"] = round(change, 4)
    span = _size(min(judged)) if len(judged) == 1 else f"{_size(min(judged))} to {_size(max(judged))}"
    values = f"best {best_c:.2f} GB/s, baseline {best_b:.2f} GB/s"
    if change is not None and change < -tolerance:
        fell = sorted((r for r in tail if r["change"] < -tolerance), key=lambda r: r["change"])
        each = ", ".join(
            f"{_size(r['bytes'])} {r['baseline_gbps']:.2f} -> {r['measured_gbps']:.2f} GB/s ({_pct(r['change'])})"
            for r in fell[:3]
        )
        more = f" (+{len(fell) - 3} more)" if len(fell) > 3 else ""
        message = (
            f"busbw fell more than {tolerance:.0%} where it is bandwidth-bound ({span}): {values} ({_pct(change)}); "
            f"{each}{more}"
        )
        return finding(BUSBW, Status.FAIL, "host", message, evidence)
    slower = [r for r in rows if not r["bandwidth_bound"] and r["change"] < -tolerance]
    note = f"; {len(slower)} latency-bound size(s) slower, not judged" if slower else ""
    message = (
        f"busbw within {tolerance:.0%} of the baseline (or better) where it is bandwidth-bound ({span}): {values}{note}"
    )
    return finding(BUSBW, Status.PASS, "host", message, evidence)


def compare_ddp(base: dict[str, Any], cur: dict[str, Any], tolerance: float) -> Finding:
    why = _comparable(base, cur, "DDP step time")
    evidence = {"tolerance": tolerance, "baseline_step_s": base["step_s"], "step_s": cur["step_s"]}
    if why:
        return finding(DDP_STEP, Status.SKIP, "host", why, evidence)
    change = _change(cur["step_s"], base["step_s"]) or 0.0
    evidence["change"] = round(change, 4)
    values = f"{base['step_s'] * 1000:.1f} ms in the baseline, {cur['step_s'] * 1000:.1f} ms now ({_pct(change)})"
    if change > tolerance:
        return finding(
            DDP_STEP, Status.WARN, "host", f"DDP step slower by more than {tolerance:.0%}: {values}", evidence
        )
    return finding(DDP_STEP, Status.PASS, "host", f"DDP step time {values}", evidence)


def compare_p2p(base: dict[str, Any], cur: dict[str, Any], tolerance: float) -> list[Finding]:
    out = []
    common = [p for p in cur if p in base and _change(cur[p]["p2p_gbps"], base[p]["p2p_gbps"]) is not None]
    for pair in common:
        b, c = base[pair]["p2p_gbps"], cur[pair]["p2p_gbps"]
        change = _change(c, b) or 0.0
        if change < -tolerance:
            out.append(
                finding(
                    P2P,
                    Status.FAIL,
                    f"pair:{pair}",
                    f"GPU {pair.replace('-', ' -> ')} P2P copy {b:.1f} GB/s in the baseline, {c:.1f} GB/s now "
                    f"({_pct(change)}, tolerance {tolerance:.0%})",
                    {"baseline_gbps": b, "measured_gbps": c, "change": round(change, 4), "path": cur[pair].get("path")},
                )
            )
    if not common:
        return [finding(P2P, Status.SKIP, "host", "P2P not compared: no GPU pair measured on both sides", {})]
    if not out:
        out.append(
            finding(
                P2P,
                Status.PASS,
                "host",
                f"P2P copies within {tolerance:.0%} of the baseline (or better) on {len(common)} pair(s)",
                {"tolerance": tolerance, "pairs": len(common)},
            )
        )
    return out


def compare_measurements(base: Side, cur: Side, tolerance: float) -> list[Finding]:
    mb, mc = base.measurements, cur.measurements
    if not mb and not mc:
        why = "nothing measured on either side (snapshots, or runs with --quick/--snapshot): facts only"
        return [finding(BUSBW, Status.SKIP, "host", why, {})]
    out: list[Finding] = []
    for key, code, what in (
        ("allreduce", BUSBW, "all-reduce sweep"),
        ("ddp", DDP_STEP, "DDP run"),
        ("p2p", P2P, "P2P"),
    ):
        if key not in mb or key not in mc:
            where = "the baseline" if key not in mb else "this run"
            out.append(finding(code, Status.SKIP, "host", f"{what} not compared: none in {where}", {}))
        elif key == "allreduce":
            out.append(compare_busbw(mb[key], mc[key], tolerance))
        elif key == "ddp":
            out.append(compare_ddp(mb[key], mc[key], tolerance))
        else:
            out.extend(compare_p2p(mb[key], mc[key], tolerance))
    return out
