"""The Python API: `run_checks` (what `gpudoctor check` does) and `preflight` (a gate for training scripts).

    import gpudoctor

    gpudoctor.preflight(expect_gpus=8)            # raises gpudoctor.PreflightError listing what fails
    report = gpudoctor.run_checks(quick=True)      # the Report object, as `check --json` writes it

Both read the team's policy the way the CLI does (policy.py: `gpudoctor.toml` or `[tool.gpudoctor]`
found upwards of the current directory; `config=` names one, `use_config=False` uses none), and
arguments given here win over it. With `quick=True` nothing is spawned and torch is not imported.
Errors the caller can act on (a bad policy file, an unreadable snapshot or baseline, an unknown
code) raise `gpudoctor.UserError` with a one-line message.
"""

from __future__ import annotations

import dataclasses
import re
import socket
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpudoctor import __version__
from gpudoctor.errors import EXIT_USAGE, UserError
from gpudoctor.findings import CheckResult, Finding, Report, Status

if TYPE_CHECKING:
    from gpudoctor.policy import Policy
    from gpudoctor.snapshot import Snapshot

__all__ = ["PreflightError", "preflight", "run_checks"]


class PreflightError(RuntimeError):
    """The machine is not ready: `failures` are the findings at or above `fail_on`, `report` the whole run.

    Its text lists every failure with its hint, with gpudoctor's command-line options written as the
    keywords a Python caller passes (`--expect-gpus 16` reads `expect_gpus=16`). It pickles (a
    multiprocessing worker or a launcher can send it back whole)."""

    def __init__(self, report: Report) -> None:
        self.report = report
        self.failures: list[Finding] = [f for f in report.findings if f.status.rank >= report.fail_on.rank]
        lines = [f"gpudoctor preflight: {len(self.failures)} finding(s) at or above {report.fail_on.value}:"]
        for f in self.failures:
            lines.append(f"  {f.status.value.upper()} {f.code} {f.subject}: {as_keywords(f.message)}")
            if f.hint:
                lines.append(f"    hint: {as_keywords(f.hint)}")
        super().__init__("\n".join(lines))

    def __reduce__(self) -> tuple[Any, tuple[Report]]:
        return (PreflightError, (self.report,))


PreflightError.__module__ = "gpudoctor"  # tracebacks name it as users import it: gpudoctor.PreflightError

# gpudoctor's options that run_checks takes as keywords: in a Python caller's error, "--timeout"
# is `timeout_s=`. Options of other tools (docker's --gpus, torchrun's --nproc) are left alone.
KEYWORDS = {
    "--expect-gpus": "expect_gpus",
    "--expect-model": "expect_model",
    "--min-busbw": "min_busbw",
    "--ram-per-gpu": "ram_per_gpu_gb",
    "--timeout": "timeout_s",
    "--allow-mig": "allow_mig",
    "--device": "device",
    "--ranks": "ranks",
    "--level": "level",
    "--quick": "quick",
    "--duration": "duration_s",
    "--mem-share": "mem_share",
    "--select": "select",
    "--ignore": "ignore",
    "--fail-on": "fail_on",
    "--collectives": "collectives",
    "--tolerance": "tolerance",
    "--baseline": "baseline",
    "--config": "config",
    "--snapshot": "snapshot",
}
_SWITCHES = {"--allow-mig", "--quick"}
_LISTS = {"--select", "--ignore", "--collectives"}
_OPTION = re.compile(r"(?<![\w-])(--[a-z][a-z-]*)(?:[ =]([^\s;:)`'\"]+))?")
_COMMAND = re.compile(r"(`gpudoctor [^`]*`)")


def as_keywords(text: str) -> str:
    """`--expect-gpus 16` -> `expect_gpus=16`, `--allow-mig` -> `allow_mig=True`, for gpudoctor's own options.

    A quoted command line (`gpudoctor check --level 3`) stays as it is: it is still what to run."""
    parts = _COMMAND.split(text)
    return "".join(part if n % 2 else _OPTION.sub(_keyword, part) for n, part in enumerate(parts))


def _keyword(match: re.Match[str]) -> str:
    option, value = match.group(1), match.group(2) or ""
    name = KEYWORDS.get(option)
    if name is None:
        return match.group(0)
    trailing = value[len(value.rstrip(".,")) :]
    value = value.rstrip(".,")
    if option in _SWITCHES:
        return f"{name}=True" + (f" {value}" if value else "") + trailing
    if not value or value.startswith("-"):
        return f"{name}=" + (f" {value}" if value else "") + trailing

    def shown(item: str) -> str:  # a number, or a placeholder such as N, stays bare
        return item if re.fullmatch(r"[0-9.]+|[A-Z]+", item) else repr(item)

    if option in _LISTS:
        return f"{name}=[{', '.join(shown(v) for v in value.split(',') if v)}]{trailing}"
    return f"{name}={shown(value)}{trailing}"


def run_checks(
    *,
    snapshot: str | Path | Snapshot | None = None,
    quick: bool = False,
    level: int | None = None,
    duration_s: float | None = None,
    mem_share: float | None = None,
    expect_gpus: int | None = None,
    expect_model: str | None = None,
    select: Sequence[str] = (),
    ignore: Sequence[str] = (),
    fail_on: str | None = None,
    device: str = "auto",
    ranks: int | None = None,
    timeout_s: float | None = None,
    min_busbw: float | str | None = None,
    allow_mig: bool | None = None,
    collectives: Sequence[str] | None = None,
    ram_per_gpu_gb: float | None = None,
    baseline: str | Path | None = None,
    tolerance: float | str | None = None,
    config: str | Path | None = None,
    use_config: bool = True,
    progress: Callable[[str], None] | None = None,
) -> Report:
    """Run the checks of `gpudoctor check` and return the report (`report.exit_code`, `report.findings`).

    snapshot: a recorded snapshot (a path, "-" for standard input, or an object) instead of probing
        this machine (implies quick).
    quick: only the static checks: no ranks spawned, no torch import (level 1).
    level: 1 static, 2 + active checks (the default), 3 + deep checks under load (docs/deep-checks.md);
    duration_s, mem_share: level 3's seconds of load (60) and share of free GPU memory tested (0.8).
    select/ignore: codes (GD401), prefixes (GD4) or check names; `ignore` adds to the policy's.
    min_busbw: GB/s, or a share of the expected busbw such as "80%".
    collectives: also run and judge these beside all-reduce ("allgather", "reducescatter", ...).
    baseline: a saved `check --json` report or a snapshot to compare with (GD011-GD016),
    `tolerance` (default 10%, "10%" or 0.1) for its measured regressions.
    Every other argument left as None takes the policy's value, then gpudoctor's default.
    """
    from gpudoctor import api_args as arg
    from gpudoctor import policy as pol
    from gpudoctor.registry import CheckContext, Selection, SelectionError, load_all
    from gpudoctor.registry import run_checks as run_registered
    from gpudoctor.snapshot import Snapshot

    # Every argument checked before any work, with the command line's bounds (cli.py).
    if not isinstance(snapshot, Snapshot):
        arg.path("snapshot", snapshot)
    arg.flag("quick", quick, optional=False)
    arg.integer("level", level, 1, 3)
    duration_s = arg.real("duration_s", duration_s, 1, 86400)
    mem_share = arg.real("mem_share", mem_share, 0.01, 0.95)
    expect_gpus = arg.integer("expect_gpus", expect_gpus, 1)
    arg.text("expect_model", expect_model)
    select, ignore = arg.names("select", select) or (), arg.names("ignore", ignore) or ()
    arg.text("fail_on", fail_on, ("warn", "fail"))
    arg.text("device", device, ("auto", "cuda", "cpu"))
    ranks = arg.integer("ranks", ranks, 1, 64)
    timeout_s = arg.real("timeout_s", timeout_s, 1)
    if min_busbw is not None and not isinstance(min_busbw, str):
        arg.real("min_busbw", min_busbw, 0)
    arg.flag("allow_mig", allow_mig)
    collectives = arg.names("collectives", collectives)
    ram_per_gpu_gb = arg.real("ram_per_gpu_gb", ram_per_gpu_gb, 0)
    arg.path("baseline", baseline)
    _check_tolerance(tolerance)
    arg.path("config", config)
    arg.flag("use_config", use_config, optional=False)
    arg.callable_or_none("progress", progress)

    policy = pol.load(config, use_config=use_config)
    load_all()
    selection = Selection(tuple(select) or policy.select, (*policy.ignore, *ignore))
    try:
        selection.validate()
    except SelectionError as exc:
        raise UserError(str(exc), EXIT_USAGE, "usage") from None
    if device not in ("auto", "cuda", "cpu"):
        raise UserError(f"device must be 'auto', 'cuda' or 'cpu', got {device!r}", EXIT_USAGE, "usage")
    if ranks is not None and device != "cpu":
        raise UserError("--ranks needs --device cpu (on GPUs there is one rank per visible GPU)", EXIT_USAGE, "usage")
    status_on = _fail_on(fail_on or policy.fail_on or "fail")
    tol = _tolerance(tolerance, policy)
    base = None
    if baseline is not None:  # read before any work: a bad baseline must not cost an active run
        from gpudoctor.compare import load_side

        base = load_side(baseline)
    chosen = check_level(level, quick, snapshot is not None, duration_s, mem_share)
    if chosen >= 2:  # ranks will start: a fault spec or launcher variable they cannot read is a usage error now
        from gpudoctor.launch import check_launcher_env
        from gpudoctor.workloads.faults import check_env

        check_env()
        check_launcher_env()
    snap_obj, source = _snapshot(snapshot)
    options = check_options(
        policy,
        quick=chosen == 1,
        level=chosen,
        duration_s=duration_s,
        mem_share=mem_share,
        expect_gpus=expect_gpus,
        expect_model=expect_model,
        device=device,
        ranks=ranks,
        timeout_s=timeout_s,
        min_busbw=min_busbw,
        allow_mig=allow_mig,
        collectives=collectives,
        ram_per_gpu_gb=ram_per_gpu_gb,
    )
    ctx = CheckContext(snap_obj, options, progress=progress or (lambda message: None))
    report = build_report(ctx, run_registered(ctx, selection), source, status_on, policy)
    if base is not None:
        from gpudoctor.compare import Side, compare

        this = Side("this run", "report", report.facts, report.measurements, __version__)
        for result in compare(base, this, tol):
            result.findings = [f for f in result.findings if selection.wants(f.code)]
            if result.findings:
                report.checks.append(result)
    if not report.checks:
        # A gate that checked nothing must not say READY.
        from gpudoctor.registry import CHECKS

        above = [c for c in CHECKS.values() if c.level > chosen and selection.wants_check(c)]
        names = ", ".join(c.name for c in above)
        why = f" ({names} run at --level {max(c.level for c in above)}; this run is level {chosen})" if above else ""
        raise UserError(f"no check ran: --select/--ignore left nothing to run{why}", EXIT_USAGE, "usage")
    nothing_checked(report.checks, "checked")
    report.checks = apply_severity(report.checks, policy)
    return report


def nothing_checked(results: list[CheckResult], verb: str) -> None:
    """Every check that ran skipped: the gate checked nothing, which is a usage error, not READY.

    The rule of "no check ran" (--select left nothing) extended to checks that ran and could judge
    nothing on this machine (`--level 3 --select deep_links --device cpu`, a diff of two reports
    that hold neither facts nor measurements): exit 2, naming each check and why it skipped."""
    if not results or any(f.status is not Status.SKIP for r in results for f in r.findings):
        return
    reasons = [f"{r.name}: {r.findings[0].message}" if r.findings else f"{r.name}: nothing to judge" for r in results]
    shown = "; ".join(reasons[:3]) + (f"; +{len(reasons) - 3} more" if len(reasons) > 3 else "")
    raise UserError(f"nothing was {verb}: every selected check skipped ({shown})", EXIT_USAGE, "usage")


def preflight(
    expect_gpus: int | None = None,
    *,
    quick: bool = True,
    fail_on: str | None = None,
    **options: Any,
) -> Report:
    """Check this machine at the top of a training script; raise PreflightError listing what fails.

        import gpudoctor
        gpudoctor.preflight(expect_gpus=8)   # quick: static checks only, no torch import, no ranks

    Returns the report when nothing is at or above `fail_on` (policy's, else "fail"). Any other
    keyword of `run_checks` is accepted (expect_model=, ignore=, config=, snapshot=, ...).
    """
    report = run_checks(expect_gpus=expect_gpus, quick=quick, fail_on=fail_on, **options)
    if report.exit_code:
        raise PreflightError(report)
    return report


# ---------------------------------------------------------------------------------------------
# The pieces, shared with the CLI


def _fail_on(value: str) -> Status:
    if value not in ("warn", "fail"):
        raise UserError(f"fail_on must be 'warn' or 'fail', got {value!r}", EXIT_USAGE, "usage")
    return Status(value)


def _check_tolerance(value: Any) -> None:
    """tolerance: '10%', '0.1' or 0.1 (a share, policy.parse_share); refused before any work."""
    from gpudoctor.api_args import ArgumentError, ArgumentTypeError
    from gpudoctor.policy import parse_share

    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise ArgumentTypeError(f"tolerance must be a share such as '10%' or 0.1, got {value!r}")
    try:
        parse_share(value, "tolerance")
    except ValueError as exc:
        raise ArgumentError(str(exc)) from None


def _tolerance(value: float | str | None, policy: Policy) -> float:
    from gpudoctor.compare import DEFAULT_TOLERANCE
    from gpudoctor.policy import parse_share

    if value is None:
        return policy.tolerance if policy.tolerance is not None else DEFAULT_TOLERANCE
    try:
        return parse_share(value, "--tolerance")
    except ValueError as exc:
        raise UserError(str(exc), EXIT_USAGE, "usage") from None


def _snapshot(snapshot: str | Path | Snapshot | None) -> tuple[Snapshot, str]:
    from gpudoctor import snapshot as snap

    if snapshot is None:
        from gpudoctor.probe import collect

        return collect(), "live"
    if isinstance(snapshot, snap.Snapshot):
        return snapshot, "snapshot"
    try:
        return snap.load(snapshot), "stdin" if snapshot == "-" else str(snapshot)
    except snap.SnapshotError as exc:
        raise UserError(f"cannot use snapshot {exc}", EXIT_USAGE, "input") from None


def check_level(
    level: int | None, quick: bool, recorded: bool, duration_s: float | None, mem_share: float | None
) -> int:
    """The level `check` runs at (1 static, 2 active, 3 deep); contradictory options are usage errors."""
    if level not in (None, 1, 2, 3):
        raise UserError(f"level must be 1, 2 or 3, got {level!r}", EXIT_USAGE, "usage")
    if quick and level not in (None, 1):
        raise UserError(f"--quick is --level 1; it cannot be combined with --level {level}", EXIT_USAGE, "usage")
    if recorded and level not in (None, 1):
        # Workloads on a recorded snapshot would measure this machine, not the recorded one.
        raise UserError(f"--snapshot runs the static checks only (level 1), not --level {level}", EXIT_USAGE, "usage")
    chosen = 1 if quick or recorded else (level or 2)
    for name, value in (("--duration", duration_s), ("--mem-share", mem_share)):
        if value is not None and chosen < 3:
            raise UserError(f"{name} sets level 3's load tests: add --level 3", EXIT_USAGE, "usage")
    return chosen


def check_options(
    policy: Policy,
    *,
    quick: bool,
    level: int | None = None,
    duration_s: float | None = None,
    mem_share: float | None = None,
    expect_gpus: int | None = None,
    expect_model: str | None = None,
    device: str = "auto",
    ranks: int | None = None,
    timeout_s: float | None = None,
    min_busbw: float | str | None = None,
    allow_mig: bool | None = None,
    collectives: Sequence[str] | None = None,
    ram_per_gpu_gb: float | None = None,
) -> Any:
    """CheckOptions from the arguments, then the policy, then the defaults: the one place they meet."""
    from gpudoctor.policy import parse_busbw
    from gpudoctor.registry import MAX_TIMEOUT_S, CheckOptions

    defaults = CheckOptions()
    if min_busbw is not None:
        try:
            busbw_abs, busbw_share = parse_busbw(min_busbw)
        except ValueError as exc:
            raise UserError(f"--min-busbw: {exc}", EXIT_USAGE, "usage") from None
    else:
        busbw_abs, busbw_share = policy.min_busbw_gbps, policy.min_busbw_share
    fail_ratio = busbw_share if busbw_share is not None else defaults.busbw_fail_ratio
    timeout = _first(timeout_s, policy.timeout_s, defaults.timeout_s)
    if not 1 <= timeout <= MAX_TIMEOUT_S:  # NaN fails both
        raise UserError(
            f"timeout must be between 1 and {MAX_TIMEOUT_S:.0f} seconds (a day), got {timeout!r}", EXIT_USAGE, "usage"
        )
    return CheckOptions(
        expect_gpus=expect_gpus if expect_gpus is not None else policy.expect_gpus,
        quick=quick,
        level=1 if quick else _first(level, defaults.level),
        duration_s=_first(duration_s, defaults.duration_s),
        mem_share=_first(mem_share, defaults.mem_share),
        device=device,
        ranks=ranks,
        timeout_s=timeout,
        min_busbw_gbps=busbw_abs,
        # "min-busbw = '90%'": below 90% of the expectation fails; the warn band stays below it.
        busbw_fail_ratio=fail_ratio,
        busbw_warn_ratio=max(defaults.busbw_warn_ratio, fail_ratio),
        ram_per_gpu_gb=_first(ram_per_gpu_gb, policy.ram_per_gpu_gb, defaults.ram_per_gpu_gb),
        allow_mig=_first(allow_mig, policy.allow_mig, defaults.allow_mig),
        expect_model=expect_model if expect_model is not None else policy.expect_model,
        min_shm_bytes=None if policy.min_shm_gb is None else int(policy.min_shm_gb * (1 << 30)),
        collectives=tuple(collectives) if collectives is not None else policy.collectives,
    )


def _first(*values: Any) -> Any:
    return next(v for v in values if v is not None)


def build_report(ctx: Any, results: list[CheckResult], source: str, fail_on: Status, policy: Policy) -> Report:
    from gpudoctor.facts import facts_from_snapshot, measurements_from_checks
    from gpudoctor.snapshot import now_iso

    snapshot = ctx.snapshot
    run = ctx.active_run
    return Report(
        command="check",
        source=source,
        created=now_iso(),
        gpudoctor_version=__version__,
        # A replayed snapshot names the machine it recorded, never this one.
        hostname=snapshot.host.hostname or ("" if source != "live" else socket.gethostname()),
        checks=results,
        fail_on=fail_on,
        nodes=run.report_nodes() if run is not None else [],
        facts=facts_from_snapshot(snapshot),
        measurements=measurements_from_checks([r.to_json() for r in results], run),
        policy=policy.to_json(),
    )


def apply_severity(results: list[CheckResult], policy: Policy) -> list[CheckResult]:
    """The policy's per-code severity: a warn or fail of that code becomes the policy's level, and says so."""
    if not policy.severity:
        return results
    for result in results:
        result.findings = [_override(f, policy) for f in result.findings]
    return results


def _override(f: Finding, policy: Policy) -> Finding:
    level = policy.severity.get(f.code)
    if level is None or f.status not in (Status.WARN, Status.FAIL) or f.status.value == level:
        return f
    evidence = {**f.evidence, "policy_severity": {"was": f.status.value, "policy": str(policy.path)}}
    return dataclasses.replace(f, status=Status(level), evidence=evidence)


def diff_report(
    before: str | Path,
    after: str | Path,
    *,
    tolerance: float | str | None = None,
    fail_on: str | None = None,
    ignore: Sequence[str] = (),
    config: str | Path | None = None,
    use_config: bool = True,
) -> Report:
    """`gpudoctor diff A B`: B compared with A (saved reports or snapshots), as a report."""
    from gpudoctor import api_args as arg
    from gpudoctor import policy as pol
    from gpudoctor.compare import compare, load_side
    from gpudoctor.registry import Selection, SelectionError, load_all
    from gpudoctor.snapshot import now_iso

    arg.path("before", before, required=True)
    arg.path("after", after, required=True)
    _check_tolerance(tolerance)
    arg.text("fail_on", fail_on, ("warn", "fail"))
    ignore = arg.names("ignore", ignore) or ()
    arg.path("config", config)
    arg.flag("use_config", use_config, optional=False)
    policy = pol.load(config, use_config=use_config)
    load_all()
    selection = Selection((), (*policy.ignore, *ignore))
    try:
        selection.validate()
    except SelectionError as exc:
        raise UserError(str(exc), EXIT_USAGE, "usage") from None
    base, cur = load_side(before), load_side(after)
    results = compare(base, cur, _tolerance(tolerance, policy))
    for result in results:
        result.findings = [f for f in result.findings if selection.wants(f.code)]
    if not any(r.findings for r in results):
        raise UserError(
            "no comparison left: --ignore (or the policy's ignore) left out every code", EXIT_USAGE, "usage"
        )
    report = Report(
        command="diff",
        source=f"{before} -> {after}",
        created=now_iso(),
        gpudoctor_version=__version__,
        hostname=(cur.facts or {}).get("hostname", ""),
        checks=[r for r in results if r.findings],
        fail_on=_fail_on(fail_on or policy.fail_on or "fail"),
        facts=cur.facts,
        measurements=cur.measurements,
        policy=policy.to_json(),
    )
    nothing_checked(report.checks, "compared")
    report.checks = apply_severity(report.checks, policy)
    return report
