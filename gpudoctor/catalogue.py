"""Every finding code gpudoctor gives, and its words: `gpudoctor explain CODE` (or a check
name: its codes), `gpudoctor list-checks` and the docs/checks/ pages (one text, three places).

`catalogue()` is the checks' registry with the codes raised outside a check run: the baseline
comparison (GD011-GD019, which `check --baseline` runs, so --select takes them), the verdicts of
`gpudoctor watch` (GD9xx), of `gpudoctor bench scaling` and the rules of `gpudoctor lint`
(GD750-GD799), which `check --select` does not take.
Retired codes (engine/codes.py RETIRED) are still explained, as removed.

It is built from a table (gpudoctor/catalogue_table.py: every check and code with its module,
generated from the modules by scripts/gen_catalogue.py; a test keeps the two in step), so that
`check --quick`, `list-checks` and `explain` import no check module they do not run or explain:
a check's module is imported when the check first runs (or its `wanted` is asked), a code's texts
(what/why/fix) when first read. `assembled()` builds the same registry by importing every module.

docs/checks/GDxxx.md is generated from the same text (`python scripts/gen_check_docs.py`);
a test keeps the two in step.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from importlib import import_module
from typing import Any

from gpudoctor.catalogue_table import CHECKS, CODES, RUNS, SELECTABLE
from gpudoctor.engine.codes import CHECK_CRASHED, Code
from gpudoctor.engine.registry import LEVELS, RUNNER, Check, Registry, checks_in

# Owners of codes raised outside a check run, and the module whose CODES lists them.
OWNERS = {
    "baseline": "gpudoctor.compare.codes",
    "watch": "gpudoctor.watch.codes",
    "bench scaling": "gpudoctor.checks.active.scaling",
    "lint": "gpudoctor.lint.codes",
}


@cache
def catalogue() -> Registry:
    """The checks of `gpudoctor check` and every code any command gives, by owner (from the table)."""
    codes = {row[0]: TableCode(*row[:3], module=row[4]) for row in CODES if row[0] != CHECK_CRASHED.code}
    checks = [
        _deferred(name, title, module, level, needs, shares, wanted, tuple(codes[c] for c in ids))
        for name, title, module, level, needs, shares, wanted, ids in CHECKS
    ]
    by_owner: dict[str, list[Code]] = {owner: [] for owner in OWNERS}
    for code, _, _, owner, _ in CODES:
        if owner in by_owner:
            by_owner[owner].append(codes[code])
    runs = {name: _starter(target) for name, target in RUNS.items()}
    return Registry(checks, by_owner, runs=runs, selectable=SELECTABLE)


def assembled() -> Registry:
    """The same registry built by importing every module that declares checks or codes: what the
    table is generated from (scripts/gen_catalogue.py) and checked against."""
    from gpudoctor import checks

    base = checks.registry()
    owned = {owner: import_module(module).CODES for owner, module in OWNERS.items()}
    return Registry(base.checks.values(), owned, runs=base.runs, selectable={"baseline"})


class TableCode(Code):
    """A code as the table names it (code, name, title), standing for the Code its module declares:
    its texts are read from that module, imported on first use. Equal to that Code."""

    def __init__(self, code: str, name: str, title: str, *, module: str) -> None:
        self.__dict__.update(code=code, name=name, title=title, module=module)

    def declared(self) -> Code:
        return _declared(self.module)[self.code]

    what = property(lambda self: self.declared().what)  # type: ignore[assignment]
    why = property(lambda self: self.declared().why)  # type: ignore[assignment]
    fix = property(lambda self: self.declared().fix)  # type: ignore[assignment]

    def __eq__(self, other: object) -> bool:
        return self.declared() == (other.declared() if isinstance(other, TableCode) else other)

    def __hash__(self) -> int:  # as the Code it equals
        return hash(self.declared())

    def __repr__(self) -> str:
        return repr(self.declared())


@cache
def _declared(module: str) -> dict[str, Code]:
    """The codes a module declares: those of its checks and those it lists in CODES."""
    mod = import_module(module)
    out = {c.code: c for chk in checks_in(mod) for c in chk.codes}
    out.update((c.code, c) for c in getattr(mod, "CODES", ()))
    return out


@cache
def _real(module: str, name: str) -> Check:
    return next(c for c in checks_in(import_module(module)) if c.name == name)


class _DeferredRun:
    """A check's function, imported on first use. `resolve` lets the runner import it before its clock
    starts, so a check's duration is its own work, not its module's import."""

    def __init__(self, module: str, name: str) -> None:
        self.module, self.name = module, name

    def resolve(self) -> Callable[[Any], Any]:
        return _real(self.module, self.name).func

    def __call__(self, ctx: Any) -> Any:
        return self.resolve()(ctx)


def _deferred(
    name: str,
    title: str,
    module: str,
    level: int,
    needs: str,
    shares: str,
    wanted: bool,
    codes: tuple[Code, ...],
) -> Check:
    """The check as the table declares it; its function (and `wanted`) import its module when called."""
    run = _DeferredRun(module, name)

    def wants(options: Any) -> bool:
        real = _real(module, name).wanted
        return real is None or real(options)

    return Check(name, title, codes, run, level >= 2, needs, wants if wanted else None, level, shares)


def _starter(target: str) -> Callable[[Any], Any]:
    module, function = target.split(":")

    def start(ctx: Any) -> Any:
        return getattr(import_module(module), function)(ctx)

    return start


def _raised_by(code: str) -> dict[str, Any]:
    """Who raises `code`: a check (static, active or deep), the check runner itself, the
    comparison with a baseline, or another command (watch's verdicts)."""
    reg = catalogue()
    owner = reg.owner[code]
    chk = reg.checks.get(owner)
    if chk is not None:
        return {"check": owner, "kind": LEVELS[chk.level], "level": chk.level, "selectable": True}
    if owner == RUNNER:  # the check runner's own codes (GD001): never filtered out
        return {"check": RUNNER, "kind": "runner", "level": None, "selectable": False}
    return {"check": owner, "kind": owner, "level": None, "selectable": owner not in reg.outside}


def code_rows() -> list[dict[str, Any]]:
    """Every finding code, sorted by code, with who raises it and its title."""
    codes = catalogue().codes
    rows = []
    for code in sorted(codes):
        info = codes[code]
        by = _raised_by(code)
        rows.append(
            {
                "code": code,
                "name": info.name,
                "check": by["check"],
                "kind": by["kind"],
                "active": by["kind"] in ("active", "deep"),
                "level": by["level"],
                "selectable": by["selectable"],
                "title": info.title,
            }
        )
    return rows


def explain_doc(code: str) -> dict[str, Any] | None:
    """`explain CODE --json`: the code's texts and who raises it, or None for an unknown code."""
    info = catalogue().codes.get(code)
    if info is None:
        return _retired_doc(code)
    by = _raised_by(code)
    return {
        "schema_version": 1,
        "command": "explain",
        "code": info.code,
        "name": info.name,
        "title": info.title,
        "raised_by": by["check"],
        "kind": by["kind"],
        "level": by["level"],
        "selectable": by["selectable"],
        "what": info.what,
        "why": info.why,
        "fix": info.fix,
    }


def _raised_line(code: str) -> str:
    by = _raised_by(code)
    select = f"Select or ignore it with `--select {code}` / `--ignore {code}`."
    if by["kind"] == "runner":
        return "Raised by `gpudoctor check` itself, for any check; --select and --ignore never hide it."
    if by["kind"] == "baseline":
        return f"Raised by `gpudoctor check --baseline FILE` and `gpudoctor diff A B`. {select}"
    if by["check"] == "lint":
        return (
            "Raised by `gpudoctor lint` on a training script, before it runs; `gpudoctor lint --select` and "
            "`--ignore` choose its rules (`gpudoctor check --select` does not take them)."
        )
    if not by["selectable"]:
        also = " (and `gpudoctor report` on its recordings)" if by["check"] == "watch" else ""
        return f"Raised by `gpudoctor {by['check']}`{also}; `gpudoctor check --select` does not take it."
    kind = {
        "static": "static",
        "active": "active: runs a workload, skipped by --quick",
        "deep": "deep: runs under sustained load, only with `--level 3`",
    }[by["kind"]]
    return f"Raised by check `{by['check']}` ({kind}). {select}"


def explain_text(code: str) -> str | None:
    info = catalogue().codes.get(code)
    if info is None:
        return _retired_text(code)
    return (
        f"# {info.code} {info.name}: {info.title}\n\n"
        f"{_raised_line(code)}\n\n"
        f"## What it checks\n\n{info.what}\n\n"
        f"## Why it matters\n\n{info.why}\n\n"
        f"## How to fix it\n\n{info.fix}\n"
    )


def _retired_doc(code: str) -> dict[str, Any] | None:
    gone = catalogue().retired.get(code)
    if gone is None:
        return None
    return {
        "schema_version": 1,
        "command": "explain",
        "code": gone.code,
        "name": gone.name,
        "title": gone.title,
        "raised_by": None,
        "kind": "retired",
        "level": None,
        "selectable": False,
        "removed_in": gone.removed_in,
        "why": gone.why,
        "replaced_by": list(gone.replaced_by),
    }


def _retired_text(code: str) -> str | None:
    gone = catalogue().retired.get(code)
    if gone is None:
        return None
    see = f" Its findings are now {', '.join(gone.replaced_by)}." if gone.replaced_by else ""
    return (
        f"# {gone.code} {gone.name}: {gone.title}\n\n"
        f"Retired in gpudoctor {gone.removed_in}: gpudoctor no longer gives this code, and never will give it "
        f"to anything else.{see}\n\n## Why it was removed\n\n{gone.why}\n"
    )


def owner_doc(name: str) -> dict[str, Any] | None:
    """`explain topology`: a check (or another owner of codes: `watch`, `baseline`) and its codes,
    for the names `--select` takes beside codes; None for a name that owns no code."""
    reg = catalogue()
    codes = sorted(c for c, owner in reg.owner.items() if owner == name)
    if not codes:
        return None
    chk = reg.checks.get(name)
    by = _raised_by(codes[0])
    return {
        "schema_version": 1,
        "command": "explain",
        "check": name,
        "title": chk.title if chk is not None else None,
        "kind": by["kind"],
        "level": by["level"],
        "selectable": by["selectable"],
        "codes": [{"code": c, "name": reg.codes[c].name, "title": reg.codes[c].title} for c in codes],
    }


def owner_text(name: str) -> str | None:
    doc = owner_doc(name)
    if doc is None:
        return None
    codes = doc["codes"]
    if doc["kind"] in ("static", "active", "deep"):
        kind = _raised_line(codes[0]["code"]).split("(", 1)[1].split(")", 1)[0]  # "static", "active: ..."
        how = f"Check `{name}` ({kind}). `--select {name}` / `--ignore {name}` take all its codes at once."
    else:  # the runner, the baseline comparison, another command: its sentence without the per-code advice
        how = _raised_line(codes[0]["code"]).split(" Select or ignore it", 1)[0]
        if doc["selectable"] and doc["kind"] != "runner":
            how += " Select or ignore them by code (`--select CODE`) or prefix."
    head = f"# {name}: {doc['title']}" if doc["title"] else f"# {name}"
    rows = "".join(f"- {c['code']} {c['name']}: {c['title']}\n" for c in codes)
    more = "`gpudoctor explain CODE` says what each checks, why it matters and how to fix it."
    return f"{head}\n\n{how}\n\n## Its codes\n\n{rows}\n{more}\n"
