"""The `gpudoctor` command: the group of commands and the entry point that turns every failure
into one line (or one JSON document) and an exit code.

Start-up is part of the interface (`check --quick` gates CI jobs; benchmarks/check_quick.py):
every command lives in its own module, imported only when named (`LazyGroup`), and imports what
it needs when it runs.
"""

from __future__ import annotations

import errno
import os
import sys
from importlib import import_module

import click

from gpudoctor.cli.options import EXIT_CODES_HELP
from gpudoctor.cli.output import GuardedStdout, OutputError, Verdict
from gpudoctor.cli.types import OnceCommand
from gpudoctor.errors import EXIT_UNAVAILABLE, UserError, error_document, wants_json
from gpudoctor.safety import signals
from gpudoctor.version import __version__

# The commands, imported only when named: "name" -> "module:attribute".
LAZY_COMMANDS = {
    "bench": "gpudoctor.cli.bench:bench",
    "check": "gpudoctor.cli.check:check",
    "diff": "gpudoctor.cli.check:diff",
    "explain": "gpudoctor.cli.info:explain",
    "fleet": "gpudoctor.cli.check:fleet",
    "lint": "gpudoctor.cli.lint:lint",
    "list-checks": "gpudoctor.cli.info:list_checks",
    "report": "gpudoctor.cli.watch:report",
    "snapshot": "gpudoctor.cli.info:snapshot_cmd",
    "watch": "gpudoctor.cli.watch:watch",
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
@click.version_option(__version__, "-V", "--version", prog_name="gpudoctor")
def main() -> None:
    """Is this machine ready for multi-GPU PyTorch training, and is the run balanced?"""


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
    except click.exceptions.NoArgsIsHelpError as exc:
        # `gpudoctor` or `gpudoctor bench` alone: the help laid out as --help shows it (flattened
        # onto one line it was unreadable), on stderr with the usage error's exit code, as click does.
        _show_help(exc)
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


def _show_help(exc: click.exceptions.NoArgsIsHelpError) -> None:
    try:
        click.echo(exc.ctx.get_help(), err=True)
    except (OSError, ValueError):
        pass  # no stderr left to say it on
    sys.exit(exc.exit_code)


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
        sys.exit(Verdict.code)  # the reader stopped reading; the verdict stands
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
