"""The `gpudoctor` command: click wiring only; the work lives in probe/, checks/, render/.

Start-up is part of the interface (`check --quick` gates CI jobs; benchmarks/check_quick.py):
each command imports what it needs when it runs, and `watch`, `report` and `bench` are loaded
only when named (`LazyGroup`).
"""

from __future__ import annotations

import errno
import json
import os
import sys
from importlib import import_module
from typing import Any

import click

from gpudoctor import __version__, signals
from gpudoctor.cli_types import FiniteFloat, NonEmpty, OnceCommand
from gpudoctor.errors import EXIT_UNAVAILABLE, EXIT_USAGE, UserError, error_document, wants_json

EXIT_CODES_HELP = """\b
Exit codes:
  0  nothing at or above --fail-on
  1  a finding at or above --fail-on (an `error` finding counts as fail)
  2  usage error: bad option, unknown code, unusable input file
  3  gpudoctor could not run at all (e.g. cannot write its output)
  129  hung up (SIGHUP: the terminal or SSH session closed)
  130  interrupted (Ctrl-C, SIGTERM)"""

# Commands that live beside their subsystem, imported only when named: "name" -> "module:attribute".
LAZY_COMMANDS = {
    "bench": "gpudoctor.cli_bench:bench",
    "report": "gpudoctor.watch.command:report",
    "watch": "gpudoctor.watch.command:watch",
}


class LazyGroup(click.Group):
    """A click group whose subcommands in LAZY_COMMANDS are imported on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *LAZY_COMMANDS})

    command_class = OnceCommand  # a repeated single-value option is refused, not silently last-wins

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in LAZY_COMMANDS and cmd_name not in self.commands:
            module, attribute = LAZY_COMMANDS[cmd_name].split(":")
            self.add_command(getattr(import_module(module), attribute), cmd_name)
        return super().get_command(ctx, cmd_name)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]}, epilog=EXIT_CODES_HELP)
@click.version_option(__version__, prog_name="gpudoctor")
def main() -> None:
    """Is this machine ready for multi-GPU PyTorch training, and is the run balanced?"""


FILE_NAME = NonEmpty("a file name")
CODE_LIST = NonEmpty("codes, prefixes or check names", items=True)
COLOR = click.option(
    "--color",
    type=click.Choice(["auto", "always", "never"]),
    default="auto",
    show_default=True,
    help="Style the text output: auto = on a terminal unless NO_COLOR is set.",
)
QUIET = click.option("-q", "--quiet", is_flag=True, help="Show only what is not a pass, and the summary line.")


def _collectives(ctx: click.Context, param: click.Parameter, value: str | None) -> tuple[str, ...] | None:
    """--collectives: the names, checked; None when not given (then the policy's list applies)."""
    if value is None:
        return None
    if not value.strip(" ,\t"):  # like --select '': an empty list would silently run nothing more
        raise click.BadParameter(f"needs collective names, got {value!r}.", ctx, param)
    from gpudoctor.busbw import parse_ops

    try:
        return parse_ops(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc), ctx, param) from None


def _split(values: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(t.strip() for v in values for t in v.split(",") if t.strip())


@main.command(epilog=EXIT_CODES_HELP)
@click.option(
    "--snapshot",
    "snapshot_path",
    type=FILE_NAME,
    metavar="FILE",
    help="Check a recorded snapshot instead of this machine (- reads it from standard input).",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document (schema: gpudoctor/schemas).")
@click.option("--junit", "junit_path", type=FILE_NAME, metavar="FILE", help="Also write the findings as JUnit XML.")
@click.option(
    "--prometheus",
    "prometheus_path",
    type=FILE_NAME,
    metavar="FILE",
    help="Also write metrics for node_exporter's textfile collector.",
)
@click.option(
    "--github/--no-github",
    "github",
    default=None,
    help="GitHub Actions job summary and annotations (default: on when GITHUB_ACTIONS=true).",
)
@click.option("--quick", is_flag=True, help="Skip the checks that run workloads (no torch import): --level 1.")
@click.option(
    "--level",
    type=click.IntRange(1, 3),
    help="1 static checks (--quick), 2 adds the active checks (default), 3 adds the deep checks under "
    "load: GEMM, silent data corruption, GPU memory, host links (docs/deep-checks.md).",
)
@click.option(
    "--duration",
    "duration_s",
    type=FiniteFloat(min=1, max=86400),
    metavar="SECONDS",
    help="How long level 3's sustained load runs (default 60); the whole level takes about 1.5x this.",
)
@click.option(
    "--mem-share",
    type=FiniteFloat(min=0.01, max=0.95),
    metavar="FRACTION",
    help="Share of free GPU memory level 3's memory test writes and verifies (default 0.8).",
)
@click.option(
    "--select", multiple=True, type=CODE_LIST, metavar="CODES", help="Only these codes, prefixes (GD4) or check names."
)
@click.option(
    "--ignore", multiple=True, type=CODE_LIST, metavar="CODES", help="Leave out these codes, prefixes or check names."
)
@click.option("--expect-gpus", type=click.IntRange(min=1), help="Fail when fewer GPUs are visible.")
@click.option(
    "--expect-model",
    type=NonEmpty("a model name"),
    metavar="NAME",
    help="Fail when a visible GPU's name does not contain NAME (GD010).",
)
@click.option("--fail-on", type=click.Choice(["warn", "fail"]), help="What makes the exit code 1.  [default: fail]")
@click.option(
    "--device",
    type=click.Choice(["auto", "cuda", "cpu"]),
    default="auto",
    show_default=True,
    help="Where workloads run: cpu uses N processes with gloo.",
)
@click.option("--ranks", type=click.IntRange(min=1, max=64), help="Ranks for --device cpu (default 2).")
@click.option(
    "--timeout",
    "timeout_s",
    type=FiniteFloat(min=1, max=86400),  # registry.MAX_TIMEOUT_S (not imported here: start-up time)
    metavar="SECONDS",
    help="Deadline in seconds for all workloads together (level 3's run gets this plus its planned load), "
    "at most 86400 (a day).  [default: 120]",
)
@click.option(
    "--min-busbw",
    metavar="GB/s|N%",
    help="Required all-reduce busbw: GB/s, or a share of the expected busbw (80%).",
)
@click.option("--allow-mig", is_flag=True, default=None, help="Do not fail multi-GPU checks on MIG-enabled GPUs.")
@click.option(
    "--collectives",
    metavar="LIST",
    callback=_collectives,
    help="Also run and judge these beside all-reduce: allgather, reducescatter (what FSDP/ZeRO use; "
    "`fsdp` names both), alltoall, broadcast, sendrecv, or all.",
)
@click.option(
    "--ram-per-gpu",
    "ram_per_gpu_gb",
    type=FiniteFloat(min=0),
    metavar="GiB",
    help="Host RAM wanted per visible GPU (GD501).  [default: 16]",
)
@click.option(
    "--baseline", type=FILE_NAME, metavar="FILE", help="Compare with a saved `check --json` report or a snapshot."
)
@click.option("--tolerance", metavar="N%", help="Regression allowed against --baseline.  [default: 10%]")
@click.option(
    "--config",
    "config_path",
    type=FILE_NAME,
    metavar="FILE",
    help="Policy file (default: gpudoctor.toml or pyproject.toml found upwards).",
)
@click.option("--no-config", is_flag=True, help="Use no policy file.")
@click.option("-v", "--verbose", count=True, help="-v: every check with its tables; -vv: passing findings too.")
@QUIET
@COLOR
def check(
    snapshot_path: str | None,
    as_json: bool,
    junit_path: str | None,
    prometheus_path: str | None,
    github: bool | None,
    quick: bool,
    level: int | None,
    duration_s: float | None,
    mem_share: float | None,
    select: tuple[str, ...],
    ignore: tuple[str, ...],
    expect_gpus: int | None,
    expect_model: str | None,
    fail_on: str | None,
    device: str,
    ranks: int | None,
    timeout_s: float | None,
    min_busbw: str | None,
    allow_mig: bool | None,
    collectives: tuple[str, ...] | None,
    ram_per_gpu_gb: float | None,
    baseline: str | None,
    tolerance: str | None,
    config_path: str | None,
    no_config: bool,
    verbose: int,
    quiet: bool,
    color: str,
) -> None:
    """Check that this machine (or a recorded snapshot) is ready for a multi-GPU run."""
    from gpudoctor.api import run_checks
    from gpudoctor.render.outputs import Outputs

    if config_path and no_config:
        raise UserError("--config and --no-config contradict each other", EXIT_USAGE, "usage")
    _quiet_and_verbose(quiet, verbose)
    other_rank = _quiet_rank(os.environ)
    inputs = {"the --snapshot file": snapshot_path, "the --baseline file": baseline, "the --config file": config_path}
    outputs = Outputs(junit_path, prometheus_path, github, inputs=inputs) if not other_rank else Outputs(github=False)
    outputs.precheck()
    report = run_checks(
        snapshot=snapshot_path,
        quick=quick,
        level=level,
        duration_s=duration_s,
        mem_share=mem_share,
        expect_gpus=expect_gpus,
        expect_model=expect_model,
        select=_split(select),
        ignore=_split(ignore),
        fail_on=fail_on,
        device=device,
        ranks=ranks,
        timeout_s=timeout_s,
        min_busbw=min_busbw,
        allow_mig=allow_mig,
        collectives=collectives,
        ram_per_gpu_gb=ram_per_gpu_gb,
        baseline=baseline,
        tolerance=tolerance,
        config=config_path,
        use_config=not no_config,
        progress=_progress_printer(as_json or quiet),
    )
    if other_rank:
        # torchrun merges its local ranks' stdout: one report per node keeps --json parseable.
        counts = ", ".join(f"{n} {s}" for s, n in report.counts().items() if n)
        click.echo(f"gpudoctor: {other_rank}: {counts}; local rank 0 prints the report", err=True)
        sys.exit(report.exit_code)
    _print_report(report, as_json, verbose, outputs, quiet, color)


def _quiet_and_verbose(quiet: bool, verbose: int) -> None:
    if quiet and verbose:
        raise UserError("-q/--quiet and -v/--verbose ask for opposite things; give one", EXIT_USAGE, "usage")


def _print_report(
    report: Any, as_json: bool, verbose: int, outputs: Any, quiet: bool = False, color: str = "auto"
) -> None:
    """Side outputs, then the report; an output that failed is a line on stderr and exit 3."""
    problems = outputs.write(report, sys.stderr)
    _verdict[0] = EXIT_UNAVAILABLE if problems else report.exit_code  # what a closed pipe still exits with
    if as_json:
        from gpudoctor.render.json import dumps, report_document

        click.echo(dumps(report_document(report)), nl=False)
    else:
        from gpudoctor.render.text import TextOptions, make_console, render_report  # rich: the text report only

        render_report(report, make_console(color), options=TextOptions(verbose=verbose, quiet=quiet))
    for problem in problems:
        click.echo(f"gpudoctor: {problem}", err=True)
    sys.exit(_verdict[0])


@main.command(epilog=EXIT_CODES_HELP)
@click.argument("before", metavar="A")
@click.argument("after", metavar="B")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document (schema: gpudoctor/schemas).")
@click.option("--tolerance", metavar="N%", help="Regression allowed from A to B.  [default: 10%]")
@click.option("--fail-on", type=click.Choice(["warn", "fail"]), help="What makes the exit code 1.  [default: fail]")
@click.option("--ignore", multiple=True, type=CODE_LIST, metavar="CODES", help="Leave out these codes (GD011-GD016).")
@click.option("--junit", "junit_path", type=FILE_NAME, metavar="FILE", help="Also write the findings as JUnit XML.")
@click.option("--github/--no-github", "github", default=None, help="GitHub Actions summary and annotations.")
@click.option(
    "--config",
    "config_path",
    type=FILE_NAME,
    metavar="FILE",
    help="Policy file for tolerance, fail-on, ignore, severity.",
)
@click.option("--no-config", is_flag=True, help="Use no policy file.")
@click.option("-v", "--verbose", count=True, help="-v: every comparison; -vv: passing findings too.")
@QUIET
@COLOR
def diff(
    before: str,
    after: str,
    as_json: bool,
    tolerance: str | None,
    fail_on: str | None,
    ignore: tuple[str, ...],
    junit_path: str | None,
    github: bool | None,
    config_path: str | None,
    no_config: bool,
    verbose: int,
    quiet: bool,
    color: str,
) -> None:
    """Compare two saved reports (`check --json`) or snapshots: A the reference, B the one judged.

    Two nodes of a cluster, or one node before and after maintenance: GPU count, models, UUIDs,
    driver, VBIOS and links, then busbw, DDP step time and P2P bandwidth beyond the tolerance.
    """
    from gpudoctor.api import diff_report
    from gpudoctor.render.outputs import Outputs

    if config_path and no_config:
        raise UserError("--config and --no-config contradict each other", EXIT_USAGE, "usage")
    _quiet_and_verbose(quiet, verbose)
    outputs = Outputs(
        junit_path, None, github, inputs={"report A": before, "report B": after, "the --config file": config_path}
    )
    outputs.precheck()
    report = diff_report(
        before,
        after,
        tolerance=tolerance,
        fail_on=fail_on,
        ignore=_split(ignore),
        config=config_path,
        use_config=not no_config,
    )
    _print_report(report, as_json, verbose, outputs, quiet, color)


def _quiet_rank(environ: Any) -> str | None:
    """Under torchrun/srun, every local rank but 0 leaves the report to local rank 0."""
    if "RANK" not in environ:  # not under a launcher: nothing to import (start-up time)
        return None
    from gpudoctor.launch import torchrun_env  # torch-free

    if torchrun_env(environ) and environ.get("LOCAL_RANK", "0").strip() not in ("", "0"):
        return f"rank {environ['RANK']} (local rank {environ['LOCAL_RANK']})"
    return None


def _progress_printer(silent: bool) -> Any:
    """Active checks say what they are doing; on stderr, so JSON on stdout stays clean."""

    def progress(message: str) -> None:
        if not silent:
            click.echo(f"  ... {message}", err=True)

    return progress


@main.command("snapshot")
@click.option(
    "-o",
    "--output",
    type=FILE_NAME,
    metavar="FILE",
    help="Write to FILE instead of standard output (`-o -`: standard output, the Unix convention).",
)
def snapshot_cmd(output: str | None) -> None:
    """Record this machine's GPUs, host and allow-listed environment as JSON."""
    from gpudoctor import snapshot as snap
    from gpudoctor.probe import collect

    data = collect()
    if output in (None, "-"):  # a file named "-" is `-o ./-`
        click.echo(snap.dumps(data), nl=False)
        return
    try:
        snap.write(data, output)
    except OSError as exc:
        raise UserError(f"cannot write {output}: {exc.strerror}", EXIT_UNAVAILABLE, "unavailable") from None
    click.echo(f"wrote {output} ({len(data.gpus)} GPU(s))", err=True)


@main.command("list-checks")
@click.option("--json", "as_json", is_flag=True, help="Print the list as JSON.")
def list_checks(as_json: bool) -> None:
    """List every finding code, sorted by code: the check (or command) that raises it and its title."""
    from gpudoctor.explain import code_rows

    rows = code_rows()
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    for r in rows:
        click.echo(f"{r['code']}  {r['check']:<14} {r['kind']:<6}  {r['title']}")


@main.command()
@click.argument("code")
@click.option("--json", "as_json", is_flag=True, help="Print the explanation as one JSON document.")
def explain(code: str, as_json: bool) -> None:
    """Explain a finding code: what it checks, why it matters, how to fix it."""
    from gpudoctor.explain import explain_doc, explain_text

    if as_json:
        doc = explain_doc(code.strip().upper())
        if doc is None:
            raise UserError(f"unknown finding code {code!r} (see `gpudoctor list-checks`)", EXIT_USAGE, "usage")
        click.echo(json.dumps(doc, indent=2))
        return
    text = explain_text(code.strip().upper())
    if text is None:
        raise UserError(f"unknown finding code {code!r} (see `gpudoctor list-checks`)", EXIT_USAGE, "usage")
    click.echo(text, nl=False)


class OutputError(Exception):
    """Standard output cannot be written. Not an OSError, so click does not swallow it."""

    def __init__(self, errno_: int | None, reason: str) -> None:
        super().__init__(reason)
        self.errno = errno_


class GuardedStdout:
    """sys.stdout whose write failures (closed pipe, full disk, closed descriptor) raise OutputError."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def _guard(self, method: str, *args: Any) -> Any:
        if self._stream is None:
            raise OutputError(errno.EBADF, "standard output is closed")
        try:
            return getattr(self._stream, method)(*args)
        except OSError as exc:
            raise OutputError(exc.errno, exc.strerror or str(exc)) from None
        except ValueError as exc:  # writing to a stream already closed
            raise OutputError(errno.EBADF, str(exc)) from None

    def write(self, text: str) -> int:
        return self._guard("write", text)

    def flush(self) -> None:
        if self._stream is not None:  # nothing can be pending on a closed stdout
            self._guard("flush")

    def isatty(self) -> bool:
        return self._stream is not None and self._stream.isatty()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


# The exit code a command has decided before it writes its output; a reader that closes the
# pipe early (`gpudoctor check | head`) does not change the verdict.
_verdict: list[int] = [0]


def run(argv: list[str] | None = None) -> None:
    """Entry point: every failure ends as one line (or one JSON document) and an exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    signals.install()  # SIGTERM/SIGHUP unwind like Ctrl-C: ranks stopped, files removed, a report of why
    for stream in (sys.stdout, sys.stderr):
        # A snapshot's text (a lone surrogate, a non-ASCII host name) that the terminal's encoding
        # cannot show is shown as "?"; it never turns into "cannot write to standard output".
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            try:
                reconfigure(errors="replace")
            except (ValueError, OSError):
                pass
    sys.stdout = GuardedStdout(sys.stdout)  # type: ignore[assignment]
    try:
        main.main(args=argv, prog_name="gpudoctor", standalone_mode=False)
    except OutputError as exc:
        _output_failed(exc)
    except UserError as exc:
        _fail(argv, exc.kind, str(exc), exc.exit_code)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except (click.exceptions.Abort, KeyboardInterrupt) as exc:
        # click turns an interruption inside a command into Abort, after ending the ^C line itself
        newline = not isinstance(exc, click.exceptions.Abort)
        _fail(argv, "interrupted", signals.describe(exc), signals.exit_code(exc), newline=newline)
    except click.ClickException as exc:
        _fail(argv, "usage", _one_line_usage(exc), exc.exit_code)
    except Exception as exc:  # noqa: BLE001  (never a traceback; GPUDOCTOR_DEBUG=1 shows it)
        if os.environ.get("GPUDOCTOR_DEBUG"):
            raise
        _fail(
            argv,
            "internal",
            f"internal error: {type(exc).__name__}: {exc} (GPUDOCTOR_DEBUG=1 shows the traceback)",
            EXIT_UNAVAILABLE,
        )
    else:
        sys.exit(0)


def _one_line_usage(exc: click.ClickException) -> str:
    """click's usage errors are three lines (usage, try, error); ours are one."""
    message = " ".join(exc.format_message().split())
    ctx = getattr(exc, "ctx", None)
    if isinstance(exc, click.UsageError) and ctx is not None:
        message += f" (see `{ctx.command_path} --help`)"
    return message


def _output_failed(exc: OutputError) -> None:
    """No JSON retry: the stream that failed is the one it would go to."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
    except OSError:
        pass
    sys.stdout = open(os.devnull, "w")  # noqa: SIM115  (so the interpreter's final flush stays quiet)
    if exc.errno == errno.EPIPE:
        sys.exit(_verdict[0])  # the reader stopped reading; the verdict stands
    click.echo(f"gpudoctor: cannot write to standard output: {exc}", err=True)
    sys.exit(EXIT_UNAVAILABLE)


def _fail(argv: list[str], kind: str, message: str, exit_code: int, newline: bool = False) -> None:
    """One line on stderr (and the JSON error document under --json), then exit.

    Held back meanwhile: a second Ctrl-C, SIGTERM or SIGHUP would cut the document in half. A
    run that was stopped keeps its exit code even when its terminal is gone (SIGHUP: stdout and
    stderr then fail with EIO): the code is what is left to say why it ended.
    """
    with signals.deferred(act=False):  # already on the way out: a second signal changes nothing
        stopped = kind == "interrupted"
        if wants_json(argv):
            try:
                click.echo(error_document(argv, kind, message, exit_code), nl=False)
            except OutputError as exc:
                if not stopped:
                    _output_failed(exc)
        try:
            click.echo(f"{chr(10) if newline else ''}gpudoctor: {message}", err=True)
        except (OSError, ValueError):
            pass  # no stderr left to say it on
    sys.exit(exit_code)
