"""The check registry: an object built from the modules that declare checks and codes.

A check module declares its codes and marks its function; marking changes nothing global:

    CODES = [Code("GD401", "nvlink-missing", what=..., why=..., fix=...)]

    @check("topology", "NVLink/PCIe topology", codes=CODES)
    def topology(ctx: CheckContext) -> list[Finding]: ...

The package that owns the checks builds the registry from its modules, in display order
(`gpudoctor.checks.registry()`); codes raised outside `gpudoctor check` (watch verdicts, baseline
comparisons) are added by whoever assembles the catalogue (`gpudoctor.catalogue`). The framework
names none of them.

A static check reads only `ctx.snapshot` (and `ctx.visible`). An active check (`active=True`)
runs a workload and is skipped by `--quick`; checks that share one launch name it (`shares=`)
and the runner hands it to them (engine/runner.py).

Levels (`check --level N`, docs/deep-checks.md): 1 the static checks (`--quick`), 2 adds the
active checks, 3 adds the deep checks under sustained load (`level=3`). A check runs when its
level is at most the one asked for.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping
from types import ModuleType
from typing import TYPE_CHECKING, Any

from gpudoctor.engine.codes import CHECK_CRASHED, RETIRED, Code, Retired
from gpudoctor.records import Record, record

if TYPE_CHECKING:
    from gpudoctor.engine.context import CheckContext, CheckOptions

NEEDS = ("", "gpus", "visible")
LEVELS = {1: "static", 2: "active", 3: "deep"}
RUNNER = "check"  # the owner of the runner's own codes (GD001)
_MARK = "__gpudoctor_check__"

# A shared run's starter: called once per check run, by the runner, when the first check that
# shares the run needs it; it plans from the whole run (ctx.planned), never from the caller.
Starter = Callable[["CheckContext"], Any]


@record
class Check(Record):
    name: str
    title: str
    codes: tuple[Code, ...]
    func: Callable[[CheckContext], Any]
    active: bool = False  # runs a workload: skipped by --quick
    # What the check needs before it can say anything: "" (nothing), "gpus" (a working
    # driver and at least one GPU), "visible" (and at least one GPU the run will see).
    # Without it the runner gives one `skip` finding instead of running the check.
    needs: str = ""
    # Runs only when the options ask for it (e.g. a policy's expect-model); otherwise it is not
    # part of the run at all, rather than a check that passes having looked at nothing.
    wanted: Callable[[CheckOptions], bool] | None = None
    level: int = 1  # 1 static, 2 active, 3 deep (under load); runs when <= --level
    shares: str = ""  # the shared run (one launch for several checks) it reads: "" none

    @property
    def code_ids(self) -> tuple[str, ...]:
        return tuple(c.code for c in self.codes)


def check(
    name: str,
    title: str,
    codes: Iterable[Code],
    *,
    active: bool = False,
    needs: str = "",
    wanted: Callable[[CheckOptions], bool] | None = None,
    level: int | None = None,
    shares: str = "",
) -> Callable[[Callable[[CheckContext], Any]], Callable[[CheckContext], Any]]:
    """Mark a function as a check (see the module's docstring); `Registry` collects the marks."""
    codes = tuple(codes)
    if needs not in NEEDS:
        raise ValueError(f"check {name!r}: needs must be one of {NEEDS}")
    level = level if level is not None else (2 if active else 1)
    if level not in LEVELS or (level >= 2) != active:
        raise ValueError(f"check {name!r}: level {level} (levels 2 and 3 run workloads: active=True)")

    def mark(func: Callable[[CheckContext], Any]) -> Callable[[CheckContext], Any]:
        setattr(func, _MARK, Check(name, title, codes, func, active, needs, wanted, level, shares))
        return func

    return mark


def checks_in(module: ModuleType) -> list[Check]:
    """The checks a module defines (not those it imports), in the order it defines them."""
    out = []
    for value in vars(module).values():
        chk = getattr(value, _MARK, None)
        if isinstance(chk, Check) and getattr(value, "__module__", None) == module.__name__:
            out.append(chk)
    return out


class Registry:
    """Checks in display order, every code with its owner, and the starters of shared runs.

    `codes` adds codes that `gpudoctor check` does not raise by running a check, by owner
    ("watch", "baseline", ...); owners in `selectable` may still be named by --select/--ignore
    (the baseline comparison runs inside `check --baseline`), the others may not."""

    def __init__(
        self,
        checks: Iterable[Check] = (),
        codes: Mapping[str, Iterable[Code]] | None = None,
        *,
        runs: Mapping[str, Starter] | None = None,
        selectable: Collection[str] = (),
        retired: Iterable[Retired] = RETIRED,
    ) -> None:
        self.checks: dict[str, Check] = {}
        self.codes: dict[str, Code] = {}
        self.owner: dict[str, str] = {}
        self.retired: dict[str, Retired] = {r.code: r for r in retired}
        self.runs: dict[str, Starter] = dict(runs or {})
        self._add(RUNNER, [CHECK_CRASHED])
        for chk in checks:
            if chk.name in self.checks:
                raise ValueError(f"check {chk.name!r} registered twice")
            if chk.shares and chk.shares not in self.runs:
                raise ValueError(f"check {chk.name!r} shares the run {chk.shares!r}, which nothing starts")
            self._add(chk.name, chk.codes)
            self.checks[chk.name] = chk
        self.outside: set[str] = set()  # owners whose codes `check` never gives
        for owner, declared in (codes or {}).items():
            self._add(owner, declared)
            if owner not in selectable:
                self.outside.add(owner)

    def _add(self, owner: str, codes: Iterable[Code]) -> None:
        for c in codes:
            if c.code in self.codes:
                raise ValueError(f"finding code {c.code} registered twice")
            if c.code in self.retired:
                raise ValueError(f"finding code {c.code} was retired ({self.retired[c.code].name}): never reuse it")
            self.codes[c.code] = c
            self.owner[c.code] = owner

    @classmethod
    def from_modules(cls, modules: Iterable[ModuleType], **kwargs: Any) -> Registry:
        return cls([chk for module in modules for chk in checks_in(module)], **kwargs)

    def selected(self, options: CheckOptions, wants: Callable[[Check], bool]) -> list[Check]:
        """The checks a run with these options runs, in display order."""
        top = 1 if options.quick else options.level
        return [
            c for c in self.checks.values() if wants(c) and c.level <= top and (c.wanted is None or c.wanted(options))
        ]
