"""Which members of a group differ from the rest: the comparison behind "node 7 has driver X, the
other 15 nodes Y". Pure and generic (members are names, values anything hashable), so any
comparison of several recordings can share it (cross-node facts today; snapshot diffs later).

    split = odd_one_out({"n0": "550.54.15", "n1": "550.54.15", "n2": "535.129.03"})
    split.majority        # "550.54.15" (None on a tie: then no member is "the odd one")
    split.odd             # {"n2": "535.129.03"}
    split.groups          # {"550.54.15": ["n0", "n1"], "535.129.03": ["n2"]}
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Split:
    groups: dict[Any, list[str]]  # value -> members holding it, largest group first
    majority: Any | None  # the value most members hold; None when two or more tie
    odd: dict[str, Any]  # member -> its value, for members not holding the majority value

    @property
    def differs(self) -> bool:
        return len(self.groups) > 1


def odd_one_out(values: Mapping[str, Hashable]) -> Split:
    groups: dict[Any, list[str]] = {}
    for member, value in values.items():
        groups.setdefault(value, []).append(member)
    ordered = dict(sorted(groups.items(), key=lambda kv: (-len(kv[1]), str(kv[0]))))
    sizes = [len(m) for m in ordered.values()]
    majority = next(iter(ordered)) if sizes and (len(sizes) == 1 or sizes[0] > sizes[1]) else None
    if majority is None:
        odd = dict(values) if len(ordered) > 1 else {}
    else:
        odd = {m: v for m, v in values.items() if v != majority}
    return Split(ordered, majority, odd)
