"""Finding codes: how one is declared, and the codes that were removed (listed for ever, never reused).

A code is a stable name a CI gate, a policy file (`severity`, `ignore`) or a dashboard may hold on
to. As ruff does with its rules, a code that is removed stays listed here as retired: `explain`
still answers for it, docs/checks/ keeps its page (saying it was removed and what replaced it),
and declaring it again is refused, so an old `--ignore GD123` can never silently start to mean
something else.
"""

from __future__ import annotations

import re

from gpudoctor.records import Record, record

CODE_RE = re.compile(r"^GD\d{3}$")


@record
class Code(Record):
    code: str  # GD + three digits; the hundreds digit is the area (DESIGN.md)
    name: str  # kebab-case slug, e.g. "nvlink-fewer-links"
    title: str  # one line: what the finding is about
    what: str  # what the check looks at
    why: str  # why it matters for a multi-GPU run
    fix: str  # how to fix it

    def __post_init__(self) -> None:
        if not CODE_RE.match(self.code):
            raise ValueError(f"bad finding code {self.code!r}")


@record
class Retired(Record):
    """A code gpudoctor no longer gives."""

    code: str
    name: str
    title: str
    removed_in: str  # the gpudoctor version that stopped giving it
    why: str  # why it went
    replaced_by: tuple[str, ...] = ()  # the codes that now say what it said, if any

    def __post_init__(self) -> None:
        if not CODE_RE.match(self.code):
            raise ValueError(f"bad finding code {self.code!r}")


# The lifecycle table: every code ever removed, oldest first. None has been removed yet (checked
# against every docs/checks/README.md in the repository's history when this table was made).
RETIRED: tuple[Retired, ...] = ()

# gpudoctor's own code (area 0), raised by the check runner for any check.
CHECK_CRASHED = Code(
    "GD001",
    "check-crashed",
    "A check could not run to the end",
    what="Every check runs inside a guard; when one raises, its exception becomes this finding "
    "and the other checks still run.",
    why="A check that crashed proved nothing, so gpudoctor treats it like a failure when gating "
    "(exit code 1 under the default --fail-on fail).",
    fix="Read the message and evidence (the exception and where it was raised). If the machine is "
    "healthy this is a gpudoctor bug: report it with `gpudoctor snapshot` output attached.",
)
