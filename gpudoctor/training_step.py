"""`gpudoctor.step()`: a training loop tells `gpudoctor watch` when each step ends.

    import gpudoctor

    for batch in loader:
        with gpudoctor.step():           # the time between steps (waiting for `batch`) is input wait
            train_step(batch)

or, at the end of each step, a plain `gpudoctor.step()` call (step time only; pass
`input_wait=seconds` if you time your loader yourself; the first call starts the clock).

When nothing watches (no `GPUDOCTOR_STEPS` in the environment) a call costs well under 5 us
(`benchmarks/step_overhead.py`). Under `gpudoctor watch -- COMMAND` each rank sends its steps to
the watcher: one small datagram per step, or per 50 ms of steps for faster loops, never blocking
(a full queue drops the record, counted and sent with the next one).

The channel is safe on a shared machine: `watch` makes a private directory (mode 0700, a random
name) holding a unix datagram socket, and names it in `GPUDOCTOR_STEPS`. A rank publishes only if
that directory is a real directory (not a symlink) owned by its own user and closed to everyone
else, and the socket in it is a socket (not a symlink) of the same owner; otherwise it says so once
on stderr and stays silent. The watcher accepts a record only from a process of the job it
follows, checked by the kernel's sender credentials (SO_PASSCRED), never by what the record says.

Arrival and stalls: under `watch`, `import gpudoctor` sets the publisher up at once and starts one daemon
thread ("gpudoctor-beat") that wakes every BEAT_S seconds and reads a few attributes. It sends a small
event record (EVENT) only when there is news: the process joined a process group (torch.distributed is
initialised, read from `sys.modules`, never imported), or its state has held for a beat: before its first
step, inside step N+1 (entered, not left: `with gpudoctor.step():` knows both ends), or outside its step
after step N; and again every RESEND_S while that state holds. A healthy loop changes state every step,
so the thread sends nothing. The step path itself only stores the time a step was entered.

This module imports only the standard library: no torch, no click, no textual.
"""

from __future__ import annotations

import atexit
import os
import socket
import stat
import struct
import sys
import threading
import time
from typing import Any

ENV = "GPUDOCTOR_STEPS"  # the per-run directory, set by `gpudoctor watch -- COMMAND`
SOCKET_NAME = "steps.sock"
MAGIC = b"GDS2"
# magic, rank (-1: unknown), pid, steps in this record, steps with a measured input wait, dropped records
# before this one, number of the last step, its end (epoch s), sum and max of step times, sum of input waits,
# sum of the step times of the steps that measured one (the input-wait share is over those steps alone:
# a loop may mix `with step():` and plain `step()`, whose time has no measured wait).
RECORD = struct.Struct("<4siIIIIQddddd")
_ROLE_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789_-")
EXIT_SEND_S = 0.2  # at exit, each datagram may wait this long for the watcher to take the ones before it
# ...and the last steps are tried again until this long has passed: under load the watcher's thread may be
# seconds behind a queue of 10 datagrams (net.unix.max_dgram_qlen), and steps lost at exit would read as
# a rank that stopped early (CI at stop 28: 34 of 40 steps). Only a live, slow watcher makes a job wait.
EXIT_WAIT_S = 3.0
FLUSH_S = 0.05  # steps faster than this travel together: at most ~20 records a second per rank

# The arrival/stall event: magic, pid, rank (as RECORD's), torch.distributed rank and world size (-1: not
# joined), flags, the last step finished, when the state began (epoch s).
EVENT_MAGIC = b"GDE1"
EVENT = struct.Struct("<4siiiiIQd")
JOINED = 1  # torch.distributed is initialised in this process
INSIDE = 2  # inside step N+1 (entered, not left); without it: outside, after step N
ENTRY_KNOWN = 4  # the `with` form was used: INSIDE says where it is (plain calls cannot tell)
CHILD = 8  # a multiprocessing child (mp.spawn, a DataLoader worker): heard only once it joined or stepped
EXITING = 16  # sent at exit (atexit): where the process was when it ended
FAILED = 32  # ...with an exception nobody caught (the interpreter printed its traceback)
BEAT_S = 0.5  # how often the thread looks; a state is news once it held for a beat
RESEND_S = 5.0  # a state that holds is said again this often (the watcher knows the rank is alive)


def _rank() -> int:
    """This process's global rank: RANK (torchrun, srun with the launcher's help), or torch.distributed's
    if the script already set it up (never imported here), else LOCAL_RANK; -1 when unknown."""
    for name in ("RANK", "SLURM_PROCID"):
        value = os.environ.get(name, "")
        if value.isdigit():
            return int(value)
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            return int(dist.get_rank())
    except Exception:  # noqa: BLE001  (whatever torch raises, the rank is just unknown)
        pass
    value = os.environ.get("LOCAL_RANK", "")
    return int(value) if value.isdigit() else -1


def _private_socket(directory: str) -> str | None:
    """The socket path if `directory` is ours alone and holds our socket; else why not (printed once)."""
    uid = os.geteuid()
    try:
        st = os.lstat(directory)
    except OSError as exc:
        return f"cannot use {ENV}={directory}: {exc.strerror}"
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != uid or st.st_mode & 0o077:
        return f"{ENV}={directory} is not a private directory of this user (mode 0700, not a symlink)"
    path = os.path.join(directory, SOCKET_NAME)
    try:
        st = os.lstat(path)
    except OSError as exc:
        return f"cannot use {path}: {exc.strerror}"
    if not stat.S_ISSOCK(st.st_mode) or st.st_uid != uid:
        return f"{path} is not a socket of this user"
    return None


class _Publisher:
    """One per process: accumulates steps and sends them to the watcher without ever blocking."""

    def __init__(self, directory: str) -> None:
        self.rank = _rank()
        self.pid = os.getpid()
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.setblocking(False)
        self.sock.connect(os.path.join(directory, SOCKET_NAME))
        self.step = 0
        self.started = False  # a plain call's first step starts the clock; a `with` block is a step
        self.last_mono = time.monotonic()  # where the next step starts
        self.sent_mono = 0.0
        self.ended = 0.0  # when the last step ended (monotonic; made an epoch time only when sent: last_end)
        self.dropped = 0
        self.inside: float | None = None  # when the step being run was entered (monotonic); 0.0: outside; None: unknown
        self.joined: tuple[int, int] | None = None  # (rank, world size) once a beat saw the group joined
        # Once the exit is being said, the beat says nothing more: an event after it would have the watcher
        # hold an exited process as alive (the lock lets a beat's event in flight go first).
        self.saying = threading.Lock()
        self.exiting = False
        self.gone = False  # the watcher is gone (an event could not go, and never will)
        self._reset()
        from gpudoctor.training_data import Data  # only when watched: `import gpudoctor` stays light

        self.data = Data(self.rank, self.send)  # samples, loss, loader time (gpudoctor/training_data.py)
        atexit.register(self.last_flush)
        threading.Thread(target=_beat, args=(self,), name="gpudoctor-beat", daemon=True).start()

    def last_flush(self) -> None:
        """At exit: send the steps still held back (a fast loop's last few) and the data, then where it ended."""
        if _publisher is not self or self.pid != os.getpid():
            return
        try:  # the job's ranks all end at once: wait a little for room in the watcher's queue, not drop
            self.sock.settimeout(EXIT_SEND_S)
        except OSError:
            return
        deadline = time.monotonic() + EXIT_WAIT_S
        while self.count and _publisher is self and time.monotonic() < deadline:
            self.flush(time.monotonic())  # sent: count is 0; the watcher gone: not the publisher any more
        if _publisher is not self:
            return
        if not _loader_worker():  # a worker has no data of its own: only its exit is said (it is forgotten)
            self.data.flush(time.monotonic(), final=True)
        failed = getattr(sys, "last_exc", None) or getattr(sys, "last_value", None)
        flags = EXITING | (FAILED if failed is not None else 0)
        joined = _joined() or self.joined  # destroy_process_group() may have ended the group it joined
        with self.saying:
            self.exiting = True
        # Tried again like the last steps: one lost (the queue full for EXIT_SEND_S) left the process held
        # as alive, its end unknown (CI at stop 32: a rank of a finished job still 'heard').
        while not _say(self, joined, (self.step, self.inside), _child(), time.time(), flags):
            if self.gone or _publisher is not self or time.monotonic() >= deadline:
                return
        # The watcher checks that a datagram comes from a process of the job when it reads it: one read after
        # this process was reaped could not be checked (its last steps and exit were ignored as from outside
        # the job, under load). Until the deadline, the process waits for the watcher to take what it sent.
        _wait_taken(self.sock, deadline)

    def send(self, payload: bytes) -> bool:
        """One datagram of data (training_data), never blocking: False when it could not go now."""
        try:
            self.sock.send(payload)
        except (BlockingIOError, InterruptedError):
            return False
        except OSError:
            return False  # the watcher is gone, or the datagram is too large: the data is not sent
        return True

    def _reset(self) -> None:
        self.count = self.waited = 0
        self.sum_step = self.max_step = self.sum_wait = self.sum_waited_step = 0.0

    def plain(self, ended: float, input_wait: float | None) -> None:
        """A plain `step()` call made at `ended` (monotonic): the step since the previous one ended."""
        if not self.started:
            self.started = True
            self.last_mono = ended
            return
        self.end_step(ended, input_wait)

    def end_step(self, ended: float, input_wait: float | None) -> None:
        # Comparisons, not max()/min(): a builtin call with two arguments costs ~0.15 us here, per step.
        self.started = True
        duration = ended - self.last_mono
        if duration < 0.0:
            duration = 0.0
        self.last_mono = self.ended = ended
        self.step += 1
        self.count += 1
        self.sum_step += duration
        if duration > self.max_step:
            self.max_step = duration
        if input_wait is not None and input_wait >= 0:
            self.waited += 1
            self.sum_wait += input_wait if input_wait < duration else duration
            self.sum_waited_step += duration
        if ended - self.sent_mono >= FLUSH_S:
            self.flush(ended)

    def last_end(self) -> float:
        """The epoch time the last step ended (0.0 before the first): made from its monotonic time when sent."""
        return time.time() - (time.monotonic() - self.ended) if self.step else 0.0

    def flush(self, now: float) -> None:
        if self.pid != os.getpid():  # forked by something that skips os.register_at_fork: stay silent here
            _forget()
            return
        if self.rank < 0:  # set up at import, before init_process_group: its rank may be known now
            self.rank = _rank()
        record = RECORD.pack(
            MAGIC,
            self.rank,
            self.pid,
            self.count,
            self.waited,
            self.dropped,
            self.step,
            self.last_end(),
            self.sum_step,
            self.max_step,
            self.sum_wait,
            self.sum_waited_step,
        )
        try:
            self.sock.send(record)
        except (BlockingIOError, InterruptedError, TimeoutError):
            self.dropped += 1  # the watcher is behind: these steps travel with the next record
            return
        except OSError:
            _disable()  # the watcher is gone (it ended): stay silent from now on
            return
        self.sent_mono = now
        self.dropped = 0
        self._reset()
        self.data.flush(now)


_publisher: _Publisher | None = None
_checked = False  # the environment was looked at (once per process)


def _disable() -> None:
    global _publisher
    if _publisher is not None:
        try:
            _publisher.sock.close()
        except OSError:
            pass
    _publisher = None


def _forget() -> None:
    """In a forked child (a DataLoader worker, multiprocessing's fork): the parent's publisher is not this
    process's; the next step() sets up its own. Called by os.register_at_fork, so step() needs no getpid()."""
    global _checked
    _disable()
    _checked = False


os.register_at_fork(after_in_child=_forget)


def _setup() -> _Publisher | None:
    """Once per process (again in a forked child): the publisher, or None when nothing watches."""
    global _publisher, _checked
    _disable()
    _checked = True
    directory = os.environ.get(ENV)
    if not directory:
        return None
    problem = _private_socket(directory)
    if problem is None:
        try:
            _publisher = _Publisher(directory)
        except OSError as exc:
            problem = f"cannot reach the watcher at {directory}: {exc.strerror or exc}"
    if problem is not None:
        print(f"gpudoctor.step: {problem}; not publishing steps", file=sys.stderr)
    return _publisher


def arrive() -> None:
    """`import gpudoctor` under watch (GPUDOCTOR_STEPS set): publish from now on, so the watcher hears this
    process join its process group, or not, before its first step."""
    if _publisher is None and not _checked:
        _setup()


def _wait_taken(sock: socket.socket, deadline: float) -> None:
    """Until `deadline` (monotonic), wait for the watcher to have read every datagram sent on `sock`: the
    kernel charges a unix datagram to its sender until it is read (SIOCOUTQ, Linux)."""
    try:
        import fcntl
        import termios
    except ImportError:
        return
    while time.monotonic() < deadline:
        try:
            left = struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0\0\0\0"))[0]
        except OSError:
            return
        if left <= 0:
            return
        time.sleep(0.005)  # a heuristic poll: the watcher reads a datagram in microseconds when it keeps up


def _joined() -> tuple[int, int] | None:
    """(rank, world size) once torch.distributed is initialised here (only if the script imported it)."""
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            return int(dist.get_rank()), int(dist.get_world_size())
    except Exception:  # noqa: BLE001  (mid-initialisation or torn down: not joined now)
        pass
    return None


def _loader_worker() -> bool:
    """A DataLoader worker: torch sets its worker info in the worker process, for good. One started with
    spawn imports the script (and gpudoctor) and exits through sys.exit, so its atexit runs: it said hello
    every epoch, a new process each time, and is no rank. Its exit is still said, as a multiprocessing
    child's (known by then: not while the script is imported), so that the watcher forgets it
    (gpudoctor/watch/steps.py)."""
    data = sys.modules.get("torch.utils.data")  # only if the script imported it: torch is never imported here
    info = getattr(data, "get_worker_info", None)  # public: None outside a worker
    try:
        return info is not None and info() is not None
    except Exception:  # noqa: BLE001  (a torch without it, or torn down at exit: not a worker we can tell)
        return False


def _child() -> bool:
    """A multiprocessing child: an mp.spawn rank, or a DataLoader worker that imported the script."""
    mp = sys.modules.get("multiprocessing")
    if mp is None:
        return False
    # While a spawned child imports the script its parent is not set yet (a script slow to import had its
    # worker say hello), but the script runs as a module named __mp_main__ (multiprocessing.spawn.prepare;
    # in the parent, __mp_main__ is __main__ under its own name).
    if getattr(sys.modules.get("__mp_main__"), "__name__", None) == "__mp_main__":
        return True
    try:
        return mp.parent_process() is not None
    except Exception:  # noqa: BLE001
        return False


def _beat(pub: _Publisher) -> None:
    """The thread of the module docstring: a join is said at once; a state once it held for a beat, and
    again every RESEND_S while it holds."""
    joined: tuple[int, int] | None = None
    prev: tuple[bool, int, float | None] | None = None
    first_seen = time.time()  # when the state began, as far as a beat can tell
    said: tuple[bool, int, float | None] | None = None
    said_at = 0.0
    while True:
        time.sleep(BEAT_S)
        if _publisher is not pub or pub.pid != os.getpid():
            return  # replaced (a forked child's own), or closed
        if joined is None:
            joined = pub.joined = _joined()
        state = (joined is not None, pub.step, pub.inside)
        now = time.time()
        held = state == prev
        if not held:
            prev, first_seen = state, now
        join_news = state[0] and (said is None or not said[0])
        if not join_news and (not held or (state == said and now - said_at < RESEND_S)):
            continue
        child = _child()  # asked again: torch.multiprocessing may come to be imported later
        if child and joined is None and not state[1]:
            continue  # a DataLoader worker, or a spawned rank not joined yet: the process tree tells of it
        if _say(pub, joined, state[1:], child, first_seen):
            said, said_at = state, now


def _say(
    pub: _Publisher,
    joined: tuple[int, int] | None,
    state: tuple[int, float | None],
    child: bool,
    seen: float,
    flags: int = 0,
) -> bool:
    """Send one event record; False if it could not go now (said again at the next beat)."""
    step, inside = state
    if inside:
        since = time.time() - (time.monotonic() - inside)  # when the step being run was entered
    elif step:
        since = pub.last_end()  # when the last step ended
    else:
        since = seen
    flags |= (JOINED if joined else 0) | (CHILD if child else 0)
    flags |= (ENTRY_KNOWN if inside is not None else 0) | (INSIDE if inside else 0)
    rank, world = joined or (-1, -1)
    event = EVENT.pack(EVENT_MAGIC, pub.pid, pub.rank, rank, world, flags, step, since)
    with pub.saying:
        if pub.exiting and not flags & EXITING:
            return False  # the exit is said, or being said: nothing may follow it
        try:
            pub.sock.send(event)
        except (BlockingIOError, InterruptedError, TimeoutError):
            return False  # the watcher is behind (TimeoutError: at exit, after EXIT_SEND_S)
        except OSError:
            pub.gone = True  # the watcher is gone: the step path notices and stops publishing
            return False
    return True


class _NoOp:
    """What `step()` returns when nothing watches: nothing to do, with or without `with`."""

    __slots__ = ()

    def __enter__(self) -> _NoOp:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def loss(self, value: object) -> None:
        """The step's loss (nothing to do: nobody watches)."""
        return None


_NOOP = _NoOp()
NESTED = -1.0  # a `with step():` entered inside another: not a step of its own


class _Mark:
    """What `step()` returns when watched.

    Used with `with`, the block is the step's body: the step ends at `__exit__`, and the time from the
    previous step's end to `__enter__` (waiting for the next batch) is its input wait. As a plain call,
    the step ended when the call was made; the object cannot know at that moment which form it is in,
    so a plain call's step is counted when the unused object is released, right after the call
    (CPython frees it at once; the time counted is still the call's)."""

    __slots__ = ("_pub", "_made", "_wait", "_entered")

    def __init__(self, pub: _Publisher, input_wait: float | None) -> None:
        self._pub = pub
        self._made = time.monotonic()
        self._wait = input_wait
        self._entered: float | None = None

    def __enter__(self) -> _Mark:
        if self._pub.inside:  # inside another `with step():` (a helper that marks its own): one step, the outer
            self._entered = NESTED
            return self
        self._entered = self._pub.inside = time.monotonic()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._entered is NESTED:
            return
        pub = self._pub
        entered = self._made if self._entered is None else self._entered
        if not pub.started:
            pub.last_mono = entered  # set up at import: the first step starts when it is entered
        wait = entered - pub.last_mono if self._wait is None else self._wait
        if wait < 0.0:
            wait = 0.0
        pub.inside = 0.0
        pub.end_step(time.monotonic(), wait)

    def loss(self, value: object) -> None:
        """The step's loss, inside `with gpudoctor.step() as step:` (a float or a one-element tensor,
        read without waiting for the device: gpudoctor/training_data.py)."""
        self._pub.data.losses.add(value, self._pub.data.note)

    def __del__(self) -> None:
        if self._entered is None:  # never entered: a plain call
            try:
                self._pub.plain(self._made, self._wait)
            except Exception:  # noqa: BLE001  (never raise into the training loop from a finalizer)
                pass


def _check_wait(value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"gpudoctor.step(input_wait=...) takes seconds as a number, got {type(value).__name__}")
    if not 0 <= value < float("inf"):  # also refuses NaN
        raise ValueError(f"gpudoctor.step(input_wait=...) takes a finite number of seconds >= 0, got {value!r}")


def step(  # no keyword-only parameters: CPython fills those from a dict, twice the cost of a call unwatched
    input_wait: float | None = None, loss: object = None, samples: object = None, epoch: object = None
) -> _Mark | _NoOp:
    """Mark the end of a training step (call it once per step), or use it as `with gpudoctor.step():`
    around the step's body, which also measures the input wait between steps.

    `loss=` (a float or a one-element tensor) lets `watch` call a NaN/inf loss and ranks whose losses
    disagree; `samples=` (the batch's sample indices, on the CPU) with `epoch=` lets it judge what the
    ranks read (or wrap the loader: `gpudoctor.watch_loader`). Both are ignored when nobody watches.

    As a plain call, the step time is the time since the previous call (the first call starts the
    clock); `input_wait` (seconds) is the part of it spent waiting for input, if you measure that
    yourself (a finite number of seconds, 0 or more: anything else raises TypeError/ValueError,
    watched or not, so a wrong figure never reaches the dashboard; more than the step is counted as
    the whole step). Costs next to nothing when no `gpudoctor watch` follows this process.
    """
    if input_wait is not None:
        _check_wait(input_wait)
    pub = _publisher  # a forked child's is reset at the fork (_forget): no getpid() a step
    if pub is None:
        if _checked:
            return _NOOP
        pub = _setup()
        if pub is None:
            return _NOOP
    if loss is not None or samples is not None:
        try:  # free when nothing is raised (3.11): a user's odd object never breaks the training loop
            pub.data.on_step(loss, samples, epoch)
        except Exception as exc:  # noqa: BLE001
            pub.data.refused(exc)
    return _Mark(pub, input_wait)


def watch_loader(loader: Any, role: str = "train") -> Any:
    """`for batch in gpudoctor.watch_loader(loader):` lets `gpudoctor watch` see what this rank reads
    (sample indices through the loader's sampler, epochs) and the time spent inside next(loader).
    `role`: "train", "eval", or another short lower-case name; loaders of one role are one series of
    epochs. Returns the loader itself when nobody watches (a wrong role raises ValueError either way)."""
    if not isinstance(role, str) or not 1 <= len(role) <= 16 or not set(role) <= _ROLE_CHARS:
        raise ValueError(f"gpudoctor.watch_loader(role=...) takes a short lower-case name like 'eval', got {role!r}")
    pub = _publisher
    if (pub is None and not _checked) or (pub is not None and pub.pid != os.getpid()):
        pub = _setup()
    if pub is None:
        return loader
    from gpudoctor.training_data import WatchedLoader  # only when watched

    return WatchedLoader(loader, role, pub.data)
