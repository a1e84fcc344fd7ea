"""`gpudoctor check` and `gpudoctor diff`: the report commands. Their options come from the option
table (gpudoctor/engine/options.py); the work is gpudoctor.api's."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

import click

from gpudoctor.cli.options import (
    COLOR,
    EXIT_CODES_HELP,
    FILE_NAME,
    JSON,
    JUNIT,
    NO_CONFIG,
    QUIET,
    split,
    table_option,
    table_options,
)
from gpudoctor.cli.output import print_report
from gpudoctor.cli.types import OnceCommand
from gpudoctor.errors import EXIT_USAGE, UserError


@click.command(cls=OnceCommand, epilog=EXIT_CODES_HELP)
@table_option("snapshot")
@JSON
@JUNIT
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
@table_options(
    "quick",
    "level",
    "duration_s",
    "mem_share",
    "select",
    "ignore",
    "expect_gpus",
    "expect_model",
    "fail_on",
    "device",
    "ranks",
    "python",
    "timeout_s",
    "min_busbw",
    "allow_mig",
    "collectives",
    "ram_per_gpu_gb",
    "baseline",
    "tolerance",
    "config",
)
@NO_CONFIG
@click.option("-v", "--verbose", count=True, help="-v: every check with its tables; -vv: passing findings too.")
@QUIET
@COLOR
def check(
    snapshot_path: str | None,
    as_json: bool,
    junit_path: str | None,
    prometheus_path: str | None,
    github: bool | None,
    config_path: str | None,
    no_config: bool,
    verbose: int,
    quiet: bool,
    color: str,
    **options: Any,
) -> None:
    """Check that this machine (or a recorded snapshot) is ready for a multi-GPU run."""
    from gpudoctor.api import run_checks
    from gpudoctor.render.outputs import Outputs

    if config_path and no_config:
        raise UserError("--config and --no-config contradict each other", EXIT_USAGE, "usage")
    quiet_or_verbose(quiet, verbose)
    other_rank = quiet_rank(os.environ)
    baseline = options["baseline"]
    inputs = {"the --snapshot file": snapshot_path, "the --baseline file": baseline, "the --config file": config_path}
    outputs = Outputs(junit_path, prometheus_path, github, inputs=inputs) if not other_rank else Outputs(github=False)
    outputs.precheck()
    options["select"], options["ignore"] = split(options["select"]), split(options["ignore"])
    recorded_device(snapshot_path, options["device"], options["ranks"])
    report = run_checks(
        snapshot=snapshot_path,
        config=config_path,
        use_config=not no_config,
        progress=progress_printer(as_json or quiet),
        **options,
    )
    if other_rank:
        # torchrun merges its local ranks' stdout: one report per node keeps --json parseable.
        counts = ", ".join(f"{n} {s}" for s, n in report.counts().items() if n)
        click.echo(f"gpudoctor: {other_rank}: {counts}; local rank 0 prints the report", err=True)
        sys.exit(report.exit_code)
    print_report(report, as_json, verbose, outputs, quiet, color)


GITHUB_SUMMARY = click.option(
    "--github/--no-github", "github", default=None, help="GitHub Actions summary and annotations."
)


def comparison_options(tolerance_help: str, ignore_help: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """The options `diff` and `fleet` share, in the order their help lists them."""

    def decorate(f: Callable[..., Any]) -> Callable[..., Any]:
        for option in reversed(
            [
                JSON,
                table_option("tolerance", tolerance_help),
                table_option("fail_on"),
                table_option("ignore", ignore_help),
                JUNIT,
                click.option(
                    "--github/--no-github", "github", default=None, help="GitHub Actions summary and annotations."
                ),
                table_option("config", "Policy file for tolerance, fail-on, ignore, severity."),
                NO_CONFIG,
                click.option("-v", "--verbose", count=True, help="-v: every comparison; -vv: passing findings too."),
                QUIET,
                COLOR,
            ]
        ):
            f = option(f)
        return f

    return decorate


@click.command(cls=OnceCommand, epilog=EXIT_CODES_HELP)
@click.argument("before", metavar="A")
@click.argument("after", metavar="B")
@comparison_options("Regression allowed from A to B.  [default: 10%]", "Leave out these codes (GD011-GD019).")
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
    quiet_or_verbose(quiet, verbose)
    outputs = Outputs(
        junit_path, None, github, inputs={"report A": before, "report B": after, "the --config file": config_path}
    )
    outputs.precheck()
    report = diff_report(
        before,
        after,
        tolerance=tolerance,
        fail_on=fail_on,
        ignore=split(ignore),
        config=config_path,
        use_config=not no_config,
    )
    print_report(report, as_json, verbose, outputs, quiet, color)


def recorded_device(snapshot_path: str | None, device: str, ranks: int | None) -> None:
    """On a recorded snapshot no workload runs: --ranks has nothing to place (refused), and --device
    only tells the static checks where the job will run, which the user is told (not ignored silently)."""
    if snapshot_path is None:
        return
    if ranks is not None:
        raise UserError(
            "--ranks: no rank runs on a recorded snapshot (--snapshot runs the static checks only)", EXIT_USAGE, "usage"
        )
    if device == "cpu":
        click.echo(
            "gpudoctor: note: no workload runs on a recorded snapshot; --device cpu only tells the static checks "
            "the job runs on CPU (a missing driver, GD101, is then a skip, not a failure)",
            err=True,
        )
    elif device == "cuda":
        click.echo(
            "gpudoctor: note: no workload runs on a recorded snapshot; --device cuda judges it as --device auto does",
            err=True,
        )


def quiet_or_verbose(quiet: bool, verbose: int) -> None:
    if quiet and verbose:
        raise UserError("-q/--quiet and -v/--verbose ask for opposite things; give one", EXIT_USAGE, "usage")


def quiet_rank(environ: Any) -> str | None:
    """Under torchrun/srun, every local rank but 0 leaves the report to local rank 0."""
    if "RANK" not in environ:  # not under a launcher: nothing to import (start-up time)
        return None
    from gpudoctor.launch import torchrun_env  # torch-free

    if torchrun_env(environ) and environ.get("LOCAL_RANK", "0").strip() not in ("", "0"):
        return f"rank {environ['RANK']} (local rank {environ['LOCAL_RANK']})"
    return None


def progress_printer(silent: bool) -> Any:
    """Active checks say what they are doing; on stderr, so JSON on stdout stays clean."""

    def progress(message: str) -> None:
        if not silent:
            click.echo(f"  ... {message}", err=True)

    return progress


FLEET_EXIT_HELP = (
    EXIT_CODES_HELP
    + """
\b
A file that cannot be used (unreadable, not JSON, not a snapshot or report, a symbolic link in a
directory, over 32 MiB) is one GD464 warning naming it: exit 1 under --fail-on warn. Fewer than
two usable files, or more than 10000: exit 2."""
)


@click.command(cls=OnceCommand, epilog=FLEET_EXIT_HELP)
@click.argument("paths", metavar="PATH...", nargs=-1, required=True)
@click.option("--baseline", "baseline", type=FILE_NAME, metavar="FILE", help="Judge every node against this file.")
@comparison_options("Regression allowed from the baseline.  [default: 10%]", "Leave out these codes.")
def fleet(
    paths: tuple[str, ...],
    baseline: str | None,
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
    """Judge many nodes at once from saved snapshots or reports (`check --json`): files, or
    directories of *.json files (one node each).

    Names the node(s) that differ from the majority in driver, CUDA, NCCL, torch, GPUs, NVLinks,
    firmware, NICs and GPUDirect RDMA, the node whose all-reduce busbw is low against the median,
    the nodes' own warnings grouped by code, and with --baseline every node's regressions.
    """
    from gpudoctor.api import fleet_report
    from gpudoctor.render.outputs import Outputs

    if config_path and no_config:
        raise UserError("--config and --no-config contradict each other", EXIT_USAGE, "usage")
    quiet_or_verbose(quiet, verbose)
    from gpudoctor.fleet import fleet_files

    # Every node file read, named or found in a named directory, is an input no output replaces.
    files, _ = fleet_files([p for p in paths if p != "-"])
    inputs = {f"the node file {p}": p for p, _ in files}
    outputs = Outputs(
        junit_path, None, github, inputs={**inputs, "the baseline": baseline, "the --config file": config_path}
    )
    outputs.precheck()
    report = fleet_report(
        list(paths),
        baseline=baseline,
        tolerance=tolerance,
        fail_on=fail_on,
        ignore=split(ignore),
        config=config_path,
        use_config=not no_config,
    )
    print_report(report, as_json, verbose, outputs, quiet, color)
