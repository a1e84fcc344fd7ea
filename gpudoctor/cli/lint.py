"""`gpudoctor lint PATH...`: the training script's mistakes visible in its code (gpudoctor/lint/).

The findings have the shape of `check`'s (code, status, subject FILE:LINE, message, hint,
evidence), `--json` is a report document (command "lint", one result per file), `--junit` one
test suite per file, and the exit codes are `check`'s.
"""

from __future__ import annotations

import sys

import click

from gpudoctor.cli.options import CODE_LIST, COLOR, EXIT_CODES_HELP, JSON, JUNIT, split
from gpudoctor.cli.types import OnceCommand

LINT_EPILOG = EXIT_CODES_HELP.replace(
    "  2  usage error: bad option, unknown code, unusable input file",
    "  2  usage error: bad option, unknown code, a path that does not exist",
)


@click.command(cls=OnceCommand, epilog=LINT_EPILOG)
@click.argument("paths", nargs=-1, metavar="PATH...")
@click.option(
    "--launcher",
    type=click.Choice(["auto", "torchrun", "spawn"]),
    default="auto",
    show_default=True,
    help="How the scripts are run: torchrun, or python with mp.spawn; auto infers it from each script.",
)
@JSON
@JUNIT
@click.option(
    "--select", multiple=True, type=CODE_LIST, metavar="CODES", help="Only these codes, prefixes or rule names."
)
@click.option(
    "--ignore", multiple=True, type=CODE_LIST, metavar="CODES", help="Leave out these codes, prefixes or rule names."
)
@click.option(
    "--fail-on",
    type=click.Choice(["warn", "fail"]),
    default="fail",
    show_default=True,
    help="What makes the exit code 1 (info findings never do).",
)
@click.option("-v", "--verbose", count=True, help="Also list the clean files.")
@click.option("-q", "--quiet", is_flag=True, help="Only the findings, without hints, and the summary line.")
@COLOR
def lint(
    paths: tuple[str, ...],
    launcher: str,
    as_json: bool,
    junit_path: str | None,
    select: tuple[str, ...],
    ignore: tuple[str, ...],
    fail_on: str,
    verbose: int,
    quiet: bool,
    color: str,
) -> None:
    """Check training scripts (files, directories, or - for standard input) for the multi-GPU
    mistakes visible in their code, before they run. The scripts are parsed, never executed."""
    from gpudoctor.cli.check import quiet_or_verbose
    from gpudoctor.cli.output import Verdict
    from gpudoctor.errors import EXIT_UNAVAILABLE
    from gpudoctor.findings import Status
    from gpudoctor.lint.runner import collect, lint_report
    from gpudoctor.render.outputs import Outputs

    quiet_or_verbose(quiet, verbose)
    files = collect(paths)  # a missing path is a usage error before anything is written
    outputs = Outputs(junit_path, None, False, inputs={f"the linted file {p}": p for p in files if p != "-"})
    outputs.precheck()
    report = lint_report(list(paths), launcher, Status(fail_on), split(select), split(ignore), files)
    problems = outputs.write(report, sys.stderr)
    Verdict.code = EXIT_UNAVAILABLE if problems else report.exit_code
    if as_json:
        from gpudoctor.render.json import dumps, report_document

        click.echo(dumps(report_document(report)), nl=False)
    else:
        from gpudoctor.render.lint_text import render_lint
        from gpudoctor.render.text import make_console

        render_lint(report, make_console(color), verbose, quiet)
    for problem in problems:
        click.echo(f"gpudoctor: {problem}", err=True)
    sys.exit(Verdict.code)
