"""gpudoctor as a separate process, as users and CI run it: the command, the environment it gets,
and reading the process table without tripping over processes that end meanwhile.

Tests receive the runner as the `gpudoctor_cli` fixture (tests/conftest.py); the functions are
here for module-level helpers and parametrize lists, which run before any fixture."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
from collections.abc import Callable, Mapping
from typing import Any

import psutil

from tests.paths import FAKE_SITE, REPO

GPUDOCTOR = [sys.executable, "-m", "gpudoctor"]
GpudoctorCli = Callable[..., subprocess.CompletedProcess[str]]  # the type of the `gpudoctor_cli` fixture

# What a child must not inherit from the test run: an enclosing launcher's rendezvous, and the
# switches that fake a fault or the watch source (a test that wants one sets it for its child).
NOT_PASSED_ON = ("MASTER_PORT", "RANK", "WORLD_SIZE", "NCCL_IB_HCA", "GPUDOCTOR_FAULT", "GPUDOCTOR_WATCH_FAKE")

# The deadline (--timeout) the tests give a run in which a rank hangs: it covers two ranks importing
# torch on a loaded 2-core machine (up to ~16 s measured at load 4; 30 s was missed at load 12; with
# 45 s a hang test failed at load 9-10, most likely on its imports) plus the work. It costs nothing
# when imports are quick: the hang is cut HANG_RUN_S after the join (below), so it can be as long as
# the worst load needs.
HANG_TIMEOUT_S = 120.0
# How long a hang test's ranks may hang once every rank has joined: launch()'s `run_s` (the tasks'
# budget counted from the join, which link probes use in production) ends the run there. So a hang
# test costs its torch imports plus this, not the whole HANG_TIMEOUT_S; a run that ends at `run_s`
# reports timed_out == "run".
HANG_RUN_S = 3.0


def cut_hangs(monkeypatch: Any, run_s: float = HANG_RUN_S) -> list[Any]:
    """Make every launch() of this test (`gpudoctor.launch.launch`, which the checks import when they
    run) end its run `run_s` after its ranks joined; the list that each LaunchResult is added to.
    The deadline the checks report stays theirs (their timeout): only when the hang is cut moves."""
    import gpudoctor.launch
    from gpudoctor.launch.supervise import launch

    results: list[Any] = []

    def launch_cut(*args: Any, **kwargs: Any) -> Any:
        result = launch(*args, **{**kwargs, "run_s": run_s})
        results.append(result)
        return result

    monkeypatch.setattr(gpudoctor.launch, "launch", launch_cut)
    return results


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without NOT_PASSED_ON, one OpenMP thread, and `extra` on top."""
    env = {k: v for k, v in os.environ.items() if k not in NOT_PASSED_ON}
    env.update(OMP_NUM_THREADS="1", **extra)
    return env


def hiding(module: str) -> dict[str, str]:
    """A clean environment in which `import MODULE` fails, as on a machine without it (tests/fakes/site)."""
    return clean_env(PYTHONPATH=FAKE_SITE, GPUDOCTOR_TEST_HIDE=module)


def run_gpudoctor(
    *args: str, env: Mapping[str, str] | None = None, timeout: float = 60, **options: Any
) -> subprocess.CompletedProcess[str]:
    """`python -m gpudoctor ARGS` from the repository root, its output captured as text, killed
    after `timeout` seconds. `env` is the whole environment: clean_env() unless given (a test that
    wants a variable set passes clean_env(NAME=value)). `options` go to subprocess.run (cwd, stdout,
    preexec_fn, ...) and win over these defaults."""
    settings: dict[str, Any] = {"capture_output": True, "text": True, "timeout": timeout, "cwd": REPO}
    settings["env"] = clean_env() if env is None else dict(env)
    return subprocess.run([*GPUDOCTOR, *args], **{**settings, **options})


def cmdline(p: psutil.Process) -> list[str]:
    """The process's argv, or [] once it has ended or cannot be read."""
    try:
        return p.cmdline()
    except psutil.Error:
        return []


def marked(marker: str) -> list[psutil.Process]:
    """Live processes whose environment carries GD_TEST_MARKER=`marker` (a followed job, its
    children, its sentinel)."""
    found = []
    for p in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if p.status() != psutil.STATUS_ZOMBIE and p.environ().get("GD_TEST_MARKER") == marker:
                found.append(p)
    return found


def free_port() -> int:
    """A TCP port on loopback that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def reap(proc: subprocess.Popen[Any], timer: Any, drain: Any) -> None:
    """The end of a followed `gpudoctor watch`: its deadline timer cancelled, the process killed if it is
    still running, and the thread draining its stderr joined."""
    timer.cancel()
    if proc.poll() is None:
        proc.kill()
        proc.wait()
    drain.join(timeout=10)
