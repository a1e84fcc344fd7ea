"""The job's processes, sample by sample: which is torchrun's agent, which are ranks (and which rank),
which are alive, what each said through the step API, and, for those a hang verdict names, where their
stack is (gpudoctor/probe/stacks.py, py-spy, on a thread of its own so sampling never waits for it).

A rank is the top process that carries a RANK in its environment (torchrun gives one to each worker;
its DataLoader workers and other children inherit it and are not ranks), or, without one, a process
that said it joined a process group (an mp.spawn script started directly). A process under a rank that
joined a process group of its own is a CHILD_RANK: ranks inside ranks, the mark of an mp.spawn script
launched by torchrun. Other processes (DataLoader workers, compile workers, shells) are not listed.
"""

from __future__ import annotations

import contextlib
import queue
import subprocess
import threading
import time
from collections.abc import Iterable
from dataclasses import replace

from gpudoctor.knowledge import torch_stacks
from gpudoctor.knowledge.launchers import is_torchrun, torchrun_plan
from gpudoctor.probe import stacks as probe_stacks
from gpudoctor.probe.job_procs import ProcFacts, alive, facts
from gpudoctor.watch.arrival import CHILD_RANK, LAUNCHER, MAX_ENDED, MAX_FRAMES, RANK, Heard, JobProc, merged
from gpudoctor.watch.model import RankReading

RESTACK_S = 10.0  # a stack asked for again is read again after this long (has it moved?)
STACK_KEPT_S = 25.0  # a stack older than this is not shown (nobody asked again: it is not stuck there)
MAX_STACKS = 16  # stacks read per request: the ranks a verdict names first
# A process is read again at every sample until it is this old (a heuristic: exec follows fork within
# milliseconds even on a loaded machine): one first read between fork and exec shows its parent's command
# line and environment, and a rank kept with those would never be listed as a rank while it lived.
FRESH_S = 5.0


class JobTracker:
    """See the module docstring. `observe` runs on the session's thread; stacks are read on another."""

    def __init__(self, join_after_s: float = 30.0) -> None:
        self.join_after_s = join_after_s  # stacks of processes waiting half this long are read ahead
        self._facts: dict[int, ProcFacts | None] = {}
        self._listed: dict[int, JobProc] = {}  # every job process listed so far, by PID
        # pid -> (when taken, its state then: joined, step, inside; the stack)
        self._stacks: dict[int, tuple[float, tuple[object, ...], probe_stacks.Stack]] = {}
        self._pending: set[int] = set()
        self._lock = threading.Lock()
        self._queue: queue.Queue[int | None] = queue.Queue()
        self._running: subprocess.Popen[bytes] | None = None
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._read_stacks, name="gpudoctor-stacks", daemon=True)
        self._thread.start()

    # -- the processes ---------------------------------------------------------------------------------

    def _facts_of(self, pid: int) -> ProcFacts | None:
        if pid in self._facts:
            known = self._facts[pid]
            if known is None or time.time() - known.started >= FRESH_S:
                return known
        found = self._facts[pid] = facts(pid)
        return found

    def observe(
        self, tree: Iterable[int], readings: Iterable[RankReading] | None, heard: dict[int, Heard], now: float
    ) -> tuple[JobProc, ...]:
        """The job's processes now: those alive in `tree`, and the ranks seen before that have ended."""
        alive = set(tree)
        steps = {r.pid: r.last_step for r in readings or () if r.last_step is not None}
        current: dict[int, JobProc] = {}
        for pid in sorted(alive):
            proc = self._classify(pid, alive, heard)
            if proc is not None:
                current[pid] = proc
        for pid, old in self._listed.items():
            if pid not in current:
                current[pid] = old if old.ended is not None else replace(old, ended=now)
        out = []
        for pid, proc in current.items():
            said = heard.get(pid)
            step = steps.get(pid)
            placed = said is None or step is None or step <= said.step  # else it moved on since it said
            proc = merged(proc, said, self._listed.get(pid), placed)
            if step is not None and step > (proc.step or 0):
                proc = replace(proc, step=step)
            out.append(self._with_stack(proc))
        self._listed = {p.pid: p for p in out}
        self._forget(alive)
        self.want_stacks(p.pid for p in out if self._waiting(p, out, now))
        return tuple(sorted(out, key=_order))

    def _waiting(self, p: JobProc, procs: list[JobProc], now: float) -> bool:
        """Before step 1 and waiting half the join deadline: its stack is read ahead, so that the verdict
        at the deadline can say where it is (and a launcher still importing is not called stuck)."""
        if not p.alive or now - p.started < self.join_after_s / 2:
            return False
        ranks = [q for q in procs if q.role != LAUNCHER]
        if any(q.step or q.inside for q in ranks):
            return False
        if p.role == LAUNCHER:
            return not any(q.alive for q in ranks)
        if p.joined is None and not any(q.joined is not None for q in ranks):
            return False  # no rank says anything (no gpudoctor in the job): nothing to judge by
        return not p.joined or (p.since is not None and now - p.since >= self.join_after_s / 2)

    def _classify(self, pid: int, alive: set[int], heard: dict[int, Heard]) -> JobProc | None:
        f = self._facts_of(pid)
        if f is None:
            return None
        said = heard.get(pid)
        if is_torchrun(f.argv):
            plan = torchrun_plan(f.argv)
            world = plan.world if plan else None
            return JobProc(pid, LAUNCHER, f.started, world=world, nodes=plan.nnodes if plan else "")
        rank = f.number("RANK")
        parent = self._facts_of(f.ppid) if f.ppid in alive else None
        inherited = parent is not None and parent.env.get("RANK") == f.env.get("RANK") and rank is not None
        fr = f.number("TORCH_NCCL_TRACE_BUFFER_SIZE")
        if rank is not None and not inherited:
            local, world = f.number("LOCAL_RANK"), f.number("WORLD_SIZE")
            return JobProc(pid, RANK, f.started, rank=rank, local_rank=local, world=world, trace_buffer=fr)
        if said is None or not said.joined:
            return None
        top = self._rank_above(f, alive)
        if top is None:  # no rank above it: a rank of a job started without torchrun (mp.spawn)
            return JobProc(pid, RANK, f.started, rank=said.dist_rank, world=said.dist_world, trace_buffer=fr)
        return JobProc(pid, CHILD_RANK, f.started, rank=said.dist_rank, parent=top, trace_buffer=fr)

    def _rank_above(self, f: ProcFacts, alive: set[int]) -> int | None:
        """The nearest ancestor that is a rank (carries RANK, not inherited), within the job."""
        seen = 0
        ppid = f.ppid
        while ppid in alive and seen < 64:
            p = self._facts_of(ppid)
            if p is None:
                return None
            up = self._facts_of(p.ppid) if p.ppid in alive else None
            if p.number("RANK") is not None and (up is None or up.env.get("RANK") != p.env.get("RANK")):
                return ppid
            ppid, seen = p.ppid, seen + 1
        return None

    def _forget(self, alive: set[int]) -> None:
        """Keep memory bounded: the latest MAX_ENDED ended ranks, and the facts of live processes only."""
        ended = [p for p in self._listed.values() if p.ended is not None]
        if len(ended) > MAX_ENDED:
            for p in sorted(ended, key=lambda p: p.ended or 0.0)[: len(ended) - MAX_ENDED]:
                del self._listed[p.pid]
        for pid in [pid for pid in self._facts if pid not in alive]:
            del self._facts[pid]
        for pid in [pid for pid in self._stacks if pid not in self._listed]:
            with self._lock:
                self._stacks.pop(pid, None)

    # -- stacks ----------------------------------------------------------------------------------------

    def want_stacks(self, pids: Iterable[int]) -> None:
        """Read the stacks of these processes (those a hang verdict names), unless read recently."""
        now = time.monotonic()
        with self._lock:
            for pid in list(pids)[:MAX_STACKS]:
                taken = self._stacks.get(pid)
                listed = self._listed.get(pid)
                # A stack taken in another state is not shown (_with_stack): it is read again now, not
                # RESTACK_S later. A rank read while it imported, then heard saying hello, had no
                # whereabouts for 10 s: GD920 named it with none, and GD923 (every rank waits to join) came
                # 10 s late (found by test_job_life's MASTER_PORT job on a loaded machine).
                moved = listed is not None and taken is not None and taken[1] != _state(listed)
                if pid in self._pending or (taken is not None and now - taken[0] < RESTACK_S and not moved):
                    continue
                self._pending.add(pid)
                self._queue.put(pid)

    def _read_stacks(self) -> None:
        while not self._closed.is_set():
            pid = self._queue.get()
            if pid is None:
                return
            listed = self._listed.get(pid)
            if listed is None or not alive(pid, listed.started):
                with self._lock:
                    self._pending.discard(pid)
                continue  # gone, or its number now belongs to another process: never read that one
            # The state the stack is valid for is the one before the read: a process that said hello (or
            # joined) while py-spy read it may show where it was before, and that stack must not be kept
            # as where it is now (its state then is read again, want_stacks).
            state = _state(listed)
            stack = probe_stacks.dump(pid, on_start=self._started)
            with self._lock:
                self._running = None
                self._stacks[pid] = (time.monotonic(), state, stack)
                self._pending.discard(pid)

    def _started(self, proc: subprocess.Popen[bytes]) -> None:
        with self._lock:
            self._running = proc
        if self._closed.is_set():
            with contextlib.suppress(OSError):
                proc.kill()

    def _with_stack(self, proc: JobProc) -> JobProc:
        with self._lock:
            taken = self._stacks.get(proc.pid)
        if taken is None or not proc.alive:
            return proc
        when, state, stack = taken
        if state != _state(proc) or time.monotonic() - when > STACK_KEPT_S:
            return proc  # it has moved on since, or nobody asked again: where it was, not where it is
        if not stack.frames:
            return replace(proc, stack_note=stack.note)
        where = torch_stacks.classify(stack.frames)
        own = torch_stacks.own_frame(stack.frames, stack.files)
        shown = tuple(f"{name} ({file}:{line})" for name, file, line in stack.frames[:MAX_FRAMES])
        at = "" if own is None else "{} ({}:{})".format(*stack.frames[own])
        return replace(proc, where=where, stack=shown, at=at)

    def close(self) -> None:
        """Stop reading stacks; a py-spy still running is killed (nothing outlives gpudoctor)."""
        self._closed.set()
        self._queue.put(None)
        with self._lock:
            running = self._running
        if running is not None:
            with contextlib.suppress(OSError):
                running.kill()
        self._thread.join(timeout=2.0)


def _state(p: JobProc) -> tuple[object, ...]:
    """What a stack is valid for: while the process has not joined, stepped or moved in or out of a step."""
    return (p.joined, p.step, p.inside)


def _order(p: JobProc) -> tuple[int, bool, int, int]:
    role = {LAUNCHER: 0, RANK: 1, CHILD_RANK: 2}.get(p.role, 3)
    return (role, p.rank is None, p.rank or 0, p.pid)
