"""The training-step API (`gpudoctor.step()`), its private channel to `watch`, and the rank verdicts."""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from gpudoctor.training_step import ENV, EVENT_MAGIC, MAGIC, RECORD, SOCKET_NAME
from gpudoctor.watch import analysis
from gpudoctor.watch.model import RankReading, Sample
from gpudoctor.watch.steps import StepChannel
from gpudoctor.watch.summary import render_text, summarize
from gpudoctor.watch.thresholds import Thresholds
from tests.helpers.channel import raw_channel
from tests.helpers.processes import GpudoctorCli, clean_env
from tests.paths import FIXTURES

JOBS = FIXTURES / "jobs"
NO_WARMUP = Thresholds(warmup_s=0)


def python(code: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})}
    )


def wait_for(cond, timeout: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


# -- the API, unwatched --------------------------------------------------------------------------------


def test_step_imports_nothing_heavy_and_is_a_no_op_when_nobody_watches() -> None:
    code = (
        "import sys, gpudoctor\n"
        "gpudoctor.step()\n"
        "with gpudoctor.step():\n"
        "    pass\n"
        "gpudoctor.step(input_wait=0.1)\n"
        "print(sorted(m for m in ('torch', 'click', 'textual', 'rich', 'psutil') if m in sys.modules))\n"
    )
    r = python(code, env={ENV: ""})
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]" and r.stderr == ""


@pytest.mark.parametrize(
    ("wait", "error"),
    [(float("nan"), ValueError), (-5, ValueError), (float("inf"), ValueError), ("1", TypeError), (True, TypeError)],
)
def test_an_input_wait_that_is_not_seconds_raises_watched_or_not(wait: object, error: type) -> None:
    import gpudoctor

    with pytest.raises(error, match="input_wait"):
        gpudoctor.step(input_wait=wait)  # type: ignore[arg-type]
    gpudoctor.step(input_wait=0)  # zero and whole numbers are seconds too


def test_a_channel_that_is_not_private_is_refused_once_and_steps_stay_silent(tmp_path: Path) -> None:
    open_dir = tmp_path / "open"
    open_dir.mkdir(mode=0o755)
    open_dir.chmod(0o755)
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    link = tmp_path / "link"
    link.symlink_to(real)
    not_a_socket = tmp_path / "plain"
    not_a_socket.mkdir(mode=0o700)
    (not_a_socket / SOCKET_NAME).write_text("")
    code = "import gpudoctor\nfor _ in range(3):\n    gpudoctor.step()\nprint('trained')"
    for path, why in (
        (open_dir, "is not a private directory of this user"),
        (link, "is not a private directory of this user"),  # a symlink is never followed
        (not_a_socket, "is not a socket of this user"),
        (tmp_path / "missing", "No such file or directory"),
    ):
        r = python(code, env={ENV: str(path)})
        assert r.returncode == 0 and r.stdout.strip() == "trained", r.stderr
        assert r.stderr.count("gpudoctor.step:") == 1 and why in r.stderr and "not publishing steps" in r.stderr


def test_the_last_steps_wait_for_a_watcher_that_is_behind_rather_than_vanish(tmp_path: Path) -> None:
    """CI at stop 28 summarized 34 of a job's 40 steps: under load the watcher's thread was behind its queue
    of 10 datagrams when the job exited, and the last record (carrying every step since the last one that
    got through) timed out after 0.2 s and was dropped. Here the watcher reads nothing until the job has
    printed its last line, and 0.5 s more: every step still arrives."""
    directory, sock = raw_channel(tmp_path)
    code = (
        "import time, gpudoctor\nfor _ in range(40):\n    with gpudoctor.step():\n        time.sleep(0.06)\n"
        "print('done', flush=True)"
    )  # a record a step: the queue is full long before the end
    job = subprocess.Popen(
        [sys.executable, "-c", code], env=clean_env(**{ENV: str(directory)}), stdout=subprocess.PIPE, text=True
    )
    try:
        assert job.stdout is not None and job.stdout.readline().strip() == "done"
        time.sleep(0.5)  # the job is in its exit now, its queue full: it must wait, not drop
        sock.settimeout(10)
        steps = 0
        while steps < 40:  # (a record lost: the read times out and the count says so)
            try:
                data = sock.recv(65536)
            except TimeoutError:
                break
            if len(data) == RECORD.size and data[:4] == MAGIC:
                steps += RECORD.unpack(data)[3]
        assert steps == 40
    finally:
        job.kill()
        job.wait()
        sock.close()


# -- the channel ---------------------------------------------------------------------------------------


def test_the_channel_is_a_private_directory_with_a_private_socket_and_goes_away() -> None:
    channel = StepChannel(accept=lambda pid: True)
    try:
        st = os.lstat(channel.directory)
        assert st.st_mode & 0o777 == 0o700 and st.st_uid == os.geteuid()
        assert os.lstat(channel.path).st_mode & 0o777 == 0o600
        assert channel.env == {ENV: channel.directory}
    finally:
        channel.close()
    assert not os.path.exists(channel.directory)


def test_steps_of_a_job_process_arrive_per_rank_with_step_time_and_input_wait() -> None:
    code = (
        "import time, gpudoctor\n"
        "start = time.monotonic()\n"
        "for i in range(6):\n"
        "    time.sleep(0.04)  # waiting for the batch\n"
        "    with gpudoctor.step():\n"
        "        time.sleep(0.06)  # the step's work\n"
        "for i in range(3):\n"
        "    time.sleep(0.1)\n"
        "    gpudoctor.step()  # plain calls: each ends a step (the clock runs since the last block)\n"
        "print(time.monotonic() - start)\n"
    )
    channel = StepChannel()
    try:
        proc = subprocess.Popen(
            [sys.executable, "-c", code], env={**os.environ, **channel.env, "RANK": "3"}, stdout=subprocess.PIPE
        )
        channel.accept = lambda pid: pid == proc.pid
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0
        loop_s = float(out)  # the job's own clock around its loop
        wait_for(lambda: channel._ranks and next(iter(channel._ranks.values())).last_step == 9)
        (r,) = channel.take()
        assert (r.rank, r.pid, r.steps, r.last_step) == (3, proc.pid, 9, 9)
        # Bounds that hold under any load: a sleep never ends early, and the 9 steps lie inside the
        # loop the job timed itself. The first step is its body alone (0.06 s, the clock starts at the
        # first call), the other 8 take at least 0.1 s; waits are counted for the 6 `with` steps, the
        # first of them ~0, the others at least 0.04 s, and never more than the loop left for them.
        assert r.step_s is not None and (0.06 + 8 * 0.1) / 9 - 1e-3 <= r.step_s <= loop_s / 9 + 1e-6
        assert r.wait_s is not None and 5 * 0.04 / 6 - 1e-3 <= r.wait_s
        assert r.wait_s * 6 <= loop_s - 6 * 0.06 - 3 * 0.1 + 1e-6 and r.wait_s <= r.step_s
        assert r.last_end is not None and abs(r.last_end - time.time()) < 30
        (again,) = channel.take()
        assert again.steps == 0 and again.last_step == 9  # an idle interval still says where the rank is
    finally:
        channel.close()


def test_a_with_step_inside_another_is_one_step() -> None:
    """Hostile review 2, L2: `with step(): with step():` (a helper that marks its own step, called
    inside the loop's) counted 2 steps an iteration. The outer block is the step."""
    code = (
        "import time, gpudoctor\n"
        "for i in range(30):\n"
        "    with gpudoctor.step():\n"
        "        with gpudoctor.step():\n"
        "            time.sleep(0.002)\n"
    )
    channel = StepChannel()
    try:
        proc = subprocess.Popen([sys.executable, "-c", code], env={**os.environ, **channel.env, "RANK": "0"})
        channel.accept = lambda pid: pid == proc.pid
        assert proc.wait(timeout=60) == 0
        wait_for(lambda: channel._ranks and next(iter(channel._ranks.values())).last_step == 30)
        (r,) = channel.take()
        assert (r.steps, r.last_step) == (30, 30)
    finally:
        channel.close()


def test_a_forked_child_publishes_its_own_steps_from_its_own_count() -> None:
    """step() no longer calls getpid() (os.register_at_fork resets the publisher in the child): a child
    forked mid-loop counts its steps from 0 on its own socket, and the parent's count goes on."""
    code = (
        "import os, sys, time, gpudoctor\n"
        "def steps(n):\n"
        "    for _ in range(n):\n"
        "        with gpudoctor.step():\n"
        "            time.sleep(0.06)\n"
        "steps(3)\n"
        "child = os.fork()\n"
        "if child == 0:\n"
        "    steps(4)\n"
        "    sys.exit(0)\n"
        "os.waitpid(child, 0)\n"
        "steps(2)\n"
        "print(child)\n"
    )
    channel = StepChannel(accept=lambda pid: True)
    try:
        r = python(code, env=channel.env)
        assert r.returncode == 0, r.stderr
        child, parent = int(r.stdout), None
        wait_for(lambda: sorted(a.last_step or 0 for a in channel._ranks.values()) in ([4, 5], [5, 7]))
        last = {reading.pid: reading.last_step for reading in channel.take()}
        parent = next(pid for pid in last if pid != child)
        assert last == {child: 4, parent: 5}
    finally:
        channel.close()


def test_records_from_outside_the_job_or_forged_are_ignored_and_counted() -> None:
    channel = StepChannel()
    try:
        channel.accept = lambda pid: False  # nobody is the job
        r = python("import gpudoctor\nfor _ in range(3):\n    gpudoctor.step()\n", env=channel.env)
        assert r.returncode == 0
        # a process that writes to the socket itself, claiming another PID: the kernel's PID counts
        forged = RECORD.pack(MAGIC, 0, 1, 1, 0, 0, 1, time.time(), 0.1, 0.1, 0.0, 0.0)
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
            s.sendto(forged, channel.path)
            s.sendto(b"garbage", channel.path)
        wait_for(lambda: channel.rejected >= 3)
        assert channel.take() == ()
        assert channel.note is not None and "from outside the job or damaged" in channel.note
    finally:
        channel.close()


def test_another_user_cannot_reach_the_channel(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to act as another user")
    channel = StepChannel(accept=lambda pid: True)
    try:
        code = (
            "import os, socket\n"
            "os.setgid(65534); os.setuid(65534)\n"
            "s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)\n"
            "try:\n"
            f"    s.sendto(b'x' * {RECORD.size}, {channel.path!r})\n"
            "    print('sent')\n"
            "except PermissionError:\n"
            "    print('refused')\n"
        )
        r = python(code)
        assert r.stdout.strip() == "refused", r.stderr
    finally:
        channel.close()


# -- analysis of rank readings ---------------------------------------------------------------------


def ranks_run(
    n: int,
    step_s: float = 0.5,
    late: dict[int, float] | None = None,
    wait: dict[int, float] | None = None,
    slow: dict[int, float] | None = None,
    stop_at: int | None = None,
    behind: int | None = None,
    n_ranks: int = 4,
) -> list[Sample]:
    """n one-second samples of `n_ranks` ranks stepping every `step_s` (rank r: `slow` step time, ending
    `late` seconds after the others, waiting `wait` of each step); from `stop_at` nobody steps, `behind` one short."""
    out = []
    t0 = 1_700_000_000.0
    for i in range(n):
        t = t0 + i
        rs = []
        for r in range(n_ranks):
            s = (slow or {}).get(r, step_s)
            per = 1.0 / s
            steps, last, end = round(per), round(per * (i + 1)), t - 0.05 + (late or {}).get(r, 0.0)
            if stop_at is not None and i >= stop_at:
                steps, last = 0, round(per * stop_at) - (1 if r == behind else 0)
                end = t0 + stop_at - 1 - 0.05 - (s if r == behind else 0)
            rs.append(
                RankReading(
                    pid=1000 + r,
                    rank=r,
                    steps=steps,
                    step_s=s if steps else None,
                    wait_s=(wait or {}).get(r, 0.0) * s if steps else None,
                    last_step=last,
                    last_end=end,
                )
            )
        out.append(Sample(t, (), 20.0, None, ranks=tuple(rs)))
    return out


def verdicts(samples: list[Sample], th: Thresholds = NO_WARMUP) -> dict[str, list[tuple[int | None, ...]]]:
    found: dict[str, list[tuple[int | None, ...]]] = {}
    for v in analysis.analyze(analysis.window(samples, th.window_s), th).verdicts:
        found.setdefault(v.code, []).append(tuple(r.rank for r in v.ranks))
    return found


def test_even_ranks_have_no_verdict() -> None:
    assert verdicts(ranks_run(30)) == {}


def test_a_rank_ending_its_steps_late_is_named_even_with_equal_step_times() -> None:
    found = verdicts(ranks_run(30, late={2: 0.15}))  # synchronized ranks: step times agree, rank 2 ends late
    assert found == {"GD909": [(2,)]}
    (v,) = analysis.analyze(ranks_run(30, late={2: 0.15}), NO_WARMUP).verdicts
    assert "rank 2 ends each step 150 ms after the others (step 500 ms)" in v.message
    assert verdicts(ranks_run(30, late={2: 0.02})) == {}  # 4% of the step: timer noise, not a straggler


def test_a_rank_with_slower_steps_is_named_and_a_rank_waiting_for_input_too() -> None:
    assert verdicts(ranks_run(30, slow={1: 1.0})) == {"GD909": [(1,)]}
    assert verdicts(ranks_run(30, wait={3: 0.4})) == {"GD909": [(3,)]}  # only rank 3 waits: it holds the rest
    assert verdicts(ranks_run(30, wait={0: 0.4, 1: 0.4, 2: 0.35, 3: 0.45})) == {"GD910": [(0, 1, 2, 3)]}


def _mixed(samples: list[Sample], wait_step_s: float) -> list[Sample]:
    """Every rank's loop mixes `with step():` (its wait measured, the step `wait_step_s` long) and a
    plain `step()` just after it (~0 s, no wait measured): half the steps measured a wait."""
    out = []
    for s in samples:
        ranks = tuple(
            dataclasses.replace(r, waited=r.steps // 2, wait_step_s=wait_step_s) if r.steps else r
            for r in s.ranks or ()
        )
        out.append(dataclasses.replace(s, ranks=ranks))
    return out


def test_the_input_wait_share_is_over_the_steps_that_measured_a_wait() -> None:
    """Hostile review 2, M1: the mean wait of the waited steps was multiplied by every step: 199%."""
    # 10 ms of wait, then a 30 ms body, then a plain step(): 2 steps of 20 ms mean, one wait of 10 ms in 40.
    run = _mixed(ranks_run(30, step_s=0.02, wait={r: 0.5 for r in range(4)}), wait_step_s=0.04)
    shares = [st.wait_share for st in analysis.rank_stats(analysis.window(run, 30)).values()]
    assert shares == [pytest.approx(0.25)] * 4
    summary = summarize(run, "x", NO_WARMUP)
    assert [r.to_json()["wait_share"] for r in summary.ranks.values()] == [0.25] * 4
    # ...and no GD910 for the job when each waited step is mostly work (10 ms of wait in 50): 20%
    calm = _mixed(ranks_run(30, step_s=0.025, wait={r: 0.4 for r in range(4)}), wait_step_s=0.05)
    assert verdicts(calm) == {}
    assert [r.to_json()["wait_share"] for r in summarize(calm, "x", NO_WARMUP).ranks.values()] == [0.2] * 4


def test_a_loop_mixing_with_step_and_plain_step_waits_at_most_all_of_its_time(
    gpudoctor_cli: GpudoctorCli,
) -> None:
    """Hostile review 2, M1, end to end: the reviewer's loop was summarized as 199% input wait."""
    code = (
        "import time, gpudoctor\n"
        "for i in range(100):\n"
        "    time.sleep(0.01)\n"
        "    with gpudoctor.step():\n"
        "        pass\n"
        "    gpudoctor.step()\n"
    )
    r = gpudoctor_cli("watch", "--no-tui", "--json", "--", sys.executable, "-c", code, env=clean_env(RANK="0"))
    assert r.returncode == 0, r.stderr
    (rank,) = json.loads(r.stdout.splitlines()[-1])["ranks"]
    assert rank["steps"] == 200
    # The waited steps are their wait (an empty body): near 100%, never above.
    assert 0.5 <= rank["wait_share"] <= 1.0


def test_a_step_record_of_an_older_gpudoctor_is_still_taken() -> None:
    """A job may import an older gpudoctor than the watcher's: its records (GDS1) still count."""
    from gpudoctor.watch.steps import MAGIC_V1, RECORD_V1

    channel = StepChannel()
    try:
        me = os.getpid()
        channel.accept = lambda pid: pid == me
        old = RECORD_V1.pack(MAGIC_V1, 0, 1, 4, 2, 0, 4, time.time(), 0.4, 0.1, 0.08)
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.sendto(old, channel.path)
        wait_for(lambda: channel._ranks)
        (r,) = channel.take()
        assert (r.steps, r.step_s, r.wait_s, r.waited) == (4, 0.1, 0.04, 2)
        assert channel.rejected == 0
    finally:
        channel.close()


def test_stalled_steps_name_the_rank_behind_after_the_deadline() -> None:
    th = Thresholds(warmup_s=0, hang_after_s=10)
    run = ranks_run(60, stop_at=40, behind=1)
    assert verdicts(run[:48], th) == {}  # 8 s quiet: not yet
    found = verdicts(run, th)
    assert found == {"GD911": [(1,)]}
    (v,) = analysis.analyze(analysis.window(run, 30), th).verdicts
    assert v.severity == "fail" and "rank 1 at step 79" in v.message and "(step 80)" in v.message
    default = ranks_run(100, stop_at=20)  # deadline by default: 60 s (or 10 steps' time, if longer)
    assert verdicts(default[:75], NO_WARMUP) == {}
    assert verdicts(default, NO_WARMUP) == {"GD911": [(0, 1, 2, 3)]}  # all stopped after the same step


def test_warm_up_holds_balance_verdicts_but_not_a_hang() -> None:
    run = ranks_run(50, late={2: 0.15})
    early = summarize(run[:40], "x", Thresholds(warmup_s=45))
    assert early.spans == []
    later = summarize(run, "x", Thresholds(warmup_s=45))
    assert [sp.verdict.code for sp in later.spans] == ["GD909"] and later.spans[0].start == run[45].t
    hung = summarize(ranks_run(100, stop_at=5), "x", Thresholds(warmup_s=600, hang_after_s=10))
    assert [sp.verdict.code for sp in hung.spans] == ["GD911"]


def test_a_span_quotes_its_figure_over_the_whole_span() -> None:
    grows = ranks_run(30, late={2: 0.1}) + ranks_run(30, late={2: 0.3})[0:30]
    for i, s in enumerate(grows):  # one continuous run: 30 s 100 ms late, then 30 s 300 ms late
        grows[i] = Sample(
            1_700_000_000.0 + i,
            (),
            20.0,
            None,
            ranks=tuple(
                RankReading(
                    **{
                        **r.__dict__,
                        "last_step": 2 * (i + 1),
                        "last_end": 1_700_000_000.0 + i - 0.05 + (0.1 if i < 30 else 0.3) * (r.rank == 2),
                    }
                )
                for r in s.ranks or ()
            ),
        )
    summary = summarize(grows, "x", NO_WARMUP)
    (span,) = summary.spans
    first_window = analysis.analyze(grows[:10], NO_WARMUP).verdicts[0]
    assert "100 ms after" in first_window.message  # what it said when it first fired...
    assert span.mean is not None and 150 < span.mean < 260  # ...and over the span, more
    assert span.worst is not None and 280 <= span.worst <= 300  # the last window's mean, nearly all 300 ms
    assert f"{span.mean:.0f} ms after" in span.message and span.worst_text == f"{span.worst:.0f} ms late"
    text = render_text(summary)
    assert f"rank 2 ends each step {span.mean:.0f} ms after" in text and f"worst {span.worst:.0f} ms late" in text
    doc = summary.to_json()
    assert doc["verdicts"][0]["figure"]["worst"] == pytest.approx(span.worst, abs=0.01)
    assert doc["verdicts"][0]["ranks"] == [{"rank": 2, "pid": 1002}]


# -- end to end -----------------------------------------------------------------------------------------
# `gpudoctor watch --no-tui --json` in the clean environment: real NVML, never the fake (here, no GPU).


def test_watch_follows_steps_without_a_gpu_and_says_so_once(tmp_path: Path, gpudoctor_cli: GpudoctorCli) -> None:
    code = "import time, gpudoctor\nfor i in range(40):\n    with gpudoctor.step():\n        time.sleep(0.05)\n"
    r = gpudoctor_cli(
        "watch", "--no-tui", "--json", "--interval", "0.3", "--", sys.executable, "-c", code, env=clean_env(RANK="0")
    )
    if "no GPU to watch" not in r.stderr:
        pytest.skip("this machine has a GPU: the no-GPU path is not taken")
    assert r.returncode == 0, r.stderr
    assert r.stderr.count("no GPU to watch") == 1
    lines = [json.loads(x) for x in r.stdout.splitlines()]
    summary = lines[-1]
    assert summary["kind"] == "summary" and summary["gpus"] == []
    assert [(x["rank"], x["steps"]) for x in summary["ranks"]] == [(0, 40)]
    assert any(x.get("ranks") for x in lines[:-1])  # rank rows in the samples too
    assert all(x["gpus"] == [] for x in lines[:-1])


@pytest.mark.slow
@pytest.mark.parametrize("where", ["after", "input"])
def test_a_real_gloo_job_names_its_slow_rank_from_its_steps(where: str, gpudoctor_cli: GpudoctorCli) -> None:
    """torchrun, 2 ranks, DDP over gloo; rank 1 slowed on purpose (rank-only work after its optimizer
    step, or its data late): named as the straggler by rank, from the step records alone (no GPU)."""
    job = [str(JOBS / "ddp_steps.py"), "--steps", "45", "--slow-rank", "1", "--slow-s", "0.12", "--slow-where", where]
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", *job]
    r = gpudoctor_cli("watch", "--no-tui", "--json", "--warmup", "0", "--interval", "0.5", "--", *torchrun, timeout=240)
    assert r.returncode == 0, r.stderr[-2000:]
    summary = json.loads(r.stdout.splitlines()[-1])
    assert [x["steps"] for x in summary["ranks"]] == [45, 45]
    named = [(v["code"], [x["rank"] for x in v["ranks"]]) for v in summary["verdicts"]]
    assert ("GD909", [1]) in named, named
    assert all(ranks != [0] for code, ranks in named if code == "GD909")
    assert "GD910" not in [c for c, _ in named]  # one rank's input, not the job's


def _record(rank: int = 0, end: float | None = None, step: float = 0.1, last: int = 1, **over: float) -> bytes:
    fields = {"count": 1, "waited": 0, "dropped": 0, "sum_wait": 0.0, **over}
    return RECORD.pack(
        MAGIC,
        rank,
        1,
        fields["count"],
        fields["waited"],
        fields["dropped"],
        last,
        time.time() if end is None else end,
        step,
        fields.get("max_step", step),
        fields["sum_wait"],
        fields.get("waited_step", fields["sum_wait"]),
    )


@pytest.mark.parametrize(
    "record",
    [
        _record(step=1e308),  # a float, not a step time: two of them summed are inf
        _record(step=0.1, max_step=1e308),
        _record(sum_wait=1e308, waited=1),
        _record(end=1e308),
        _record(end=time.time() + 10 * 86_400),  # an end of a step ten days from now
        _record(last=2**63),  # beyond what a JSON number holds exactly
        _record(dropped=2**31),
        _record(rank=2**31 - 1),
        _record(step=172_800.0, max_step=86_400.0, count=2, waited=1, waited_step=172_800.0),  # a waited step of 2 days
    ],
    # Named, not shown: a record holds the time it was built, and xdist's workers must collect the same ids.
    ids=["step", "max_step", "sum_wait", "end", "end_in_ten_days", "last", "dropped", "rank", "waited_step"],
)
def test_a_step_record_with_values_no_training_loop_sends_is_ignored_and_counted(record: bytes) -> None:
    """Issue 24: step records accepted 1e308; the watcher's sums turned to inf."""
    channel = StepChannel()
    try:
        me = os.getpid()
        channel.accept = lambda pid: pid == me
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
            s.sendto(record, channel.path)
            s.sendto(_record(rank=0, step=0.25, last=7), channel.path)  # a sane one after it
        wait_for(lambda: channel._ranks)
        (r,) = channel.take()
        assert (r.rank, r.steps, r.step_s, r.last_step) == (0, 1, 0.25, 7)
        assert channel.rejected == 1 and channel.note is not None and "damaged" in channel.note
    finally:
        channel.close()


def test_a_process_flooding_records_is_held_to_a_rate_and_to_one_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 24: step records floods. The publisher sends ~20 a second (FLUSH_S); past a burst, a
    process is held to steps.RATE a second, and the ranks followed are bounded."""
    from gpudoctor.watch import steps

    channel = StepChannel()
    try:
        now = [1000.0]
        monkeypatch.setattr(channel, "clock", lambda: now[0])
        for i in range(1000):  # all at once: only the burst gets through
            channel._add(42, _record(rank=i % 7, last=i + 1))
        assert channel.flooded == 1000 - steps.BURST
        assert len(channel._ranks) == 1  # one process is one rank, whatever numbers it claims
        now[0] += 1.0  # a second later: RATE more
        accepted = 0
        for i in range(1000):
            before = channel.flooded
            channel._add(42, _record(last=2000 + i))
            accepted += channel.flooded == before
        assert accepted == steps.RATE
        for pid in range(100, 100 + steps.MAX_RANKS + 50):  # a flood of processes
            channel._add(pid, _record(rank=pid))
        assert len(channel._ranks) == steps.MAX_RANKS
        assert channel.note is not None and f"beyond {steps.RATE:.0f} a second from one process" in channel.note
    finally:
        channel.close()


def test_a_ranks_process_is_replaced_once_gone_even_when_its_number_was_taken_again() -> None:
    """Review 6 F8 and review 7: a rank's old process is replaced by a new one with its number only once it no
    longer runs: a live one (two runs under one watch) keeps its steps; a process that holds the old number
    but started after it was heard (a reused PID, a thread) is not it, and the old entry goes."""
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    channel = StepChannel()
    try:
        channel._add(other.pid, _record(rank=0, last=5))
        channel._add(os.getpid(), _record(rank=0, last=9))  # another live process says rank 0: both kept
        assert sorted(r.pid for r in channel.take()) == sorted([other.pid, os.getpid()])
        channel._ranks[(0, other.pid)].heard = time.time() - 3600  # heard long before this process started
        channel._add(1, _record(rank=0, last=1))  # a third process with rank 0 arrives (PID 1 runs too)
        assert {r.pid for r in channel.take()} == {os.getpid(), 1}
    finally:
        channel.close()
        other.kill()
        other.wait()


def test_a_job_process_reaped_before_its_last_record_is_read_still_has_it_counted() -> None:
    """Found under load (test_held's restarted job at interval 3: a rank counted 94 of its 100 steps, 'ignored
    3 step records from outside the job'): the watcher's thread read a rank's last record after the rank had
    exited and been reaped, so it was no descendant of the job any more. A process whose earlier records were
    accepted keeps them accepted while no other process holds its PID. Here the check of its last record is
    held until the process is reaped."""
    calls: list[int] = []
    reaped = threading.Event()

    def accept(pid: int) -> bool:  # what Job.owns asks: a child of ours, now
        calls.append(pid)
        if len(calls) == 2:
            assert reaped.wait(10)
        try:
            return psutil.Process(pid).ppid() == os.getpid()
        except psutil.Error:
            return False

    channel = StepChannel(accept)
    first, last = _record(count=1, last=1), _record(count=2, last=3)
    code = (
        "import socket, sys\n"
        f"s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM); s.connect({channel.path!r})\n"
        f"s.send({first!r}); print('one', flush=True); sys.stdin.readline(); s.send({last!r})\n"
    )
    child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "one"
        wait_for(lambda: len(calls) == 1)
        assert child.stdin is not None
        child.stdin.write("\n")
        child.stdin.close()
        assert child.wait(timeout=30) == 0  # reaped: its PID is nobody's now
        reaped.set()
        wait_for(lambda: len(calls) == 2)
        taken: list[int] = []  # every take's steps (a take resets them)
        wait_for(lambda: channel.rejected or taken.append(sum(r.steps for r in channel.take())) or sum(taken) == 3)
        assert channel.rejected == 0 and sum(taken) == 3
    finally:
        reaped.set()
        if child.poll() is None:
            child.kill()
            child.wait()
        channel.close()


def test_a_process_exits_once_the_watcher_took_what_it_sent(tmp_path: Path) -> None:
    """The watcher checks a datagram's sender when it reads it (above): a process that exits before its
    last datagrams are read may be gone by then. Its exit waits (up to EXIT_WAIT_S; here an hour) until the
    watcher has taken them: it is alive while the watcher reads nothing, and ends once it read."""
    directory, sock = raw_channel(tmp_path)
    code = (
        "import gpudoctor, gpudoctor.training_step as t\nt.EXIT_WAIT_S = 3600.0\n"
        "with gpudoctor.step():\n    pass\nprint('done', flush=True)"
    )
    job = subprocess.Popen(
        [sys.executable, "-c", code], env=clean_env(**{ENV: str(directory)}), stdout=subprocess.PIPE, text=True
    )
    try:
        assert job.stdout is not None and job.stdout.readline().strip() == "done"
        with pytest.raises(subprocess.TimeoutExpired):
            job.wait(timeout=2)  # nothing read yet: it waits in its exit
        sock.settimeout(10)
        kinds = []
        while not kinds or kinds[-1] != EVENT_MAGIC:  # ... its steps, its data, then its exit
            kinds.append(sock.recv(65536)[:4])
        assert MAGIC in kinds
        assert job.wait(timeout=30) == 0  # all taken: it ends
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()
        sock.close()
