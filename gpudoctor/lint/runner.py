"""Lint files: find them, read them safely, parse them (never run them), group them into
programs, run the rules, and turn what the rules say into findings and a report.

A file that cannot be read or parsed is one GD799 finding and the others are still linted; a
path that does not exist, or a directory with no Python file, is a usage error (exit 2).
"""

from __future__ import annotations

import ast
import os
import stat
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from gpudoctor.errors import EXIT_USAGE, UserError
from gpudoctor.findings import CheckResult, Finding, Report, Status
from gpudoctor.lint import rules_data, rules_launch, rules_model, rules_state
from gpudoctor.lint.codes import BY_CODE, BY_NAME, ERROR, INFO, UNREADABLE, WARNING
from gpudoctor.lint.context import AUTO, LAUNCHERS, Context, Facts, Hit, file_facts
from gpudoctor.lint.programs import programs
from gpudoctor.lint.source import Source
from gpudoctor.safety.safe_io import InputFileError, read_bytes, read_stdin_bytes
from gpudoctor.safety.safe_text import printable

# A training script is kilobytes (torch's largest source file is 1.3 MiB); past this: generated
# code, a log, a wrong path, and minutes of analysis.
MAX_BYTES = 2 << 20
STDIN = "-"
STDIN_NAME = "<stdin>"
# Directories never walked into: ruff's default excludes (https://docs.astral.sh/ruff/settings/#exclude),
# and any hidden one.
SKIP_DIRS = {
    "__pycache__",
    "__pypackages__",
    "_build",
    "buck-out",
    "build",
    "dist",
    "node_modules",
    "site-packages",
    "venv",
}

RULES: tuple[Callable[[Context], list[Hit]], ...] = (
    rules_launch.master_port,
    rules_launch.world_size,
    rules_launch.spawn_under_torchrun,
    rules_launch.global_rank_device,
    rules_data.no_distributed_sampler,
    rules_data.set_epoch_missing,
    rules_data.random_split_no_generator,
    rules_state.unguarded_rank_write,
    rules_state.load_no_map_location,
    rules_model.ddp_no_device_ids,
    rules_model.accumulation_without_no_sync,
    rules_model.clip_before_unscale,
    rules_model.data_parallel,
    rules_model.batchnorm_without_sync,
)
_STATUS = {ERROR: Status.FAIL, WARNING: Status.WARN, INFO: Status.PASS}


@dataclass
class Script:
    path: str  # as shown: the path given or found, "<stdin>" for standard input
    source: Source | None = None
    problem: Hit | None = None  # why it could not be linted (GD799)
    hits: list[Hit] = field(default_factory=list)
    seconds: float = 0.0
    launcher: str = ""  # what the script showed about its launcher ("" nothing)


# ---- which files ------------------------------------------------------------------------------


def collect(paths: Sequence[str]) -> list[str]:
    """The files to lint: files as named, directories walked for *.py (sorted, links found in them not
    followed, to files or directories); each file once. A missing path is a usage error."""
    if not paths:
        raise UserError("name the scripts or directories to lint (or - for standard input)", EXIT_USAGE, "usage")
    out: list[str] = []
    for path in paths:
        if path == STDIN:
            out.append(STDIN)
            continue
        try:
            st = os.stat(path)
        except FileNotFoundError:
            raise UserError(f"{printable(path)}: no such file or directory", EXIT_USAGE, "input") from None
        except OSError as exc:
            raise UserError(f"{printable(path)}: {exc.strerror}", EXIT_USAGE, "input") from None
        if not stat.S_ISDIR(st.st_mode):
            out.append(path)
            continue
        links: list[str] = []
        found = sorted(_walk(path, links))
        if not found:
            count = "a link to a .py file" if len(links) == 1 else f"{len(links)} links to .py files"
            why = f" ({count} not followed: name a file to lint it)" if links else ""
            raise UserError(f"{printable(path)}: no Python files in this directory{why}", EXIT_USAGE, "input")
        out += found
    return list(dict.fromkeys(out))  # each file once, in the order named


def _walk(top: str, links: list[str]) -> Iterable[str]:
    """The *.py files under `top`; the links found (to files: not followed) go to `links`."""
    for root, dirs, files in os.walk(top, onerror=None, followlinks=False):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in SKIP_DIRS)
        for name in files:
            path = os.path.join(root, name)
            if name.endswith(".py"):
                if os.path.islink(path):
                    links.append(path)
                else:
                    yield path


# ---- reading and parsing ------------------------------------------------------------------------


def load(path: str, follow: bool = True) -> Script:
    """Read and parse one file; a file that cannot be is a Script with its GD799 problem. `follow=False`
    for a file found in a folder: it was no link when walked, and one put there since is not read."""
    shown = STDIN_NAME if path == STDIN else path
    try:
        data = read_stdin_bytes(MAX_BYTES) if path == STDIN else read_bytes(path, MAX_BYTES, follow)
    except InputFileError as exc:
        return Script(shown, problem=_unreadable(f"cannot be read: {exc.strerror or exc}"))
    except IsADirectoryError:
        return Script(shown, problem=_unreadable("cannot be read: is a directory"))
    except OSError as exc:
        return Script(shown, problem=_unreadable(f"cannot be read: {exc.strerror or exc}"))
    try:
        tree = ast.parse(data, filename=shown)
    except SyntaxError as exc:
        line = exc.lineno or 1
        return Script(shown, problem=_unreadable(f"does not parse: {type(exc).__name__}: {exc.msg}", line))
    except (ValueError, RecursionError, MemoryError) as exc:
        why = str(exc) or "nested too deeply for Python's parser"  # a MemoryError says nothing of itself
        return Script(shown, problem=_unreadable(f"does not parse: {type(exc).__name__}: {why}"))
    try:
        return Script(shown, source=Source(shown, tree))
    except RecursionError:
        return Script(shown, problem=_unreadable("is nested too deeply to analyse"))


def _unreadable(message: str, line: int = 1) -> Hit:
    return Hit(UNREADABLE.name, line, f"this file {message}; no rule looked at it")


# ---- linting ---------------------------------------------------------------------------------


def lint_scripts(scripts: list[Script], launcher: str = AUTO) -> list[Script]:
    """Run every rule on every parsed script, with the facts of its program."""
    if launcher not in LAUNCHERS:
        raise UserError(f"unknown launcher {launcher!r} (one of {', '.join(LAUNCHERS)})", EXIT_USAGE, "usage")
    parsed = [s for s in scripts if s.source is not None]
    own: dict[str, Facts] = {}
    for s in parsed:
        assert s.source is not None
        try:
            own[s.path] = file_facts(s.source)
        except RecursionError:
            s.problem, s.source = _unreadable("is nested too deeply to analyse"), None
    parsed = [s for s in parsed if s.source is not None]
    groups = programs({s.path: s.source for s in parsed if s.source is not None})
    for s in parsed:
        assert s.source is not None
        merged = Facts()
        for member in groups[s.path]:
            merged = merged | own[member]
        ctx = Context(s.source, own[s.path], merged, launcher)
        s.launcher = _launcher_shown(ctx)
        start = time.perf_counter()
        try:
            for rule in RULES:
                s.hits += rule(ctx)
        except RecursionError:
            s.hits, s.problem = [], _unreadable("is nested too deeply to analyse")
        s.seconds = time.perf_counter() - start
    return scripts


def _launcher_shown(ctx: Context) -> str:
    """What the file was judged under, for the report's details: the launcher named, or what
    the script showed."""
    if ctx.launcher != AUTO:
        return ctx.launcher
    if ctx.torchrun:
        return f"torchrun ({ctx.torchrun})"
    return "spawn (mp.spawn)" if ctx.own.spawns else "unknown"


def to_finding(path: str, hit: Hit) -> Finding:
    rule = BY_NAME[hit.rule]
    severity = hit.severity or rule.severity
    evidence = {"rule": rule.name, "severity": severity, "file": path, "line": hit.line}
    if hit.related:
        evidence["related_lines"] = list(hit.related)
    evidence.update(hit.evidence)
    # a file that could not be linted proved nothing: an error, as a check that crashed
    status = Status.ERROR if rule.code is UNREADABLE else _STATUS[severity]
    return Finding(rule.code.code, status, f"{path}:{hit.line}", hit.message, hit.hint or rule.hint, evidence)


def findings_of(script: Script, wanted: Callable[[str], bool]) -> list[Finding]:
    hits = [script.problem] if script.problem is not None else []
    hits += sorted(script.hits, key=lambda h: (h.line, BY_NAME[h.rule].code.code))
    out = [to_finding(script.path, h) for h in hits]
    return [f for f in out if f.code == UNREADABLE.code or wanted(f.code)]


def selection(select: Iterable[str] = (), ignore: Iterable[str] = ()) -> Callable[[str], bool]:
    """What --select/--ignore keep: tokens are codes (GD750), prefixes (GD75) or rule names."""
    chosen, dropped = _codes(select, "--select"), _codes(ignore, "--ignore")

    def wanted(code: str) -> bool:
        return (not chosen or code in chosen) and code not in dropped

    return wanted


def _codes(tokens: Iterable[str], option: str) -> set[str]:
    out: set[str] = set()
    for token in tokens:
        token = token.strip()
        if token.lower() in BY_NAME:
            out.add(BY_NAME[token.lower()].code.code)
            continue
        matching = {c for c in BY_CODE if token.upper().startswith("GD") and c.startswith(token.upper())}
        if not matching:
            raise UserError(
                f"{option} {printable(token)!r}: not a lint code or rule (GD750-GD799; see docs/lint.md)",
                EXIT_USAGE,
                "usage",
            )
        out |= matching
    return out


def lint_paths(
    paths: Sequence[str | os.PathLike[str]],
    launcher: str = AUTO,
    select: Iterable[str] = (),
    ignore: Iterable[str] = (),
) -> list[Finding]:
    """Lint scripts and directories (never running them); the findings, file by file.

    `launcher`: "torchrun" or "spawn" when the caller knows how the scripts are run (`gpudoctor
    watch -- torchrun ...` does), "auto" to infer it from each script. Raises UserError for a path
    that does not exist or an unknown launcher, code or rule.
    """
    wanted = selection(select, ignore)
    named = [os.fspath(p) for p in paths]
    followed = set(named)  # a link named is the user's own choice; the files found in a folder are not followed
    scripts = lint_scripts([load(p, follow=p in followed) for p in collect(named)], launcher)
    return [f for s in scripts for f in findings_of(s, wanted)]


def lint_report(
    paths: Sequence[str],
    launcher: str = AUTO,
    fail_on: Status = Status.FAIL,
    select: Iterable[str] = (),
    ignore: Iterable[str] = (),
    files: Sequence[str] | None = None,
) -> Report:
    """The report of `gpudoctor lint`: one result per file, in the order linted (`files`: what
    `collect(paths)` already gave)."""
    from gpudoctor.snapshot import now_iso
    from gpudoctor.version import __version__

    wanted = selection(select, ignore)
    named = set(paths)  # followed if a link; the files found in a folder are not
    scripts = lint_scripts([load(p, follow=p in named) for p in (collect(paths) if files is None else files)], launcher)
    results = [
        CheckResult(
            name=s.path,
            title=s.path,
            findings=findings_of(s, wanted),
            duration_s=s.seconds,
            details={"launcher": s.launcher or "unknown"},
        )
        for s in scripts
    ]
    return Report("lint", " ".join(paths), now_iso(), __version__, "", results, fail_on=fail_on)
