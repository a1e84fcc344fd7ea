"""`@record` types behave as `@dataclass(frozen=True)` would: each is held to a twin made by dataclasses."""

from __future__ import annotations

import copy
import dataclasses
import inspect
import pickle
from typing import Any

import pytest

from gpudoctor import findings, policy, records, snapshot
from gpudoctor.checks import identity, nccl_env, unread
from gpudoctor.engine import codes, context, options, registry, selection
from gpudoctor.knowledge import (
    clock_reasons,
    expectations,
    nccl_list,
    nccl_rules,
    nic_ports,
    pci_paths,
    pcie_model,
    visible_gpus,
)


def _twin(cls: type) -> type:
    """The same fields, made by @dataclass(frozen=True), or @dataclass for a MutableRecord."""
    spec = [
        (
            f.name,
            f.type,
            dataclasses.field(
                default=f.default, default_factory=f.default_factory, repr=f.repr, hash=f.hash, compare=f.compare
            ),
        )  # type: ignore[call-overload]
        for f in dataclasses.fields(cls)
    ]
    namespace = {"__qualname__": cls.__qualname__}
    if hasattr(cls, "__post_init__"):
        namespace["__post_init__"] = cls.__post_init__  # type: ignore[assignment]
    frozen = not issubclass(cls, records.MutableRecord)
    return dataclasses.make_dataclass(cls.__name__, spec, frozen=frozen, namespace=namespace)


def _records(module: Any) -> list[type]:
    return [
        v
        for v in vars(module).values()
        if isinstance(v, type) and issubclass(v, records.Record) and v not in (records.Record, records.MutableRecord)
    ]


# The value types `check --quick` imports (issue 22: their generated methods were its start-up).
MODULES = [
    snapshot,
    codes,
    context,
    registry,
    selection,
    options,
    findings,
    policy,
    visible_gpus,
    expectations,
    clock_reasons,
]
MODULES += [nccl_rules, pcie_model, nic_ports, nccl_list, pci_paths, nccl_env, identity, unread]
TYPES = sorted({cls for module in MODULES for cls in _records(module)}, key=lambda c: (c.__module__, c.__name__))


def test_the_start_up_types_are_records() -> None:
    assert len(TYPES) >= 49 and snapshot.Gpu in TYPES and findings.Finding in TYPES and codes.Code in TYPES
    assert findings.Report in TYPES and context.CheckContext in TYPES  # mutable ones too


def _example(cls: type) -> dict[str, Any]:
    """Values for the required fields (any value: the types are not checked at construction)."""
    return {
        f.name: f"v-{f.name}" for f in dataclasses.fields(cls) if f.default is f.default_factory is dataclasses.MISSING
    }


def _call(make: Any, *args: Any, **kwargs: Any) -> tuple[str, str]:
    try:
        obj = make(*args, **kwargs)
    except (TypeError, ValueError) as exc:
        return type(exc).__name__, str(exc)
    return "ok", repr(obj)


@pytest.mark.parametrize("cls", TYPES, ids=lambda c: c.__name__)
def test_a_record_is_built_compared_and_shown_as_a_frozen_dataclass_would_be(cls: type) -> None:
    twin = _twin(cls)
    required = _example(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    positional = list(required.values())
    for args, kwargs in [
        ((), required),
        (positional, {}),
        ((), {}),
        ([*positional, 1, 2, 3] + [0] * len(names), {}),
        (positional[:1], {names[0]: 1}),
        ((), {**required, "no_such_field": 1}),
    ]:
        assert _call(cls, *args, **kwargs) == _call(twin, *args, **kwargs)
    if _call(cls, **required)[0] != "ok":  # its __post_init__ refuses any value of ours (Code: GDnnn)
        return
    a, b = cls(**required), twin(**required)
    assert repr(a) == repr(b)
    assert a == cls(**required) and a != b  # equal to its own kind only, as a dataclass is
    try:
        assert hash(a) == hash(b)
    except TypeError:  # a list field: unhashable in both
        with pytest.raises(TypeError):
            hash(b)
    if isinstance(a, records.MutableRecord):
        a.__setattr__(names[0], "set")
        b.__setattr__(names[0], "set")
        assert repr(a) == repr(b) and getattr(a, names[0]) == "set"
    else:
        with pytest.raises(dataclasses.FrozenInstanceError):
            a.__setattr__(names[0], 1)
        with pytest.raises(dataclasses.FrozenInstanceError):
            a.__delattr__(names[0])
    changed = dataclasses.replace(a, **{names[0]: "changed"})
    assert repr(changed) == repr(dataclasses.replace(b, **{names[0]: "changed"}))
    assert dataclasses.asdict(a) == dataclasses.asdict(b)
    assert copy.deepcopy(a) == a
    if not any(callable(getattr(a, name)) for name in names):  # a function field (a lambda) never pickles
        assert pickle.loads(pickle.dumps(a)) == a
    assert cls.__match_args__ == twin.__match_args__
    assert str(inspect.signature(cls)) == str(inspect.signature(twin))  # help() and IDEs show the fields


def test_post_init_runs_and_excluded_fields_stay_out() -> None:
    @records.record
    class Checked(records.Record):
        value: int
        note: str = dataclasses.field(default="", compare=False, repr=False)

        def __post_init__(self) -> None:
            if self.value < 0:
                raise ValueError("negative")

    with pytest.raises(ValueError, match="negative"):
        Checked(-1)
    assert (
        Checked(1, "a") == Checked(1, "b")
        and repr(Checked(1, "a")) == "test_post_init_runs_and_excluded_fields_stay_out.<locals>.Checked(value=1)"
    )
    assert hash(Checked(1, "a")) == hash(Checked(1, "b"))
