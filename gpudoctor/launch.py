"""The parent side of active checks: start ranks, watch them against deadlines, collect results.

Torch-free: the ranks import torch, the parent never does (and so never creates a CUDA context).

API (for a new workload: one function in gpudoctor/workloads/ listed in WORKLOADS, plus a call):

    from gpudoctor.launch import Task, launch
    result = launch([Task("allreduce", {"sizes": [1 << 20]})], device="cpu", ranks=2,
                    timeout_s=30, progress=print)
    result.ok                     # every rank finished every task
    result.results("allreduce")   # rank 0's result dict (or result.ranks[r].results[...])
    result.failed_ranks()         # RankOutcome of ranks that erred, exited, hung or were aborted

Each rank is `python -m gpudoctor.workloads.rank`, in its own session (so a terminal's Ctrl-C
reaches only gpudoctor, which then stops the ranks), with PR_SET_PDEATHSIG so it dies if
gpudoctor is killed, and its own deadline as a last resort. Call launch() from a thread that
outlives it (PDEATHSIG follows the spawning thread). Ranks report JSON lines in a private temp dir.

Deadlines (`Deadlines`): importing torch (and initialising CUDA) may take up to the whole timeout;
the join clock starts only when every rank has reported `imported`, and the ranks must then
have joined within `join_share` of the timeout (never past the timeout); everything must be
finished within the timeout. So a slow import on a loaded machine is reported as an import that
did not finish (`timed_out == "import"`), not as a rank that could not join. On expiry, or a few
seconds after one rank fails (its peers then wait forever in a collective), every rank's process
group gets SIGTERM, then SIGKILL (gpudoctor.procs.terminate_groups: at most KILL_SEQUENCE_S).

GPUs: on one node, the ranks get CUDA_DEVICE_ORDER=PCI_BUS_ID and CUDA_VISIBLE_DEVICES=<the GPU
UUIDs in rank order> (`rank_env`), so local rank i drives exactly the GPU gpudoctor names for it.
Under torchrun/srun the user's environment is left alone.

Rendezvous: on one node the ranks meet in a `torch.distributed.FileStore`, a file (0600) in the
ranks' private directory (0700): no other local user can read or write its keys, as anyone could
with a TCPStore on 127.0.0.1 (workloads/rank.py `_store`). No port is used, so a user's
MASTER_PORT is neither needed nor touched (GD221-GD223 judge it for training). CPU ranks get
GLOO_SOCKET_IFNAME=<the loopback interface>. Under torchrun/srun (RANK, WORLD_SIZE, MASTER_ADDR
set) this process starts ONE rank, its own, with the env:// rendezvous that the launcher already
set up, so the workload spans every node; `launcher_env` reads that environment first, and a value
torch could not use is a one-line usage error, not a crash in every active check.

Files: the ranks' spec, reports, logs and rendezvous store live in a directory made by mkdtemp (0700,
an unpredictable name), so they are written with plain opens; it is removed on every way out
(SIGTERM and SIGHUP unwind like Ctrl-C: `_TermAsInterrupt`, gpudoctor.signals). Without torch
nothing starts (`setup_error` kind "no_torch" names the install). Only a SIGKILL leaves the
directory behind; the next run removes such leftovers of its own user whose run lock is free
(`sweep_leftovers`).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpudoctor.errors import EXIT_USAGE, UserError
from gpudoctor.procs import REAP_S, TERM_GRACE_S, terminate_groups
from gpudoctor.signals import Stopped, deferred
from gpudoctor.workloads.known_errors import classify

if TYPE_CHECKING:
    import subprocess

# Imported where ranks start, not here: `check --quick` loads this module (the active checks
# register with it) but never starts a rank, and every import is start-up time.

GRACE_AFTER_FAILURE_S = 3.0  # how long peers of a failed rank get to report before we stop them
TERM_WAIT_S = TERM_GRACE_S  # between SIGTERM and SIGKILL
# After a deadline: one poll, SIGTERM, up to TERM_WAIT_S of grace, SIGKILL, up to REAP_S to reap.
KILL_SEQUENCE_S = TERM_WAIT_S + REAP_S
POLL_S = 0.05
HEARTBEAT_S = 5.0

# Ordered steps of a rank's life, to tell which rank is behind when a deadline passes.
_STEPS = ["spawned", "started", "importing", "imported", "joined", "peers", "phase", "result", "done"]


def _reached(step: str, target: str) -> bool:
    return _STEPS.index(step) >= _STEPS.index(target)


@dataclass(frozen=True)
class Task:
    name: str  # a key of gpudoctor.workloads.WORKLOADS
    params: dict[str, Any] = field(default_factory=dict)


@dataclass
class RankOutcome:
    rank: int
    local_rank: int
    gpu: int | None  # the physical GPU (NVML index) this rank drives, where known
    pid: int | None = None
    # "done", "error" (reported an exception), "exited" (died without a word), "hung" (did not
    # answer by the deadline), "aborted" (stopped by us after another rank failed)
    state: str = "spawned"
    last_step: str = "spawned"
    phase: str = "start"  # the last phase it entered
    join_s: float | None = None
    import_s: float | None = None
    shutdown_s: float | None = None
    exit_code: int | None = None
    error: str = ""
    error_kind: str | None = None  # known_errors kind
    log_tail: str = ""
    host: str = ""
    node_rank: int = 0
    results: dict[str, Any] = field(default_factory=dict)
    durations: dict[str, float] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return f"rank {self.rank}" + (f" (GPU {self.gpu})" if self.gpu is not None else "")

    def hang_reason(self) -> str:
        """What this rank had not done when it was stopped, as a verb phrase."""
        if not _reached(self.last_step, "importing"):
            return "did not get as far as importing torch"
        if not _reached(self.last_step, "imported"):
            return "did not finish initialising CUDA" if self.phase == "cuda_init" else "did not finish importing torch"
        if not _reached(self.last_step, "joined"):
            return "did not join the process group"
        return "did not answer"

    def to_json(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "gpu": self.gpu,
            "pid": self.pid,
            "host": self.host,
            "state": self.state,
            "phase": self.phase,
            "join_s": _round(self.join_s),
            "exit_code": self.exit_code,
            "error": self.error[:500],
            "error_kind": self.error_kind,
        }


def _round(v: float | None) -> float | None:
    return None if v is None else round(v, 4)


@dataclass
class LaunchResult:
    device: str
    backend: str
    world_size: int
    ranks: list[RankOutcome]
    elapsed_s: float
    rendezvous: str  # "file" (one node, FileStore in the private directory), "env" (torchrun/srun)
    timed_out: str | None = None  # the phase whose deadline passed: "import", "join" or "run"
    deadline_s: float | None = None
    setup_error: dict[str, Any] | None = None  # nothing started: {"kind", "message", ...}
    peers: list[dict[str, Any]] = field(default_factory=list)
    under_launcher: bool = False  # torchrun/srun set up the rendezvous: one rank here, env://

    @property
    def node_count(self) -> int:
        """How many nodes the process group spans (from the peers every rank gathered; 1 if unknown)."""
        return len({(p.get("host", ""), int(p.get("node_rank", 0))) for p in self.peers}) or 1

    @property
    def ok(self) -> bool:
        return self.setup_error is None and bool(self.ranks) and all(r.state == "done" for r in self.ranks)

    def results(self, task: str) -> dict[str, Any] | None:
        """Rank 0's result of `task` (every rank computes the group-wide verdicts alike)."""
        for r in sorted(self.ranks, key=lambda r: r.rank):
            if task in r.results:
                return r.results[task]
        return None

    def failed_ranks(self) -> list[RankOutcome]:
        return [r for r in self.ranks if r.state != "done"]

    def suspects(self) -> list[RankOutcome]:
        """The ranks that caused the failure: those that erred or exited, else the hung ranks
        that got least far (their peers wait for them inside a collective)."""
        direct = [r for r in self.ranks if r.state in ("error", "exited")]
        if direct:
            # A rank whose error is a timeout/connection loss is usually a victim of another.
            primary = [r for r in direct if r.error_kind not in ("timeout", "peer_lost")] or direct
            return primary
        hung = [r for r in self.ranks if r.state == "hung"]
        if not hung:
            return []
        least = min(_STEPS.index(r.last_step) for r in hung)
        return [r for r in hung if _STEPS.index(r.last_step) == least]

    def error_kinds(self) -> set[str]:
        return {r.error_kind for r in self.ranks if r.error_kind}

    def report_nodes(self) -> list[dict[str, Any]]:
        """The report's `nodes` rows: under torchrun/srun, and only in global rank 0's report."""
        if not self.under_launcher or not self.peers or not any(r.rank == 0 for r in self.ranks):
            return []
        return self.nodes()

    def nodes(self) -> list[dict[str, Any]]:
        """One row per node (hostname + node rank) from the peers rank 0 saw."""
        rows: dict[tuple[str, int], dict[str, Any]] = {}
        states = {r.rank: r.state for r in self.ranks}
        for p in self.peers:
            key = (p["host"], int(p.get("node_rank", 0)))
            row = rows.setdefault(
                key, {"hostname": key[0], "node_rank": key[1], "ranks": [], "gpus": [], "status": "ok"}
            )
            row["ranks"].append(p["rank"])
            if p.get("device", "cpu").startswith("cuda"):
                row["gpus"].append(p.get("local_rank", 0))
            local_state = states.get(p["rank"])
            finished = self.ok or (local_state == "done")
            if not finished and local_state is not None:
                row["status"] = local_state
            elif not finished and not self.ok:
                row["status"] = "unknown"
        return sorted(rows.values(), key=lambda r: r["node_rank"])

    def to_json(self) -> dict[str, Any]:
        return {
            "device": self.device,
            "backend": self.backend,
            "world_size": self.world_size,
            "rendezvous": self.rendezvous,
            "elapsed_s": round(self.elapsed_s, 3),
            "timed_out": self.timed_out,
            "setup_error": self.setup_error,
            "ranks": [r.to_json() for r in self.ranks],
        }


NO_GPU = "no GPU is visible"
NO_GPU_AUTO = f"{NO_GPU}; `--device cpu --ranks N` runs the same machinery on CPU"


def choose_device(requested: str, visible_gpus: int) -> tuple[str, str]:
    """Where workloads run for `--device auto|cuda|cpu`: ("cuda" | "cpu", "") or ("", why not).

    The one rule `check` and `bench` share: cpu when asked for; otherwise the GPUs, when one is
    visible. `auto` on a machine without a visible GPU runs nothing rather than measuring the
    CPU in place of the GPUs it was asked about; the reason says how to run on CPU.
    """
    if requested == "cpu":
        return "cpu", ""
    if visible_gpus > 0:
        return "cuda", ""
    return "", NO_GPU if requested == "cuda" else NO_GPU_AUTO


def torch_missing_message() -> str | None:
    """Why the ranks cannot import torch (a clear install hint), or None when they can."""
    from gpudoctor.probe.software import torch_installed  # light: importlib only

    if torch_installed():
        return None
    return (
        f"PyTorch is not installed in {sys.executable}: the ranks run torch. Install it "
        f"(`{Path(sys.executable).name} -m pip install torch`), or run the static checks alone with --quick"
    )


def torchrun_env(environ: Mapping[str, str]) -> bool:
    """True when a launcher (torchrun, srun + env) already set up a rendezvous for us."""
    return all(k in environ for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR"))


class LauncherEnvError(UserError, ValueError):
    """A torchrun/srun variable the ranks cannot use: a usage error (exit 2), one line."""

    def __init__(self, message: str) -> None:
        super().__init__(message, EXIT_USAGE, "usage")


@dataclass(frozen=True)
class LauncherEnv:
    """What torchrun/srun told this process: its rank, the world, its place on its node."""

    rank: int
    world_size: int
    local_rank: int
    node_rank: int


# (name, required, smallest value). torch's env:// rendezvous reads RANK, WORLD_SIZE and
# MASTER_PORT with int() (torch/distributed/rendezvous.py `_env_rendezvous_handler`); the ranks
# read LOCAL_RANK (their GPU) and GROUP_RANK (torchrun's node rank) the same way.
_LAUNCHER_INTS = (
    ("WORLD_SIZE", True, 1),
    ("RANK", True, 0),
    ("MASTER_PORT", True, 1),
    ("LOCAL_RANK", False, 0),
    ("LOCAL_WORLD_SIZE", False, 1),
    ("GROUP_RANK", False, 0),
)
_WHAT = {"WORLD_SIZE": "a process count", "LOCAL_WORLD_SIZE": "a process count", "MASTER_PORT": "a port number"}


def launcher_env(environ: Mapping[str, str]) -> LauncherEnv | None:
    """The launcher's environment, read the way torch reads it (int()), or None when no launcher
    set one up (`torchrun_env`). Raises LauncherEnvError naming the first variable torch (or
    the ranks) could not use, e.g. `RANK='x' is not a rank number`."""
    if not torchrun_env(environ):
        return None
    from gpudoctor.redact import text as redact_text  # a value may be anything the user typed

    values: dict[str, int] = {}
    for name, required, least in _LAUNCHER_INTS:
        if name not in environ and not required:
            continue
        raw = environ.get(name, "")
        what = _WHAT.get(name, "a rank number")
        try:
            value = int(raw)
        except ValueError:
            value = None
        if value is None or value < least or (name == "MASTER_PORT" and value > 65535):
            shown = f"{name}={redact_text(raw)!r}" if name in environ else f"{name} is not set and"
            raise LauncherEnvError(
                f"{shown} is not {what}: under torchrun/srun (RANK, WORLD_SIZE and MASTER_ADDR set) "
                "gpudoctor joins the launcher's process group; fix the variable or unset RANK to run on this node alone"
            )
        values[name] = value
    for name, limit in (("RANK", "WORLD_SIZE"), ("LOCAL_RANK", "LOCAL_WORLD_SIZE")):
        if name in values and limit in values and values[name] >= values[limit]:
            raise LauncherEnvError(
                f"{name}={values[name]} is not below {limit}={values[limit]}: ranks count from 0 to {limit}-1"
            )
    return LauncherEnv(values["RANK"], values["WORLD_SIZE"], values.get("LOCAL_RANK", 0), values.get("GROUP_RANK", 0))


def check_launcher_env(environ: Mapping[str, str] | None = None) -> LauncherEnv | None:
    """`launcher_env` of this process, read before any rank starts (`check` at level 2 and up,
    `bench`), so a broken torchrun/srun variable is one usage line, not a crash per check."""
    return launcher_env(os.environ if environ is None else environ)


def rank_env(
    environ: Mapping[str, str], *, device: str, gpu_uuids: Sequence[str] | None, under_launcher: bool
) -> dict[str, str]:
    """The environment of gpudoctor's spawned ranks.

    On one node with GPUs, rank i must drive exactly the GPU gpudoctor names for it: the ranks
    get CUDA_VISIBLE_DEVICES=<UUIDs in rank order> (so cuda:i is the i-th UUID, whatever the
    user's CUDA_DEVICE_ORDER would have made of indices) and CUDA_DEVICE_ORDER=PCI_BUS_ID. On one
    node, GLOO_SOCKET_IFNAME names the loopback interface (gloo carries the CPU runs and the GPU
    runs' side groups): gloo otherwise listens on the address the host name resolves to (a public
    one on most servers) for the whole run. Its pair sockets then listen on loopback, reachable
    by local users, but the addresses they trust come from the rendezvous store, which is a
    private file (`private_store`). NCCL's bootstrap sockets go to loopback the same way
    (`NCCL_SOCKET_IFNAME==lo`, an exact name) unless the user named an interface, in the
    environment or in an NCCL config file (`nccl_names_interface`): that is their training's
    setting, and GD626 judges it. One node needs no network. Under torchrun/srun the user's (and
    launcher's) environment is left as it is.
    """
    env = dict(environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    env["PYTHONUNBUFFERED"] = "1"
    uuids = list(gpu_uuids or [])
    if device == "cuda" and not under_launcher and uuids and all(_is_uuid(u) for u in uuids):
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
        env["CUDA_VISIBLE_DEVICES"] = ",".join(uuids)
    if not under_launcher:
        env["GLOO_SOCKET_IFNAME"] = loopback_interface()
        if device == "cuda" and not nccl_names_interface(env):
            env["NCCL_SOCKET_IFNAME"] = "=" + env["GLOO_SOCKET_IFNAME"]
    return env


NCCL_CONF_MAX_BYTES = 1 << 20


def nccl_names_interface(env: Mapping[str, str]) -> bool:
    """Whether NCCL would use an interface the user named: NCCL_SOCKET_IFNAME of two or more
    characters (NCCL ignores shorter values) in the environment, or else in the config file NCCL
    reads (NCCL_CONF_FILE, or ~/.nccl.conf, then /etc/nccl.conf; the environment wins). NCCL's
    `ncclFindInterfaces` and `initEnv` (src/misc/socket.cc, src/misc/param.cc;
    tests/reference/nccl_env_variables.md)."""
    if "NCCL_SOCKET_IFNAME" in env:
        return len(env["NCCL_SOCKET_IFNAME"]) > 1
    conf = env.get("NCCL_CONF_FILE", "")
    home = env.get("HOME", "")
    files = [conf] if conf else ([f"{home}/.nccl.conf"] if home else [])
    from gpudoctor.safe_io import read_text

    for name in [*files, "/etc/nccl.conf"]:
        try:  # a regular file only: a FIFO planted as ~/.nccl.conf would block the open
            text = read_text(name, NCCL_CONF_MAX_BYTES)
        except (OSError, UnicodeDecodeError):
            continue
        for line in text.splitlines():
            key, eq, value = line.strip().partition("=")
            if eq and not key.startswith("#") and key.strip() == "NCCL_SOCKET_IFNAME" and len(value.strip()) > 1:
                return True
    return False


def loopback_interface() -> str:
    """The name of the interface that holds 127.0.0.1 ("lo" on Linux)."""
    import socket

    try:
        import psutil  # lazy: only the active checks need it

        for name, addrs in psutil.net_if_addrs().items():
            if any(a.family == socket.AF_INET and a.address == "127.0.0.1" for a in addrs):
                return name
    except Exception:  # noqa: BLE001  (no psutil view of the interfaces: Linux's name)
        pass
    return "lo"


def _is_uuid(text: object) -> bool:
    return isinstance(text, str) and text.startswith(("GPU-", "MIG-")) and "," not in text


@dataclass
class Deadlines:
    """When each phase of a launch runs out (monotonic seconds).

    Import (torch, CUDA init) may use the whole timeout; the join window (`join_share` of the
    timeout) opens when the last rank reports `imported`; everything ends at the timeout.
    """

    start: float
    timeout_s: float
    join_share: float = 0.6
    imported_at: float | None = None  # when every rank had reported `imported`

    @property
    def end(self) -> float:
        return self.start + self.timeout_s

    @property
    def join_deadline(self) -> float | None:
        if self.imported_at is None:
            return None
        return min(self.imported_at + self.timeout_s * self.join_share, self.end)

    def expired(self, outcomes: Sequence[RankOutcome], now: float) -> str | None:
        """The phase whose deadline has passed ("import", "join", "run"), or None."""
        if self.imported_at is None and all(_reached(o.last_step, "imported") for o in outcomes):
            self.imported_at = now
        joined = all(_reached(o.last_step, "joined") for o in outcomes)
        if now > self.end:
            if self.imported_at is None:
                return "import"
            return "run" if joined else "join"
        join_deadline = self.join_deadline
        if join_deadline is not None and now > join_deadline and not joined:
            return "join"
        return None


class _Reader:
    """Reads a rank's JSON-lines file incrementally (a line may be half-written)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._pos = 0
        self._buf = ""

    def read(self) -> list[dict[str, Any]]:
        try:
            with open(self.path, encoding="utf-8") as f:
                f.seek(self._pos)
                chunk = f.read()
                self._pos = f.tell()
        except FileNotFoundError:
            return []
        self._buf += chunk
        *lines, self._buf = self._buf.split("\n")
        out = []
        for line in lines:
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue
        return out


def _apply(outcome: RankOutcome, ev: dict[str, Any], peers: list[dict[str, Any]]) -> None:
    kind = ev.get("event", "")
    if kind in _STEPS and _STEPS.index(kind) > _STEPS.index(outcome.last_step):
        outcome.last_step = kind
    if kind == "started":
        outcome.pid = ev.get("pid", outcome.pid)
        outcome.host = ev.get("host", "")
        outcome.node_rank = int(ev.get("node_rank", 0))
    elif kind == "importing":
        outcome.phase = ev.get("stage", "import")
    elif kind == "imported":
        outcome.import_s = ev.get("import_s")
        outcome.phase = "join"
    elif kind == "joined":
        outcome.join_s = ev.get("join_s")
        outcome.phase = "joined"
    elif kind == "peers":
        peers[:] = ev.get("peers", [])
    elif kind == "phase":
        outcome.phase = ev.get("name", outcome.phase)
    elif kind == "result":
        outcome.results[ev["task"]] = ev.get("data")
        outcome.durations[ev["task"]] = float(ev.get("duration_s", 0.0))
    elif kind == "error":
        outcome.state = "error"
        outcome.phase = ev.get("phase", outcome.phase)
        outcome.error = ev.get("message", "")
        outcome.error_kind = classify(outcome.error + "\n" + ev.get("traceback", ""))
    elif kind == "done":
        outcome.state = "done"
        outcome.shutdown_s = ev.get("shutdown_s")


class _TermAsInterrupt:
    """While ranks run, SIGTERM and SIGHUP to gpudoctor unwind like Ctrl-C so the ranks get
    stopped (gpudoctor's CLI installs the same for its whole run: gpudoctor.signals)."""

    def __enter__(self) -> None:
        self._old: dict[int, Any] = {}
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGHUP):
                if signal.getsignal(sig) in (signal.SIG_DFL, None):
                    self._old[sig] = signal.signal(sig, self._raise)

    @staticmethod
    def _raise(signum: int, frame: Any) -> None:
        raise Stopped(signum)

    def __exit__(self, *exc: Any) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)


RANK_DIR_PREFIX = "gpudoctor-ranks-"
RUN_LOCK = "run.lock"  # flock'd by the launching gpudoctor for the whole run; the kernel drops it on SIGKILL
LEFTOVER_AGE_S = 60.0  # heuristic: a younger directory may belong to a run still starting (not yet locked)


def hold_run_lock(outdir: Path) -> int:
    """Lock the rank directory as in use (an fd to keep open for the run). A lock, not a PID: the
    run may be in another PID namespace (a container sharing /tmp) or on another host (TMPDIR on
    shared scratch), where a PID says nothing."""
    import fcntl

    fd = os.open(outdir / RUN_LOCK, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


def sweep_leftovers(tmp: Path) -> None:
    """Remove rank directories a SIGKILLed gpudoctor left behind: only this user's private ones
    (0700, not links, a minute old) whose run lock nobody holds any more."""
    import fcntl
    import shutil
    import stat

    now = time.time()
    try:
        entries = [e for e in os.scandir(tmp) if e.name.startswith(RANK_DIR_PREFIX)]
    except OSError:
        return
    for entry in entries:
        try:
            st = entry.stat(follow_symlinks=False)
            if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or stat.S_IMODE(st.st_mode) != 0o700:
                continue
            if now - st.st_mtime < LEFTOVER_AGE_S:
                continue
            fd = os.open(Path(entry.path) / RUN_LOCK, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            continue  # no lock file (an older gpudoctor's, or not ours): left alone
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            continue  # a live run holds it
        finally:
            os.close(fd)
        shutil.rmtree(entry.path, ignore_errors=True)


def launch(
    tasks: list[Task],
    *,
    device: str = "cpu",
    ranks: int = 2,
    timeout_s: float = 120.0,
    gpus: list[int] | None = None,
    gpu_uuids: list[str] | None = None,
    progress: Callable[[str], None] = lambda message: None,
    environ: Mapping[str, str] | None = None,
    join_share: float = 0.6,
) -> LaunchResult:
    """Run `tasks` in `ranks` spawned ranks (one per GPU for device="cuda"); never hangs.

    `gpus`: the physical GPU (NVML index) of each CUDA device, in rank order, to name ranks in
    reports. `gpu_uuids`: the same GPUs' UUIDs; on one node the ranks see exactly these, in this
    order (`rank_env`), so cuda:i is gpus[i].
    """
    import shutil
    import subprocess
    import tempfile

    env = dict(os.environ if environ is None else environ)
    backend = "nccl" if device == "cuda" else "gloo"
    start = time.monotonic()
    no_torch = torch_missing_message()
    if no_torch is not None:
        return _setup_failed(device, backend, ranks, start, "no_torch", no_torch)
    try:
        launcher = launcher_env(env)
    except LauncherEnvError as exc:
        return _setup_failed(device, backend, ranks, start, "bad_launcher_env", str(exc))
    multi = launcher is not None
    rdzv: dict[str, Any]
    if launcher is not None:
        world = launcher.world_size
        local = [launcher.local_rank]
        rank_ids = [launcher.rank]
        rdzv = {"mode": "env", "local_rank": launcher.local_rank, "node_rank": launcher.node_rank}
    else:
        world = ranks
        local = list(range(ranks))
        rank_ids = list(range(ranks))
        rdzv = {"mode": "file"}

    env = rank_env(env, device=device, gpu_uuids=gpu_uuids, under_launcher=multi)
    outcomes = [
        RankOutcome(r, lr, (gpus[lr] if gpus and lr < len(gpus) else None) if device == "cuda" else None)
        for r, lr in zip(rank_ids, local, strict=True)
    ]
    procs: list[subprocess.Popen[bytes]] = []
    peers: list[dict[str, Any]] = []
    timed_out = None
    outdir: Path | None = None
    lock_fd: int | None = None
    try:
        with _TermAsInterrupt():
            # Private (mkdtemp: 0700, an unpredictable name) and removed on every way out: the
            # ranks' reports, logs and the rendezvous store live here.
            sweep_leftovers(Path(tempfile.gettempdir()))
            outdir = Path(tempfile.mkdtemp(prefix=RANK_DIR_PREFIX))
            lock_fd = hold_run_lock(outdir)
            if not multi:
                rdzv["path"] = str(private_store(outdir))
            spec = {
                "tasks": [{"name": t.name, "params": t.params} for t in tasks],
                "world_size": world,
                "device": device,
                "backend": backend,
                "rendezvous": rdzv,
                "outdir": str(outdir),
                "parent_pid": os.getpid(),
                "deadline_epoch": time.time() + timeout_s,
                "op_timeout_s": max(1.0, timeout_s),
            }
            (outdir / "spec.json").write_text(json.dumps(spec))
            # A Ctrl-C inside Popen would leave a started rank that no list holds (Popen never
            # returned it): the spawning is not interrupted; a stop signal is acted on right after.
            with deferred():
                for o in outcomes:
                    log = open(outdir / f"rank{o.rank}.log", "wb")  # noqa: SIM115  (closed right after Popen)
                    try:
                        p = subprocess.Popen(
                            [sys.executable, "-m", "gpudoctor.workloads.rank", str(outdir / "spec.json"), str(o.rank)],
                            stdin=subprocess.DEVNULL,
                            stdout=log,
                            stderr=subprocess.STDOUT,
                            env=env,
                            start_new_session=True,
                        )
                    finally:
                        log.close()
                    procs.append(p)
                    o.pid = p.pid
            timed_out = _supervise(outcomes, procs, outdir, peers, start, timeout_s, join_share, progress, tasks)
    finally:
        # A second Ctrl-C, SIGTERM or SIGHUP waits until the ranks are stopped and their files gone.
        with deferred():
            stopped = terminate_groups(procs)
            if outdir is not None:
                _collect(outcomes, procs, outdir, peers, stopped)
                shutil.rmtree(outdir, ignore_errors=True)
            if lock_fd is not None:
                os.close(lock_fd)
    return LaunchResult(
        device=device,
        backend=backend,
        world_size=world,
        ranks=outcomes,
        elapsed_s=time.monotonic() - start,
        rendezvous=rdzv["mode"],
        timed_out=timed_out,
        deadline_s=timeout_s,
        peers=peers,
        under_launcher=multi,
    )


STORE_NAME = "rendezvous.store"


def private_store(outdir: Path) -> Path:
    """Create the single-node rendezvous store's file, empty and 0600, in the ranks' 0700 directory.

    The ranks open it as a `torch.distributed.FileStore` (which would create it 0644 itself):
    only this user can reach it, unlike a TCP port on 127.0.0.1, which every local user can
    connect to and read or poison the keys of (review3 S3). O_EXCL | O_NOFOLLOW: a fresh file,
    never one planted in its place.
    """
    path = outdir / STORE_NAME
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    os.close(fd)
    return path


def _setup_failed(
    device: str, backend: str, world: int, start: float, kind: str, message: str, **extra: Any
) -> LaunchResult:
    return LaunchResult(
        device,
        backend,
        world,
        [],
        time.monotonic() - start,
        "none",
        setup_error={"kind": kind, "message": message, **extra},
    )


def _supervise(
    outcomes: list[RankOutcome],
    procs: list[subprocess.Popen[bytes]],
    outdir: Path,
    peers: list[dict[str, Any]],
    start: float,
    timeout_s: float,
    join_share: float,
    progress: Callable[[str], None],
    tasks: list[Task],
) -> str | None:
    """Poll the ranks until all end; returns the phase whose deadline passed, if one did."""
    readers = [_Reader(outdir / f"rank{o.rank}.jsonl") for o in outcomes]
    deadlines = Deadlines(start, timeout_s, join_share)
    failed_at: float | None = None
    shown = ""
    last_beat = start
    names = ", ".join(t.name for t in tasks)
    progress(f"starting {len(procs)} rank(s) for {names} (deadline {timeout_s:.0f} s)")
    while True:
        for o, reader in zip(outcomes, readers, strict=True):
            for ev in reader.read():
                _apply(o, ev, peers)
        now = time.monotonic()
        phase = _common_phase(outcomes)
        if phase != shown or now - last_beat >= HEARTBEAT_S:
            progress(f"{phase} ({now - start:.1f} s)")
            shown, last_beat = phase, now
        if all(p.poll() is not None for p in procs):
            return None
        if failed_at is None and any(
            (p.poll() is not None and o.state != "done") or o.state == "error"
            for o, p in zip(outcomes, procs, strict=True)
        ):
            failed_at = now
        if failed_at is not None and now - failed_at > GRACE_AFTER_FAILURE_S:
            return None
        expired = deadlines.expired(outcomes, now)
        if expired is not None:
            return expired
        time.sleep(POLL_S)


def _common_phase(outcomes: list[RankOutcome]) -> str:
    if not all(_reached(o.last_step, "imported") for o in outcomes):
        ready = sum(1 for o in outcomes if _reached(o.last_step, "imported"))
        return f"importing torch: {ready}/{len(outcomes)} rank(s) ready"
    if not all(_reached(o.last_step, "joined") for o in outcomes):
        joined = sum(1 for o in outcomes if _reached(o.last_step, "joined"))
        return f"joining the process group: {joined}/{len(outcomes)} rank(s) joined"
    phases = sorted({o.phase for o in outcomes if o.state != "done"})
    if not phases:
        return "finished"
    return "running " + ", ".join(phases)


def _collect(
    outcomes: list[RankOutcome],
    procs: list[subprocess.Popen[bytes]],
    outdir: Path,
    peers: list[dict[str, Any]],
    stopped: set[int],
) -> None:
    """Final reading after every rank is gone: decide each rank's state."""
    from gpudoctor.redact import text as redact_text

    any_direct_failure = False
    for o in outcomes[len(procs) :]:  # a spawn that failed (fork, exec) left the later ranks unstarted
        o.state, o.last_step, o.error = "aborted", "spawned", "not started"
    for o, p in zip(outcomes, procs, strict=False):
        for ev in _Reader(outdir / f"rank{o.rank}.jsonl").read():
            _apply(o, ev, peers)
        o.exit_code = p.returncode
        try:
            o.log_tail = (outdir / f"rank{o.rank}.log").read_bytes()[-3000:].decode("utf-8", "replace")
        except OSError:
            o.log_tail = ""
        if o.state in ("done", "error"):
            if o.state == "error" and not o.error_kind:
                o.error_kind = classify(o.log_tail)
        elif p.pid not in stopped:
            o.state = "exited"
            how = f"was killed by signal {-p.returncode}" if p.returncode < 0 else f"exited with status {p.returncode}"
            o.error = f"{how} in phase {o.phase}"
            o.error_kind = classify(o.log_tail)
        else:
            o.state = "unfinished"
        if o.state in ("error", "exited"):
            any_direct_failure = True
    for o in outcomes:
        # What a rank printed can hold the environment (NCCL_DEBUG=INFO echoes NCCL_IB_HCA, torch
        # names MASTER_ADDR): it goes into findings, so it is redacted like any other text.
        o.error = redact_text(o.error)
        o.log_tail = redact_text(o.log_tail)
        if o.state == "unfinished":
            o.state = "aborted" if any_direct_failure else "hung"
            if not o.error:
                o.error = (
                    f"{o.hang_reason()} (phase {o.phase})"
                    if o.state == "hung"
                    else (f"stopped in phase {o.phase} after another rank failed")
                )
