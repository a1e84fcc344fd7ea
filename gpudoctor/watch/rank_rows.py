"""The summary's rank rows: what `watch` and `report` hold per rank over a whole run, bounded by the
ranks held at once, not by the processes a run ever had (issue 22).

A row is a rank number: every process that held it, one after another (a restarted job, an elastic one),
is folded into it, its steps counted, its PID the latest; the row says how many processes it had. Two
processes with one number at the same time (two jobs under one watch) are two rows. A
rank without a number is its own process. At most MAX_RANKS rows are held (gpudoctor.watch.bounds, the
ranks a line may hold): a run that shows more (a crafted recording whose rank numbers change line to
line) folds the least recently seen row into one "earlier ranks" row, counted and named in the summary's
note, and never refuses a line for it. A live `watch` and `report` of its recording feed the same rows
the same readings, so they agree.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from gpudoctor.watch.bounds import MAX_RANKS
from gpudoctor.watch.model import RankReading, plural

RECENT_PIDS = 4  # a rank's latest processes, so that two taking turns are counted once each


@dataclass
class RankRow:
    """One rank's row over the run: every process that held the rank number, one after another (a
    restarted job, a crafted recording taking turns), folded in; `pid` is the latest. A rank without a
    number is one process."""

    rank: int | None
    pid: int
    steps: int = 0
    step_sum: float = 0.0
    timed: int = 0
    wait_sum: float = 0.0
    waited: int = 0
    waited_step_sum: float = 0.0  # the step time of the steps that measured an input wait
    last_step: int | None = None
    processes: int = 1  # distinct processes that held the rank (the latest RECENT_PIDS told apart)
    recent: list[int] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "pid": self.pid,
            "steps": self.steps,
            "mean_step_ms": round(1000 * self.step_sum / self.timed, 1) if self.timed else None,
            "wait_share": self.wait_share,
            "last_step": self.last_step,
            **({"processes": self.processes} if self.processes > 1 else {}),
        }

    @property
    def wait_share(self) -> float | None:
        """The input wait over the time of the steps that measured one (at most 1: a plain step() in the
        same loop measures none, and its time is not the wait's whole)."""
        if not self.waited or not self.waited_step_sum:
            return None
        return round(min(1.0, self.wait_sum / self.waited_step_sum), 3)

    def took(self, pid: int) -> None:
        """Process `pid` holds the rank now: a new one is counted, its steps go in the same row."""
        if pid == self.pid:
            return
        if pid in self.recent:
            self.recent.remove(pid)  # one of the latest, back: not a new process
        else:
            self.processes += 1
        self.recent = [*self.recent, self.pid][-(RECENT_PIDS - 1) :]
        self.pid = pid

    def fold(self, other: RankRow) -> None:
        """Count `other`'s steps in this row (the earlier ranks' row)."""
        self.steps += other.steps
        self.step_sum += other.step_sum
        self.timed += other.timed
        self.wait_sum += other.wait_sum
        self.waited += other.waited
        self.waited_step_sum += other.waited_step_sum
        self.processes += other.processes


@dataclass
class Earlier:
    """The rank rows folded into one because more than MAX_RANKS were held at once (the least recently
    seen first): a recording whose rank numbers keep changing is summarized, not refused. A rank number
    seen again after its row was folded starts a new row, folded again in its turn: `rows` counts rows,
    not distinct rank numbers, which would need a set as large as the recording to tell."""

    rows: int = 0
    first: int | None = None  # the lowest and highest rank numbers folded (None: ranks without a number)
    last: int | None = None
    row: RankRow = field(default_factory=lambda: RankRow(None, 0, processes=0))

    def add(self, rs: RankRow) -> None:
        self.rows += 1
        self.row.fold(rs)
        if rs.rank is not None:
            self.first = rs.rank if self.first is None else min(self.first, rs.rank)
            self.last = rs.rank if self.last is None else max(self.last, rs.rank)

    def to_json(self) -> dict[str, Any]:
        row = self.row.to_json()
        return {
            "rows": self.rows,
            "processes": self.row.processes,
            "steps": self.row.steps,
            "mean_step_ms": row["mean_step_ms"],
            "wait_share": row["wait_share"],
            "first_rank": self.first,
            "last_rank": self.last,
        }

    @property
    def note(self) -> str:
        numbered = "" if self.first is None else f", ranks {self.first}..{self.last} among them"
        return (
            f"{plural(self.rows, 'earlier rank row')} ({plural(self.row.processes, 'process', 'processes')}{numbered}) "
            f"are counted in one row: at most {MAX_RANKS} ranks are held, the least recently seen are folded "
            "(a rank seen again after it was folded is counted again)"
        )


class RankRows:
    """The rows, the least recently seen first (an OrderedDict: moving a row to the end and folding the first
    are O(1)), and the earlier ranks' row once more than MAX_RANKS were held."""

    def __init__(self) -> None:
        self.rows: OrderedDict[tuple[int | None, int], RankRow] = OrderedDict()
        self.earlier: Earlier | None = None

    def add(self, ranks: Iterable[RankReading]) -> None:
        """One sample's (or one take's) readings. Processes of one rank number in the same readings ran at
        the same time (two jobs under one watch, a rank's child that steps): each keeps a row of its own,
        the first the rank's, the others keyed by their PID; only processes one after another share a row."""
        rows = self.rows
        ranks = tuple(ranks)
        together: dict[int, set[int]] = {}
        for r in ranks:
            if r.rank is not None:
                together.setdefault(r.rank, set()).add(r.pid)
        for r in ranks:
            key = (r.rank, 0) if r.rank is not None else (None, r.pid)  # the number, whichever process holds it
            if r.rank is not None:
                own = (r.rank, r.pid)
                held = rows.get(key)
                if own in rows or (held is not None and held.pid != r.pid and held.pid in together[r.rank]):
                    key = own  # a twin: another process held the rank's row at the same time
            rs = rows.get(key)
            if rs is None:
                rs = rows[key] = RankRow(r.rank, r.pid)
                if len(rows) > MAX_RANKS:
                    if self.earlier is None:
                        self.earlier = Earlier()
                    self.earlier.add(rows.popitem(last=False)[1])
            else:
                rows.move_to_end(key)
                rs.took(r.pid)
            rs.steps += r.steps
            rs.last_step = r.last_step if r.last_step is not None else rs.last_step
            if r.steps and r.step_s is not None:
                rs.timed += r.steps
                rs.step_sum += r.step_s * r.steps
                waited, wait, waited_step = r.wait_totals()
                rs.waited += waited
                rs.wait_sum += wait
                rs.waited_step_sum += waited_step
