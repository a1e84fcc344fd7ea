"""--select / --ignore: codes (GD401), code prefixes (GD4) or check names."""

from __future__ import annotations

from dataclasses import field, replace
from typing import TYPE_CHECKING

from gpudoctor.engine.codes import CHECK_CRASHED
from gpudoctor.records import Record, record

if TYPE_CHECKING:
    from gpudoctor.engine.registry import Check, Registry


class SelectionError(ValueError):
    pass


@record
class Selection(Record):
    """Which codes reach the report. Check names are known through the registry it is bound to
    (`using`); unbound, every token is read as a code or a prefix."""

    select: tuple[str, ...] = ()
    ignore: tuple[str, ...] = ()
    registry: Registry | None = field(default=None, compare=False, repr=False)

    def using(self, registry: Registry) -> Selection:
        return self if self.registry is registry else replace(self, registry=registry)

    def validate(self) -> None:
        reg = self.registry
        if reg is None:
            raise ValueError("Selection.validate needs a registry (Selection.using)")
        for token in self.select + self.ignore:
            if token in reg.checks:
                continue
            matching = [c for c in reg.codes if token.upper().startswith("GD") and c.startswith(token.upper())]
            if any(reg.owner[c] not in reg.outside for c in matching):
                continue
            if matching:  # only codes another command raises (watch verdicts)
                owner = reg.owner[matching[0]]
                raise SelectionError(f"{token!r} names `gpudoctor {owner}` codes, which `check` never gives")
            raise SelectionError(f"unknown check or code {token!r} (see `gpudoctor list-checks`)")

    def _matches(self, token: str, code: str) -> bool:
        reg = self.registry
        if reg is not None and token in reg.checks:
            return reg.owner.get(code) == token
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
