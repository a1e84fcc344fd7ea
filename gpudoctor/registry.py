"""The check registry: registered checks, their finding codes, selection and running.

A check module declares its codes and registers its function:

    CODES = [Code("GD401", "nvlink-missing", what=..., why=..., fix=...)]

    @check("topology", "NVLink/PCIe topology", codes=CODES)
    def topology(ctx: CheckContext) -> list[Finding]: ...

A static check reads only `ctx.snapshot` (and `ctx.visible`). An active check
(`active=True`) runs a workload and is skipped by `--quick`.

Levels (`check --level N`, docs/deep-checks.md): 1 the static checks (`--quick`), 2 adds the
active checks, 3 adds the deep checks under sustained load (`level=3`). A check runs when its
level is at most the one asked for.
"""

from __future__ import annotations

import dataclasses
import importlib
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any

from gpudoctor.findings import CheckResult, Finding, Status
from gpudoctor.snapshot import Snapshot

if TYPE_CHECKING:
    from gpudoctor.launch import LaunchResult
    from gpudoctor.visibility import Visibility

CODE_RE = re.compile(r"^GD\d{3}$")

# Modules that declare finding codes raised outside `gpudoctor check` (watch, bench scaling verdicts).
CODE_MODULES = ["gpudoctor.watch.codes", "gpudoctor.compare", "gpudoctor.checks.scaling"]
# Owners of codes that `gpudoctor check` never gives (list-checks and explain say so; --select refuses them).
NOT_IN_CHECK = frozenset({"watch", "bench scaling"})

# Modules under gpudoctor/checks/, in the order their results are shown.
CHECK_MODULES = [
    "nvml",
    "torch_install",
    "driver_stack",
    "lost_gpus",
    "visibility",
    "expected",
    "launch_port",
    "identity",
    "topology",
    "link_errors",
    "health",
    "gpu_modes",
    "nccl_env",
    "nccl_tuning",
    "memory",
    "host_resources",
    "network",
    "allreduce",
    "collectives",
    "ddp",
    "link_probes",
    "deep_load",
    "deep_sdc",
    "deep_memory",
    "deep_links",
    "nodes",
]


@dataclass(frozen=True)
class Code:
    code: str  # GD + three digits; the hundreds digit is the area (DESIGN.md)
    name: str  # kebab-case slug, e.g. "nvlink-fewer-links"
    title: str  # one line: what the finding is about
    what: str  # what the check looks at
    why: str  # why it matters for a multi-GPU run
    fix: str  # how to fix it

    def __post_init__(self) -> None:
        if not CODE_RE.match(self.code):
            raise ValueError(f"bad finding code {self.code!r}")


@dataclass(frozen=True)
class Check:
    name: str
    title: str
    codes: tuple[Code, ...]
    func: Callable[[CheckContext], Any]
    active: bool = False  # runs a workload: skipped by --quick
    # What the check needs before it can say anything: "" (nothing), "gpus" (a working
    # driver and at least one GPU), "visible" (and at least one GPU the run will see).
    # Without it the registry gives one `skip` finding instead of running the check.
    needs: str = ""
    # Runs only when the options ask for it (e.g. a policy's expect-model); otherwise it is not
    # part of the run at all, rather than a check that passes having looked at nothing.
    wanted: Callable[[CheckOptions], bool] | None = None
    level: int = 1  # 1 static, 2 active, 3 deep (under load); runs when <= --level

    @property
    def code_ids(self) -> tuple[str, ...]:
        return tuple(c.code for c in self.codes)


CHECKS: dict[str, Check] = {}
CODES: dict[str, Code] = {}
CODE_OWNER: dict[str, str] = {}  # code -> check name

# gpudoctor's own codes (area 0).
CHECK_CRASHED = Code(
    "GD001",
    "check-crashed",
    "A check could not run to the end",
    what="Every check runs inside a guard; when one raises, its exception becomes this finding "
    "and the other checks still run.",
    why="A check that crashed proved nothing, so gpudoctor treats it like a failure when gating "
    "(exit code 1 under the default --fail-on fail).",
    fix="Read the message and evidence (the exception and where it was raised). If the machine is "
    "healthy this is a gpudoctor bug: report it with `gpudoctor snapshot` output attached.",
)
CODES[CHECK_CRASHED.code] = CHECK_CRASHED
CODE_OWNER[CHECK_CRASHED.code] = "check"


NEEDS = ("", "gpus", "visible")
LEVELS = {1: "static", 2: "active", 3: "deep"}
DEFAULT_LEVEL = 2  # `check` without --level or --quick: static and active checks


def check(
    name: str,
    title: str,
    codes: Iterable[Code],
    *,
    active: bool = False,
    needs: str = "",
    wanted: Callable[[CheckOptions], bool] | None = None,
    level: int | None = None,
) -> Callable[[Callable[[CheckContext], Any]], Callable[[CheckContext], Any]]:
    codes = tuple(codes)
    if needs not in NEEDS:
        raise ValueError(f"check {name!r}: needs must be one of {NEEDS}")
    level = level if level is not None else (2 if active else 1)
    if level not in LEVELS or (level >= 2) != active:
        raise ValueError(f"check {name!r}: level {level} (levels 2 and 3 run workloads: active=True)")

    def register(func: Callable[[CheckContext], Any]) -> Callable[[CheckContext], Any]:
        if name in CHECKS:
            raise ValueError(f"check {name!r} registered twice")
        for c in codes:
            if c.code in CODES:
                raise ValueError(f"finding code {c.code} registered twice")
            CODES[c.code] = c
            CODE_OWNER[c.code] = name
        CHECKS[name] = Check(name, title, codes, func, active, needs, wanted, level)
        return func

    return register


def register_codes(owner: str, codes: Iterable[Code]) -> None:
    """Declare codes raised outside the check run, e.g. by `gpudoctor watch` (owner "watch")."""
    for c in codes:
        if c.code in CODES:
            raise ValueError(f"finding code {c.code} registered twice")
        CODES[c.code] = c
        CODE_OWNER[c.code] = owner


def load_all() -> None:
    """Import every check module so its checks and codes register (idempotent)."""
    for module in CHECK_MODULES:
        importlib.import_module(f"gpudoctor.checks.{module}")
    for module in CODE_MODULES:
        importlib.import_module(module)


# The longest --timeout (and policy timeout) accepted: a day. Ranks turn the deadline into OS
# timers and torch's C++ timeouts, which overflow (OverflowError: "C int", "time_t") long before
# 1e308; a workload start that needs more than a day is a setup that will not start at all.
# cli.py repeats the number in its option type (start-up: it does not import this module).
MAX_TIMEOUT_S = 86400.0


@dataclass
class CheckOptions:
    expect_gpus: int | None = None
    quick: bool = False  # skip checks that run workloads (level 1)
    device: str = "auto"  # "auto", "cuda" or "cpu" for workloads
    ranks: int | None = None  # CPU ranks for --device cpu
    timeout_s: float = 120.0  # the whole of the active checks (at most MAX_TIMEOUT_S)
    min_busbw_gbps: float | None = None
    busbw_warn_ratio: float = 0.8  # measured/expected below this: warn
    busbw_fail_ratio: float = 0.5  # below this: fail
    ram_per_gpu_gb: float = 16.0
    allow_mig: bool = False
    # From a policy (policy.py); None: the check's own default.
    expect_model: str | None = None  # every visible GPU's name contains this (GD010)
    min_shm_bytes: int | None = None  # /dev/shm wanted (GD510's shm_wanted otherwise)
    collectives: tuple[str, ...] | None = None  # the collectives `check` judges (issue 12)
    level: int = DEFAULT_LEVEL  # run the checks of this level and below (`quick` means 1)
    duration_s: float = 60.0  # how long level 3's load tests run
    mem_share: float = 0.8  # share of free GPU memory level 3's memory test writes and verifies


@dataclass
class CheckContext:
    snapshot: Snapshot
    options: CheckOptions = field(default_factory=CheckOptions)
    progress: Callable[[str], None] = lambda message: None  # active checks report here
    # The one launch the active checks share (all-reduce and DDP in one process group): set by
    # the first of them to run (checks/active_common.py); the report's node rows come from it.
    active_run: LaunchResult | None = None
    # Launches other checks share, by name (the deep checks' one run: checks/deep_common.py).
    runs: dict[str, Any] = field(default_factory=dict)
    # The names of the checks this run will run (set by run_checks), so a shared launch starts
    # only the workloads of selected checks.
    planned: tuple[str, ...] = ()
    # Whether a code's findings reach the report (--select/--ignore; set by run_checks), so a skip
    # never sends the reader to a finding the selection hid.
    shown: Callable[[str], bool] = lambda code: True

    @cached_property
    def visible(self) -> Visibility:
        """The GPUs the run will use, in CUDA order (CUDA_VISIBLE_DEVICES resolved)."""
        from gpudoctor.visibility import resolve  # lazy: keeps imports acyclic

        return resolve(self.snapshot)


class SelectionError(ValueError):
    pass


@dataclass(frozen=True)
class Selection:
    """--select / --ignore: codes (GD401), code prefixes (GD4) or check names."""

    select: tuple[str, ...] = ()
    ignore: tuple[str, ...] = ()

    def validate(self) -> None:
        for token in self.select + self.ignore:
            if token in CHECKS:
                continue
            matching = [c for c in CODES if token.upper().startswith("GD") and c.startswith(token.upper())]
            if any(CODE_OWNER[c] not in NOT_IN_CHECK for c in matching):
                continue
            if matching:  # only codes another command raises (watch verdicts)
                owner = CODE_OWNER[matching[0]]
                raise SelectionError(f"{token!r} names `gpudoctor {owner}` codes, which `check` never gives")
            raise SelectionError(f"unknown check or code {token!r} (see `gpudoctor list-checks`)")

    @staticmethod
    def _matches(token: str, code: str) -> bool:
        if token in CHECKS:
            return CODE_OWNER.get(code) == token
        return code.startswith(token.upper())

    def wants(self, code: str) -> bool:
        if code == CHECK_CRASHED.code:
            return True
        if self.select and not any(self._matches(t, code) for t in self.select):
            return False
        return not any(self._matches(t, code) for t in self.ignore)

    def ignores(self, code: str) -> bool:
        return any(self._matches(t, code) for t in self.ignore)

    def wants_check(self, chk: Check) -> bool:
        return any(self.wants(c) for c in chk.code_ids)


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
    if not chk.needs:
        return None
    snap = ctx.snapshot
    code = chk.codes[0].code
    if snap.driver.nvml_status != "ok" or not snap.gpus:
        why = _see(ctx, "nvml", "GD101")
        evidence = {"nvml_status": snap.driver.nvml_status, "see": "GD101"}
        return Finding(code, Status.SKIP, "host", f"no GPUs to check: {why}", evidence=evidence)
    if chk.needs == "visible" and not ctx.visible.gpus:
        raw = snap.env.get("CUDA_VISIBLE_DEVICES")
        why = _see(ctx, "visibility", "GD201")
        evidence = {"CUDA_VISIBLE_DEVICES": raw, "see": "GD201"}
        return Finding(code, Status.SKIP, "host", f"no visible GPUs to check: {why}", evidence=evidence)
    return None


def _see(ctx: CheckContext, check_name: str, code: str) -> str:
    """'see GD101', or, when --select/--ignore hides GD101, its own sentence: 'no NVIDIA driver: the
    NVIDIA kernel module is not loaded (GD101, not shown)'."""
    if ctx.shown(code) or check_name not in CHECKS:
        return f"see {code}"
    said = [f.message for f in findings_of(ctx, check_name, code) if f.status is not Status.PASS]
    return f"{said[0]} ({code}, not shown)" if said else f"see {code}"


def findings_of(ctx: CheckContext, check_name: str, code: str) -> list[Finding]:
    """What check `check_name` says under `code` (run for a finding the selection hid)."""
    out = CHECKS[check_name].func(ctx)
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
        out = [skipped] if skipped else chk.func(ctx)
        if isinstance(out, tuple):
            findings, details = out
        else:
            findings = out
        findings = shown_findings(findings, selection)
    except Exception as exc:  # noqa: BLE001  (a crashing check is a result, not an abort)
        findings = [crashed(chk, exc)]
    return CheckResult(chk.name, chk.title, list(findings), time.perf_counter() - start, details)


def max_level(options: CheckOptions) -> int:
    return 1 if options.quick else options.level


def selected(options: CheckOptions, selection: Selection = Selection()) -> list[Check]:
    """The checks a run with these options and this selection runs, in order."""
    load_all()
    chosen = [
        c
        for c in CHECKS.values()
        if selection.wants_check(c) and c.level <= max_level(options) and (c.wanted is None or c.wanted(options))
    ]
    # CHECK_MODULES' order, whichever module was imported first (a test may import one early).
    order = {f"gpudoctor.checks.{m}": i for i, m in enumerate(CHECK_MODULES)}
    return sorted(chosen, key=lambda c: order.get(c.func.__module__, len(order)))


def run_checks(
    ctx: CheckContext, selection: Selection = Selection(), *, on_start: Callable[[Check], None] | None = None
) -> list[CheckResult]:
    results = []
    chosen = selected(ctx.options, selection)
    ctx.planned = tuple(c.name for c in chosen)
    ctx.shown = selection.wants
    for chk in chosen:
        if on_start is not None:
            on_start(chk)
        results.append(run_one(chk, ctx, selection))
    results += hidden_causes(ctx, results, selection)
    return results


# What an unmet need's skip points at, and the lost GPU (GD827) that a GPU check leaves out.
CAUSE_OWNER = {"GD101": "nvml", "GD201": "visibility", "GD827": "lost_gpus"}


def hidden_causes(ctx: CheckContext, results: list[CheckResult], selection: Selection) -> list[CheckResult]:
    """The failures the selection hid that decide what the selected checks could judge: when every
    selected check skipped for one (`--select GD801` on a machine without a driver: GD101), and a
    GPU the run would use that is lost (GD827), which every GPU check leaves out (`--select GD801`
    on a node with a GPU off the bus would pass on the others). Shown, the run is NOT READY (exit
    1) rather than "nothing was checked" (exit 2) or READY. A code --ignore names stays hidden."""
    judged = any(f.status is not Status.SKIP for r in results for f in r.findings)
    seen = [] if judged else [f.evidence.get("see") for r in results for f in r.findings if f.status is Status.SKIP]
    gpu_checks = any(CHECKS[r.name].needs for r in results if r.name in CHECKS)
    if gpu_checks and ctx.snapshot.gpus and ctx.visible.lost_wanted:
        seen.append("GD827")
    out = []
    for code in dict.fromkeys(c for c in seen if c in CAUSE_OWNER and not ctx.shown(c)):
        owner = CHECKS.get(CAUSE_OWNER[code])
        if owner is None or selection.ignores(code):
            continue
        failed = [f for f in findings_of(ctx, owner.name, code) if f.status in (Status.FAIL, Status.ERROR)]
        if failed:
            out.append(CheckResult(owner.name, owner.title, failed, 0.0))
            for r in results:  # the skips now point at the failure shown below them
                r.findings = [_see_shown(f, code) for f in r.findings]
    return out


def _see_shown(f: Finding, code: str) -> Finding:
    if f.status is not Status.SKIP or f.evidence.get("see") != code:
        return f
    return dataclasses.replace(f, message=f"{f.message.split(': ', 1)[0]}: see {code}")
