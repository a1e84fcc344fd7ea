"""Running checks: each inside a guard, skipped when it has nothing to look at, its findings
filtered by the selection, its shared run handed to it, and the hidden causes shown."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping
from typing import Any

from gpudoctor.engine.codes import CHECK_CRASHED
from gpudoctor.engine.context import CheckContext
from gpudoctor.engine.registry import Check, Registry, Starter
from gpudoctor.engine.selection import Selection
from gpudoctor.findings import CheckResult, Finding, Status


class SharedRuns:
    """The launches of one check run that several checks read (all-reduce and DDP in one process
    group; the deep checks' one load run). Each is started once, by its starter, when the first
    check that reads it asks; the starter plans from the whole run (ctx.planned), so what runs does
    not depend on which check asked first."""

    def __init__(self, starters: Mapping[str, Starter]) -> None:
        self._starters = dict(starters)
        self.started: dict[str, Any] = {}

    def get(self, name: str, ctx: CheckContext) -> Any:
        if name not in self.started:
            self.started[name] = self._starters[name](ctx)
        return self.started[name]


def crashed(chk: Check, exc: BaseException) -> Finding:
    import traceback  # only when a check crashed

    tb = traceback.extract_tb(exc.__traceback__)
    where = f"{tb[-1].filename.rsplit('/', 1)[-1]}:{tb[-1].lineno}" if tb else ""
    return Finding(
        CHECK_CRASHED.code,
        Status.ERROR,
        f"check:{chk.name}",
        f"check {chk.name!r} crashed: {type(exc).__name__}: {exc}",
        hint="The other checks still ran. This is likely a gpudoctor bug; please report it with "
        "the output of `gpudoctor snapshot`.",
        evidence={"exception": type(exc).__name__, "detail": str(exc), "where": where},
    )


def unmet_need(chk: Check, ctx: CheckContext) -> Finding | None:
    """One `skip` finding when the check has nothing to look at (no driver, no GPU, none visible).
    It points at the finding that says why (GD101, GD201), or, when the selection hides that
    finding (--ignore GD101), says what it would have said."""
    return missing_gpus(chk.codes[0].code, chk.needs, ctx)


def missing_gpus(code: str, needs: str, ctx: CheckContext) -> Finding | None:
    """`unmet_need` for a check that decides for itself when it needs GPUs (an active check whose
    plan asks for them): the same skip under its own `code`."""
    if not needs:
        return None
    snap = ctx.snapshot
    if snap.driver.nvml_status != "ok" or not snap.gpus:
        why = _see(ctx, "nvml", "GD101")
        evidence = {"nvml_status": snap.driver.nvml_status, "see": "GD101"}
        return Finding(code, Status.SKIP, "host", f"no GPUs to check: {why}", evidence=evidence)
    if needs == "visible" and not ctx.visible.gpus:
        raw = snap.env.get("CUDA_VISIBLE_DEVICES")
        why = _see(ctx, "visibility", "GD201")
        evidence = {"CUDA_VISIBLE_DEVICES": raw, "see": "GD201"}
        return Finding(code, Status.SKIP, "host", f"no visible GPUs to check: {why}", evidence=evidence)
    return None


def _see(ctx: CheckContext, check_name: str, code: str) -> str:
    """'see GD101', or, when --select/--ignore hides GD101, its own sentence: 'no NVIDIA driver: the
    NVIDIA kernel module is not loaded (GD101, not shown)'."""
    if ctx.shown(code) or ctx.registry is None or check_name not in ctx.registry.checks:
        return f"see {code}"
    said = [f.message for f in findings_of(ctx, check_name, code) if f.status is not Status.PASS]
    return f"{said[0]} ({code}, not shown)" if said else f"see {code}"


def findings_of(ctx: CheckContext, check_name: str, code: str) -> list[Finding]:
    """What check `check_name` says under `code` (run for a finding the selection hid)."""
    assert ctx.registry is not None
    out = ctx.registry.checks[check_name].func(ctx)
    findings = out[0] if isinstance(out, tuple) else out
    return [f for f in findings if f.code == code]


def shown_findings(findings: list[Finding], selection: Selection) -> list[Finding]:
    """The findings the selection wants; and, when none of them judged anything, the check's
    failures that say why (`--select GD601` on a hung all-reduce: GD603 'did not complete' is kept,
    not a skip that would read as 'nothing was checked'). --ignore still hides a code it names."""
    shown = [f for f in findings if selection.wants(f.code)]
    if any(f.status is not Status.SKIP for f in shown):
        return shown
    why = [f for f in findings if f.status in (Status.FAIL, Status.ERROR) and f not in shown]
    return [f for f in why if not selection.ignores(f.code)] + shown


def run_one(chk: Check, ctx: CheckContext, selection: Selection) -> CheckResult:
    start = time.perf_counter()
    details: dict[str, Any] = {}
    try:
        skipped = unmet_need(chk, ctx)
        func = chk.func
        if not skipped and hasattr(func, "resolve"):  # a check imported on first use: not timed as its own work
            func = func.resolve()
            start = time.perf_counter()
        out = [skipped] if skipped else func(ctx)
        if isinstance(out, tuple):
            findings, details = out
        else:
            findings = out
        findings = shown_findings(findings, selection)
    except Exception as exc:  # noqa: BLE001  (a crashing check is a result, not an abort)
        findings = [crashed(chk, exc)]
    return CheckResult(chk.name, chk.title, list(findings), time.perf_counter() - start, details)


def selected(registry: Registry, ctx: CheckContext, selection: Selection) -> list[Check]:
    """The checks a run with these options and this selection runs, in display order."""
    selection = selection.using(registry)
    return registry.selected(ctx.options, selection.wants_check)


def run_checks(
    registry: Registry,
    ctx: CheckContext,
    selection: Selection | None = None,
    *,
    on_start: Callable[[Check], None] | None = None,
    runs: SharedRuns | None = None,
) -> list[CheckResult]:
    """Run the selected checks of `registry` on `ctx`. `runs` keeps the shared runs (the caller
    reads what they measured afterwards: the report's node rows)."""
    selection = (selection or Selection()).using(registry)
    chosen = wire(ctx, registry, selection, runs)
    results = []
    for chk in chosen:
        if on_start is not None:
            on_start(chk)
        results.append(run_one(chk, ctx, selection))
    results += hidden_causes(ctx, results, selection)
    return results


def wire(ctx: CheckContext, registry: Registry, selection: Selection, runs: SharedRuns | None = None) -> list[Check]:
    """Hand `ctx` what the runner gives every check of a run: the registry, the plan, what the
    selection shows and the shared runs. Returns the checks of the run, in order."""
    runs = runs if runs is not None else SharedRuns(registry.runs)
    chosen = selected(registry, ctx, selection)
    ctx.registry = registry
    ctx.planned = tuple(c.name for c in chosen)
    ctx.shown = selection.wants
    ctx.shared = lambda name: runs.get(name, ctx)
    return chosen


# What an unmet need's skip points at, and the lost GPU (GD827) that a GPU check leaves out.
CAUSE_OWNER = {"GD002": "torch_install", "GD101": "nvml", "GD201": "visibility", "GD827": "lost_gpus"}


def hidden_causes(ctx: CheckContext, results: list[CheckResult], selection: Selection) -> list[CheckResult]:
    """The failures the selection hid that decide what the selected checks could judge: when every
    selected check skipped for one (`--select GD801` on a machine without a driver: GD101), and a
    GPU the run would use that is lost (GD827), which every GPU check leaves out (`--select GD801`
    on a node with a GPU off the bus would pass on the others). Shown, the run is NOT READY (exit
    1) rather than "nothing was checked" (exit 2) or READY. A code --ignore names stays hidden."""
    registry = ctx.registry
    assert registry is not None
    judged = any(f.status is not Status.SKIP for r in results for f in r.findings)
    seen = [] if judged else [f.evidence.get("see") for r in results for f in r.findings if f.status is Status.SKIP]
    gpu_checks = any(registry.checks[r.name].needs for r in results if r.name in registry.checks)
    if gpu_checks and ctx.snapshot.gpus and ctx.visible.lost_wanted:
        seen.append("GD827")
    out = []
    for code in dict.fromkeys(c for c in seen if c in CAUSE_OWNER and not ctx.shown(c)):
        owner = registry.checks.get(CAUSE_OWNER[code])
        if owner is None or selection.ignores(code):
            continue
        failed = [f for f in findings_of(ctx, owner.name, code) if f.status in (Status.FAIL, Status.ERROR)]
        if failed:
            out.append(CheckResult(owner.name, owner.title, failed, 0.0))
            for r in results:  # the skips now point at the failure shown below them
                r.findings = [_see_shown(f, code) for f in r.findings]
    return out


def _see_shown(f: Finding, code: str) -> Finding:
    if f.status is not Status.SKIP or f.evidence.get("see") != code or f"({code}, not shown)" not in f.message:
        return f  # a skip that said its own reason (an active check's plan) keeps its words
    return dataclasses.replace(f, message=f"{f.message.split(': ', 1)[0]}: see {code}")
