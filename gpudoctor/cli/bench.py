"""`gpudoctor bench`: measurements printed whole.

- `bench allreduce`: the all-reduce sweep as a table (or JSON), no verdict.
- `bench collectives`: all-gather, reduce-scatter, all-to-all, broadcast and send/recv per pair,
  verified, with the verdicts of checks/collectives.py (GD65x).
- `bench scaling`: DDP training throughput on 1, 2, 4, ... GPUs with the step split and the
  cause of a low efficiency (checks/scaling.py, GD72x), DataParallel beside it.

Light to import (click only): the ranks import torch, this process never does.
"""

from __future__ import annotations

import os
import socket
import sys
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NoReturn

import click

from gpudoctor.cli.types import FiniteFloat, NonEmpty, OnceGroup
from gpudoctor.engine.options import MAX_TIMEOUT_S
from gpudoctor.errors import EXIT_UNAVAILABLE, EXIT_USAGE, UserError

if TYPE_CHECKING:
    from gpudoctor.launch.workload_results import AllreduceResult

SIZE_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(text: str) -> int:
    t = text.strip().upper().removesuffix("IB").removesuffix("B")
    unit = t[-1:] if t[-1:] in SIZE_UNITS and not t[-1:].isdigit() else ""
    try:
        value = int(t[: len(t) - len(unit)]) * SIZE_UNITS[unit]
    except ValueError:
        raise UserError(f"cannot read size {text!r} (examples: 65536, 64K, 8M, 1G)", EXIT_USAGE, "usage") from None
    if value < 256:
        raise UserError(f"size {text!r} is too small (at least 256 bytes)", EXIT_USAGE, "usage")
    return value


def sizes_between(lo: int, hi: int, factor: int) -> list[int]:
    if hi < lo:
        raise UserError("--max-bytes is smaller than --min-bytes", EXIT_USAGE, "usage")
    out, s = [], lo
    while s <= hi:
        out.append(s - s % 256)  # whole rows of the verification pattern
        s *= factor
    return out


FAIL_ON_HELP = "What makes the exit code 1."
EXIT_CODES = """\b
Exit codes:
  0  nothing at or above --fail-on
  1  a finding at or above --fail-on (wrong data, a low efficiency, ...)
  2  usage error
  3  could not run (no GPU for --device cuda, the ranks did not start)
  130  interrupted"""


def _options(*decorators: Any) -> Any:
    """Several click options as one decorator, in the order they are listed."""

    def apply(func: Any) -> Any:
        for decorator in reversed(decorators):
            func = decorator(func)
        return func

    return apply


def _where(min_ranks: int) -> Any:
    return _options(
        click.option("--device", type=click.Choice(["auto", "cuda", "cpu"]), default="auto", show_default=True),
        click.option("--ranks", type=click.IntRange(min=min_ranks, max=64), help="Ranks for --device cpu (default 2)."),
        click.option(
            "--python",
            type=NonEmpty("a file name"),
            metavar="PATH",
            help="Run the ranks with this Python: your training environment's interpreter (its torch is measured).",
        ),
    )


def _output(timeout_s: float, verdicts: bool = True) -> Any:
    options = [
        click.option(
            "--timeout",
            "timeout_s",
            type=FiniteFloat(min=1, max=MAX_TIMEOUT_S),
            default=timeout_s,
            show_default=True,
            metavar="SECONDS",
            help="Deadline in seconds for the whole run, at most 86400 (a day).",
        ),
        click.option("--json", "as_json", is_flag=True, help="Print one JSON document."),
    ]
    if verdicts:
        options.insert(
            0, click.option("--fail-on", type=click.Choice(["warn", "fail"]), default="fail", show_default=True)
        )
    return _options(*options)


SWEEP = _options(
    click.option("--min-bytes", default=None, metavar="SIZE", help="Smallest size (default 8M on GPUs, 64K on CPU)."),
    click.option("--max-bytes", default=None, metavar="SIZE", help="Largest size (default 1G on GPUs, 4M on CPU)."),
    click.option("--factor", type=click.IntRange(min=2), default=2, show_default=True, help="Size step factor."),
    click.option("--iters", type=click.IntRange(min=1), default=None, help="Timed iterations per size."),
    click.option("--warmup", type=click.IntRange(min=0), default=None, help="Warm-up iterations per size."),
)


@click.group(cls=OnceGroup)
def bench() -> None:
    """Measurements printed whole: all-reduce sweep, other collectives, DDP scaling."""


@dataclass
class Target:
    """Where the ranks run: one per visible GPU, or N CPU ranks; under torchrun, the launcher's."""

    device: str
    ranks: int
    gpus: list[int] = field(default_factory=list)  # NVML index per local rank
    uuids: list[str] = field(default_factory=list)
    snapshot: Any = None  # the probe of this machine (GPUs only)
    python: str | None = None  # the interpreter the ranks run in (--python, validated); None: this one


def _target(device: str, ranks: int | None, minimum: int, what: str, python: str | None = None) -> Target:
    """Resolve --device/--ranks with the rule `check` uses (launch.choose_device: `auto` without a
    visible GPU runs nothing); fewer than `minimum` GPUs is 'could not run' (exit 3). --python is
    validated here, before any probe (a usage error, exit 2)."""
    from dataclasses import replace

    from gpudoctor.launch import check_launcher_env, choose_device
    from gpudoctor.launch.faults import check_env

    check_env()  # a fault spec the ranks cannot read is a usage error before any rank starts
    if python is not None:
        from gpudoctor.probe.interpreter import software_of

        python = os.path.abspath(python)  # not resolved: a venv's python is a link
        software_of(python)
        return replace(_target(device, ranks, minimum, what), python=python)
    launcher = check_launcher_env()  # so is a torchrun/srun variable torch could not read
    if ranks is not None and device != "cpu":
        raise UserError("--ranks needs --device cpu (on GPUs there is one rank per visible GPU)", EXIT_USAGE, "usage")
    under_launcher = launcher is not None  # torchrun/srun placed this rank on its GPU already
    snap, gpus, uuids = _visible_gpus() if device != "cpu" and not under_launcher else (None, [], [])
    chosen, why_not = choose_device(device, 1 if under_launcher else len(gpus))
    if not chosen:
        raise UserError(why_not, EXIT_UNAVAILABLE, "unavailable")
    if chosen == "cpu":
        return Target("cpu", ranks or 2)
    if launcher is not None:
        return Target("cuda", launcher.world_size)
    if len(gpus) < minimum:
        raise UserError(f"one visible GPU: {what} needs at least {minimum}", EXIT_UNAVAILABLE, "unavailable")
    return Target("cuda", len(gpus), gpus, uuids, snap)


def _visible_gpus() -> tuple[Any, list[int], list[str]]:
    """This machine's snapshot, and the visible GPUs' NVML indices and UUIDs in rank order."""
    from gpudoctor.knowledge.visible_gpus import resolve
    from gpudoctor.probe import collect

    snap = collect()
    if snap.driver.nvml_status != "ok":
        return snap, [], []
    devices = resolve(snap).devices
    return snap, [d.nvml_index for d in devices], [d.uuid for d in devices]


def _progress(as_json: bool) -> Any:
    """What runs, on stderr (stdout stays one JSON document with --json)."""
    return (lambda m: None) if as_json else (lambda m: click.echo(f"  ... {m}", err=True))


def _run(task: Any, target: Target, timeout_s: float, as_json: bool) -> Any:
    from gpudoctor.launch import launch

    return launch(
        [task],
        device=target.device,
        ranks=target.ranks,
        timeout_s=timeout_s,
        gpus=target.gpus,
        gpu_uuids=target.uuids,
        progress=_progress(as_json),
        python=target.python,
    )


def _why_not(result: Any, what: str = "the sweep") -> str:
    if result.setup_error:
        return f"{what} did not start: {result.setup_error['message']}"
    parts = [f"{r.label}: {r.error or r.state}" for r in result.suspects()]
    return f"{what} did not complete: " + ("; ".join(parts) or "no result")


def _console() -> Any:
    from gpudoctor.render.text import make_console

    return make_console()  # styled on a terminal; piped or NO_COLOR: plain text, aligned tables


@bench.command("allreduce")
@_where(2)
@SWEEP
@_output(300.0, verdicts=False)
def bench_allreduce(
    device: str,
    ranks: int | None,
    python: str | None,
    min_bytes: str | None,
    max_bytes: str | None,
    factor: int,
    iters: int | None,
    warmup: int | None,
    timeout_s: float,
    as_json: bool,
) -> None:
    """Sweep all-reduce sizes across one rank per GPU (or N CPU ranks); print algbw and busbw."""
    from gpudoctor.launch import Task

    target = _target(device, ranks, 2, "all-reduce", python)
    started = time.monotonic()
    params: dict[str, Any] = {"sizes": _sweep_sizes(target, min_bytes, max_bytes, factor)}
    params |= _repeats(target, iters, warmup)
    result = _run(Task("allreduce", params), target, timeout_s, as_json)
    data = result.results("allreduce")
    if data is None:
        raise UserError(_why_not(result), EXIT_UNAVAILABLE, "unavailable")
    wrong = sum(r["wrong"] for r in data["rows"])
    if as_json:  # the document every bench prints: the report (its findings, exit code) plus `results`
        report = _report("bench allreduce", "allreduce", "All-reduce sweep", [_exact(result, data)], started, "fail")
        _emit(report, [], {"allreduce": data, "launch": result.to_json()}, as_json)
    _print_table(data)
    if wrong:
        click.echo(f"{wrong} wrong element(s): the sums are not exact (see `gpudoctor explain GD602`)", err=True)
    sys.exit(1 if wrong else 0)


def _exact(result: Any, data: AllreduceResult) -> Any:
    """The sweep's one verdict, as a finding: every sum exact (GD602 pass), or who sent or got wrong ones."""
    from gpudoctor.checks.active.allreduce import WRONG, wrong_finding
    from gpudoctor.findings import Finding, Status

    if any(r["wrong"] for r in data["rows"]):
        return wrong_finding(result, data["rows"])
    sizes = len(data["rows"])
    return Finding(WRONG.code, Status.PASS, "host", f"every all-reduce sum was exact ({sizes} size(s))")


def _sweep_sizes(target: Target, min_bytes: str | None, max_bytes: str | None, factor: int) -> list[int]:
    on_gpu = target.device == "cuda"
    lo = parse_size(min_bytes or ("8M" if on_gpu else "64K"))
    hi = parse_size(max_bytes or ("1G" if on_gpu else "4M"))
    return sizes_between(lo, hi, factor)


def _repeats(target: Target, iters: int | None, warmup: int | None) -> dict[str, int]:
    on_gpu = target.device == "cuda"
    return {
        "warmup": warmup if warmup is not None else (5 if on_gpu else 1),
        "iters": iters if iters is not None else (20 if on_gpu else 5),
    }


def _print_table(data: AllreduceResult) -> None:
    from gpudoctor.checks.active.allreduce import sweep_table
    from gpudoctor.render.text import TableSpec

    _console().print(TableSpec(sweep_table(data)))
    best = max(data["rows"], key=lambda r: r["busbw_gbps"], default=None)
    if best is not None:
        click.echo(f"# best busbw {best['busbw_gbps']:.2f} GB/s (busbw = algbw x {data['busbw_factor']:.3g})")
    if data["skipped_sizes"]:
        click.echo(f"# skipped for lack of free GPU memory: {data['skipped_sizes']}")


def _report(command: str, name: str, title: str, findings: list[Any], started: float, fail_on: str) -> Any:
    from gpudoctor.findings import CheckResult, Report, Status
    from gpudoctor.snapshot import now_iso
    from gpudoctor.version import __version__

    result = CheckResult(name, title, findings, time.monotonic() - started)
    return Report(command, "live", now_iso(), __version__, socket.gethostname(), [result], Status(fail_on))


def _emit(report: Any, tables: list[dict[str, Any]], results: dict[str, Any], as_json: bool) -> NoReturn:
    """One JSON document (the report plus `results`), or the tables, the findings and a summary."""
    if as_json:
        from gpudoctor.render.json import dumps

        click.echo(dumps(report.to_json() | {"results": results}), nl=False)
    else:
        from gpudoctor.findings import Status
        from gpudoctor.render.text import STYLE, Line, TableSpec, finding_lines

        console = _console()
        for spec in tables:
            console.print(TableSpec(spec))
            console.print(Line())
        for finding in report.findings:
            for line in finding_lines(finding, verbose=True):
                console.print(line)
        summary = Line()
        shown = [(s, n) for s, n in report.counts().items() if n]
        for i, (s, n) in enumerate(shown):
            summary.append(("" if not i else ", ") + f"{n} {s}", style=STYLE[Status(s)])
        summary.append(f"  (exit {report.exit_code}, --fail-on {report.fail_on.value})", style="bold")
        console.print(summary)
    sys.exit(report.exit_code)


@bench.command("collectives", epilog=EXIT_CODES)
@_where(2)
@click.option(
    "--ops",
    default="all",
    show_default=True,
    metavar="LIST",
    help="Which: allgather, reducescatter, alltoall, broadcast, sendrecv (per pair), or all.",
)
@click.option("--pair-bytes", default=None, metavar="SIZE", help="Send/recv size per pair (default 256M GPU, 1M CPU).")
@SWEEP
@_output(300.0)
def bench_collectives(
    device: str,
    ranks: int | None,
    python: str | None,
    ops: str,
    pair_bytes: str | None,
    min_bytes: str | None,
    max_bytes: str | None,
    factor: int,
    iters: int | None,
    warmup: int | None,
    fail_on: str,
    timeout_s: float,
    as_json: bool,
) -> None:
    """All-gather, reduce-scatter, all-to-all, broadcast and send/recv per pair: algbw and busbw as
    nccl-tests defines each, every result verified (a rank sending wrong data is named)."""
    from gpudoctor.checks.active.collectives import Judging, judge
    from gpudoctor.knowledge.busbw import parse_ops
    from gpudoctor.launch import Task

    try:
        chosen = parse_ops(ops)
    except ValueError as exc:
        raise UserError(f"--ops: {exc}", EXIT_USAGE, "usage") from None
    if not chosen:
        raise UserError("--ops names no collective (all-reduce: `gpudoctor bench allreduce`)", EXIT_USAGE, "usage")
    target = _target(device, ranks, 2, "a collective", python)
    started = time.monotonic()
    on_gpu = target.device == "cuda"
    params: dict[str, Any] = {
        "ops": [op for op in chosen if op != "sendrecv"],
        "sizes": _sweep_sizes(target, min_bytes, max_bytes, factor),
        "pair_bytes": parse_size(pair_bytes or ("256M" if on_gpu else "1M")) if "sendrecv" in chosen else 0,
    } | _repeats(target, iters, warmup)
    result = _run(Task("collectives", params), target, timeout_s, as_json)
    data = result.results("collectives")
    results: dict[str, Any] = {"collectives": data, "launch": result.to_json()}
    if data is None:
        from gpudoctor.checks.active.collectives import not_completed

        report = _report("bench collectives", "collectives", "Collectives", [not_completed(result)], started, fail_on)
        _emit(report, [], results, as_json)
    if not on_gpu:
        how = Judging(no_verdict="CPU/gloo")
    elif result.node_count > 1 or target.snapshot is None:
        how = Judging(no_verdict="across nodes the network caps busbw")
    else:
        how = Judging(target.gpus, target.snapshot)
    findings, details = judge(data, how)
    report = _report("bench collectives", "collectives", "Collectives", findings, started, fail_on)
    _emit(report, details["tables"], results, as_json)


def _model_sizes(name: str, text: str | None, defaults: dict[str, int], batch: int | None) -> dict[str, int]:
    """`width=128,depth=4` over the defaults; unknown keys or non-positive values are usage errors."""
    sizes = dict(defaults)
    for item in (t.strip() for t in (text or "").split(",")):
        if not item:
            continue
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or key not in sizes:
            keys = ", ".join(k for k in defaults)
            raise UserError(f"--{name}-size: cannot read {item!r} (KEY=N with KEY one of {keys})", EXIT_USAGE, "usage")
        try:
            sizes[key] = int(value)
        except ValueError:
            raise UserError(
                f"--{name}-size: {key} must be a whole number, not {value!r}", EXIT_USAGE, "usage"
            ) from None
        if sizes[key] < 1:
            raise UserError(f"--{name}-size: {key} must be at least 1", EXIT_USAGE, "usage")
    if batch is not None:
        sizes["batch"] = batch
    if name == "transformer" and sizes["width"] % sizes["heads"]:
        raise UserError("--transformer-size: width must be a multiple of heads", EXIT_USAGE, "usage")
    return sizes


def _counts(text: str | None, world: int) -> list[int]:
    """--counts 1,2,4 (always with 1, the baseline), or 1, 2, 4, ... up to every rank and all of them."""
    if not text:
        out, k = [], 1
        while k < world:
            out.append(k)
            k *= 2
        return [*out, world]
    try:
        counts = sorted({int(t) for t in text.split(",") if t.strip()} | {1})
    except ValueError:
        raise UserError(f"--counts: cannot read {text!r} (example: 1,2,4,8)", EXIT_USAGE, "usage") from None
    bad = [k for k in counts if not 1 <= k <= world]
    if bad:
        raise UserError(f"--counts: {bad[0]} is not between 1 and the {world} rank(s) there are", EXIT_USAGE, "usage")
    return counts


@bench.command("scaling", epilog=EXIT_CODES)
@_where(1)
@click.option("--model", type=click.Choice(["cnn", "transformer", "both"]), default="both", show_default=True)
@click.option("--counts", metavar="LIST", help="GPU counts to train on (default 1, 2, 4, ... and all).")
@click.option("--batch", type=click.IntRange(min=1), help="Batch per GPU (default: cnn 64, transformer 8; CPU 8).")
@click.option("--cnn-size", metavar="K=N,...", help="ConvNet: width, depth, image, classes.")
@click.option("--transformer-size", metavar="K=N,...", help="Transformer: width, layers, heads, seq, vocab.")
@click.option("--amp", type=click.Choice(["off", "bf16", "fp16"]), default="off", show_default=True)
@click.option("--accum", type=click.IntRange(min=1), default=1, show_default=True, help="Micro-batches per step.")
@click.option("--bucket-mb", type=FiniteFloat(min=0, min_open=True), default=25.0, show_default=True)
@click.option("--gradient-as-bucket-view", is_flag=True, help="DDP gradient_as_bucket_view=True.")
@click.option("--static-graph", is_flag=True, help="DDP static_graph=True.")
@click.option("--no-dataparallel", is_flag=True, help="Skip the nn.DataParallel comparison.")
@click.option("--steps", type=click.IntRange(min=1), help="Measured steps per count (default 20 GPU, 12 CPU).")
@click.option("--warmup", type=click.IntRange(min=0), help="Warm-up steps per count (default 5 GPU, 2 CPU).")
@click.option("--warn-below", type=FiniteFloat(min=0, max=1), help="Efficiency that warns (default 0.80).")
@click.option("--fail-below", type=FiniteFloat(min=0, max=1), help="Efficiency that fails (default 0.50).")
@_output(600.0)
def bench_scaling(
    device: str,
    ranks: int | None,
    python: str | None,
    model: str,
    counts: str | None,
    batch: int | None,
    cnn_size: str | None,
    transformer_size: str | None,
    amp: str,
    accum: int,
    bucket_mb: float,
    gradient_as_bucket_view: bool,
    static_graph: bool,
    no_dataparallel: bool,
    steps: int | None,
    warmup: int | None,
    warn_below: float | None,
    fail_below: float | None,
    fail_on: str,
    timeout_s: float,
    as_json: bool,
) -> None:
    """Train synthetic models with DDP on 1, 2, 4, ... GPUs (the same batch per GPU): samples/s,
    speedup, efficiency, each step split into input, compute and communication not hidden, and
    the cause of a low efficiency; DataParallel beside DDP on 2+ GPUs."""
    from gpudoctor.checks.active import scaling
    from gpudoctor.launch import Task, torchrun_env

    target = _target(device, ranks, 1, "scaling", python)
    kind = target.device
    models = ["cnn", "transformer"] if model == "both" else [model]
    texts = {"cnn": cnn_size, "transformer": transformer_size}
    sizes = {m: _model_sizes(m, texts[m], scaling.DEFAULT_SIZES[kind][m], batch) for m in models}
    warn = scaling.WARN_EFFICIENCY if warn_below is None else warn_below
    fail = scaling.FAIL_EFFICIENCY if fail_below is None else fail_below
    if fail > warn:
        raise UserError(f"--fail-below {fail:g} is above --warn-below {warn:g}", EXIT_USAGE, "usage")
    default_warmup, default_steps = scaling.DEFAULT_STEPS[kind]
    params: dict[str, Any] = {
        "models": models,
        "sizes": sizes,
        "counts": _counts(counts, target.ranks),
        "steps": steps or default_steps,
        "warmup": default_warmup if warmup is None else warmup,
        "accum": accum,
        "amp": amp,
        "bucket_cap_mb": bucket_mb,
        "gradient_as_bucket_view": gradient_as_bucket_view,
        "static_graph": static_graph,
        # DataParallel drives one node's GPUs from one process: not under torchrun/srun.
        "dataparallel": not no_dataparallel and not torchrun_env(os.environ),
    }
    started = time.monotonic()
    result = _run(Task("scaling", params), target, timeout_s, as_json)
    data = result.results("scaling")
    machine = scaling.Machine(target.gpus, target.snapshot)
    results: dict[str, Any] = {"scaling": data, "launch": result.to_json()}
    if data is None:
        finding = scaling.not_completed(result, lambda r: machine.label(r.rank))
        _emit(_report("bench scaling", "scaling", "DDP scaling", [finding], started, fail_on), [], results, as_json)
    # On CPU ranks share the cores: a verdict only when the user asks for one with a threshold.
    verdict = kind == "cuda" or warn_below is not None or fail_below is not None
    thresholds = scaling.Thresholds(warn, fail, verdict)
    findings, tables, rows = scaling.judge(data, machine, thresholds)
    results["summary"] = rows
    _emit(_report("bench scaling", "scaling", "DDP scaling", findings, started, fail_on), tables, results, as_json)
