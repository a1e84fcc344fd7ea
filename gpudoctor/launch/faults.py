"""The test-only fault switch: GPUDOCTOR_FAULT makes a chosen rank misbehave on purpose.

    GPUDOCTOR_FAULT="<rank>:<action>[@<when>][,...]"     or   "node<N>:<action>" (every rank of node N)

actions: `hang` (sleep forever), `exit` (exit with status 17), `corrupt` (send wrong DDP
gradients), `wrongsum` (add a wrong value to its all-reduce input), `sdc` (silent data
corruption in level 3's deep checks: flip one bit of its GEMM result from the second check on,
of its all-reduce result from the second iteration on, and of its memory-test buffer after the
first pattern is written), `garble` (add 1 to the first element of every chunk it sends in the
other collectives: all-gather, reduce-scatter, all-to-all, broadcast, send/recv), `slow` (a
straggler: in `bench scaling` it sleeps five times as long as each forward pass took, about
2.5x its compute), `slownet` (its inter-node collectives in the `nodes` workload take 10x as long,
as over a link at a tenth of its speed), `slownode` (the same for that workload's intra-node
collectives and copies too: a node that is slow itself). A node is its torchrun node rank
(GROUP_RANK) or Slurm's SLURM_NODEID. `when` for hang/exit:
`start` (before importing torch), `import` (while importing torch: an import that never ends),
or `joined` (after joining, the default: the peers then wait in a collective). Used by the
tests and by users who want to watch each failure path.

The parent reads the spec before it starts any rank (`check_env`, from `gpudoctor check` at
level 2 and above and from `gpudoctor bench`): a spec the ranks could not read is a usage error
(one line, exit 2), not a rank that "failed in phase start" like a broken GPU would.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import dataclass

from gpudoctor.errors import EXIT_USAGE, UserError

ENV = "GPUDOCTOR_FAULT"
ACTIONS = ("hang", "exit", "corrupt", "wrongsum", "sdc", "garble", "slow", "slownet", "slownode")
WHEN = ("start", "import", "joined")
EXIT_STATUS = 17


class FaultSpecError(UserError, ValueError):
    """A GPUDOCTOR_FAULT the ranks cannot read: a usage error (exit 2) with a one-line message."""

    def __init__(self, message: str) -> None:
        super().__init__(message, EXIT_USAGE, "usage")


@dataclass(frozen=True)
class Fault:
    rank: int | None  # None: the fault names a node
    action: str
    when: str = "joined"
    node: int | None = None


def parse(text: str) -> list[Fault]:
    faults = []
    for item in (t.strip() for t in text.split(",")):
        if not item:
            continue
        try:
            target, rest = item.split(":", 1)
            action, _, when = rest.partition("@")
            node = int(target[4:]) if target.startswith("node") else None
            fault = Fault(None if node is not None else int(target), action, when or "joined", node)
            if any(n is not None and n < 0 for n in (fault.rank, fault.node)):
                raise ValueError("negative rank or node")
        except ValueError:
            raise FaultSpecError(
                f"{ENV}: cannot read {item!r} (expected RANK:ACTION[@WHEN] or nodeN:ACTION, e.g. 1:hang)"
            ) from None
        if fault.action not in ACTIONS or fault.when not in WHEN:
            raise FaultSpecError(
                f"{ENV}: unknown fault {item!r} (actions: {', '.join(ACTIONS)}; when: {', '.join(WHEN)})"
            )
        faults.append(fault)
    return faults


def check_env(environ: Mapping[str, str] | None = None) -> list[Fault]:
    """The faults GPUDOCTOR_FAULT asks for, read in the parent before any rank starts;
    FaultSpecError (a usage error) when the spec cannot be read."""
    return parse((os.environ if environ is None else environ).get(ENV, ""))


class Faults:
    """The faults that apply to one rank."""

    def __init__(self, rank: int, text: str | None = None, node: int | None = None) -> None:
        text = os.environ.get(ENV, "") if text is None else text
        self._mine = [f for f in parse(text) if f.rank == rank or (f.node is not None and f.node == node)]

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
