"""`gpudoctor bench allreduce`: the whole all-reduce sweep as a table (or JSON), no verdict."""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import click

from gpudoctor.cli_types import FiniteFloat
from gpudoctor.errors import EXIT_UNAVAILABLE, EXIT_USAGE, UserError

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


@click.group()
def bench() -> None:
    """Measurements without a verdict (all-reduce bandwidth sweep)."""


@bench.command("allreduce")
@click.option("--device", type=click.Choice(["auto", "cuda", "cpu"]), default="auto", show_default=True)
@click.option("--ranks", type=click.IntRange(min=2, max=64), help="Ranks for --device cpu (default 2).")
@click.option("--min-bytes", default=None, metavar="SIZE", help="Smallest message (default 8M on GPUs, 64K on CPU).")
@click.option("--max-bytes", default=None, metavar="SIZE", help="Largest message (default 1G on GPUs, 4M on CPU).")
@click.option("--factor", type=click.IntRange(min=2), default=2, show_default=True, help="Size step factor.")
@click.option("--iters", type=click.IntRange(min=1), default=None, help="Timed iterations per size.")
@click.option("--warmup", type=click.IntRange(min=0), default=None, help="Warm-up iterations per size.")
@click.option("--timeout", "timeout_s", type=FiniteFloat(min=1), default=300.0, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
def bench_allreduce(
    device: str,
    ranks: int | None,
    min_bytes: str | None,
    max_bytes: str | None,
    factor: int,
    iters: int | None,
    warmup: int | None,
    timeout_s: float,
    as_json: bool,
) -> None:
    """Sweep all-reduce sizes across one rank per GPU (or N CPU ranks); print algbw and busbw."""
    from gpudoctor.launch import Task, choose_device, launch, torchrun_env

    gpus: list[int] = []
    uuids: list[str] = []
    under_launcher = torchrun_env(os.environ)  # torchrun/srun placed this rank on its GPU already
    if device != "cpu" and not under_launcher:
        gpus, uuids = _visible_gpus()
    device, why_not = choose_device(device, 1 if under_launcher else len(gpus))  # the rule `check` uses too
    if not device:
        raise UserError(why_not, EXIT_UNAVAILABLE, "unavailable")
    if device == "cuda" and not under_launcher and len(gpus) < 2:
        raise UserError("one visible GPU: all-reduce needs at least 2", EXIT_UNAVAILABLE, "unavailable")
    on_gpu = device == "cuda"
    lo = parse_size(min_bytes or ("8M" if on_gpu else "64K"))
    hi = parse_size(max_bytes or ("1G" if on_gpu else "4M"))
    params: dict[str, Any] = {
        "sizes": sizes_between(lo, hi, factor),
        "warmup": warmup if warmup is not None else (5 if on_gpu else 1),
        "iters": iters if iters is not None else (20 if on_gpu else 5),
    }
    progress = (lambda m: None) if as_json else (lambda m: click.echo(f"  ... {m}", err=True))
    result = launch(
        [Task("allreduce", params)],
        device=device,
        ranks=ranks or len(gpus) or 2,
        timeout_s=timeout_s,
        gpus=gpus,
        gpu_uuids=uuids,
        progress=progress,
    )
    data = result.results("allreduce")
    if data is None:
        raise UserError(_why_not(result), EXIT_UNAVAILABLE, "unavailable")
    wrong = sum(r["wrong"] for r in data["rows"])
    exit_code = 1 if wrong else 0
    if as_json:
        doc = {
            "schema_version": 1,
            "command": "bench",
            "exit_code": exit_code,
            "results": {"allreduce": data, "launch": result.to_json()},
        }
        click.echo(json.dumps(doc, indent=2))
    else:
        _print_table(data)
        if wrong:
            click.echo(f"{wrong} wrong element(s): the sums are not exact (see `gpudoctor explain GD602`)", err=True)
    sys.exit(exit_code)


def _visible_gpus() -> tuple[list[int], list[str]]:
    """The visible GPUs' NVML indices and UUIDs, in the order the ranks will drive them."""
    from gpudoctor.probe import collect
    from gpudoctor.visibility import resolve

    snap = collect()
    if snap.driver.nvml_status != "ok":
        return [], []
    devices = resolve(snap).devices
    return [d.nvml_index for d in devices], [d.uuid for d in devices]


def _why_not(result: Any) -> str:
    if result.setup_error:
        return f"the sweep did not start: {result.setup_error['message']}"
    parts = [f"{r.label}: {r.error or r.state}" for r in result.suspects()]
    return "the sweep did not complete: " + ("; ".join(parts) or "no result")


def _print_table(data: dict[str, Any]) -> None:
    from rich.console import Console

    from gpudoctor.checks.allreduce import sweep_table
    from gpudoctor.render.text import render_table

    Console(highlight=False, no_color="NO_COLOR" in os.environ).print(render_table(sweep_table(data)))
    best = max(data["rows"], key=lambda r: r["busbw_gbps"], default=None)
    if best is not None:
        click.echo(f"# best busbw {best['busbw_gbps']:.2f} GB/s (busbw = algbw x {data['busbw_factor']:.3g})")
    if data["skipped_sizes"]:
        click.echo(f"# skipped for lack of free GPU memory: {data['skipped_sizes']}")
