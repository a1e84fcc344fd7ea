"""The team's policy: what "good" means for its machines, from a TOML file.

Where it comes from (the rule ruff uses for its own configuration, see
tests/reference/config-discovery.md):

- `--config FILE` names it: a `pyproject.toml` is read from its `[tool.gpudoctor]` table, any
  other file from its top level. `--no-config` uses none.
- Otherwise the nearest directory, from the current one up to the filesystem root, that holds a
  `gpudoctor.toml`, or a `pyproject.toml` with a `[tool.gpudoctor]` table, gives it. In one
  directory `gpudoctor.toml` wins. Files are never merged: the nearest one is the policy.

Command-line flags win over the file. Every key is the long option's name where one exists
(`fail-on`, `expect-gpus`, `min-busbw`, ...). A bad file is a usage error (exit 2) that names the
file, the line and the key: an unknown key, a value of the wrong type, an unknown finding code.
Checks never read this file: its values reach them through `CheckOptions` (engine/context.py).
Its keys, their types and bounds are the option table's (engine/options.py).
"""

from __future__ import annotations

import dataclasses
import os
import re
import stat
import sys
from collections.abc import Callable
from dataclasses import field
from pathlib import Path
from typing import Any

from gpudoctor.engine.options import BUSBW, BY_POLICY_KEY
from gpudoctor.engine.values import SEVERITIES, _choice, _number, parse_busbw, reader
from gpudoctor.errors import EXIT_USAGE, UserError, shown
from gpudoctor.records import Record, record
from gpudoctor.safety.user_files import owner_name


def _toml() -> Any:
    """The TOML parser, imported when a file is read (start-up: most runs find no policy file)."""
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover  (3.10: the same parser, from PyPI; declared in pyproject.toml)
        import tomli as tomllib
    return tomllib


DEDICATED = "gpudoctor.toml"
PYPROJECT = "pyproject.toml"
TABLE = ("tool", "gpudoctor")


class PolicyError(UserError):
    """A policy file that cannot be used: one line naming the file, the line and the key."""

    def __init__(self, message: str) -> None:
        super().__init__(message, EXIT_USAGE, "input")


@record
class Policy(Record):
    """What a policy file sets; None (or empty) where it says nothing."""

    path: Path | None = None
    fail_on: str | None = None
    expect_gpus: int | None = None
    expect_model: str | None = None
    min_busbw_gbps: float | None = None  # absolute floor, GB/s
    min_busbw_share: float | None = None  # or a share of the expected busbw (0-1]
    ram_per_gpu_gb: float | None = None
    min_shm_gb: float | None = None
    timeout_s: float | None = None
    allow_mig: bool | None = None
    select: tuple[str, ...] = ()
    ignore: tuple[str, ...] = ()
    tolerance: float | None = None  # baseline comparisons (a fraction)
    collectives: tuple[str, ...] | None = None
    severity: dict[str, str] = field(default_factory=dict)  # code -> "warn" | "fail"
    watch: dict[str, float] = field(default_factory=dict)  # watch.thresholds.Thresholds field -> value
    skipped: tuple[tuple[str, str], ...] = ()  # (path, why) of files discovery did not trust

    def to_json(self) -> dict[str, Any] | None:
        """What the report records: the file and the keys it set, and the files skipped (path null: none used)."""
        if self.path is None and not self.skipped:
            return None
        values = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name in ("path", "skipped") or value is None or value == () or value == {}:
                continue
            values[f.name] = list(value) if isinstance(value, tuple) else value
        out: dict[str, Any] = {"path": None if self.path is None else str(self.path), "set": values}
        if self.skipped:
            out["skipped"] = [{"path": path, "reason": why} for path, why in self.skipped]
        return out


NO_POLICY = Policy()


# ---------------------------------------------------------------------------------------------
# Finding the file, and whether to trust it
#
# A policy decides whether a machine is READY, and gpudoctor runs as root in Slurm prologs. A file
# that someone else could have written must not decide it: discovery walks up into /scratch or a
# /tmp job directory, where any user can plant a gpudoctor.toml. Mercurial skips an hgrc that
# another user owns, with a warning; git refuses to read the config of a repository another user
# owns; sshd refuses an authorized_keys that others can write (tests/reference/policy-trust.md).
#
# Discovery skips, with one line on stderr, a file that is not owned by the caller or root, that
# its group or others can write, or that lies in a world-writable directory, and a file reached
# through a folder or link another user controls (as git's safe.directory: every folder from /
# down, every link and the folders of its target, owned by the caller or root and writable by
# nobody else, sticky folders excepted; `untrusted_path`); the walk goes on as if it were absent.
# Skipping rather than refusing: a refusal would let anyone who can write to /tmp stop every
# gpudoctor run below it. A file named with --config is the user's choice and is used,
# unless every user could have written it (others can write it; or it lies in a world-writable
# directory, or its group can write it, and neither the caller nor root owns it; or a folder on its
# way is writable by every user and not sticky): that is refused.


@record
class Found(Record):
    """What discovery chose (path and text, or None) and the files it skipped, with why."""

    path: Path | None
    text: str
    skipped: tuple[tuple[str, str], ...] = ()


def _distrust(path: Path, st: os.stat_result, *, named: bool) -> str | None:
    """Why this file must not be used as a policy (None: it may); `named`: given with --config."""
    me = os.geteuid()
    ours = st.st_uid in (me, 0)
    world_dirs = [d for d in {path.parent, Path(os.path.realpath(path)).parent} if _world_writable(d)]
    if st.st_mode & stat.S_IWOTH:
        return f"every user can write it (mode {stat.S_IMODE(st.st_mode):04o}; chmod o-w)"
    if named and ours:
        return None
    if world_dirs:
        return f"it lies in the world-writable directory {world_dirs[0]}" + (
            f" and is owned by {owner_name(st.st_uid)}" if not ours else ""
        )
    if st.st_mode & stat.S_IWGRP and (not ours or not named):
        who = f"owned by {owner_name(st.st_uid)}, " if not ours else ""
        return f"{who}its group can write it (mode {stat.S_IMODE(st.st_mode):04o}; chmod g-w)"
    if not ours and not named:
        return f"it is owned by {owner_name(st.st_uid)}, not by you or root"
    return None


def _world_writable(directory: Path) -> bool:
    try:
        return bool(os.stat(directory).st_mode & stat.S_IWOTH)
    except OSError:
        return False


def _read(path: Path, *, named: bool) -> tuple[str | None, str]:
    """(why it is not trusted, or None; its text). The way to the file is judged first (its folders
    and links: `untrusted_path`), then the file that is read."""
    from gpudoctor.safety.user_files import UserFileError, read_text, untrusted_path

    way = untrusted_path(path, None if named else {os.geteuid(), 0})
    if way is not None:
        return way, ""
    try:
        return None, read_text(path, trust=lambda st: _distrust(path, st, named=named))
    except UserFileError as exc:
        if exc.untrusted:
            return str(exc), ""
        raise PolicyError(f"policy file {path}: {exc}") from None


def _has_table(text: str, path: Path) -> bool:
    """A pyproject.toml is a policy when parsing it finds [tool.gpudoctor] (in any TOML spelling).

    Fast path: a file that never writes "gpudoctor" and has no escape (a quoted key may spell it
    with \\u escapes) cannot hold the table. A file that does but does not parse is taken, so that
    its syntax error is reported rather than the policy silently skipped."""
    if "gpudoctor" not in text and "\\" not in text:
        return False
    tomllib = _toml()
    try:
        data = tomllib.loads(text.removeprefix(BOM))
    except (tomllib.TOMLDecodeError, RecursionError):  # RecursionError: nested deeper than tomllib follows
        return "gpudoctor" in text
    tool = data.get("tool")
    return isinstance(tool, dict) and "gpudoctor" in tool


def find(start: Path | None = None) -> Found:
    """The nearest trusted gpudoctor.toml, or pyproject.toml with a [tool.gpudoctor] table, upwards of `start`."""
    try:
        here = (start or Path.cwd()).resolve()
    except OSError:  # the current directory was removed under us
        return Found(None, "")
    skipped: list[tuple[str, str]] = []
    for directory in (here, *here.parents):
        for name in (DEDICATED, PYPROJECT):
            path = directory / name
            if not path.is_file():
                continue
            why, text = _read(path, named=False)
            if why is not None:
                skipped.append((str(path), why))
                continue
            if name == DEDICATED or _has_table(text, path):
                return Found(path, text, tuple(skipped))
    return Found(None, "", tuple(skipped))


def discover(start: Path | None = None) -> Path | None:
    """The policy file discovery would use (see find())."""
    return find(start).path


def load(
    config: str | Path | None = None,
    *,
    use_config: bool = True,
    start: Path | None = None,
    warn: Callable[[str], None] | None = None,
) -> Policy:
    """The policy in force: `config` if given, else the discovered file, else NO_POLICY.

    Each file discovery skipped is one line through `warn` (default: stderr) and is listed in the
    policy's `skipped`, which the report carries."""
    if not use_config:
        return NO_POLICY
    if config is not None:
        path = Path(config)
        why, text = _read(path, named=True)
        if why is not None:
            raise PolicyError(f"policy file {path}: refused: {why}")
        return parse_text(text, path, named=True)
    found = find(start)
    say = warn or _stderr
    for path_text, why in found.skipped:
        say(f"gpudoctor: warning: policy file {path_text} ignored: {why}")
    policy = parse_text(found.text, found.path) if found.path is not None else NO_POLICY
    return dataclasses.replace(policy, skipped=found.skipped) if found.skipped else policy


def _stderr(line: str) -> None:
    try:
        print(line, file=sys.stderr)
    except (OSError, ValueError):
        pass  # no stderr left to say it on


BOM = "\ufeff"  # a UTF-8 byte-order mark, as Windows editors write it: TOML has none, tomllib refuses it


def parse_text(text: str, path: Path, *, named: bool = False) -> Policy:
    text = text.removeprefix(BOM)
    tomllib = _toml()
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        # tomllib says "(at line L, column C)"; keep the file:line form of the other errors.
        message = str(exc)
        match = re.search(r"\(at line (\d+), column \d+\)", message)
        where = f"{path}:{match.group(1)}" if match else str(path)
        raise PolicyError(f"{where}: not valid TOML: {re.sub(r' ?[(]at line .*', '', message)}") from None
    except RecursionError:  # tomllib recurses per nested array or inline table, as json does
        raise PolicyError(f"{path}: not a policy: values nested deeper than the TOML reader follows") from None
    prefix: tuple[str, ...] = ()
    if path.name == PYPROJECT:
        tool = data.get("tool")
        if named and not (isinstance(tool, dict) and "gpudoctor" in tool):
            # Named on purpose, it must hold a policy: a misspelt table would silently gate nothing.
            raise PolicyError(f"{path}: has no [tool.gpudoctor] table (a pyproject.toml policy lives there)")
        table: Any = data
        for part in TABLE:
            table = table.get(part, {}) if isinstance(table, dict) else {}
        if not isinstance(table, dict):
            raise PolicyError(f"{path}:1: tool.gpudoctor must be a table")
        data, prefix = table, TABLE
    return _Reader(path, text, prefix).policy(data)


# ---------------------------------------------------------------------------------------------
# Reading the keys


# key -> (Policy field, reader), from the option table (engine/options.py): the keys are the long
# option names, kebab-case like ruff's. min-busbw sets two fields (an absolute floor or a share).
SCALARS: dict[str, tuple[str, Callable[[Any], Any]]] = {
    key: (opt.policy_field, reader(opt)) for key, opt in BY_POLICY_KEY.items() if opt.kind != BUSBW
}
TABLES = ("severity", "watch")
KEYS = (*BY_POLICY_KEY, *TABLES)


def watch_keys() -> dict[str, tuple[str, type]]:
    """[watch] keys: the fields of watch.thresholds.Thresholds, kebab-case, so they follow that class."""
    from gpudoctor.watch.thresholds import Thresholds  # light: no textual, no NVML

    return {f.name.replace("_", "-"): (f.name, type(f.default)) for f in dataclasses.fields(Thresholds)}


def watch_thresholds(policy: Policy) -> Any:
    """`gpudoctor watch`'s thresholds with the policy's [watch] values applied (the one line to wire)."""
    from gpudoctor.watch.thresholds import DEFAULT

    return dataclasses.replace(DEFAULT, **policy.watch)


class _Reader:
    def __init__(self, path: Path, text: str, prefix: tuple[str, ...]) -> None:
        self.path = path
        self.prefix = prefix
        self.lines = key_lines(text)

    def fail(self, keys: tuple[str, ...], problem: str) -> PolicyError:
        full = (*self.prefix, *keys)
        line = self.lines.get(full) or self.lines.get(full[:-1]) or self.lines.get(self.prefix) or 1
        return PolicyError(f"{self.path}:{line}: {'.'.join(full)}: {problem}")

    def unknown(self, keys: tuple[str, ...], known: list[str]) -> PolicyError:
        import difflib  # only for a misspelt key: not on every run's start-up

        close = difflib.get_close_matches(keys[-1].replace("_", "-"), known, n=1, cutoff=0.6)
        hint = f" (did you mean {close[0]!r}?)" if close else f" (known keys: {', '.join(known)})"
        return self.fail(keys, f"unknown key{hint}")

    def policy(self, data: dict[str, Any]) -> Policy:
        values: dict[str, Any] = {"path": self.path}
        for key, value in data.items():
            if key in SCALARS:
                name, read = SCALARS[key]
                values[name] = self.read((key,), value, read)
            elif key == "min-busbw":
                values["min_busbw_gbps"], values["min_busbw_share"] = self.read((key,), value, parse_busbw)
            elif key == "severity":
                values["severity"] = self.severity(value)
            elif key == "watch":
                values["watch"] = self.watch(value)
            else:
                raise self.unknown((key,), list(KEYS))
        policy = Policy(**values)
        self.check_codes(policy)
        return policy

    def read(self, keys: tuple[str, ...], value: Any, read: Callable[[Any], Any]) -> Any:
        try:
            return read(value)
        except ValueError as exc:
            raise self.fail(keys, str(exc)) from None

    def table(self, key: str, value: Any) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise self.fail((key,), f"expected a table ([{'.'.join((*self.prefix, key))}]), got {shown(value)}")
        return value

    def severity(self, value: Any) -> dict[str, str]:
        out = {}
        for code, level in self.table("severity", value).items():
            out[code.upper()] = self.read(("severity", code), level, _choice(*SEVERITIES))
        return out

    def watch(self, value: Any) -> dict[str, float]:
        from gpudoctor.watch.bounds import MAX_THRESHOLD_S  # light, and only for a [watch] table

        known = watch_keys()
        out: dict[str, float] = {}
        for key, number in self.table("watch", value).items():
            if key not in known:
                raise self.unknown(("watch", key), list(known))
            name, kind = known[key]
            integer = kind is int
            read = _number(0, integer=integer, above=not integer)
            value_read = self.read(("watch", key), number, read)
            if name.endswith("_share") and value_read > 1:
                raise self.fail(("watch", key), f"a share is at most 1, got {shown(number)}")
            if "s" in name.split("_") and value_read > MAX_THRESHOLD_S:  # window_s, hang_min_s_steps: seconds
                raise self.fail(("watch", key), f"at most {MAX_THRESHOLD_S:.0f} s (a day), got {shown(number)}")
            out[name] = value_read
        return out

    def check_codes(self, policy: Policy) -> None:
        """Codes and check names must exist: a typo would silently select or ignore nothing."""
        from gpudoctor.catalogue import catalogue
        from gpudoctor.engine.selection import Selection, SelectionError

        reg = catalogue()
        for key, tokens in (("select", policy.select), ("ignore", policy.ignore)):
            for token in tokens:
                try:
                    Selection((token,), registry=reg).validate()
                except SelectionError as exc:
                    raise self.fail((key,), str(exc)) from None
        for code in policy.severity:
            if code not in reg.codes:
                what = "a check name" if code.lower() in reg.checks else "an unknown finding code"
                raise self.fail(("severity", code), f"{what}: severity keys are finding codes like GD503")


# ---------------------------------------------------------------------------------------------
# Lines of keys, for error messages (tomllib gives values, not positions)

_HEADER_RE = re.compile(r"^\s*\[(?!\[)\s*([^\]]+?)\s*\]")
_KEY_RE = re.compile(r"""^\s*((?:"[^"]*"|'[^']*'|[A-Za-z0-9_-]+)(?:\s*\.\s*(?:"[^"]*"|'[^']*'|[A-Za-z0-9_-]+))*)\s*=""")
_PART_RE = re.compile(r"""\s*("[^"]*"|'[^']*'|[A-Za-z0-9_-]+)\s*""")


def _parts(dotted: str) -> tuple[str, ...]:
    return tuple(m.group(1).strip("\"'") for m in _PART_RE.finditer(dotted) if m.group(1))


def key_lines(text: str) -> dict[tuple[str, ...], int]:
    """(table..., key) -> the line that defines it, for the simple TOML a policy is written in.

    Headers and `key =` lines at the start of a line are found; a key inside a multi-line string
    or array is not (the error then names the table's line)."""
    out: dict[tuple[str, ...], int] = {}
    table: tuple[str, ...] = ()
    open_string = ""  # the delimiter of a multi-line string we are inside
    for number, line in enumerate(text.splitlines(), start=1):
        if open_string:
            if line.count(open_string) % 2:
                open_string = ""
            continue
        header = _HEADER_RE.match(line)
        key = None if header else _KEY_RE.match(line)
        if header:
            table = _parts(header.group(1))
            out.setdefault(table, number)
        elif key:
            out.setdefault((*table, *_parts(key.group(1))), number)
        open_string = next((d for d in ('"""', "'''") if line.count(d) % 2), "")
    return out
