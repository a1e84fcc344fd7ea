"""The job verdicts' rules (gpudoctor/watch/job.py) on job states a real job passes through quickly or
only on some machines (still importing, stacks not read yet, py-spy missing, NCCL): the real jobs of
test_job_life.py show the verdicts themselves."""

from __future__ import annotations

from gpudoctor.watch.arrival import CHILD_RANK, LAUNCHER, RANK, JobProc
from gpudoctor.watch.job import job_verdicts
from gpudoctor.watch.model import ProcReading, Sample
from gpudoctor.watch.summary import SummaryBuilder
from gpudoctor.watch.thresholds import Thresholds

TH = Thresholds(join_after_s=30.0)
T0 = 1000.0


def judged(*procs: JobProc, at: float = T0 + 40, stalled: bool = False, gpu: bool = False) -> dict[str, str]:
    procs_on_gpu = (ProcReading(procs[-1].pid, 0),) if gpu else None
    sample = Sample(at, (), procs=procs_on_gpu, job=procs)
    return {v.code: v.message + " | " + v.hint for v in job_verdicts([sample], TH, stalled)}


def rank(r: int, **kw: object) -> JobProc:
    fields: dict[str, object] = {"rank": r, "world": 2, "joined": False}
    fields.update(kw)
    return JobProc(100 + r, RANK, T0, **fields)  # type: ignore[arg-type]


def test_ranks_still_importing_are_not_called_stuck_but_one_waiting_for_them_is() -> None:
    importing = {"where": "importing", "at": "<module> (train.py:1)"}
    assert judged(rank(0, **importing), rank(1, **importing)) == {}
    got = judged(rank(0, where="join", at="main (train.py:9)"), rank(1, **importing))
    assert "rank 1 is still importing modules" in got["GD920"] and "rank 0 waits to join" in got["GD920"]


def test_a_late_rank_is_named_once_its_stack_is_read_or_cannot_be() -> None:
    assert judged(rank(0), rank(1)) == {}  # stacks being read: wait (up to 1.5 deadlines)
    assert "GD920" in judged(rank(0), rank(1), at=T0 + 46)  # ...not longer
    note = "py-spy is not installed (`pip install py-spy` shows where each stuck rank is)"
    got = judged(rank(0, stack_note=note), rank(1, stack_note=note))
    assert got["GD920"].startswith("ranks 0,1 have not joined the process group after 40 s (no stack: py-spy")


def test_a_job_that_never_imports_gpudoctor_is_not_judged_on_arrival() -> None:
    assert judged(rank(0, joined=None, stack_note="x"), rank(1, joined=None, stack_note="x")) == {}


def test_ranks_of_world_size_not_on_this_machine_are_named() -> None:
    got = judged(rank(0, world=4, stack_note="n"), rank(1, world=4, joined=True, stack_note="n"))
    assert "joined: rank 1; ranks 2,3 of 4 are not on this machine" in got["GD920"]
    assert "another node" in got["GD920"]


def test_a_launcher_alone_is_named_only_once_its_stack_shows_the_rendezvous() -> None:
    launcher = JobProc(50, LAUNCHER, T0, world=4, nodes="2")
    assert judged(launcher) == {}  # its stack is not read yet
    assert judged(JobProc(50, LAUNCHER, T0, nodes="2", where="importing")) == {}
    got = judged(JobProc(50, LAUNCHER, T0, nodes="2", where="rendezvous"))
    assert got["GD921"].startswith("torchrun (PID 50) has started no rank for 40 s: its rendezvous waits for 2 nodes")
    got = judged(JobProc(50, LAUNCHER, T0, stack_note="py-spy is not installed"))
    assert "(py-spy is not installed)" in got["GD921"]


def test_a_stall_where_every_rank_waits_inside_names_all_and_the_flight_recorder() -> None:
    inside = {"joined": True, "step": 7, "inside": True, "since": T0 + 5}
    got = judged(rank(0, **inside), rank(1, **inside, trace_buffer=2000), stalled=True)
    assert got["GD925"].startswith("every rank waits inside step 8 for 35 s")
    assert "TORCH_NCCL_TRACE_BUFFER_SIZE=2000" in got["GD925"]
    got = judged(rank(0, **inside), rank(1, **inside), stalled=True, gpu=True)
    assert "set TORCH_NCCL_TRACE_BUFFER_SIZE=2000 and TORCH_NCCL_DUMP_ON_TIMEOUT=1" in got["GD925"]
    assert judged(rank(0, **inside), rank(1, **inside)) == {}  # no stall (GD911): no culprit to find


def test_a_rank_that_exited_while_others_wait_is_the_one_they_wait_for() -> None:
    got = judged(
        rank(0, joined=True, step=7, inside=False, ended=T0 + 6, exit="normal"),
        rank(1, joined=True, step=7, inside=True, since=T0 + 5),
        stalled=True,
    )
    assert got["GD925"].startswith("rank 0 has exited (after step 7) while rank 1 waits inside step 8")
    assert got["GD926"].startswith("rank 0 finished its loop after step 7 and exited, while rank 1 went on to step 8")


def test_ranks_under_a_rank_that_join_groups_of_their_own_are_spawn_under_torchrun() -> None:
    children = [JobProc(200 + i, CHILD_RANK, T0, rank=i, parent=100, joined=True, since=T0) for i in range(2)]
    got = judged(rank(0, where="spawn"), rank(1, stack_note="n"), *children)
    assert got["GD924"].startswith("rank 0 runs torch.multiprocessing.spawn")
    assert "(2 processes of theirs joined process groups)" in got["GD924"]
    assert "GD920" not in got
    # without a stack, the ranks under rank 0 alone say it spawns (the parents are looked up, not scanned)
    got = judged(rank(0, stack_note="n"), rank(1, stack_note="n"), *children)
    assert got["GD924"].startswith("rank 0 runs torch.multiprocessing.spawn"), got
    assert "(2 processes of theirs joined process groups)" in got["GD924"] and "rank 1" not in got["GD924"]


def test_a_span_keeps_its_key_while_its_ranks_are_told_in_another_order() -> None:
    b = SummaryBuilder("test", TH)
    first = (rank(0, where="join"), rank(1, where="other", at="prep (t.py:3)"))
    then = (rank(0, where="other", at="prep (t.py:3)"), rank(1, where="join"))
    for i, procs in enumerate([first, first, then, then]):
        b.add(Sample(T0 + 40 + i, (), job=procs))
    spans = [s for s in b.summary().spans if s.verdict.code == "GD920"]
    assert len(spans) == 1 and spans[0].samples == 4
    assert spans[0].verdict.message.startswith("ranks 0,1 have not joined the process group after 43 s (rank 0 is busy")
