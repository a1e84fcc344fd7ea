"""One watch run, whatever draws it: source + poller + recording + job + summary.

The poller thread only puts samples on `queue`; everything else (recording, filtering to
the job's GPUs, analysis) happens on the consumer's thread in `handle`, so the headless
loop and the Textual app share one code path.
"""

from __future__ import annotations

import queue
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass, field, replace
from typing import IO, Any

from gpudoctor.safety.safe_io import read_text
from gpudoctor.safety.signals import deferred
from gpudoctor.version import __version__
from gpudoctor.watch.analysis import Verdict
from gpudoctor.watch.bounds import MAX_RANKS
from gpudoctor.watch.crash import diagnose, explained
from gpudoctor.watch.crash import verdict as failed_verdict
from gpudoctor.watch.follow import Job
from gpudoctor.watch.job import STACK_CODES, uneven_steps
from gpudoctor.watch.model import RankReading, Sample
from gpudoctor.watch.recording import RecordWriter
from gpudoctor.watch.sources import Notice, Poller, Source
from gpudoctor.watch.steps import StepChannel
from gpudoctor.watch.summary import Summary, SummaryBuilder
from gpudoctor.watch.thresholds import DEFAULT, Thresholds
from gpudoctor.watch.tracker import JobTracker


def say(err: IO[str], line: str) -> None:
    """One line on stderr; a closed stderr does not stop watching (the summary still says it)."""
    try:
        err.write(line + "\n")
        err.flush()
    except (OSError, ValueError):
        pass


ERROR_FILE_LIMIT = 1 << 20  # torchrun's error file: a message and a traceback
TREE_EVERY_S = 5.0  # the job's process tree is recorded at least this often (its descendants, for the sentinel)
TRACK_EVERY_S = 0.9  # the job's processes (arrival, stacks) are looked at about once a second, at most


@dataclass(frozen=True)
class End:
    """Queue marker: the source ran out (replay finished, poller error) or the job ended."""

    reason: str  # "source" or "job"
    detail: str = ""


@dataclass
class Update:
    sample: Sample  # filtered to the watched GPUs
    verdicts: tuple[Verdict, ...]
    builder: SummaryBuilder


@dataclass
class Session:
    source: Source
    record_path: str | None = None
    job: Job | None = None
    gpus: frozenset[int] | None = None  # --gpus
    thresholds: Thresholds = DEFAULT
    damage: str | None = None  # from a replayed recording
    queue: queue.Queue[Any] = field(default_factory=queue.Queue)
    job_gpus: set[int] = field(default_factory=set)
    last_arrival: float = 0.0
    opened: bool = False  # the caller already opened the source (to fail before starting a job)
    err: IO[str] | None = None  # where a recording failure is said (None: sys.stderr)
    record_error: str | None = None  # why --record stopped early (disk full...); watching went on
    steps: StepChannel | None = None  # the job's training steps (gpudoctor.step()); None: no channel
    error_file: str | None = None  # where torchrun writes the first failure (TORCHELASTIC_ERROR_FILE)

    def __post_init__(self) -> None:
        self.builder = SummaryBuilder(self.source.label, self.thresholds)
        self._poller = Poller(self.source, self._deliver)
        self._writer: RecordWriter | None = None
        self._refreshed = 0.0  # when the job's process tree was last recorded (monotonic)
        # The job's processes, sample by sample (a job gpudoctor started: it gave it the step channel).
        owned = self.job is not None and self.job.owned
        self.tracker = JobTracker(self.thresholds.join_after_s) if owned else None
        self.failure: Any = None  # crash.Failure, once a job that failed has ended
        self._tracked = -TRACK_EVERY_S  # when the job's processes were last looked at (monotonic)
        self._job_now: tuple[Any, ...] = ()

    def _deliver(self, sample: Sample | Notice | None) -> None:
        if sample is None:
            detail = f"{type(self._poller.error).__name__}: {self._poller.error}" if self._poller.error else ""
            self.queue.put(End("source", detail))
        elif isinstance(sample, Sample) and self.steps is not None:
            data = self.steps.take_data() or None  # the ranks' samples, loss, loader time
            self.queue.put(
                replace(sample, ranks=self.steps.take(), data=data)
            )  # the interval's steps, with its readings
        else:
            self.queue.put(sample)

    @property
    def stale_after(self) -> float:
        """No sample for this long: the readings on screen are stale (NVML stalled)."""
        return max(2.5 * self.source.interval, self.source.interval + 2.0)

    def start(self) -> None:
        if not self.opened:
            self.source.open()
            self.opened = True
        if self.record_path:
            self._writer = RecordWriter(
                self.record_path,
                {
                    "host": socket.gethostname(),
                    "started": time.time(),
                    "interval": self.source.interval,
                    "gpudoctor_version": __version__,
                    "command": self.job.command if self.job else None,
                    "source": self.source.label,  # "live"; "synthetic:..." marks made-up readings
                },
            )
        notes = getattr(self.source, "notes", None)
        while notes:  # what the source knows before any reading (no GPU...) is said even if the job ends first
            self.queue.put(Notice(notes.pop(0)))
        if self.job is not None:
            self.job.refresh()
            threading.Thread(target=self._wait_job, name="gpudoctor-job", daemon=True).start()
        self.last_arrival = time.monotonic()
        self._poller.start()

    def _wait_job(self) -> None:
        assert self.job is not None
        self.job.wait()
        self.queue.put(End("job"))

    def handle(self, raw: Sample) -> Update:
        """Record, filter and judge one sample. A stop signal (Ctrl-C, SIGTERM, SIGHUP) waits until the sample
        is both in the recording and counted: `report` of the file then says what `watch` said (review 7)."""
        with deferred():
            return self._handle(raw)

    def _handle(self, raw: Sample) -> Update:
        self.last_arrival = time.monotonic()
        if self.tracker is not None and self.job is not None:
            if self.last_arrival - self._tracked >= TRACK_EVERY_S or raw.procs is not None:
                self._tracked = self._refreshed = self.last_arrival
                before = time.time()
                tree = self.job.refresh()
                self.job_gpus.update(p.gpu for p in raw.procs or () if p.pid in tree)
                heard = self.steps.heard() if self.steps is not None else {}
                self._job_now = self.tracker.observe(tree, raw.ranks, heard, raw.t)
                if self.steps is not None:  # what the killed said is held no longer than the tracker holds them
                    self.steps.forget_gone(set(tree) | {p.pid for p in self._job_now}, before)
            raw = replace(raw, job=self._job_now)
        if self._writer is not None:
            self._writer.write(raw)  # the raw sample: a recording keeps every GPU
            if self._writer.error is not None:
                self._recording_failed(self._writer.error)
        if self.job is not None and (raw.procs is not None or self.last_arrival - self._refreshed >= TREE_EVERY_S):
            self._refreshed = self.last_arrival  # the tree is followed without GPU process readings too
            tree = self.job.refresh()
            self.job_gpus.update(p.gpu for p in raw.procs or () if p.pid in tree and p.gpu is not None)
        sample = self.filter(raw)
        verdicts = self.builder.add(sample)
        if self.tracker is not None:
            self.tracker.want_stacks(r.pid for v in verdicts if v.code in STACK_CODES for r in v.ranks)
        return Update(sample, verdicts, self.builder)

    def _recording_failed(self, error: str) -> None:
        """Stop recording, say so once, and keep watching: the job matters more than its record."""
        self.record_error = error
        self._writer = None
        say(self.err or sys.stderr, f"gpudoctor: {error}; watching goes on without recording")

    def filter(self, raw: Sample) -> Sample:
        wanted: set[int] | None = set(self.gpus) if self.gpus is not None else None
        if self.job_gpus:
            wanted = self.job_gpus if wanted is None else wanted & self.job_gpus
        sample = raw if wanted is None else raw.only(frozenset(wanted))
        if self.job is not None and sample.procs is not None:
            tree = self.job.pids()
            sample = replace(sample, procs=tuple(p for p in sample.procs if p.pid in tree))
        return sample

    def summary(self) -> Summary:
        exit_code = self.job.poll() if self.job is not None and self.job.owned else None
        channel = self.steps.note if self.steps is not None else None
        replayed = getattr(self.source, "damage", None)  # a streamed recording's, known at its end
        damage = "; ".join(d for d in (self.damage, replayed, self.record_error, channel) if d) or None
        result = self.builder.summary(damage=damage, exit_code=exit_code)
        result.failure = self.failure.to_json() if self.failure is not None else None
        if self.job_gpus:  # GPUs seen before the job's processes appeared are not the job's
            result.gpus = {k: v for k, v in result.gpus.items() if k in self.job_gpus}
        return result

    def close(self, stop_signal: signal.Signals = signal.SIGTERM) -> None:
        """Stop sampling, end a job we started if it still runs (`stop_signal` first, SIGKILL after a
        grace: see Job.stop), count what it sent as it ended, and close the recording with that too.

        Each step runs whatever the one before raised: a job gpudoctor started is always stopped.
        """
        try:
            self._poller.close()
        finally:
            ended = self.job is not None and self.job.owned and self.job.poll() is not None
            try:
                if self.job is not None and self.job.owned:
                    self.job.stop(sig=stop_signal)
            finally:
                error_text = self._error_file_text() if ended else None
                end: Sample | None = None
                try:
                    end = self._last_words()
                    if end is not None:
                        self.builder.add_end(end)
                finally:
                    try:
                        self._close_recording(end)
                    finally:
                        if self.tracker is not None:
                            self.tracker.close()
                            if ended:
                                self._conclude((end.ranks or ()) if end is not None else (), error_text)

    def _last_words(self) -> Sample | None:
        """What the job sent after the last sample handled, as a recording's last line (Sample.end): the steps
        of samples still queued and what the channel holds as it closes; a replay: its recording's own."""
        if self.steps is None:
            return getattr(self.source, "end", None)
        taken: list[tuple[RankReading, ...]] = []
        data: list[Any] = []
        while True:  # samples the consumer did not take: their steps were taken from the channel
            try:
                item = self.queue.get_nowait()
            except queue.Empty:
                break
            if isinstance(item, Sample):
                taken.append(item.ranks or ())
                data.extend(item.data or ())
        self.steps.close()  # keeps what the job sent as it ended
        taken.append(self.steps.take())
        data.extend(self.steps.take_data())
        by_process: dict[tuple[int, int], RankReading] = {}
        for ranks in taken:  # one reading per process, as a sample holds (a recording's line is bounded by it)
            for r in ranks:
                before = by_process.get(r.key)
                by_process[r.key] = r if before is None else before.then(r)
        ranks = tuple(by_process.values())[-MAX_RANKS:]  # the channel's bound: only ever more if it churned
        return Sample(t=time.time(), gpus=(), ranks=ranks or None, data=tuple(data) or None, end=True)

    def _close_recording(self, end: Sample | None) -> None:
        """Write the job's last words as the recording's last line (Sample.end), then close it."""
        writer, self._writer = self._writer, None
        if writer is None:
            return
        try:
            if end is not None:
                writer.write_end(end)
        finally:
            writer.close()
            if writer.error is not None and self.record_error is None:
                self._recording_failed(writer.error)

    def _error_file_text(self) -> str | None:
        """What torchrun wrote to TORCHELASTIC_ERROR_FILE (a script with @record), or None."""
        if not self.error_file:
            return None
        try:
            return read_text(self.error_file, ERROR_FILE_LIMIT)
        except (OSError, UnicodeDecodeError):
            return None

    def _conclude(self, last: tuple[Any, ...], error_text: str | None) -> None:
        """The job ended by itself: judge how (uneven steps, the first rank that failed) from its final state."""
        assert self.job is not None and self.tracker is not None
        heard = self.steps.heard() if self.steps is not None else {}
        procs = self.tracker.observe((), last, heard, time.time())
        verdicts = uneven_steps(procs)
        if self.job.poll():
            tail = self.job.stderr
            if tail is not None:
                tail.wait(2.0)
            text = tail.text() if tail is not None else ""
            rank_text = tail.rank_text if tail is not None else lambda _: ""
            failure = diagnose(text, error_text, procs, rank_text, self.job.poll())
            if failure is not None:
                failure = self.failure = explained(failure, procs)
                verdicts.append(failed_verdict(failure, procs))
        self.builder.conclude(verdicts, time.time())
