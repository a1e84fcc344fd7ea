"""The snapshot decoder (built once per type) against the reflective decoder it replaced, kept
here verbatim as the oracle: on every snapshot under tests/fixtures and on fuzzed bad inputs it
must give exactly the same objects (types included) or exactly the same error text."""

from __future__ import annotations

import copy
import dataclasses
import functools
import json
import random
import types
import typing
from pathlib import Path
from typing import Any, Union

import pytest

from gpudoctor import snapshot as snap
from tests.paths import FIXTURES


def _old_decode(tp: Any, data: Any, where: str) -> Any:
    """gpudoctor/snapshot.py's `_decode` before issue 22, unchanged."""
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        options = typing.get_args(tp)
        if isinstance(data, dict) and "missing" in data and snap.Missing in options:
            reason = data["missing"]
            if reason not in snap.MISSING_REASONS:
                raise snap.SnapshotError(f"{where}: unknown missing reason {reason!r}")
            return snap.Missing(reason, str(data.get("detail", "")))
        if data is None and type(None) in options:
            return None
        errors = []
        for option in options:
            if option in (snap.Missing, type(None)):
                continue
            try:
                return _old_decode(option, data, where)
            except snap.SnapshotError as exc:
                errors.append(str(exc))
        raise snap.SnapshotError(errors[0] if errors else f"{where}: unexpected {data!r}")
    if origin is list:
        if not isinstance(data, list):
            raise snap.SnapshotError(f"{where}: expected a list")
        (item,) = typing.get_args(tp)
        return [_old_decode(item, v, f"{where}[{i}]") for i, v in enumerate(data)]
    if origin is dict:
        if not isinstance(data, dict):
            raise snap.SnapshotError(f"{where}: expected an object")
        _, item = typing.get_args(tp)
        return {str(k): _old_decode(item, v, f"{where}.{k}") for k, v in data.items()}
    if dataclasses.is_dataclass(tp):
        return _old_decode_dataclass(tp, data, where)
    if tp is float:
        if isinstance(data, int | float) and not isinstance(data, bool):
            return float(data)
        raise snap.SnapshotError(f"{where}: expected a number, got {data!r}")
    if tp is int:
        if isinstance(data, int) and not isinstance(data, bool):
            return data
        raise snap.SnapshotError(f"{where}: expected an integer, got {data!r}")
    if tp in (str, bool):
        if isinstance(data, tp):
            return data
        raise snap.SnapshotError(f"{where}: expected {tp.__name__}, got {data!r}")
    if tp is Any:
        return data
    raise snap.SnapshotError(f"{where}: cannot decode type {tp!r}")


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _old_decode_dataclass(cls: type, data: Any, where: str) -> Any:
    if not isinstance(data, dict):
        raise snap.SnapshotError(f"{where}: expected an object")
    hints = _hints(cls)
    kwargs = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if f.name in data:
            kwargs[f.name] = _old_decode(hints[f.name], data[f.name], f"{where}.{f.name}")
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise snap.SnapshotError(f"{where}: required field {f.name!r} is missing")
    return cls(**kwargs)


def _old_from_jsonable(data: Any) -> snap.Snapshot:
    if not isinstance(data, dict):
        raise snap.SnapshotError("not a gpudoctor snapshot: the top level is not a JSON object")
    version = data.get("schema_version")
    if version is None:
        raise snap.SnapshotError("not a gpudoctor snapshot: no schema_version")
    if version != snap.SCHEMA_VERSION:
        raise snap.SnapshotError(
            f"snapshot schema_version {version!r} is not supported (this gpudoctor reads {snap.SCHEMA_VERSION})"
        )
    snapshot = _old_decode_dataclass(snap.Snapshot, data, "snapshot")
    snap._check_consistent(snapshot)
    return snapshot


def _outcome(decode: Any, data: Any) -> tuple[str, str]:
    """('ok', a text that tells every value and its type apart) or ('error', the message)."""
    try:
        value = decode(data)
    except snap.SnapshotError as exc:
        return "error", str(exc)
    return "ok", _typed(value)


def _typed(value: Any) -> str:
    """repr, with each field's and element's type: 1 and 1.0, a list and a tuple differ."""
    if dataclasses.is_dataclass(value):
        inner = ", ".join(f"{f.name}={_typed(getattr(value, f.name))}" for f in dataclasses.fields(value))
        return f"{type(value).__name__}({inner})"
    if isinstance(value, list):
        return f"list[{', '.join(_typed(v) for v in value)}]"
    if isinstance(value, dict):
        return f"dict{{{', '.join(f'{k!r}: {_typed(v)}' for k, v in value.items())}}}"
    return f"{type(value).__name__}:{value!r}"


SNAPSHOTS = sorted(
    p for p in FIXTURES.rglob("*.json") if '"schema_version"' in p.read_text() and '"gpus"' in p.read_text()
)


def test_the_fixtures_hold_many_snapshots() -> None:
    assert len(SNAPSHOTS) >= 40


@pytest.mark.parametrize("path", SNAPSHOTS, ids=lambda p: str(p.relative_to(FIXTURES)))
def test_every_fixture_decodes_exactly_as_before(path: Path) -> None:
    data = json.loads(path.read_text())
    assert _outcome(snap.from_jsonable, data) == _outcome(_old_from_jsonable, data)


# Values that no field of one kind takes, and some that another kind does.
BAD = [
    "x",
    "",
    1,
    -3,
    2.5,
    True,
    False,
    None,
    [],
    [1, "a"],
    [{"x": 1}],
    {},
    {"a": 1},
    {"missing": "bogus"},
    {"missing": "error", "detail": 3},
    {"missing": "unsupported"},
    {"missing": ["unhashable"]},
    {"missing": None},
]


def _paths(node: Any, at: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [at]
    if isinstance(node, dict):
        for k, v in node.items():
            out += _paths(v, (*at, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out += _paths(v, (*at, i))
    return out


def _mutated(doc: Any, paths: list[tuple[Any, ...]], rng: random.Random) -> Any:
    """The document with one to three values replaced by a bad one, deleted, or given a stray key."""
    doc = json.loads(json.dumps(doc))
    for _ in range(rng.randint(1, 3)):
        path = rng.choice(paths)
        parent = doc
        try:
            for key in path[:-1]:
                parent = parent[key]
            parent[path[-1]]
        except (KeyError, IndexError, TypeError):  # an earlier change took it away
            continue
        roll = rng.random()
        if roll < 0.7:
            parent[path[-1]] = copy.deepcopy(rng.choice(BAD))
        elif roll < 0.85:
            del parent[path[-1]]
        elif isinstance(parent, dict):
            parent[f"stray_{rng.randint(0, 9)}"] = rng.choice(BAD)
    return doc


@pytest.mark.parametrize("name", ["h100_sxm_8x.json", "a100_mig.json", "no_driver.json", "faults/cpu_starved.json"])
def test_fuzzed_bad_documents_give_the_same_error_text_as_before(name: str) -> None:
    doc = json.loads((FIXTURES / name).read_text())
    rng = random.Random(f"issue22-{name}")
    paths = _paths(doc)[1:]
    errors = 0
    for _ in range(150):
        bad = _mutated(doc, paths, rng)
        new, old = _outcome(snap.from_jsonable, bad), _outcome(_old_from_jsonable, bad)
        assert new == old, bad
        errors += new[0] == "error"
    assert errors >= 75  # most mutations are refused: the error path is what this compares


@pytest.mark.parametrize("value", [*BAD, {"python": "3.11.7", "torch": {"missing": "not_collected"}}])
def test_a_part_decodes_as_before(value: Any) -> None:
    """probe/interpreter.py reads the training interpreter's snap.Software through part_from_jsonable."""

    def old(data: Any) -> Any:
        return _old_decode_dataclass(snap.Software, data, "software")

    def new(data: Any) -> Any:
        return snap.part_from_jsonable(snap.Software, data, "software")

    for data in (value, {"python": value}, {"torch_cuda": value}, {"torch": value, "gpudoctor": value}):
        assert _outcome(new, data) == _outcome(old, data)


def test_an_error_names_the_path_to_the_bad_value() -> None:
    doc = json.loads((FIXTURES / "h100_sxm_8x.json").read_text())
    doc["gpus"][3]["nvlinks"][5]["errors"] = {"replay": "many"}
    with pytest.raises(snap.SnapshotError) as exc:
        snap.from_jsonable(doc)
    assert str(exc.value) == "snapshot.gpus[3].nvlinks[5].errors.replay: expected an integer, got 'many'"
