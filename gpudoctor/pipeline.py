"""The check pipeline: arguments and policy -> options -> the registry's run -> the report.

What `gpudoctor check`, `gpudoctor diff` and the Python API (gpudoctor/api.py) share: the level a
run is at, the options it runs with (argument, then policy, then the table's default), the report
it builds, the policy's severities applied, and "nothing was checked" as a usage error.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpudoctor.errors import EXIT_USAGE, UserError
from gpudoctor.findings import CheckResult, Finding, Report, Status
from gpudoctor.version import __version__

if TYPE_CHECKING:
    from gpudoctor.engine.context import CheckOptions
    from gpudoctor.engine.runner import SharedRuns
    from gpudoctor.engine.selection import Selection
    from gpudoctor.policy import Policy
    from gpudoctor.snapshot import Snapshot, Software


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


def fail_on_status(value: str) -> Status:
    if value not in ("warn", "fail"):
        raise UserError(f"fail_on must be 'warn' or 'fail', got {value!r}", EXIT_USAGE, "usage")
    return Status(value)


def tolerance(value: float | str | None, policy: Policy) -> float:
    """The baseline comparison's tolerance: the argument, then the policy's, then 10%."""
    from gpudoctor.engine.values import parse_share

    if value is None:
        if policy.tolerance is not None:
            return policy.tolerance
        from gpudoctor.compare.rules import DEFAULT_TOLERANCE  # only then: compare/ is not start-up's

        return DEFAULT_TOLERANCE
    try:
        return parse_share(value, "--tolerance")
    except ValueError as exc:
        raise UserError(str(exc), EXIT_USAGE, "usage") from None


def load_snapshot(snapshot: str | Path | Snapshot | None) -> tuple[Snapshot, str]:
    """The snapshot to check and where it came from: this machine (probed), a file, standard input."""
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


def training_python(python: str | Path | None, level: int) -> Software | None:
    """--python PATH: validated (an interpreter the ranks can run in) and its software stack, which
    replaces this process's in the snapshot; None without it."""
    if python is None:
        return None
    if level < 2:
        raise UserError(
            "--python runs the active checks' ranks in that interpreter: not with --quick or --snapshot (level 1)",
            EXIT_USAGE,
            "usage",
        )
    from gpudoctor.probe.interpreter import software_of

    return software_of(os.path.abspath(python))  # absolute, not resolved: a venv's python is a link


def check_options(policy: Policy, level: int, args: Mapping[str, Any]) -> CheckOptions:
    """CheckOptions from the arguments (the option table's names), then the policy, then the
    defaults: the one place they meet. The timeout's bound is checked here, on the merged value,
    with one message whether the argument or the policy gave it."""
    from gpudoctor.engine.context import CheckOptions
    from gpudoctor.engine.options import MAX_TIMEOUT_S, option
    from gpudoctor.engine.values import parse_busbw

    defaults = CheckOptions()

    def merged(name: str) -> Any:
        value = args.get(name)
        if value is None and option(name).policy:
            value = getattr(policy, option(name).policy_field)
        return value if value is not None else getattr(defaults, name)

    if args.get("min_busbw") is not None:
        try:
            busbw_abs, busbw_share = parse_busbw(args["min_busbw"])
        except ValueError as exc:
            raise UserError(f"--min-busbw: {exc}", EXIT_USAGE, "usage") from None
    else:
        busbw_abs, busbw_share = policy.min_busbw_gbps, policy.min_busbw_share
    fail_ratio = busbw_share if busbw_share is not None else defaults.busbw_fail_ratio
    timeout = merged("timeout_s")
    if not 1 <= timeout <= MAX_TIMEOUT_S:  # NaN fails both
        raise UserError(
            f"timeout must be between 1 and {MAX_TIMEOUT_S:.0f} seconds (a day), got {timeout!r}", EXIT_USAGE, "usage"
        )
    return CheckOptions(
        expect_gpus=merged("expect_gpus"),
        quick=level == 1,
        level=level,
        duration_s=merged("duration_s"),
        mem_share=merged("mem_share"),
        device=merged("device"),
        ranks=args.get("ranks"),
        python=None if args.get("python") is None else os.path.abspath(args["python"]),
        timeout_s=timeout,
        min_busbw_gbps=busbw_abs,
        # "min-busbw = '90%'": below 90% of the expectation fails; the warn band stays below it.
        busbw_fail_ratio=fail_ratio,
        busbw_warn_ratio=max(defaults.busbw_warn_ratio, fail_ratio),
        ram_per_gpu_gb=merged("ram_per_gpu_gb"),
        allow_mig=merged("allow_mig"),
        expect_model=merged("expect_model"),
        min_shm_bytes=None if policy.min_shm_gb is None else int(policy.min_shm_gb * (1 << 30)),
        collectives=merged("collectives"),
    )


def check(args: Mapping[str, Any], policy: Policy, progress: Callable[[str], None] | None = None) -> Report:
    """`gpudoctor check`: validated arguments (the option table's names) and the policy in force
    -> the report. Everything that can be refused is refused before any work."""
    from gpudoctor.catalogue import catalogue
    from gpudoctor.engine.context import CheckContext
    from gpudoctor.engine.runner import SharedRuns, run_checks
    from gpudoctor.engine.selection import Selection, SelectionError

    registry = catalogue()
    selection = Selection(
        tuple(args.get("select") or ()) or policy.select, (*policy.ignore, *(args.get("ignore") or ()))
    )
    selection = selection.using(registry)
    try:
        selection.validate()
    except SelectionError as exc:
        raise UserError(str(exc), EXIT_USAGE, "usage") from None
    device = args.get("device") or "auto"
    if args.get("ranks") is not None and device != "cpu":
        raise UserError("--ranks needs --device cpu (on GPUs there is one rank per visible GPU)", EXIT_USAGE, "usage")
    status_on = fail_on_status(args.get("fail_on") or policy.fail_on or "fail")
    # --tolerance checked now (a bad value is refused before any work); its default only with a baseline
    tol = (
        tolerance(args.get("tolerance"), policy)
        if args.get("baseline") is not None or args.get("tolerance") is not None
        else 0.0
    )
    base = None
    if args.get("baseline") is not None:  # read before any work: a bad baseline must not cost an active run
        from gpudoctor.compare.sides import load_side

        base = load_side(args["baseline"])
    snapshot = args.get("snapshot")
    chosen = check_level(
        args.get("level"), bool(args.get("quick")), snapshot is not None, args.get("duration_s"), args.get("mem_share")
    )
    if chosen >= 2:  # ranks will start: a fault spec or launcher variable they cannot read is a usage error now
        from gpudoctor.launch import check_launcher_env
        from gpudoctor.launch.faults import check_env

        check_env()
        check_launcher_env()
    options = check_options(policy, chosen, args)
    software = training_python(args.get("python"), chosen)  # refused before the probe, like any usage error
    snap_obj, source = load_snapshot(snapshot)
    if software is not None:  # judge the stack the ranks will run in, not the one gpudoctor runs in
        snap_obj = dataclasses.replace(snap_obj, software=software)
    selection, overridden = driver_not_ignored(selection, policy, args, snap_obj, options.device)
    ctx = CheckContext(snap_obj, options, progress=progress or (lambda message: None))
    runs = SharedRuns(registry.runs)
    results = run_checks(registry, ctx, selection, runs=runs)
    if overridden:
        results = [_say_overridden(r, overridden, policy) for r in results]
    report = build_report(ctx, results, runs, source, status_on, policy)
    if base is not None:
        from gpudoctor.compare.rules import compare
        from gpudoctor.compare.sides import Side

        this = Side("this run", "report", report.facts, report.measurements, __version__)
        for result in compare(base, this, tol):
            result.findings = [f for f in result.findings if selection.wants(f.code)]
            if result.findings:
                report.checks.append(result)
    if not report.checks:
        # A gate that checked nothing must not say READY.
        above = [c for c in registry.checks.values() if c.level > chosen and selection.wants_check(c)]
        names = ", ".join(c.name for c in above)
        why = f" ({names} run at --level {max(c.level for c in above)}; this run is level {chosen})" if above else ""
        raise UserError(f"no check ran: --select/--ignore left nothing to run{why}", EXIT_USAGE, "usage")
    nothing_checked(report.checks, "checked")
    report.checks = apply_severity(report.checks, policy)
    return report


DRIVER_CODE = "GD101"  # no NVIDIA driver: without it every GPU check skips


def driver_not_ignored(
    selection: Selection, policy: Policy, args: Mapping[str, Any], snapshot: Snapshot, device: str
) -> tuple[Selection, tuple[str, ...]]:
    """A policy file (found upwards, perhaps not the user's) never hides a missing driver: its
    `ignore = ["GD1"]` would turn a node without a driver into READY, every GPU check a quiet skip.
    The policy's tokens that hide GD101 are set aside for this run (returned, to be said in the
    finding); an --ignore typed on the command line is the user's own word and stays."""
    from gpudoctor.engine.selection import Selection

    if snapshot.driver.nvml_status == "ok" or device == "cpu" or not policy.ignore:
        return selection, ()
    hides = [t for t in policy.ignore if Selection((), (t,), selection.registry).ignores(DRIVER_CODE)]
    if not hides:
        return selection, ()
    kept = tuple(t for t in policy.ignore if t not in hides)
    rebuilt = Selection(selection.select, (*kept, *(args.get("ignore") or ()))).using(selection.registry)
    return (selection, ()) if rebuilt.ignores(DRIVER_CODE) else (rebuilt, tuple(hides))


def _say_overridden(result: CheckResult, tokens: tuple[str, ...], policy: Policy) -> CheckResult:
    said = ", ".join(tokens)
    for i, f in enumerate(result.findings):
        if f.code == DRIVER_CODE and f.status is not Status.PASS:
            evidence = {**f.evidence, "policy_ignore_set_aside": list(tokens), "policy": str(policy.path)}
            message = f"{f.message} (shown although the policy ignores {said}: without a driver no GPU was checked)"
            result.findings[i] = dataclasses.replace(f, message=message, evidence=evidence)
    return result


def build_report(
    ctx: Any, results: list[CheckResult], runs: SharedRuns, source: str, fail_on: Status, policy: Policy
) -> Report:
    from gpudoctor.knowledge.facts import facts_from_snapshot, measurements_from_checks
    from gpudoctor.snapshot import now_iso

    snapshot = ctx.snapshot
    run = runs.started.get("active")  # the active checks' launch: the node rows and the measurements
    return Report(
        command="check",
        source=source,
        created=now_iso(),
        gpudoctor_version=__version__,
        # A replayed snapshot names the machine it recorded, never this one.
        hostname=snapshot.host.hostname or ("" if source != "live" else _hostname()),
        checks=results,
        fail_on=fail_on,
        nodes=run.report_nodes() if run is not None else [],
        facts=facts_from_snapshot(snapshot),
        measurements=measurements_from_checks([r.to_json() for r in results], run),
        policy=policy.to_json(),
    )


def _hostname() -> str:
    import socket  # a live probe only: start-up of `check --snapshot` does without it

    return socket.gethostname()


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


def diff(before: str | Path, after: str | Path, args: Mapping[str, Any], policy: Policy) -> Report:
    """`gpudoctor diff A B`: B compared with A (saved reports or snapshots), as a report."""
    from gpudoctor.catalogue import catalogue
    from gpudoctor.compare.rules import compare
    from gpudoctor.compare.sides import load_side
    from gpudoctor.engine.selection import Selection, SelectionError
    from gpudoctor.snapshot import now_iso

    selection = Selection((), (*policy.ignore, *(args.get("ignore") or ())), registry=catalogue())
    try:
        selection.validate()
    except SelectionError as exc:
        raise UserError(str(exc), EXIT_USAGE, "usage") from None
    base, cur = load_side(before), load_side(after)
    results = compare(base, cur, tolerance(args.get("tolerance"), policy))
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
        fail_on=fail_on_status(args.get("fail_on") or policy.fail_on or "fail"),
        facts=cur.facts,
        measurements=cur.measurements,
        policy=policy.to_json(),
    )
    nothing_checked(report.checks, "compared")
    report.checks = apply_severity(report.checks, policy)
    return report


def fleet(paths: list[str], baseline: str | Path | None, args: Mapping[str, Any], policy: Policy) -> Report:
    """`gpudoctor fleet PATH...`: every node of the saved files judged at once (gpudoctor/fleet.py)."""
    from gpudoctor import fleet as fl
    from gpudoctor.catalogue import catalogue
    from gpudoctor.compare.sides import load_side
    from gpudoctor.engine.selection import Selection, SelectionError
    from gpudoctor.snapshot import now_iso

    registry = catalogue()
    selection = Selection((), (*policy.ignore, *(args.get("ignore") or ())), registry=registry)
    try:
        selection.validate()
    except SelectionError as exc:
        raise UserError(str(exc), EXIT_USAGE, "usage") from None
    if "-" in paths:
        raise UserError(
            "fleet -: the nodes' snapshots or reports are read from files or directories "
            "(only `check --snapshot -` reads stdin)",
            EXIT_USAGE,
            "usage",
        )
    base = load_side(baseline) if baseline is not None else None
    named = list(dict.fromkeys(paths))  # as the header says them: a path named twice once
    files, problems = fl.fleet_files(paths)
    files, repeated = fl.distinct(files)
    nodes = []
    for path, follow in files:
        try:
            nodes.append(fl.load_node(path, follow))
        except UserError as exc:  # one line for this file; the others are still judged
            problems.append((path, str(exc).removeprefix(f"cannot compare with {path}: ")))
    results = fl.judge(nodes, problems, set(registry.codes), base, tolerance(args.get("tolerance"), policy), repeated)
    for result in results:
        result.findings = [f for f in result.findings if selection.wants(f.code)]
    report = Report(
        command="fleet",
        source=f"{len(files)} file(s): {', '.join(named[:3])}{' ...' if len(named) > 3 else ''}",
        created=now_iso(),
        gpudoctor_version=__version__,
        hostname="",
        checks=[r for r in results if r.findings],
        fail_on=fail_on_status(args.get("fail_on") or policy.fail_on or "fail"),
        policy=policy.to_json(),
    )
    nothing_checked(report.checks, "compared")
    report.checks = apply_severity(report.checks, policy)
    return report
