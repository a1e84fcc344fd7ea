"""Where samples come from: live NVML, a recording, or synthetic readings (tests).

A `Source` paces itself: `next(stop)` waits for the next sample time and returns the
sample, or None when the source has ended (or `stop` was set). The `Poller` runs a source
on its own thread so a stalled NVML call never freezes the dashboard.
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from gpudoctor.errors import EXIT_UNAVAILABLE, EXIT_USAGE, UserError
from gpudoctor.safety.safe_text import printable
from gpudoctor.watch.model import GpuReading, HostReading, ProcReading, Sample, clock
from gpudoctor.watch.recording import Recording, RecordingStream

if TYPE_CHECKING:
    from gpudoctor.probe.sampler import NvmlSampler, ProcessUsage
    from gpudoctor.snapshot import GpuProcess, Missing


def host_now() -> HostReading:
    """Load, RAM and swap now (psutil; no NVML needed)."""
    from gpudoctor.probe.sampler import host_reading

    return HostReading(**host_reading())


# Test-only: GPUDOCTOR_WATCH_FAKE=scenario[:gpus] makes `watch` read synthetic GPUs instead of NVML.
FAKE_ENV = "GPUDOCTOR_WATCH_FAKE"


class Source(Protocol):
    label: str  # shown in the header: "live", the recording path...
    real_processes: bool  # its processes are this machine's, now: the only ones a key may signal
    interval: float  # seconds between samples (nominal)
    available: tuple[int, ...]  # the GPUs there are to watch (known once opened)

    def open(self) -> None: ...

    def next(self, stop: threading.Event) -> Sample | None: ...

    def close(self) -> None: ...


class _Paced:
    """Live pacing: one reading per interval, processes every process_interval."""

    def __init__(self, interval: float, process_interval: float) -> None:
        self.interval = interval
        self.process_interval = process_interval
        self._due = 0.0
        self._procs_due = 0.0

    def wait(self, stop: threading.Event) -> bool:
        now = time.monotonic()
        if self._due > now and stop.wait(self._due - now):
            return False
        now = time.monotonic()
        self._due = max(self._due + self.interval, now)  # behind schedule: do not burst to catch up
        return not stop.is_set()

    def procs_due(self) -> bool:
        now = time.monotonic()
        if now >= self._procs_due:
            self._procs_due = now + self.process_interval
            return True
        return False


# Why a process NVML reports has no user, CPU% or command in the process table.
NOT_VISIBLE_ISOLATED = (
    "PID from another PID namespace (drivers before 535.113.01 report host PIDs): run the container "
    "with --pid=host, or mount the host's /proc at /host/proc"
)
NOT_VISIBLE = "process not visible here (exited, or hidden from this user)"


def proc_readings(
    procs: dict[int, list[GpuProcess]],
    usage: dict[int, ProcessUsage],
    isolated: bool | Missing,
    sm: dict[int, dict[int, int]] | None = None,
) -> tuple[ProcReading, ...]:
    """The sampler's resolved processes (probe.processes) as process-table rows; `sm`: per GPU,
    host PID -> SM utilization % (the sampler's process_utilization: a GPU there that has no sample
    for a process saw it idle, 0%)."""
    out = []
    for gpu, plist in sorted(procs.items()):
        for p in plist:
            shares = (sm or {}).get(gpu)
            share = None if shares is None else shares.get(p.pid, 0)
            if p.local_pid is None:
                note = NOT_VISIBLE_ISOLATED if isolated is True else NOT_VISIBLE
                out.append(ProcReading(p.pid, gpu, p.used_memory_mib, note=note, sm=share))
                continue
            u = usage.get(p.local_pid)
            out.append(
                ProcReading(
                    p.local_pid,  # the PID here: what `watch -- CMD` finds in the job's tree, what `kill` takes
                    gpu,
                    p.used_memory_mib,
                    user=p.user or "",
                    cpu=None if u is None else u.cpu,
                    rss=None if u is None else u.rss_mib,
                    command=p.command or "",
                    sm=share,
                    started=None if u is None else u.started,
                    own_command=(u.own_command if u is not None else None) or "",
                )
            )
    return tuple(out)


class NvmlSource(_Paced):
    def __init__(self, interval: float = 1.0, process_interval: float = 5.0, gpus: list[int] | None = None) -> None:
        super().__init__(interval, process_interval)
        self.label = "live"
        self.real_processes = True
        self._gpus = gpus
        self._sampler: NvmlSampler | None = None
        self.available: tuple[int, ...] = ()

    def open(self) -> None:
        from gpudoctor.knowledge.nvml_status import explain_init_failure
        from gpudoctor.probe.sampler import NvmlSampler

        sampler = NvmlSampler(indices=self._gpus)
        result = sampler.open()
        if not result.ok:
            message, _ = explain_init_failure(result.status, result.detail)
            raise UserError(
                f"{message} (see `gpudoctor explain GD101`; --replay FILE works without a GPU)",
                EXIT_UNAVAILABLE,
                "unavailable",
            )
        self.available = tuple(range(sampler.count))
        if not sampler.count:
            sampler.close()
            raise UserError("the NVIDIA driver reports no GPUs to watch", EXIT_UNAVAILABLE, "unavailable")
        self._sampler = sampler
        try:
            check_gpus(self._gpus, self.available, "this machine")
        except UserError:
            self.close()
            raise

    def next(self, stop: threading.Event) -> Sample | None:
        sampler = self._sampler
        if not self.wait(stop) or sampler is None:
            return None
        gpus = tuple(GpuReading(**r).checked() for r in sampler.read())  # an impossible value is n/a
        procs = None
        if self.procs_due():
            found = sampler.processes()
            local = [p.local_pid for plist in found.values() for p in plist if p.local_pid is not None]
            procs = proc_readings(found, sampler.usage(local), sampler.isolated, sampler.process_utilization())
        return Sample(round(time.time(), 3), gpus, sampler.host_cpu(), procs, host=host_now())

    def close(self) -> None:
        if self._sampler is not None:
            self._sampler.close()
            self._sampler = None


class SyntheticSource(_Paced):
    """Synthetic readings (gpudoctor.watch.synthetic): `watch --demo`, and tests through
    GPUDOCTOR_WATCH_FAKE. Sample i is stamped start + i * interval and played every interval / speed
    seconds, so `--speed 10` shows ten recorded seconds a second, as a replay would."""

    def __init__(
        self,
        scenario: str = "healthy",
        n_gpus: int = 8,
        interval: float = 1.0,
        process_interval: float = 5.0,
        pids: Callable[[], tuple[int, ...]] | None = None,
        speed: float = 1.0,
        ranks: bool = False,
        label: str | None = None,
    ) -> None:
        super().__init__(interval / speed, process_interval / speed)
        self.label = label or f"synthetic:{scenario}"
        self.real_processes = False  # made-up PIDs: a real process may have the same number
        self.scenario = scenario
        self.n_gpus = n_gpus
        self.recorded_interval = interval
        self.speed = speed
        self.ranks = ranks
        self._i = 0
        self._t0 = 0.0
        self.pids = pids
        self.available = tuple(range(n_gpus))

    def open(self) -> None:
        from gpudoctor.watch.synthetic import SCENARIOS

        if self.scenario not in (*SCENARIOS, "balanced"):
            raise UserError(f"{FAKE_ENV}: unknown scenario {self.scenario!r}", EXIT_USAGE, "usage")
        self._t0 = time.time()

    def next(self, stop: threading.Event) -> Sample | None:
        from gpudoctor.watch.synthetic import synthetic_sample

        if not self.wait(stop):
            return None
        pids = self.pids() if self.pids else ()
        t = self._t0 + self._i * self.recorded_interval
        s = synthetic_sample(self.scenario, self._i, t, self.n_gpus, pids=pids, ranks=self.ranks)
        self._i += 1
        return s

    def close(self) -> None:
        pass


def demo_source(scenario: str, n_gpus: int, speed: float) -> SyntheticSource:
    """`watch --demo SCENARIO`: a synthetic 1 s training job with one rank per GPU, live, no GPU needed."""
    return SyntheticSource(scenario, n_gpus, 1.0, 5.0, speed=speed, ranks=True, label=f"demo {scenario}")


class HostSource(_Paced):
    """No GPU to read (no driver): the host, the job's training steps and its processes (CPU%, RSS:
    `watch -- CMD` on a machine without a GPU, CPU ranks). Says once why there are no GPU rows."""

    def __init__(self, interval: float, process_interval: float, reason: str) -> None:
        super().__init__(interval, process_interval)
        self.label = "no GPU"
        self.real_processes = True
        self.available: tuple[int, ...] = ()
        self.notes = [f"no GPU to watch ({reason}): showing the job's training steps, processes and the host"]
        self.pids: Callable[[], Iterable[int]] | None = None  # the followed job's processes (set by its follower)
        self._usage: Any = None

    def open(self) -> None:
        from gpudoctor.probe.sampler import NvmlSampler, UsageReader

        NvmlSampler.host_cpu()  # starts the host CPU measurement
        self._usage = UsageReader()

    def next(self, stop: threading.Event) -> Sample | None:
        from gpudoctor.probe.sampler import NvmlSampler

        if not self.wait(stop):
            return None
        procs = self._job_processes() if self.pids is not None and self.procs_due() else None
        return Sample(round(time.time(), 3), (), NvmlSampler.host_cpu(), procs, host=host_now())

    def _job_processes(self) -> tuple[ProcReading, ...]:
        """The job's processes as process-table rows without a GPU: owner and command read as for a
        GPU process (probe.processes: another user's command line redacted), CPU% and RSS."""
        from gpudoctor.probe.pids import OWN_PIDS
        from gpudoctor.probe.processes import resolve

        assert self.pids is not None and self._usage is not None
        pids = sorted(set(self.pids()))
        usage = self._usage.read(pids)
        out = []
        for pid in pids:
            u = usage.get(pid)
            if u is None:  # gone since the job's tree was read
                continue
            _, user, command = resolve(pid, Path("/"), OWN_PIDS)  # our own tree's PIDs
            out.append(
                ProcReading(
                    pid, None, user=user or "", cpu=u.cpu, rss=u.rss_mib, command=command or "", started=u.started
                )
            )
        return tuple(out)

    def close(self) -> None:
        pass


def check_gpus(wanted: Iterable[int] | None, available: tuple[int, ...], where: str) -> None:
    """`--gpus` naming a GPU that is not there is a usage error that says which GPUs there are."""
    missing = sorted(set(wanted or ()) - set(available))
    if missing:
        there = f"GPU{'s' if len(available) > 1 else ''} {','.join(map(str, available))}" if available else "no GPU"
        name = f"GPU{'s' if len(missing) > 1 else ''} {','.join(map(str, missing))}"
        raise UserError(f"--gpus: no {name} in {where}, which has {there}", EXIT_USAGE, "usage")


def fake_from_env(interval: float, process_interval: float) -> SyntheticSource | None:
    spec = os.environ.get(FAKE_ENV)
    if not spec:
        return None
    scenario, _, count = spec.partition(":")
    if count and not (count.isascii() and count.isdigit() and 1 <= int(count) <= 1024):
        raise UserError(f"{FAKE_ENV}: {count!r} is not a GPU count (SCENARIO[:N], N 1-1024)", EXIT_USAGE, "usage")
    return SyntheticSource(scenario, int(count or 8), interval, process_interval)


# No wait of a replay is longer than this, whatever the recording: a longer hole (a suspended laptop,
# a stopped job), or a recording whose every sample is far from the last, is not waited out.
MAX_REPLAY_WAIT_S = 2.0
MAX_GAP_NOTES = 5  # gaps said one by one; later ones are counted


class ReplaySource:
    """Plays a recording at its recorded pace divided by `speed`.

    A recording file is read as a stream while it plays (`ReplaySource.open_file`): the first samples
    tell the recorded interval and the GPUs, the rest follow as they are played, so the first frame does
    not wait for a long recording, and memory does not grow with it. What was damaged in the file is
    known at its end: `damage`, and a note then.

    A wait is never longer than MAX_REPLAY_WAIT_S, whatever the recording: a hole in the recording is
    skipped, and a recording whose samples are further apart than that at this speed plays faster;
    `notes` says so (the session shows it). Below the cap `--speed` sets the pace.
    """

    PEEK = 30  # samples read ahead to learn the recorded interval and the GPUs

    def __init__(self, recording: Recording | RecordingStream, speed: float = 1.0) -> None:
        self.label = f"replay {os.path.basename(recording.path)}"  # the basename keeps the header short
        made = recording.header.get("source")
        if isinstance(made, str) and made.startswith("synthetic"):  # a test recording, not a machine
            self.label += f" ({printable(made)[:40]})"
        self.real_processes = False
        self.speed = speed
        self._stream = recording if isinstance(recording, RecordingStream) else None
        self._recording = recording
        self._samples: Iterator[Sample] = iter(recording.samples if isinstance(recording, Recording) else recording)
        self._ahead: deque[Sample] = deque(islice(self._samples, self.PEEK))
        self.available = tuple(sorted({g.index for s in self._ahead for g in s.gpus}))
        ts = [s.t for s in self._ahead]
        gaps = [b - a for a, b in zip(ts, ts[1:], strict=False) if b > a]
        self.recorded_interval = sorted(gaps)[len(gaps) // 2] if gaps else 1.0
        # The pace of playback: the recorded interval at this speed, but never a wait past the cap.
        self.capped = self.recorded_interval / speed > MAX_REPLAY_WAIT_S
        self.interval = MAX_REPLAY_WAIT_S if self.capped else self.recorded_interval / speed
        self.notes: list[str] = []  # said once each, as they happen (skipped gaps, damage)
        self._gaps = 0
        self._paced = False  # the recording's own interval was cut to the cap (said once)
        self._first: Sample | None = None
        self._previous: Sample | None = None
        self._played = False  # every sample was played (the end line then counts)

    @classmethod
    def open_file(cls, path: str, speed: float = 1.0) -> ReplaySource:
        """A recording file, streamed (a bad file raises UserError, exit 2, before anything starts)."""
        return cls(RecordingStream(path), speed)

    @property
    def damage(self) -> str | None:
        """What was wrong with a streamed file (complete once it was played to its end)."""
        return None if self._stream is None else self._stream.damage

    @property
    def end(self) -> Sample | None:
        """The job's last words (Sample.end), once the recording was played to its end (a replay stopped
        before, by --duration or q, has not reached them, whatever the read-ahead saw)."""
        return self._recording.end if self._played else None

    @property
    def unreadable(self) -> bool:
        """The file is bad input (its bytes stopped reading, lines refused as beyond one machine's bounds):
        what could be read was played, still exit 2."""
        return self._stream is not None and self._stream.bad_input

    def open(self) -> None:
        pass

    def _wait(self, gap: float) -> float:
        """Seconds to wait for a recorded gap of `gap` seconds: at most MAX_REPLAY_WAIT_S, said."""
        wait = gap / self.speed
        cap = MAX_REPLAY_WAIT_S
        if wait <= cap:
            return wait
        if gap <= 2 * self.recorded_interval:  # the recording's own pace, not a hole in it
            if not self._paced:
                self._paced = True
                self.notes.append(
                    f"replay plays faster than recorded: its samples are {clock(gap)} apart "
                    f"({wait:g} s at {self.speed:g}x); waits are capped at {cap:g} s"
                )
            return cap
        self._gaps += 1
        if self._gaps <= MAX_GAP_NOTES:
            assert self._first is not None and self._previous is not None
            at = self._previous.t - self._first.t
            self.notes.append(
                f"replay skipped a {clock(gap)} gap in the recording at t+{clock(at)} "
                f"(no samples; waits are capped at {cap:g} s)"
            )
        elif self._gaps == MAX_GAP_NOTES + 1:
            self.notes.append("replay skips more gaps in the recording; not said one by one")
        return cap

    def next(self, stop: threading.Event) -> Sample | None:
        if stop.is_set():
            return None
        s = self._ahead.popleft() if self._ahead else next(self._samples, None)
        if s is None:
            self._played = True
            if self.damage:
                self.notes.append(self.damage)
            return None
        if self._previous is not None:
            wait = self._wait(max(0.0, s.t - self._previous.t))
            if wait and stop.wait(wait):
                return None
        self._first = self._first or s
        self._previous = s
        return s

    def close(self) -> None:
        if self._stream is not None:
            self._stream.close()


@dataclass(frozen=True)
class Notice:
    """Something the user should be told once while watching (a skipped gap in a replay...)."""

    text: str


class Poller:
    """Runs `source.next` on a daemon thread and hands each sample, each of the source's notes (a
    Notice), and None at the end to `deliver`."""

    def __init__(self, source: Source, deliver: Callable[[Sample | Notice | None], None]) -> None:
        self.source = source
        self.deliver = deliver
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="gpudoctor-poller", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        try:
            while not self.stop.is_set():
                sample = self.source.next(self.stop)
                notes = getattr(self.source, "notes", None)
                while notes:
                    self.deliver(Notice(notes.pop(0)))
                if sample is None:
                    break
                self.deliver(sample)
        except Exception as exc:  # noqa: BLE001  (reported by the consumer as the end of data)
            self.error = exc
        if not self.stop.is_set():
            self.deliver(None)

    def close(self, timeout: float = 2.0) -> None:
        """Stop and join; a thread stuck inside NVML is a daemon and cannot keep us alive."""
        self.stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)
        if not self._thread.is_alive():
            self.source.close()
