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

import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpudoctor.engine import options as _options
from gpudoctor.findings import Finding, Report

if TYPE_CHECKING:
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
KEYWORDS = _options.KEYWORDS
_SWITCHES = {o.flag for o in _options.OPTIONS if o.kind == _options.FLAG}
_LISTS = {o.flag for o in _options.OPTIONS if o.kind in (_options.NAMES, _options.COLLECTIVES)}
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
    python: str | Path | None = None,
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
    python: the interpreter the ranks run in (the training environment's), validated first.
    baseline: a saved `check --json` report or a snapshot to compare with (GD011-GD019),
    `tolerance` (default 10%, "10%" or 0.1) for its measured regressions.
    Every other argument left as None takes the policy's value, then gpudoctor's default.
    """
    from gpudoctor import pipeline
    from gpudoctor import policy as pol
    from gpudoctor.engine import arguments as arg
    from gpudoctor.engine.options import OPTIONS
    from gpudoctor.snapshot import Snapshot

    given = dict(locals())
    # Every argument checked before any work, with the option table's kinds and bounds (the same
    # table the command line's click types are made from).
    args: dict[str, Any] = {}
    for opt in OPTIONS:
        if opt.name not in given:  # policy-only keys (min-shm)
            continue
        value = given[opt.name]
        args[opt.name] = value if isinstance(value, Snapshot) else arg.validate(opt, value)
    arg.flag("use_config", use_config, optional=False)
    arg.callable_or_none("progress", progress)
    policy = pol.load(config, use_config=use_config)
    return pipeline.check(args, policy, progress)


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
    from gpudoctor import pipeline
    from gpudoctor.engine import arguments as arg

    arg.path("before", before, required=True)
    arg.path("after", after, required=True)
    args, policy = _comparison_args(tolerance, fail_on, ignore, config, use_config)
    return pipeline.diff(before, after, args, policy)


def _comparison_args(
    tolerance: float | str | None,
    fail_on: str | None,
    ignore: Sequence[str],
    config: str | Path | None,
    use_config: bool,
) -> tuple[dict[str, Any], Any]:
    """The keywords `diff` and `fleet` share, validated as the option table says, and the policy."""
    from gpudoctor import policy as pol
    from gpudoctor.engine import arguments as arg
    from gpudoctor.engine.options import option

    args = {
        name: arg.validate(option(name), value)
        for name, value in (("tolerance", tolerance), ("fail_on", fail_on), ("ignore", ignore), ("config", config))
    }
    arg.flag("use_config", use_config, optional=False)
    policy = pol.load(config, use_config=use_config)
    return args, policy


def fleet_report(
    paths: Sequence[str | Path],
    *,
    baseline: str | Path | None = None,
    tolerance: float | str | None = None,
    fail_on: str | None = None,
    ignore: Sequence[str] = (),
    config: str | Path | None = None,
    use_config: bool = True,
) -> Report:
    """`gpudoctor fleet PATH...`: the nodes of many saved snapshots or reports (files or
    directories of them) judged at once: the odd node out per fact, low busbw against the median,
    and with `baseline` every node's regressions against it, as a report."""
    from gpudoctor import pipeline
    from gpudoctor.engine import arguments as arg

    if isinstance(paths, str | Path) or not paths:
        raise arg.ArgumentTypeError(f"paths must be a list of file or directory names, got {paths!r:.60}")
    for path in paths:
        arg.path("paths", path, required=True)
    if baseline is not None:
        arg.path("baseline", baseline, required=True)
    args, policy = _comparison_args(tolerance, fail_on, ignore, config, use_config)
    return pipeline.fleet([str(p) for p in paths], baseline, args, policy)
