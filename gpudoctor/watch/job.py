"""The job's life, judged: arrival before step 1, the rank that holds a stalled job up, uneven ends
(GD920-GD926; crashes are gpudoctor/watch/crash.py). Pure functions of the job's processes as the
latest sample records them (gpudoctor/watch/arrival.py), so a recording is judged as the live run was.

Every deadline here is `Thresholds.join_after_s` (30 s by default, `--join-after`, policy
`join-after-s`): the bound within which `watch` names the ranks of a job that hangs before its first
step. It is gpudoctor's choice, not torch's: torch itself says nothing for 10 minutes (NCCL) or 30
(gloo, the stores). A stall during training keeps GD911's deadline.
"""

from __future__ import annotations

from collections.abc import Sequence

from gpudoctor.knowledge import torch_stacks
from gpudoctor.watch import job_codes as codes
from gpudoctor.watch.analysis import Figure, RankRef, Verdict
from gpudoctor.watch.arrival import CHILD_RANK, LAUNCHER, RANK, JobProc
from gpudoctor.watch.model import Sample, plural
from gpudoctor.watch.thresholds import Thresholds

STACK_GRACE = 1.5  # a verdict that names ranks waits for their stacks up to this many join deadlines
STACK_CODES = {"GD911", "GD920", "GD921", "GD922", "GD923", "GD924", "GD925"}  # their ranks' stacks are read


def latest_job(win: Sequence[Sample]) -> Sample | None:
    return next((s for s in reversed(win) if s.job is not None), None)


def job_verdicts(win: Sequence[Sample], th: Thresholds, stalled: bool = False) -> list[Verdict]:
    """The verdicts of the job's processes in the window's latest sample that has them."""
    last = latest_job(win)
    if last is None or not last.job:
        return []
    procs, now = last.job, last.t
    gpu_job = any(s.procs for s in win)
    out = no_rank_started(procs, now, th)
    out += world_size_mismatch(procs, now, th)
    out += spawn_under_torchrun(procs)
    if not out or all(v.code == codes.NO_RANK_STARTED.code for v in out):  # the others explain the wait
        out += not_joined(procs, now, th, gpu_job)
    out += no_first_step(procs, now, th, gpu_job)
    out += uneven_steps(procs)
    if stalled:
        out += stall_culprit(procs, now, gpu_job)
    return out


def ranks_of(procs: Sequence[JobProc]) -> list[JobProc]:
    return [p for p in procs if p.role in (RANK, CHILD_RANK)]


def _ref(p: JobProc) -> RankRef:
    return RankRef(p.rank, p.pid)


def _refs(procs: Sequence[JobProc]) -> tuple[RankRef, ...]:
    """In rank order, whatever order the message tells them in: the verdict's key stays the same."""
    return tuple(sorted((_ref(p) for p in procs), key=lambda r: (r.rank is None, r.rank or 0, r.pid)))


def _names(procs: Sequence[JobProc]) -> str:
    known = [p for p in procs if p.rank is not None and p.role == RANK]
    if len(known) == len(procs) and known:
        return f"rank{'s' if len(known) > 1 else ''} {','.join(str(p.rank) for p in known)}"
    return ", ".join(p.label for p in procs)


def _esc(text: str) -> str:
    """Text that goes into a Figure template (formatted once with the figure)."""
    return text.replace("{", "{{").replace("}", "}}")


def _has(procs: Sequence[JobProc]) -> str:
    return "has" if len(procs) == 1 else "have"


def where(p: JobProc) -> str:
    """What its stack shows, in words ("waits in a collective at main (train.py:20)"), or why there is none."""
    if p.where:
        return torch_stacks.WORDS.get(p.where, p.where) + (f" at {p.at}" if p.at else "")
    return f"no stack: {p.stack_note}" if p.stack_note else ""


def _told(procs: Sequence[JobProc]) -> str:
    """Each process with what its stack shows, where known: "rank 0 is busy ...; rank 1 waits ..."."""
    parts = [f"{p.label} {where(p)}" for p in procs if p.where]
    notes = {p.stack_note for p in procs if not p.where and p.stack_note}
    if notes:
        parts.append(f"no stack: {'; '.join(sorted(notes))}")
    return "; ".join(parts)


def _stacks_hint(procs: Sequence[JobProc]) -> str:
    if any(p.where for p in procs):
        return "Their stacks are in the sample's `job` (watch --json, --record)."
    return "Read their stacks: py-spy dump --pid PID."


def flight_recorder_hint(procs: Sequence[JobProc], gpu_job: bool) -> str:
    """What torch's flight recorder can add (NCCL jobs): on and where its dumps go, or how to turn it on."""
    sizes = {p.trace_buffer for p in procs if p.trace_buffer}
    if sizes:
        return (
            f" torch's flight recorder is on (TORCH_NCCL_TRACE_BUFFER_SIZE={max(sizes)}): with "
            "TORCH_NCCL_DUMP_ON_TIMEOUT=1 each rank dumps its last collectives at the NCCL watchdog timeout "
            "(TORCH_NCCL_DEBUG_INFO_TEMP_FILE, /tmp/nccl_trace_rank_ by default); `torchfrtrace` reads them."
        )
    if gpu_job:
        return (
            " For NCCL, set TORCH_NCCL_TRACE_BUFFER_SIZE=2000 and TORCH_NCCL_DUMP_ON_TIMEOUT=1 (torch's flight "
            "recorder): at the watchdog timeout each rank dumps the collectives it was in."
        )
    return ""


def _verdict(code: object, procs: Sequence[JobProc], template: str, seconds: float, hint: str) -> Verdict:
    figure = Figure(seconds, template, unit=" s", span="worst")
    return Verdict(
        code.code,  # type: ignore[attr-defined]
        code.name,  # type: ignore[attr-defined]
        (),
        figure.message(seconds),
        hint,
        "fail",
        figure,
        _refs(procs),
    )


def no_rank_started(procs: Sequence[JobProc], now: float, th: Thresholds) -> list[Verdict]:
    """GD921: torchrun's agent alone for join_after_s (its rendezvous waits for nodes)."""
    out = []
    alive_ranks = [p for p in ranks_of(procs) if p.alive]
    for launcher in (p for p in procs if p.role == LAUNCHER and p.alive):
        ended = [p.ended for p in ranks_of(procs) if p.ended is not None]
        since = max([launcher.started, *ended])
        waited = now - since
        if alive_ranks or waited < th.join_after_s:
            continue
        if launcher.where != torch_stacks.RENDEZVOUS and not (launcher.stack_note and not launcher.where):
            continue  # still starting up (importing torch), or its stack is not read yet: not stuck yet
        nodes = launcher.nodes or "1"
        if nodes != "1":
            wait = f"its rendezvous waits for {nodes} nodes (--nnodes {nodes})"
        else:
            wait = "it " + torch_stacks.WORDS[torch_stacks.RENDEZVOUS]
        seen = f" ({_esc(launcher.stack_note)})" if not launcher.where and launcher.stack_note else ""
        template = f"torchrun (PID {launcher.pid}) has started no rank for {{}} s: {wait}{seen}"
        hint = (
            "Start torchrun on the other node(s) with the same --nnodes, --rdzv-id and --rdzv-endpoint (or "
            "--master-addr/--master-port and their own --node-rank), and check they reach this host's port."
        )
        out.append(_verdict(codes.NO_RANK_STARTED, [launcher], template, waited, hint))
    return out


def _missing(ranks: Sequence[JobProc]) -> list[int]:
    """Ranks of WORLD_SIZE that are not here (another node, or never started)."""
    worlds = {p.world for p in ranks if p.world and p.role == RANK}
    if len(worlds) != 1:
        return []
    seen = {p.rank for p in ranks if p.role == RANK}
    return [r for r in range(worlds.pop()) if r not in seen]


def _instrumented(ranks: Sequence[JobProc]) -> bool:
    """The ranks import gpudoctor (one said something): silence from another means it has not got there."""
    return any(p.joined is not None or p.step for p in ranks)


def not_joined(procs: Sequence[JobProc], now: float, th: Thresholds, gpu_job: bool) -> list[Verdict]:
    """GD920: ranks alive and not joined join_after_s after they started."""
    ranks = [p for p in ranks_of(procs) if p.role == RANK]
    if not _instrumented(ranks):
        return []
    late = [p for p in ranks if p.alive and not p.joined and not p.step and now - p.started >= th.join_after_s]
    if not late or all(p.where == torch_stacks.IMPORTING for p in late):
        return []  # still starting up (importing torch takes long on a busy machine): nobody waits yet
    pending = [p for p in late if not p.where and not p.stack_note]
    if pending and min(now - p.started for p in pending) < STACK_GRACE * th.join_after_s:
        return []  # their stacks are being read: say where they are, not only that they are late
    busy = [p for p in late if p.where and p.where not in torch_stacks.WAITING]
    first = set(busy)  # membership in a set: a list made the sort ranks squared (the scale audit)
    late.sort(key=lambda p: (p not in first, p.rank if p.rank is not None else 1 << 30, p.pid))
    waited = max(now - p.started for p in late)
    template = f"{_names(late)} {_has(late)} not joined the process group after {{}} s"
    told = _told(late)
    if told:
        template += f" ({_esc(told)})"
    joined = [p for p in ranks if p.joined and p.alive]
    if joined:
        template += f"; joined: {_names(joined)}"
    missing = _missing(ranks)
    if missing:
        template += f"; ranks {','.join(map(str, missing))} of {len(ranks) + len(missing)} are not on this machine"
    if busy:
        hint = (
            f"{_names(busy)} is busy before joining while the others wait: call init_process_group first on "
            "every rank, and prepare data on every rank (or before the job)."
        )
    elif missing:
        hint = "The missing ranks belong to another node: start it (same --rdzv-endpoint / --master-addr)."
    else:
        hint = "A rank busy before init_process_group, a wrong MASTER_ADDR/MASTER_PORT or a node that never started."
    hint += " " + _stacks_hint(late) + flight_recorder_hint(late, gpu_job)
    return [_verdict(codes.NOT_JOINED, late, template, waited, hint)]


def world_size_mismatch(procs: Sequence[JobProc], now: float, th: Thresholds) -> list[Verdict]:
    """GD923: a group of another size than WORLD_SIZE, or every rank started waits to join, none missing."""
    ranks = [p for p in ranks_of(procs) if p.role == RANK and p.alive]
    odd = [p for p in ranks if p.joined and p.dist_world and p.world and p.dist_world != p.world]
    if odd:
        p = odd[0]
        template = (
            f"{_names(odd)} joined a process group of {p.dist_world} ranks, but the launcher started "
            f"WORLD_SIZE={p.world}: it waits for ranks that do not exist (for {{}} s)"
        )
        hint = "Call init_process_group without world_size/rank under torchrun (env:// reads WORLD_SIZE and RANK)."
        return [_verdict(codes.WORLD_SIZE_MISMATCH, odd, template, max(0.0, now - min(p.started for p in odd)), hint)]
    if not ranks or _missing(ranks) or not all(p.world for p in ranks):
        return []
    if not all(not p.joined and not p.step and p.where == torch_stacks.JOIN for p in ranks):
        return []
    waited = min(now - p.started for p in ranks)
    if waited < th.join_after_s:
        return []
    template = (
        f"every rank started ({_names(ranks)}, WORLD_SIZE={ranks[0].world}) waits in init_process_group after "
        "{} s, and none is missing: the process group expects other ranks (a world_size or rank passed to "
        "init_process_group, or a MASTER_ADDR/MASTER_PORT set in the script)"
    )
    hint = (
        "Under torchrun call init_process_group(backend) without world_size/rank and do not set MASTER_ADDR/"
        "MASTER_PORT in the script (os.environ.setdefault if it must also run alone)."
    )
    return [_verdict(codes.WORLD_SIZE_MISMATCH, ranks, template, waited, hint)]


def spawn_under_torchrun(procs: Sequence[JobProc]) -> list[Verdict]:
    """GD924: a torchrun rank that runs mp.spawn, or processes under ranks that joined groups of their own."""
    ranks = [p for p in procs if p.role == RANK and p.alive]
    children = [p for p in procs if p.role == CHILD_RANK and p.alive]
    parents = {c.parent for c in children}  # one pass each way, not every rank against every child
    spawning = [p for p in ranks if p.where == torch_stacks.SPAWN or p.pid in parents]
    if not spawning:
        return []
    spawners = {p.pid for p in spawning}
    joined = sum(1 for c in children if c.parent in spawners)
    message = (
        f"{_names(spawning)} {'runs' if len(spawning) == 1 else 'run'} torch.multiprocessing.spawn under a "
        "launcher that already started one process per rank: ranks start ranks of their own"
        + (f" ({plural(joined, 'process', 'processes')} of theirs joined process groups)" if joined else "")
        + ", which mix in one store or wait for ranks that never come"
    )
    hint = "Launch the mp.spawn script with python alone, or drop mp.spawn and read RANK/LOCAL_RANK under torchrun."
    return [
        Verdict(
            codes.SPAWN_UNDER_TORCHRUN.code,
            codes.SPAWN_UNDER_TORCHRUN.name,
            (),
            message,
            hint,
            "fail",
            ranks=_refs(spawning),
        )
    ]


def no_first_step(procs: Sequence[JobProc], now: float, th: Thresholds, gpu_job: bool) -> list[Verdict]:
    """GD922: joined ranks and no step finished join_after_s after they joined (or entered step 1)."""
    ranks = [p for p in ranks_of(procs) if p.alive]
    if any(p.step for p in ranks_of(procs)):
        return []  # a step has ended somewhere: a stall from here is GD911's and GD925's
    waiting = [p for p in ranks if p.joined and p.since is not None and now - p.since >= th.join_after_s]
    if not waiting or all(p.where == torch_stacks.IMPORTING for p in waiting):
        return []
    inside = [p for p in ranks if p.inside]
    busy = [p for p in ranks if not p.inside and p.where and p.where not in torch_stacks.WAITING]
    culprits = busy or ([p for p in ranks if not p.inside] if inside else [])
    first = set(culprits)
    named = sorted(set(waiting) | first, key=lambda p: (p not in first, p.rank if p.rank is not None else 1 << 30))
    waited = max(now - (p.since or now) for p in waiting)
    told = _told(named)
    if inside and culprits:
        template = (
            f"{_names(inside)} {'waits' if len(inside) == 1 else 'wait'} inside step 1 while {_names(culprits)} "
            f"{_has(culprits)} not entered it, after {{}} s"
        )
    else:
        template = f"{_names(named)} joined but no rank has reached step 1 after {{}} s"
    template += f" ({_esc(told)})" if told else ""
    if culprits:
        hint = (
            f"{_names(culprits)} keeps the others waiting in their first collective (rank-only data preparation, "
            "a download, a cache): let every rank do that work, or do it before the job."
        )
    else:
        hint = "A long preparation on every rank is fine; one rank's alone keeps the others waiting."
    hint += " " + _stacks_hint(named) + flight_recorder_hint(named, gpu_job)
    return [_verdict(codes.NO_FIRST_STEP, named, template, waited, hint)]


def uneven_steps(procs: Sequence[JobProc]) -> list[Verdict]:
    """GD926: a rank ended its loop and exited normally while another went on to a later step."""
    ranks = [p for p in ranks_of(procs) if p.step is not None or p.inside]
    early = [p for p in ranks if p.exit == "normal" and not p.inside]
    if not early:
        return []
    first = min(early, key=lambda p: p.reached)
    further = [p for p in ranks if p.reached > first.reached]
    if not further:
        return []
    top = max(p.reached for p in further)
    stuck = [p for p in further if p.alive]
    message = (
        f"{first.label} finished its loop after step {first.reached} and exited, while "
        f"{_names(further)} went on to step {top}: the ranks had different numbers of batches"
        + (f"; {_names(stuck)} now waits for it in a collective" if stuck else "")
    )
    hint = (
        "Give every rank the same number of batches (DistributedSampler, drop_last=True), or wrap the loop in "
        "`with model.join():` for uneven inputs (DistributedDataParallel.join)."
    )
    return [
        Verdict(
            codes.UNEVEN_STEPS.code,
            codes.UNEVEN_STEPS.name,
            (),
            message,
            hint,
            "fail",
            ranks=_refs([first, *further]),
        )
    ]


def stall_culprit(procs: Sequence[JobProc], now: float, gpu_job: bool) -> list[Verdict]:
    """GD925 (only during a stall, GD911): who is outside its step (or gone) while others wait inside."""
    ranks = [p for p in ranks_of(procs) if p.step is not None or p.inside is not None]
    placed = [p for p in ranks if p.inside is not None or not p.alive]
    if not placed:
        return []
    top = max(p.reached for p in placed)
    waiting = [p for p in placed if p.alive and p.inside and p.reached == top]
    inside = set(waiting)
    holding = [p for p in placed if p not in inside]
    since = [now - p.since for p in placed if p.since is not None and p.alive]
    stuck_s = max(since) if since else 0.0

    def place(p: JobProc) -> str:
        if not p.alive:
            return f"{p.label} has exited (after step {p.step or 0})"
        state = f"inside step {p.reached}" if p.inside else f"outside its step after step {p.step or 0}"
        seen = _esc(where(p))
        return f"{p.label} is {state}" + (f": it {seen}" if seen and not seen.startswith("no stack") else "")

    if waiting and holding:
        named = holding
        template = (
            "; ".join(place(p) for p in holding)
            + f" while {_names(waiting)} wait{'s' if len(waiting) == 1 else ''} inside step {top} "
            "(stuck for {} s): " + ("it holds" if len(holding) == 1 else "they hold") + " the others up"
        )
    else:
        named = placed
        if all(p.inside for p in placed):
            template = (
                f"every rank waits inside step {top} for {{}} s: a collective that cannot complete (collectives "
                "called in a different order, a rank elsewhere, a network fault)"
            )
        else:
            template = (
                f"every rank is outside its step after step {top} for {{}} s: the job stalls between steps "
                "(its data, evaluation, checkpointing)"
            )
        told = _told(placed)
        template += f" ({_esc(told)})" if told else ""
    hint = "Look at the named ranks' stacks and logs. " + _stacks_hint(named) + flight_recorder_hint(named, gpu_job)
    return [_verdict(codes.STALL_CULPRIT, named, template, stuck_s, hint)]
