"""What level 3's deep checks share: one launch of the selected deep workloads, NVML sampled by
the parent while it runs, the time budget, and the findings for a run that did not finish.

The deep checks (deep_load, deep_sdc, deep_memory, deep_links) run in ONE set of spawned ranks
(one torch import and CUDA start per rank): the check runner starts it once (`start_deep_run`)
when the first of them reads `ctx.run("deep")`. Only the workloads of the checks this run
selected are started (`ctx.planned`).
The order is the order of a burn-in: the sustained GEMM first (it heats the GPUs), then the long
all-reduce, the memory test and the host links. While the ranks run, the parent reads every GPU
through the watch sampler (gpudoctor.probe.sampler.NvmlSampler: clocks, throttle reasons, power
against the limit, temperature, XID events) once a second and says on stderr what it sees.

Not a check module: it is not in gpudoctor.checks.MODULES.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gpudoctor.checks.active.common import Plan, failure_hint, plan, skip_finding, world_size
from gpudoctor.checks.active.link_probes import p2p_pairs
from gpudoctor.engine import CheckContext, Code
from gpudoctor.findings import Finding, Status, gpu_subject
from gpudoctor.knowledge import clock_reasons

if TYPE_CHECKING:  # launch loads when a run starts: check --quick never pays for it
    from gpudoctor.launch import LaunchResult, RankOutcome, Task

RUN_KEY = "deep"
# Deep check -> the workloads it needs, in run order (the GEMM heats the GPUs for the rest).
TASKS_OF = {
    "deep_load": ("deep_gemm",),
    "deep_sdc": ("deep_gemm", "deep_allreduce"),
    "deep_memory": ("deep_memory",),
    "deep_links": ("deep_links",),
}
ORDER = ("deep_gemm", "deep_allreduce", "deep_memory", "deep_links")
# Shares of --duration: the GEMM load runs the whole of it; the long all-reduce and the memory
# test a fifth each (the memory test always finishes one pass of its patterns).
ALLREDUCE_SHARE = 0.2
MEMORY_SHARE = 0.2
# The host-link copies are fixed work: about 8 timed figures per GPU and 2 per pair.
LINKS_S_PER_GPU = 3.0
LINKS_S_PER_PAIR = 1.0
SAMPLE_INTERVAL_S = 1.0
PROGRESS_EVERY_S = 10.0
# Rank-side sizes: big enough to load a GPU, small enough for 2 CPU cores running the tests.
GEMM_N = {"cuda": 8192, "cpu": 384}
ALLREDUCE_BYTES = {"cuda": 256 << 20, "cpu": 1 << 20}
CPU_MEMTEST_BYTES = 16 << 20
LINK_BYTES = 256 << 20
LINK_ITERS = 5

Reading = Mapping[str, Any]  # one GPU's NVML reading: the keys of watch's GpuReading
SampleStream = Sequence[tuple[float, Sequence[Reading]]]  # (epoch seconds, readings)


@dataclass(frozen=True)
class Budget:
    """Seconds each deep workload is given (its own time; not counting torch import and joins)."""

    gemm_s: float = 0.0
    allreduce_s: float = 0.0
    memory_s: float = 0.0
    links_s: float = 0.0

    @property
    def total_s(self) -> float:
        return self.gemm_s + self.allreduce_s + self.memory_s + self.links_s


def budget(tasks: Sequence[str], duration_s: float, gpus: int, pairs: int) -> Budget:
    return Budget(
        gemm_s=duration_s if "deep_gemm" in tasks else 0.0,
        allreduce_s=max(1.0, duration_s * ALLREDUCE_SHARE) if "deep_allreduce" in tasks else 0.0,
        memory_s=max(1.0, duration_s * MEMORY_SHARE) if "deep_memory" in tasks else 0.0,
        links_s=LINKS_S_PER_GPU * gpus + LINKS_S_PER_PAIR * pairs if "deep_links" in tasks else 0.0,
    )


@dataclass
class DeepRun:
    plan: Plan
    tasks: tuple[str, ...]
    budget: Budget
    launch: LaunchResult
    samples: list[tuple[float, list[dict[str, Any]]]] = field(default_factory=list)
    sampling: str = ""  # why there are no NVML readings ("" when there are)
    owners: dict[str, str] = field(default_factory=dict)  # task -> the check that reports its failure

    def results(self, task: str) -> dict[str, Any] | None:
        return self.launch.results(task)

    def gpu_of(self) -> dict[int, int | None]:
        """Global rank -> the NVML index of its GPU (ranks on this node; None on CPU)."""
        return {r.rank: r.gpu for r in self.launch.ranks}


def deep_tasks(planned: Sequence[str], device: str, world: int) -> tuple[str, ...]:
    """The workloads the selected deep checks need, in run order."""
    names = [c for c in planned if c in TASKS_OF] or list(TASKS_OF)
    wanted = {t for c in names for t in TASKS_OF[c]}
    if world < 2:
        wanted.discard("deep_allreduce")  # nothing to reduce across
    if device != "cuda":
        wanted.discard("deep_links")  # no host links on CPU ranks
    return tuple(t for t in ORDER if t in wanted)


def task_owners(planned: Sequence[str], tasks: Sequence[str]) -> dict[str, str]:
    """Which check reports a failure in each task: the first selected check that needs it."""
    checks = [c for c in planned if c in TASKS_OF] or list(TASKS_OF)
    return {t: next(c for c in checks if t in TASKS_OF[c]) for t in tasks}


def task_list(
    tasks: Sequence[str], b: Budget, p: Plan, ctx: CheckContext, pairs: Sequence[tuple[int, int]]
) -> list[Task]:
    params: dict[str, dict[str, Any]] = {
        "deep_gemm": {"seconds": b.gemm_s, "n": GEMM_N},
        "deep_allreduce": {"seconds": b.allreduce_s, "bytes": ALLREDUCE_BYTES},
        "deep_memory": {
            "seconds": b.memory_s,
            "share": ctx.options.mem_share,
            "cpu_bytes": CPU_MEMTEST_BYTES,
            "gpus": p.gpus,
        },
        "deep_links": {"bytes": LINK_BYTES, "iters": LINK_ITERS, "pairs": [list(x) for x in pairs], "gpus": p.gpus},
    }
    from gpudoctor.launch import Task

    return [Task(t, params[t]) for t in tasks]


def deadline_s(ctx: CheckContext, b: Budget) -> float:
    """--timeout for starting, joining and the overheads, plus the planned load time."""
    return ctx.options.timeout_s + b.total_s * 1.25


def start_deep_run(ctx: CheckContext) -> DeepRun | None:
    """The deep run of this check run (its starter: the runner calls it once, when the first deep
    check reads `ctx.run("deep")`), or None when the plan runs nothing (the caller gives the plan's
    skip). What runs is planned from every deep check of the run (ctx.planned)."""
    p = plan(ctx)
    if p.skip:
        return None
    world = world_size(ctx, p)
    tasks = deep_tasks(ctx.planned, p.device, world)
    link_pairs = p2p_pairs(ctx.snapshot, list(ctx.visible.gpus)) if "deep_links" in tasks else []
    b = budget(tasks, ctx.options.duration_s, len(p.gpus), len(link_pairs))
    ctx.progress(
        f"level 3: {', '.join(tasks)} on {world} rank(s), about {b.total_s:.0f} s of load "
        f"(deadline {deadline_s(ctx, b):.0f} s)"
    )
    local = _local_gpus(p)
    sampler = LoadSampler(local, progress=ctx.progress) if p.device == "cuda" and local else None
    if sampler is not None:
        sampler.start()
    from gpudoctor.launch import launch

    try:
        result = launch(
            task_list(tasks, b, p, ctx, link_pairs),
            device=p.device,
            ranks=p.ranks,
            timeout_s=deadline_s(ctx, b),
            gpus=p.gpus,
            gpu_uuids=p.uuids,
            progress=ctx.progress,
            python=ctx.options.python,
        )
    finally:
        samples, note = sampler.stop() if sampler is not None else ([], "CPU ranks: no NVML readings")
    return DeepRun(p, tasks, b, result, samples, note, task_owners(ctx.planned, tasks))


def skipped(ctx: CheckContext, first: Code, what: str) -> Finding:
    """The skip of a deep check whose plan runs nothing (no GPU, MIG across GPUs), under its first code."""
    return skip_finding(ctx, first, plan(ctx), what)


def _local_gpus(p: Plan) -> list[int]:
    """The GPUs this process's ranks drive (one under torchrun/srun: its local rank's)."""
    from gpudoctor.launch import launcher_env

    launcher = launcher_env(os.environ)  # read and checked before any check runs (api.check)
    if launcher is not None:
        local = launcher.local_rank
        return [p.gpus[local]] if local < len(p.gpus) else []
    return list(p.gpus)


class LoadSampler:
    """NVML readings of the GPUs under load, by the parent, from a thread, once a second.

    Uses watch's sampler (the one NVML reader for live data). A failure to read is a note, never
    an exception: the deep checks then judge without readings and say so.
    """

    def __init__(
        self,
        indices: list[int],
        *,
        interval_s: float = SAMPLE_INTERVAL_S,
        progress: Callable[[str], None] = lambda message: None,
        factory: Callable[..., Any] | None = None,
    ) -> None:
        self.indices = indices
        self.interval_s = interval_s
        self.progress = progress
        self.factory = factory
        self.samples: list[tuple[float, list[dict[str, Any]]]] = []
        self.note = ""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="deep-nvml-sampler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, wait_s: float = 5.0) -> tuple[list[tuple[float, list[dict[str, Any]]]], str]:
        self._stop.set()
        self._thread.join(wait_s)
        if self._thread.is_alive():
            self.note = self.note or f"NVML sampling did not stop within {wait_s:g} s (a stuck NVML call)"
        return list(self.samples), self.note

    def _loop(self) -> None:
        if self.factory is None:
            from gpudoctor.probe.sampler import NvmlSampler  # lazy: only live GPU runs read NVML

            self.factory = NvmlSampler
        sampler = self.factory(indices=self.indices)
        opened = sampler.open()
        if not opened.ok:
            self.note = f"NVML not readable ({opened.status}{': ' + opened.detail if opened.detail else ''})"
            return
        last_said = time.monotonic()
        try:
            while not self._stop.is_set():
                t = time.time()
                try:
                    readings = sampler.read()
                except Exception as exc:  # noqa: BLE001  (a reading gone wrong ends sampling, not the run)
                    self.note = f"NVML sampling stopped: {type(exc).__name__}: {exc}"
                    return
                self.samples.append((t, readings))
                if time.monotonic() - last_said >= PROGRESS_EVERY_S:
                    self.progress(describe_readings(readings))
                    last_said = time.monotonic()
                self._stop.wait(self.interval_s)
        finally:
            sampler.close()


def describe_readings(readings: Sequence[Reading]) -> str:
    """One progress line: the ranges of temperature, power and SM clock, and any slowdown."""

    def span(key: str, unit: str) -> str:
        values = [r[key] for r in readings if r.get(key) is not None]
        if not values:
            return ""
        low, high = min(values), max(values)
        return f"{key.replace('_', ' ')} {low:g}{'' if low == high else f'-{high:g}'}{unit}"

    parts = [s for s in (span("temp", " C"), span("power", " W"), span("sm_clock", " MHz")) if s]
    slow = [
        f"GPU {r['index']} {', '.join(x.label for x in clock_reasons.slowdowns(r['throttle']))}"
        for r in readings
        if isinstance(r.get("throttle"), int) and clock_reasons.slowdowns(r["throttle"])
    ]
    line = "under load: " + (", ".join(parts) or "no readings")
    return line + ("; slowdown: " + "; ".join(slow) if slow else "")


# -- naming ranks and GPUs in findings ------------------------------------------------------------


def with_gpus(rows: Sequence[dict[str, Any]], run: DeepRun) -> list[dict[str, Any]]:
    """Rows with "gpu" (NVML index) filled in from the launch where the workload did not say."""
    gpu_of = run.gpu_of()
    return [{**r, "gpu": r.get("gpu", gpu_of.get(r["rank"]))} for r in rows]


def subject(row: Mapping[str, Any]) -> str:
    return gpu_subject(row["gpu"]) if row.get("gpu") is not None else f"rank:{row['rank']}"


def who(row: Mapping[str, Any]) -> str:
    if row.get("gpu") is not None:
        return f"GPU {row['gpu']}"
    return f"rank {row['rank']}" + (f" ({row['device']})" if row.get("device") not in (None, "cpu") else "")


def median(values: Sequence[float]) -> float:
    """The median (0.0 of nothing); not statistics.median, whose import costs `check --quick` ~10 ms."""
    ordered = sorted(values)
    mid = len(ordered) // 2
    if not ordered:
        return 0.0
    return float(ordered[mid]) if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2.0


# -- a run that did not finish ------------------------------------------------------------------


def deep_data(
    ctx: CheckContext, check_name: str, task: str, code: Code, what: str, first: Code
) -> tuple[DeepRun, dict[str, Any]] | list[Finding]:
    """The shared deep run and `task`'s result, or the findings that say why there is none
    (`first`: the check's first code, which its skip is given under)."""
    run = ctx.run(RUN_KEY)
    if run is None:
        return [skipped(ctx, first, what)]
    data = run.results(task)
    if data is None:
        return not_finished(code, task, what, run, check_name)
    return run, data


def not_finished(code: Code, task: str, what: str, run: DeepRun, check_name: str) -> list[Finding]:
    """Why `task` gave no result. The check that owns the task the run stopped in gets a FAIL
    naming the rank that failed; the others get a SKIP that says where to look."""
    result = run.launch
    if result.setup_error is not None:
        err = result.setup_error
        hint = "No rank started: fix what the message names (the torch install, a busy port, /dev/shm) and run again."
        return [Finding(code.code, Status.FAIL, "host", f"{what} did not start: {err['message']}", hint, dict(err))]
    suspects = result.suspects() or result.failed_ranks()
    if not suspects:
        return [
            Finding(code.code, Status.ERROR, "host", f"{what} gave no result", code.fix, {"launch": result.to_json()})
        ]
    stopped_in = suspects[0].phase
    blamed = stopped_in if stopped_in in run.tasks else run.tasks[0]
    owner = run.owners.get(blamed, check_name)
    if owner != check_name or (blamed != task and run.tasks.index(blamed) < run.tasks.index(task)):
        where = f"in {blamed}" if stopped_in in run.tasks else "before its tests"
        return [
            Finding(
                code.code,
                Status.SKIP,
                "host",
                f"{what} not run: the deep run stopped {where} ({_describe(suspects)}; see {owner})",
                "",
                {"stopped_in": stopped_in},
            )
        ]
    victims = [r for r in result.failed_ranks() if r not in suspects]
    return [_rank_failure(code, what, r, run, victims, check_name) for r in suspects]


def _describe(ranks: Sequence[RankOutcome]) -> str:
    return ", ".join(r.label for r in ranks)


def _rank_failure(
    code: Code, what: str, r: RankOutcome, run: DeepRun, victims: Sequence[RankOutcome], check_name: str
) -> Finding:
    result = run.launch
    evidence = {
        **r.to_json(),
        "log_tail": r.log_tail[-1500:],
        "deadline_s": result.deadline_s,
        "timed_out": result.timed_out,
        "others_stopped": [v.rank for v in victims],
    }
    if r.state == "hung":
        how = f"{r.hang_reason()} within the {result.deadline_s:g} s deadline (last phase: {r.phase})"
    else:
        how = f"failed in phase {r.phase}: {r.error[:300]}"
    row = {"rank": r.rank, "gpu": r.gpu}
    message = f"{what} did not finish: {r.label} {how}"
    hint = failure_hint(run.plan, r, f"gpudoctor check --level 3 --select {check_name}")
    return Finding(code.code, Status.FAIL, subject(row), message, hint, evidence)
