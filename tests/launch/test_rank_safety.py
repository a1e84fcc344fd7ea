"""A local run is safe on a shared machine: the rendezvous store is a file only the caller can
reach, gloo listens on loopback only, the rank directory is private and gone on every way out,
and SIGTERM/SIGHUP end gpudoctor cleanly (also while it starts up). Real 2-rank CPU runs, read
from outside through the process and socket tables."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import jsonschema
import psutil
import pytest

from gpudoctor.schemas import report_schema
from tests.helpers.processes import clean_env, cmdline
from tests.paths import FAKE_SITE, REPO

pytestmark = pytest.mark.slow
LOOPBACK = {"127.0.0.1", "::1", "::ffff:127.0.0.1"}


def start(*args: str, **env: str) -> subprocess.Popen[str]:
    """`gpudoctor check --device cpu --ranks 2 --select ddp --json ...` with rank 1 hanging after joining."""
    return subprocess.Popen(
        [sys.executable, "-m", "gpudoctor", "check", "--device", "cpu", "--ranks", "2", "--select", "ddp", *args],
        env=clean_env(GPUDOCTOR_FAULT="1:hang", **env),
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def joined_ranks(proc: subprocess.Popen[str], within: float = 90.0) -> tuple[list[psutil.Process], Path]:
    """gpudoctor's two ranks (in rank order) and their directory, once both have joined the group
    (rank 1 then hangs)."""
    parent = psutil.Process(proc.pid)
    end = time.monotonic() + within
    while time.monotonic() < end:
        # argv: python -m gpudoctor.workloads.rank SPEC RANK, read once: a process can end between two reads
        # (its argv then reads as []: a CI run failed on one)
        argvs = [(p, cmdline(p)) for p in parent.children(recursive=True)]
        found = sorted(
            ((int(a[-1]), p, a) for p, a in argvs if "gpudoctor.workloads.rank" in a and a[-1].isdigit()),
            key=lambda x: x[0],
        )
        if len(found) == 2:
            ranks = [p for _, p, _ in found]
            outdir = Path(found[0][2][-2]).parent
            events = [outdir / f"rank{r}.jsonl" for r in (0, 1)]
            if all(e.exists() and '"event": "peers"' in e.read_text() for e in events):
                return ranks, outdir
        time.sleep(0.1)
    raise AssertionError(f"the ranks did not join within {within} s")


def gone(ranks: list[psutil.Process], within: float = 15.0) -> bool:
    _, alive = psutil.wait_procs(ranks, timeout=within)
    return not [p for p in alive if p.status() != psutil.STATUS_ZOMBIE]


@contextmanager
def running(**env: str) -> Iterator[tuple[subprocess.Popen[str], list[psutil.Process], Path]]:
    """A `check --json` whose two ranks have joined; killed on the way out whatever happened."""
    proc = start("--json", **env)
    try:
        ranks, outdir = joined_ranks(proc)
        yield proc, ranks, outdir
    finally:
        proc.kill()
        proc.wait()


def stop(proc: subprocess.Popen[str], sig: signal.Signals) -> tuple[str, str]:
    proc.send_signal(sig)
    return proc.communicate(timeout=60)


# The test below reads the ranks' sockets from outside, as another user would: in a private
# network namespace (launch/netns.py, tests/launch/test_netns.py) there is nothing to see, so it
# judges the run without one, what every machine that refuses user namespaces gets.
NO_NAMESPACE = {"GPUDOCTOR_NO_NETNS": "1"}


# What another local user did in review3 S3 to the old TCPStore on 127.0.0.1 ("num_keys 3 / set ok").
# A store answers in milliseconds once torch is imported; a gloo listener never does (the
# client then waits for ever): the client gives up ANSWER_S after its import. One client process
# tries every port at once (one torch import, not one per port) and prints each port's answer.
ANSWER_S = 10.0
STORE_CLIENT = f"""
import datetime, json, os, sys, threading, time
import torch.distributed as d
answers = {{}}
def ask(port):
    try:
        s = d.TCPStore("127.0.0.1", port, 2, False, datetime.timedelta(seconds=3))
        s.num_keys()
        s.set("evil", "1")
        answers[port] = "the store answered"
    except Exception as exc:
        answers[port] = "refused: " + type(exc).__name__
askers = [threading.Thread(target=ask, args=(int(p),), daemon=True) for p in sys.argv[1:]]
for t in askers:
    t.start()
end = time.monotonic() + {ANSWER_S}
for t in askers:
    t.join(timeout=max(0.0, end - time.monotonic()))
print(json.dumps({{p: answers.get(int(p), "no answer") for p in sys.argv[1:]}}), flush=True)
os._exit(0)
"""


def test_a_local_run_listens_on_loopback_only_and_its_rendezvous_store_is_a_private_file() -> None:
    """One run read from outside, as another user would: gloo listens on loopback only, none of its
    listeners hands out keys as a TCP store would, and the store is a file only we can reach.
    (Two tests before, each with its own run; the same run answers both.)"""
    with running(**NO_NAMESPACE) as (proc, ranks, outdir):
        listening = {
            (rank, c.laddr.ip, c.laddr.port)
            for rank, p in enumerate(ranks)
            for c in p.net_connections(kind="tcp")
            if c.status == psutil.CONN_LISTEN
        }
        assert any(rank == 0 for rank, _, _ in listening), "rank 0's gloo listener is not listening"
        assert [s for s in listening if s[1] not in LOOPBACK] == [], f"reachable from other hosts: {listening}"
        rdzv = json.loads((outdir / "spec.json").read_text())["rendezvous"]
        store = Path(rdzv["path"])
        assert rdzv["mode"] == "file" and store.parent == outdir
        home, file = outdir.stat(), store.lstat()
        assert stat.S_IMODE(home.st_mode) == 0o700 and home.st_uid == os.geteuid()
        assert stat.S_ISREG(file.st_mode) and stat.S_IMODE(file.st_mode) == 0o600 and file.st_uid == os.geteuid()
        assert file.st_size > 0, "the ranks did not rendezvous through the file"
        ports = sorted({port for _, _, port in listening})
        # gloo's pair listeners: none of them is a store that hands out keys.
        client = subprocess.run(
            [sys.executable, "-c", STORE_CLIENT, *map(str, ports)],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            timeout=120,
        )
        answers = json.loads(client.stdout)
        assert ports and sorted(map(int, answers)) == ports, answers
        assert not [a for a in answers.values() if a == "the store answered"], answers
        stop(proc, signal.SIGTERM)
        assert proc.returncode == 130 and gone(ranks) and not outdir.exists()


def test_sighup_stops_the_ranks_removes_their_private_directory_and_exits_129() -> None:
    with running() as (proc, ranks, outdir):
        assert stat.S_IMODE(outdir.stat().st_mode) == 0o700, "the rank directory is readable by others"
        assert outdir.stat().st_uid == os.getuid()
        holders = [p for p in psutil.Process(proc.pid).children() if "hold" in cmdline(p)]  # (launch/netns.py)
        out, err = stop(proc, signal.SIGHUP)
        assert proc.returncode == 129, err
        doc = json.loads(out)
        jsonschema.validate(doc, report_schema())
        assert doc["exit_code"] == 129 and doc["error"] == {"kind": "interrupted", "message": "hung up (SIGHUP)"}
        assert err.strip().splitlines()[-1] == "gpudoctor: hung up (SIGHUP)" and "Traceback" not in err
        assert gone(ranks), "a rank outlived gpudoctor"
        assert gone(holders), "the ranks' namespace holder outlived gpudoctor"
        assert not outdir.exists(), f"{outdir} left behind"


@pytest.mark.parametrize(
    ("sig", "code", "says"), [(signal.SIGTERM, 130, "terminated (SIGTERM)"), (signal.SIGHUP, 129, "hung up (SIGHUP)")]
)
def test_a_stop_signal_during_start_up_is_a_clean_exit(
    tmp_path: Path, sig: signal.Signals, code: int, says: str
) -> None:
    """While the probe module is being imported (before any rank exists), as a scheduler's
    SIGTERM or a dropped session's SIGHUP can arrive: one line, the JSON error document, the exit code."""
    ready = tmp_path / "ready"
    proc = start("--json", PYTHONPATH=FAKE_SITE, GPUDOCTOR_TEST_SLOW_IMPORT=f"gpudoctor.probe.machine:{ready}")
    try:
        end = time.monotonic() + 60
        while not ready.exists() and time.monotonic() < end:
            time.sleep(0.05)
        assert ready.exists(), "gpudoctor never reached the probe"
        out, err = stop(proc, sig)
        assert proc.returncode == code, err
        doc = json.loads(out)
        jsonschema.validate(doc, report_schema())
        assert doc["error"] == {"kind": "interrupted", "message": says}
        assert err == f"\ngpudoctor: {says}\n"
    finally:
        proc.kill()


def test_ctrl_c_while_a_rank_is_being_started_stops_every_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    """A Ctrl-C that lands inside Popen (the rank exists, Popen has not returned it) used to leave
    that rank out of the list to stop and crash the cleanup (GD001 'zip() argument 2 is shorter')."""
    from gpudoctor.launch import Task, launch

    real = subprocess.Popen
    started: list[subprocess.Popen[bytes]] = []

    def popen(*args: object, **kwargs: object) -> subprocess.Popen[bytes]:
        proc = real(*args, **kwargs)  # type: ignore[call-overload]
        if "gpudoctor.workloads.rank" not in args[0]:  # type: ignore[operator]  (the namespace holder: netns.py)
            return proc
        started.append(proc)
        if len(started) == 2:
            os.kill(os.getpid(), signal.SIGINT)  # handled before this Popen returns
        return proc

    monkeypatch.setattr(subprocess, "Popen", popen)
    with pytest.raises(KeyboardInterrupt):
        launch([Task("ddp", {"batch": 8, "steps": 5})], device="cpu", ranks=2, timeout_s=60)
    assert len(started) == 2 and all(p.poll() is not None for p in started), "a rank outlived the launch"


def test_signals_held_back_are_acted_on_after_and_not_inherited() -> None:
    from gpudoctor.safety import signals

    with pytest.raises(KeyboardInterrupt):
        with signals.deferred():
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)
            # a process started meanwhile still dies of SIGTERM: nothing was masked
            child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
            child.terminate()
            assert child.wait(timeout=10) == -signal.SIGTERM
        raise AssertionError("not reached: the held Ctrl-C is raised when the block ends")
    with signals.deferred(act=False):
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.05)
