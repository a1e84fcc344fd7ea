"""One side of a comparison: a saved `check --json` report or a snapshot, read into a Side.

Reports of every schema version up to this gpudoctor's are read; a report without `facts`
(written by gpudoctor 0.1.0) is compared on what it holds. A newer schema is refused, as is a
report whose `facts` or `measurements` are not the shape the report schema gives them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpudoctor.errors import EXIT_USAGE, UserError, shown
from gpudoctor.findings import REPORT_SCHEMA_VERSION
from gpudoctor.knowledge.facts import facts_from_snapshot, measurements_from_checks

if TYPE_CHECKING:
    from gpudoctor.snapshot import Snapshot

# Report schema versions this gpudoctor reads (CHANGELOG.md).
READABLE_REPORT_VERSIONS = range(1, REPORT_SCHEMA_VERSION + 1)
MEASURED = ("allreduce", "ddp", "p2p")  # the report's measurements this comparison reads


@dataclass(frozen=True)
class Side:
    """One side of a comparison: what a report or snapshot says about its machine and run."""

    label: str
    kind: str  # "report" or "snapshot"
    facts: dict[str, Any] | None
    measurements: dict[str, Any]
    written_by: str = ""  # the gpudoctor version that wrote it, when known


def _refuse(path: str, why: str) -> UserError:
    return UserError(f"cannot compare with {path}: {why}", EXIT_USAGE, "input")


def load_side(path: str | Path) -> Side:
    """A saved report or snapshot, refused in one line when it is neither or too new."""
    from gpudoctor.safety.user_files import UserFileError, read_json

    if path == "-":
        raise _refuse("-", "a saved report or snapshot is read from a file (only `check --snapshot -` reads stdin)")
    try:
        data = read_json(path)
    except UserFileError as exc:
        raise _refuse(str(path), str(exc)) from None
    return side_from_json(data, str(path))


def side_from_json(data: Any, label: str) -> Side:
    return read_side(data, label)[0]


def read_side(data: Any, label: str) -> tuple[Side, Snapshot | None]:
    """The side a document is, and the snapshot it was read from when it is one (the fleet command
    builds a node's facts from it: knowledge/node_record.py)."""
    if not isinstance(data, dict):
        raise _refuse(label, "not a gpudoctor report or snapshot (the top level is not an object)")
    if "command" in data or "checks" in data:
        return _report_side(data, label), None
    if "gpus" in data:
        from gpudoctor import snapshot as snap

        try:
            snapshot = snap.from_jsonable(data)
        except snap.SnapshotError as exc:
            raise _refuse(label, f"a snapshot that cannot be read: {exc}") from None
        return Side(label, "snapshot", facts_from_snapshot(snapshot), {}, snapshot.software.gpudoctor), snapshot
    raise _refuse(label, "not a gpudoctor report (`check --json`) or snapshot (`gpudoctor snapshot`)")


def _version_words(version: int) -> str:
    """A schema_version as a refusal quotes it: a 400-digit number is not printed whole."""
    digits = str(abs(version))
    return str(version) if len(digits) <= 12 else f"{str(version)[:7]}... ({len(digits)} digits)"


def _report_side(data: dict[str, Any], label: str) -> Side:
    version = data.get("schema_version")
    if not isinstance(version, int) or isinstance(version, bool):
        raise _refuse(label, "a report without a schema_version")
    if version not in READABLE_REPORT_VERSIONS:
        newest = READABLE_REPORT_VERSIONS[-1]
        quoted = _version_words(version)
        if version > newest:
            raise _refuse(
                label,
                f"report schema_version {quoted} is newer than this gpudoctor reads ({newest}): upgrade gpudoctor",
            )
        raise _refuse(label, f"report schema_version {quoted} is not one gpudoctor ever wrote")
    if "checks" not in data and isinstance(data.get("error"), dict):
        why = data["error"].get("message", "")
        why = why if isinstance(why, str) and len(why) <= 200 else shown(why, 200)
        raise _refuse(label, f"the error document of a run that did not finish ({why})")
    command = data.get("command")
    if command != "check" or not isinstance(data.get("checks"), list):
        what = f"`gpudoctor {command}`" if isinstance(command, str) and len(command) <= 20 else shown(command)
        raise _refuse(label, f"a {what} document; only `check` reports and snapshots compare")
    facts = data.get("facts")
    _check_shape(label, "facts", facts)
    if isinstance(facts, dict) and isinstance(facts.get("gpus"), list):
        from gpudoctor.snapshot import gpus_problem

        gpus = [g for g in facts["gpus"] if isinstance(g, dict)]
        why = gpus_problem([g.get("index") for g in gpus], [g.get("uuid") for g in gpus if g.get("uuid")])
        if why is not None:
            raise _refuse(label, f"its `facts` cannot be one machine's: {why}")
    if "measurements" in data:
        _check_shape(label, "measurements", data["measurements"])
        # Those this gpudoctor compares; one a newer gpudoctor added is left out, not refused.
        measurements = {k: v for k, v in data["measurements"].items() if k in MEASURED}
    else:  # a schema 1 report from gpudoctor 0.1.0: recover them from its checks
        measurements = measurements_from_checks(data["checks"])
        _check_shape(label, "measurements", measurements, "the measurements in its checks")
    return Side(label, "report", facts, measurements, str(data.get("gpudoctor_version", "")))


def _check_shape(label: str, block: str, value: Any, words: str = "") -> None:
    """Refuse a report block that is not the schema's shape: the comparison reads only well-formed ones.

    A report is a file users keep and may edit or generate; its `facts` and `measurements` are
    held to the shipped report schema (json_shape.py) before anything is compared, so a wrong
    type is one line (exit 2) before a run, never a crash after it."""
    from gpudoctor.safety.json_shape import problem
    from gpudoctor.schemas import report_schema

    schema = report_schema()
    found = problem(value, schema["properties"][block], schema, block)
    if found:
        raise _refuse(label, f"{words or f'its `{block}`'} are not what gpudoctor writes ({found})")
