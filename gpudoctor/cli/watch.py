"""The `gpudoctor watch` and `gpudoctor report` commands (click wiring only).

Textual is imported only when the dashboard is actually shown, so `gpudoctor check` and
the headless paths never pay for it.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import threading
from collections.abc import Iterator
from typing import Any

import click

from gpudoctor.cli.options import FILE_NAME
from gpudoctor.cli.output import ProgressLine, Verdict
from gpudoctor.cli.types import FiniteFloat, OnceCommand
from gpudoctor.errors import EXIT_HANGUP, EXIT_UNAVAILABLE, EXIT_USAGE, UserError
from gpudoctor.safety import signals
from gpudoctor.watch.bounds import MAX_THRESHOLD_S
from gpudoctor.watch.recording import dumps  # light: json and the sample model only

WATCH_EPILOG = """\b
Examples:
  gpudoctor watch                                   dashboard of every GPU
  gpudoctor watch -- torchrun --nproc_per_node 8 train.py
  gpudoctor watch --no-tui --duration 60 --record run.jsonl
  gpudoctor watch --replay run.jsonl --speed 10
  gpudoctor report run.jsonl --json
  gpudoctor watch --demo hung --gpus 16     a synthetic job, no GPU needed
  gpudoctor report sample:straggler         a recording shipped with gpudoctor

\b
In the training loop (standard library only; ~0.1 us a call when not watched):
  import gpudoctor
  for batch in loader:
      with gpudoctor.step():
          train_step(batch)

\b
Keys: q quit, ctrl+c interrupt, p pause, c compact GPU rows, s sort processes,
t/i SIGTERM/SIGINT the selected process (asks first), ? help.
\b
Exit codes:
  0  watched to the end (or the followed command's own exit code)
  2  usage error: bad option, unreadable recording (also one whose bytes stop reading midway, or
     with lines beyond one machine, after playing what it could), --record FILE exists; a recording
     cut off at its end (a killed --record, plain or gzip) is played to the cut and noted, exit 0
  3  gpudoctor could not run at all (no NVIDIA driver, and no command, --replay or --demo)
  129  hung up (SIGHUP, or the terminal went away): a command started by gpudoctor gets SIGHUP
  130  interrupted (Ctrl-C, SIGTERM): a command started by gpudoctor is stopped"""


def warmup_option(command: Any) -> Any:
    return click.option(
        "--warmup",
        type=FiniteFloat(min=0, max=MAX_THRESHOLD_S),
        metavar="SECONDS",
        help="Balance verdicts wait this long after the first sample (default: 60 s or one window, the later).",
    )(command)


def config_options(command: Any) -> Any:
    """--config FILE / --no-config: the policy file whose [watch] table sets the thresholds (as for check)."""
    command = click.option("--no-config", is_flag=True, help="Use no policy file.")(command)
    return click.option(
        "--config",
        "config_path",
        type=FILE_NAME,
        metavar="FILE",
        help="Policy file with a [watch] table of thresholds (default: gpudoctor.toml or pyproject.toml upwards).",
    )(command)


def _parse_gpus(value: str | None) -> frozenset[int] | None:
    if value is None:
        return None
    try:
        listed = [int(t) for t in value.split(",") if t.strip()]
    except ValueError:
        raise UserError(f"--gpus takes NVML indices like 0,1,2 (got {value!r})", EXIT_USAGE, "usage") from None
    if not listed or min(listed) < 0:
        raise UserError(f"--gpus takes NVML indices like 0,1,2 (got {value!r})", EXIT_USAGE, "usage")
    twice = sorted({i for i in listed if listed.count(i) > 1})
    if twice:
        raise UserError(
            f"--gpus names GPU {','.join(map(str, twice))} more than once (got {value!r})", EXIT_USAGE, "usage"
        )
    return frozenset(listed)


def _json_lines_error(kind: str, message: str, exit_code: int) -> None:
    """`watch --json` prints JSON lines, so its error is one JSON line too (and one line on stderr)."""
    doc = {"kind": "error", "schema_version": 1, "command": "watch", "exit_code": exit_code}
    doc["error"] = {"kind": kind, "message": message}
    click.echo(json.dumps(doc, separators=(",", ":")))
    click.echo(f"gpudoctor: {message}", err=True)
    sys.exit(exit_code)


def _json_requested(args: list[str]) -> bool:
    """--json among watch's own options (not in the command after `--`)."""
    own = args[: args.index("--")] if "--" in args else args
    return "--json" in own


class _WatchCommand(OnceCommand):
    """`watch` whose errors, with --json, are one JSON line like the rest of its output."""

    def make_context(self, info_name: str | None, args: list[str], parent: click.Context | None = None, **extra: Any):  # type: ignore[no-untyped-def,override]
        as_json = _json_requested(list(args))
        try:
            return super().make_context(info_name, args, parent=parent, **extra)
        except click.ClickException as exc:
            if as_json:
                _json_lines_error("usage", exc.format_message(), EXIT_USAGE)
            raise

    def invoke(self, ctx: click.Context) -> Any:
        if not ctx.params.get("as_json"):
            return super().invoke(ctx)
        try:
            return super().invoke(ctx)
        except UserError as exc:
            _json_lines_error(exc.kind, str(exc), exc.exit_code)
        except click.ClickException as exc:
            _json_lines_error("usage", exc.format_message(), EXIT_USAGE)
        except (KeyboardInterrupt, BrokenPipeError):
            raise
        except Exception as exc:
            if os.environ.get("GPUDOCTOR_DEBUG"):
                raise
            message = f"internal error: {type(exc).__name__}: {exc} (GPUDOCTOR_DEBUG=1 shows the traceback)"
            _json_lines_error("internal", message, EXIT_UNAVAILABLE)
        return None


DEMOS = ("straggler", "hung", "starved", "throttle", "xid", "lost", "balanced")  # synthetic.DEMOS, kept light
MAX_DEMO_GPUS = 128
ERROR_FILE_ENV = "TORCHELASTIC_ERROR_FILE"  # torchrun's: where it writes the first failure
DEMO_AFTER_WARMUP_S = 30.0  # `--demo` into a pipe: how long it plays past the warm-up (in the demo's time)
EXIT_GRACE_S = 0.5  # once stopped: output a terminal does not take within this long is given up (exit anyway)


@click.command(
    "watch",
    cls=_WatchCommand,
    epilog=WATCH_EPILOG,
    context_settings={"help_option_names": ["-h", "--help"], "ignore_unknown_options": False},
)
@click.option(
    "--interval",
    type=FiniteFloat(min=0.1),
    default=1.0,
    show_default=True,
    help="Seconds between device readings.",
)
@click.option(
    "--process-interval",
    type=FiniteFloat(min=0.5),
    default=5.0,
    show_default=True,
    help="Seconds between process-list readings.",
)
@click.option(
    "--record",
    "record_path",
    type=FILE_NAME,
    metavar="FILE",
    help="Write every sample to FILE (JSON lines).",
)
@click.option("--force", is_flag=True, help="With --record: overwrite FILE if it already holds something.")
@click.option(
    "--replay",
    "replay_path",
    type=FILE_NAME,
    metavar="FILE",
    help="Play a recording instead of reading NVML.",
)
@click.option(
    "--speed", type=FiniteFloat(min=0.01), default=1.0, show_default=True, help="Replay speed (2 = twice as fast)."
)
@click.option("--no-tui", is_flag=True, help="Print one line per interval instead of the dashboard.")
@click.option("--json", "as_json", is_flag=True, help="With --no-tui: JSON lines, then a summary line.")
@click.option("--duration", type=FiniteFloat(min=0.1), help="Stop after this many seconds.")
@click.option("--pid", type=click.IntRange(min=1), help="Follow a running job (its process tree) instead.")
@click.option(
    "--gpus",
    "gpus_opt",
    metavar="LIST",
    help="Only these GPUs (NVML indices, e.g. 0,1,2). With --demo: how many GPUs to simulate (default 8).",
)
@click.option(
    "--demo",
    type=click.Choice(DEMOS),
    is_flag=False,
    flag_value="straggler",
    default=None,
    help="Play a built-in synthetic training job live, no GPU needed (default: straggler); "
    "without a terminal it ends once its verdicts have fired.",
)
@warmup_option
@click.option(
    "--hang-after",
    type=FiniteFloat(min=1, max=MAX_THRESHOLD_S),
    metavar="SECONDS",
    help="Steps stalled this long is a hang (GD911; default: 60 s or 10x the median step, the longer).",
)
@click.option(
    "--join-after",
    type=FiniteFloat(min=1, max=MAX_THRESHOLD_S),
    metavar="SECONDS",
    help="A followed job's ranks not joined, or not at step 1, this long is a hang (GD920-GD923; default 30 s).",
)
@config_options
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def watch(
    interval: float,
    process_interval: float,
    record_path: str | None,
    force: bool,
    replay_path: str | None,
    speed: float,
    no_tui: bool,
    as_json: bool,
    duration: float | None,
    pid: int | None,
    gpus_opt: str | None,
    demo: str | None,
    warmup: float | None,
    hang_after: float | None,
    join_after: float | None,
    config_path: str | None,
    no_config: bool,
    command: tuple[str, ...],
) -> None:
    """Live per-GPU balance while training runs: a dashboard, or lines without a terminal.

    With `-- COMMAND...` gpudoctor starts the command, watches the GPUs it uses and the training
    steps its ranks publish (`gpudoctor.step()`), ends when it ends (with its exit code) and prints
    a summary. Without a GPU it still follows the command's steps.
    """
    from gpudoctor.watch.follow import Job
    from gpudoctor.watch.session import Session
    from gpudoctor.watch.sources import (
        HostSource,
        NvmlSource,
        ReplaySource,
        SyntheticSource,
        check_gpus,
        demo_source,
        fake_from_env,
    )
    from gpudoctor.watch.terminal import HangupWatch

    if command and pid:
        raise UserError("give either --pid or a command after --, not both", EXIT_USAGE, "usage")
    if demo and (command or pid or replay_path or record_path):
        raise UserError(
            "--demo plays a synthetic job: not with a command, --pid, --replay or --record", EXIT_USAGE, "usage"
        )
    if replay_path and (command or pid):
        raise UserError("--replay plays a recording; it cannot follow a job", EXIT_USAGE, "usage")
    if replay_path and record_path:
        raise UserError("--replay and --record together would copy a recording; use cp", EXIT_USAGE, "usage")
    if force and not record_path:
        raise UserError("--force goes with --record FILE (overwrite FILE)", EXIT_USAGE, "usage")
    gpus = None if demo else _parse_gpus(gpus_opt)
    th = thresholds(config_path, no_config, warmup_s=warmup, hang_after_s=hang_after, join_after_s=join_after)
    if record_path:
        from gpudoctor.watch.recording import check_record_target

        check_record_target(record_path, force)  # before anything starts: never lose a recording
    damage = None
    if replay_path:
        from gpudoctor.watch.recording import recording_path

        source: Any = ReplaySource.open_file(recording_path(replay_path), speed)  # streamed; damage said at its end
    elif demo:
        source = demo_source(demo, _demo_gpus(gpus_opt), speed)
    else:
        source = fake_from_env(interval, process_interval) or NvmlSource(
            interval, process_interval, sorted(gpus) if gpus else None
        )
    tui = not no_tui and not as_json and sys.stdout.isatty() and sys.stdin.isatty()
    term = os.environ.get("TERM", "")
    if tui and term in ("", "dumb"):  # no cursor addressing: the full-screen UI would be garbage
        shown = term or "(unset)"
        click.echo(f"gpudoctor: TERM={shown} cannot show the dashboard; printing lines (--no-tui)", err=True)
        tui = False
    if demo and not tui and duration is None:
        # Lines into a pipe or a file: nobody is there to press Ctrl-C. The demo ends once its verdicts
        # have had time to fire (the warm-up, then DEMO_AFTER_WARMUP_S of the demo's time).
        duration = (th.warmup + DEMO_AFTER_WARMUP_S) / speed
        click.echo(f"gpudoctor: --demo without a terminal ends after {duration:g} s (--duration to choose)", err=True)
    attached = Job.attach(pid) if pid else None  # no such process: said before anything about GPUs
    # Open the source before starting a job: no driver means no job started, unless the job's
    # training steps can be followed without a GPU (a started one: --pid has no step channel).
    try:
        source.open()
    except UserError as exc:
        if not command or gpus or exc.exit_code != EXIT_UNAVAILABLE:
            raise
        source = HostSource(interval, process_interval, str(exc).split(" (see ")[0])
        source.open()
    try:
        check_gpus(gpus, source.available, "the recording" if replay_path else "this machine")
    except UserError:
        source.close()
        raise
    job = None
    steps = None
    error_file = None
    if attached is not None:
        job = attached
    elif command:
        steps = _step_channel()
        env = {**os.environ, **(steps.env if steps is not None else {})}
        error_file = env.get(ERROR_FILE_ENV) or (steps.error_file if steps is not None else None)
        if error_file:  # torchrun writes the first failure there (a script with @record)
            env[ERROR_FILE_ENV] = error_file
        try:
            job = Job.start(
                list(command),
                env=env,
                adopt=True,
                channel=None if steps is None else steps.directory,
                keep_stderr=True,
            )
        except UserError:
            if steps is not None:
                steps.close()
            raise
        if steps is not None:
            steps.accept = job.owns
    if job is not None and isinstance(source, SyntheticSource):
        source.pids = lambda: tuple(sorted(job.pids()))  # the fake source puts the job's PIDs on its GPUs
    if job is not None and isinstance(source, HostSource):
        source.pids = job.pids  # no GPU: the process table lists the job's own processes (CPU%, RSS)
    session = Session(
        source,
        record_path=record_path,
        job=job,
        gpus=gpus,
        damage=damage,
        opened=True,
        thresholds=th,
        steps=steps,
        error_file=error_file,
    )
    signals.install()  # SIGTERM, SIGHUP raise Stopped like Ctrl-C (an ignored SIGHUP, nohup, stays ignored)
    hangup = HangupWatch()  # a terminal that goes away without a SIGHUP reaching us is one too
    interrupted: int | None = None  # the exit code an interruption gives
    stop_signal = signal.SIGTERM  # what a followed command gets if gpudoctor stops it
    try:
        hangup.start()
        session.start()
        if tui:
            from gpudoctor.watch.ui.app import INTERRUPTED, run_app  # lazy: textual only for the dashboard

            result, signum = run_app(session, duration=duration)  # our handlers are back when it returns
            if signum is not None:  # SIGTERM, SIGHUP, SIGINT: the same way out as without the dashboard
                raise signals.Stopped(signum)
            if result == INTERRUPTED:  # the Ctrl-C key
                raise KeyboardInterrupt
        else:
            from gpudoctor.watch import heap
            from gpudoctor.watch.headless import run_headless

            heap.settle()  # started: what is alive now lives as long as the watch
            run_headless(session, sys.stdout, as_json=as_json, duration=duration)
    except KeyboardInterrupt as exc:
        interrupted = signals.exit_code(exc)
        if interrupted == EXIT_HANGUP:
            stop_signal = signal.SIGHUP  # as the shell would have: the command is in a session of its own
    finally:
        hangup.stop()
        with signals.deferred(act=False):  # already on the way out: a second signal does not cut the stop short
            session.close(stop_signal)
    summary = session.summary()
    if interrupted is None:
        _print_summary(summary, as_json)
        if summary.failure:  # the one line that says why the command failed, beside its exit code
            click.echo(f"gpudoctor: {summary.failure['line']} (gpudoctor explain GD927)", err=True)
    else:
        # Stopped: the command is stopped already, and nothing may hold gpudoctor now. A terminal that
        # hung up fails the writes; one that nobody reads (a stalled SSH connection) would block them
        # for good: then gpudoctor exits anyway, with the code that says why it ended.
        with signals.deferred(act=False), _exit_if_stuck(interrupted):
            why = "hung up" if interrupted == EXIT_HANGUP else "interrupted"
            _print_summary(
                summary, as_json, f"gpudoctor: {why}" + ("; stopped the command" if job and job.owned else "")
            )
        sys.exit(interrupted)
    if job is not None and job.owned:
        sys.exit(job.poll() or 0)
    if isinstance(source, ReplaySource) and source.unreadable:  # played up to the damage, said in its note
        sys.exit(EXIT_USAGE)
    sys.exit(0)


def thresholds(config_path: str | None, no_config: bool, **given: float | None) -> Any:
    """The analysis thresholds: the policy file's [watch] table (gpudoctor.policy), then the options given."""
    import dataclasses

    from gpudoctor.policy import load, watch_thresholds

    if config_path and no_config:
        raise UserError("--config and --no-config contradict each other", EXIT_USAGE, "usage")
    th = watch_thresholds(load(config_path, use_config=not no_config))
    return dataclasses.replace(th, **{k: v for k, v in given.items() if v is not None})


def _print_summary(summary: Any, as_json: bool, stopped: str | None = None) -> None:
    """The summary on stdout; `stopped`: why watch was stopped, said on stderr after it. Once stopped,
    output that cannot be written (its terminal hung up) is let go: the exit code says why it ended."""
    from gpudoctor.cli.output import OutputError  # the CLI's stdout raises it for a failed write (a closed terminal)

    try:
        if as_json:
            click.echo(dumps({"kind": "summary", **summary.to_json()}, separators=(",", ":")))
        else:
            from gpudoctor.watch.summary import render_text

            click.echo(render_text(summary), nl=False)
        if stopped is not None:
            click.echo(stopped, err=True)
    except (OSError, OutputError):
        if stopped is None:
            raise
        _silence_output()


@contextlib.contextmanager
def _exit_if_stuck(code: int, seconds: float = EXIT_GRACE_S) -> Iterator[None]:
    """Exit with `code` (at once, without flushing) if the block has not finished after `seconds`."""
    timer = threading.Timer(seconds, os._exit, (code,))
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


def _silence_output() -> None:
    """Standard output and error go nowhere from now on (their terminal is gone), so that flushing them
    at exit cannot fail and change the exit code."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
    except OSError:
        pass
    sys.stdout = open(os.devnull, "w")  # noqa: SIM115  (lives until exit)
    sys.stderr = open(os.devnull, "w")  # noqa: SIM115


def _demo_gpus(value: str | None) -> int:
    """With --demo, --gpus is how many GPUs to simulate."""
    if value is None:
        return 8
    if not value.strip().isdigit() or not 1 <= int(value) <= MAX_DEMO_GPUS:
        raise UserError(
            f"with --demo, --gpus is how many GPUs to simulate, 1 to {MAX_DEMO_GPUS} (got {value!r})",
            EXIT_USAGE,
            "usage",
        )
    return int(value)


def _step_channel() -> Any:
    """The private channel the job's ranks publish their steps on; None (and said once) if it cannot be made."""
    from gpudoctor.watch.steps import StepChannel

    try:
        return StepChannel()
    except OSError as exc:
        click.echo(f"gpudoctor: training steps will not be followed: {exc.strerror or exc}", err=True)
        return None


@click.command("report", cls=OnceCommand)
@click.argument("recording", type=FILE_NAME, metavar="FILE")
@click.option("--json", "as_json", is_flag=True, help="One JSON document (schema: gpudoctor/schemas).")
@warmup_option
@config_options
def report(recording: str, as_json: bool, warmup: float | None, config_path: str | None, no_config: bool) -> None:
    """Summarize a `watch --record` recording: per-GPU utilization, balance score, verdicts.

    A file whose bytes stop reading (a corrupt gzip) is summarized up to the damage, then exit 2.

    FILE may be `sample:NAME`, a recording shipped with gpudoctor (straggler, hung, xid, ...)."""
    from gpudoctor.watch.recording import recording_path
    from gpudoctor.watch.summary import render_text, summarize_recording

    th = thresholds(config_path, no_config, warmup_s=warmup)
    progress = ProgressLine(f"gpudoctor: {recording}")  # a day of 8 GPUs takes most of a minute
    try:
        summary = summarize_recording(recording_path(recording), th, progress)  # streamed: memory stays flat
    finally:
        progress.done()
    if summary.unreadable and not summary.samples:  # damaged or refused lines alone: nothing to summarize
        raise UserError(f"recording {recording} has no usable sample: {summary.damage}", EXIT_USAGE, "input")
    Verdict.code = EXIT_USAGE if summary.unreadable else 0  # what a reader that stops reading still gets
    try:
        if as_json:
            doc = summary.to_json()
            doc["command"] = "report"
            click.echo(dumps(doc, indent=2))
        else:
            click.echo(render_text(summary), nl=False)  # a damaged recording is noted in the summary
    finally:  # said even when stdout went away (exit 2 all the same)
        if summary.unreadable:  # the samples before the damage are summarized (and the damage noted); still bad input
            kept = f"the summary covers the {summary.samples} sample(s) it could read (see the note)"
            with contextlib.suppress(OSError, ValueError):  # no stderr left to say it on: the exit code says it
                click.echo(f"gpudoctor: recording {recording} is damaged: {kept}", err=True)
    if summary.unreadable:
        sys.exit(EXIT_USAGE)


def register(group: click.Group) -> None:
    group.add_command(watch)
    group.add_command(report)
