"""`@record`: a frozen dataclass whose methods are written once, not compiled per class.

`@dataclass(frozen=True)` compiles six methods for every class (__init__, __repr__, __eq__,
__hash__, __setattr__, __delattr__) when its module is imported: for the snapshot's 25 types and
the other value types `gpudoctor check --quick` imports, that was the largest part of its start-up
(issue 22). `@record` runs dataclasses' own field processing (so `dataclasses.fields`, `replace`,
`asdict` and `is_dataclass` work as before) and gives the class Record's shared methods, which do
what the generated ones do: the same arguments (positional in field order, or by keyword), the same
TypeErrors, defaults and default factories, __post_init__ called, frozen instances
(FrozenInstanceError), equality and hash over the fields' tuple (fields with compare=False left
out), and the same repr (fields with repr=False left out).

`@mutable_record` (on a MutableRecord) is the same for a plain `@dataclass`: fields may be set,
instances are unhashable. tests/test_records.py holds each type to a twin made by dataclasses.
"""

from __future__ import annotations

import dataclasses
import inspect
import operator
from collections.abc import Callable
from typing import Any, TypeVar, dataclass_transform

C = TypeVar("C", bound=type)


class _Spec:
    """What Record's methods need of one class, worked out once by @record."""

    def __init__(self, cls: type) -> None:
        fields = dataclasses.fields(cls)
        self.names = tuple(f.name for f in fields)
        self.defaults = {f.name: f.default for f in fields if f.default is not dataclasses.MISSING}
        self.factories = {f.name: f.default_factory for f in fields if f.default_factory is not dataclasses.MISSING}
        self.shown = tuple(f.name for f in fields if f.repr)
        self.compared = _getter(tuple(f.name for f in fields if f.compare))
        self.hashed = _getter(tuple(f.name for f in fields if (f.compare if f.hash is None else f.hash)))
        self.post_init = getattr(cls, "__post_init__", None)
        self.fields = frozenset(self.names)
        # The words CPython's generated __init__ would use in its TypeErrors.
        self.init = f"{cls.__qualname__}.__init__"
        optional = len(self.defaults) + len(self.factories)
        count = len(self.names) + 1  # self included, as CPython counts
        self.takes = (
            f"from {count - optional} to {count} positional arguments"
            if optional
            else f"{count} positional argument{'s' if count != 1 else ''}"
        )

    def missing(self, given: dict[str, Any]) -> str:
        absent = [repr(n) for n in self.names if n not in given and n not in self.defaults and n not in self.factories]
        listed = (
            absent[0]
            if len(absent) == 1
            else f"{', '.join(absent[:-1])}{',' if len(absent) > 2 else ''} and {absent[-1]}"
        )
        plural = "s" if len(absent) > 1 else ""
        return f"{self.init}() missing {len(absent)} required positional argument{plural}: {listed}"


def _getter(names: tuple[str, ...]) -> Callable[[Any], tuple[Any, ...]]:
    if not names:
        return lambda obj: ()
    get = operator.attrgetter(*names)
    return get if len(names) > 1 else lambda obj: (get(obj),)  # type: ignore[return-value]


class _FactoryDefault:
    def __repr__(self) -> str:
        return "<factory>"  # as dataclasses shows a default_factory in the signature of its __init__


class _Signature:
    """`inspect.signature(cls)` (help(), IDEs): the fields, as dataclasses' generated __init__ shows
    them, made when asked rather than at import (Record.__init__ alone reads `(*args, **kwargs)`)."""

    def __get__(self, obj: object, cls: type) -> inspect.Signature:
        spec = cls.__dict__.get("_spec")
        if obj is not None or spec is None:
            raise AttributeError("__signature__")  # an instance, or Record itself: inspect's own way
        annotations = {f.name: f.type for f in dataclasses.fields(cls)}
        params = [
            inspect.Parameter(
                name,
                inspect.Parameter.POSITIONAL_OR_KEYWORD,
                default=spec.defaults.get(name, _FACTORY if name in spec.factories else inspect.Parameter.empty),
                annotation=annotations[name],
            )
            for name in spec.names
        ]
        return inspect.Signature(params, return_annotation=None)


_FACTORY = _FactoryDefault()


class Record:
    """The methods of a frozen dataclass, shared by every @record class (see the module)."""

    _spec: _Spec
    __signature__ = _Signature()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        spec = type(self)._spec
        names = spec.names
        values = dict(zip(names, args, strict=False))  # fewer arguments than fields: the rest by keyword
        for name, value in kwargs.items():  # CPython's order of complaints: keywords, then counts
            if name not in spec.fields:
                raise TypeError(f"{spec.init}() got an unexpected keyword argument {name!r}")
            if name in values:
                raise TypeError(f"{spec.init}() got multiple values for argument {name!r}")
            values[name] = value
        if len(args) > len(names):
            raise TypeError(f"{spec.init}() takes {spec.takes} but {len(args) + 1} were given")
        state = self.__dict__
        for name in names:
            if name in values:
                state[name] = values[name]
            elif name in spec.defaults:
                state[name] = spec.defaults[name]
            elif name in spec.factories:
                state[name] = spec.factories[name]()
            else:
                raise TypeError(spec.missing(values))
        if spec.post_init is not None:
            spec.post_init(self)

    def __setattr__(self, name: str, value: Any) -> None:
        raise dataclasses.FrozenInstanceError(f"cannot assign to field {name!r}")

    def __delattr__(self, name: str) -> None:
        raise dataclasses.FrozenInstanceError(f"cannot delete field {name!r}")

    def __eq__(self, other: object) -> bool:
        if other.__class__ is self.__class__:
            compared = self._spec.compared
            return bool(compared(self) == compared(other))
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self._spec.hashed(self))

    def __repr__(self) -> str:
        shown = ", ".join(f"{name}={getattr(self, name)!r}" for name in self._spec.shown)
        return f"{type(self).__qualname__}({shown})"


class MutableRecord(Record):
    """The methods of a plain (mutable) `@dataclass`: as Record's, but its fields may be set, and
    it is unhashable (a dataclass with eq and without frozen sets __hash__ to None)."""

    __setattr__ = object.__setattr__
    __delattr__ = object.__delattr__
    __hash__ = None  # type: ignore[assignment]


@dataclass_transform(frozen_default=True, field_specifiers=(dataclasses.field,))
def record(cls: C) -> C:
    """Make `cls` (a subclass of Record, annotated as for @dataclass) a frozen dataclass."""
    if not issubclass(cls, Record) or issubclass(cls, MutableRecord):
        raise TypeError(f"@record: {cls.__name__} must subclass gpudoctor.records.Record")
    return _made(cls)


@dataclass_transform(field_specifiers=(dataclasses.field,))
def mutable_record(cls: C) -> C:
    """Make `cls` (a subclass of MutableRecord) a plain, mutable dataclass."""
    if not issubclass(cls, MutableRecord):
        raise TypeError(f"@mutable_record: {cls.__name__} must subclass gpudoctor.records.MutableRecord")
    return _made(cls)


def _made(cls: C) -> C:
    if not cls.__doc__:  # dataclasses would build one from inspect.signature
        cls.__doc__ = cls.__name__
    dataclasses.dataclass(cls, init=False, repr=False, eq=False, match_args=False)
    cls._spec = _Spec(cls)  # type: ignore[attr-defined]
    cls.__match_args__ = cls._spec.names  # type: ignore[attr-defined]
    return cls
