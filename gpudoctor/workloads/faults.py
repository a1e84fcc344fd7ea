"""The test-only fault switch: GPUDOCTOR_FAULT makes a chosen rank misbehave on purpose.

    GPUDOCTOR_FAULT="<rank>:<action>[@<when>][,...]"

actions: `hang` (sleep forever), `exit` (exit with status 17), `corrupt` (send wrong DDP
gradients), `wrongsum` (add a wrong value to its all-reduce input), `sdc` (silent data
corruption in level 3's deep checks: flip one bit of its GEMM result from the second check on,
of its all-reduce result from the second iteration on, and of its memory-test buffer after the
first pattern is written), `garble` (add 1 to the first element of every chunk it sends in the
other collectives: all-gather, reduce-scatter, all-to-all, broadcast, send/recv), `slow` (a
straggler: in `bench scaling` it sleeps five times as long as each forward pass took, about
2.5x its compute). `when` for hang/exit:
`start` (before importing torch), `import` (while importing torch: an import that never ends),
or `joined` (after joining, the default: the peers then wait in a collective). Used by the
tests and by users who want to watch each failure path.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

ENV = "GPUDOCTOR_FAULT"
ACTIONS = ("hang", "exit", "corrupt", "wrongsum", "sdc", "garble", "slow")
WHEN = ("start", "import", "joined")
EXIT_STATUS = 17


class FaultSpecError(ValueError):
    pass


@dataclass(frozen=True)
class Fault:
    rank: int
    action: str
    when: str = "joined"


def parse(text: str) -> list[Fault]:
    faults = []
    for item in (t.strip() for t in text.split(",")):
        if not item:
            continue
        try:
            rank_s, rest = item.split(":", 1)
            action, _, when = rest.partition("@")
            fault = Fault(int(rank_s), action, when or "joined")
        except ValueError:
            raise FaultSpecError(f"{ENV}: cannot read {item!r} (expected RANK:ACTION[@WHEN])") from None
        if fault.action not in ACTIONS or fault.when not in WHEN:
            raise FaultSpecError(
                f"{ENV}: unknown fault {item!r} (actions: {', '.join(ACTIONS)}; when: {', '.join(WHEN)})"
            )
        faults.append(fault)
    return faults


class Faults:
    """The faults that apply to one rank."""

    def __init__(self, rank: int, text: str | None = None) -> None:
        text = os.environ.get(ENV, "") if text is None else text
        self._mine = [f for f in parse(text) if f.rank == rank]

    def has(self, action: str) -> bool:
        return any(f.action == action for f in self._mine)

    def at(self, when: str) -> None:
        """Misbehave now if a hang/exit fault is set for this point."""
        for f in self._mine:
            if f.when != when:
                continue
            if f.action == "exit":
                os._exit(EXIT_STATUS)
            if f.action == "hang":
                while True:
                    time.sleep(3600)
