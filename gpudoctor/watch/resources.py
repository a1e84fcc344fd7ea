"""The job's resources: memory on a GPU that is not the rank's own (GD947), time between steps that is
not the loader's (GD948), DataLoader workers against the host's CPUs (GD949, and the advice of GD910).

A rank's own GPU is the device its LOCAL_RANK picks among CUDA_VISIBLE_DEVICES (or the one device listed,
when a launcher gives each rank one), read with the same parser as `gpudoctor check`
(knowledge/visible_gpus.py). CUDA numbers devices by CUDA_DEVICE_ORDER: PCI_BUS_ID is NVML's order; the
default FASTEST_FIRST is PCI order among identical GPUs (visible_gpus' docstring), so on a host of mixed
GPUs without PCI_BUS_ID the own GPU is not guessed and GD947 stays silent. UUID entries are matched to
NVML's UUIDs; MIG instances are not judged.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import replace

from gpudoctor.knowledge import visible_gpus
from gpudoctor.watch import data_codes
from gpudoctor.watch.analysis import MAX_VERDICT_RANKS, Figure, RankRef, RankStats, Verdict
from gpudoctor.watch.data_model import Hello
from gpudoctor.watch.model import ProcReading, Sample, plural
from gpudoctor.watch.thresholds import Thresholds
from gpudoctor.watch.window import median_without

Key = tuple[int | None, int]


def own_gpu(hello: Hello, gpus: Mapping[int, tuple[str, str]]) -> int | None:
    """The NVML index of the rank's own GPU, or None when it cannot be told. `gpus`: index -> (name, uuid)."""
    if hello.local_rank is None:
        return None
    parsed = visible_gpus.parse(hello.visible)
    if parsed.kind == "GPU-":
        by_uuid = [next((i for i, (_, u) in gpus.items() if u.startswith(str(v))), None) for v in parsed.values]
        cands = [i for i in by_uuid if i is not None]
        if len(cands) != len(parsed.values):
            return None
    elif parsed.kind in ("all", "int"):
        if hello.order != visible_gpus.PCI_BUS_ID and len({name for name, _ in gpus.values()}) > 1:
            return None  # FASTEST_FIRST on mixed GPUs: CUDA's order is not NVML's
        if parsed.kind == "all":
            return hello.local_rank
        cands = [int(v) for v in parsed.values]
    else:
        return None  # MIG
    if len(cands) == 1:
        return cands[0]
    return cands[hello.local_rank] if hello.local_rank < len(cands) else None


def foreign_memory(win: Sequence[Sample], hellos: Mapping[Key, Hello], th: Thresholds) -> list[Verdict]:
    """GD947: ranks whose process holds memory on a GPU other than their own (NVML's latest process list)."""
    latest = next((s for s in reversed(win) if s.procs is not None), None)
    if latest is None or not hellos:
        return []
    gpus = {g.index: (g.name, g.uuid) for g in latest.gpus}
    if not gpus:  # no GPU watched: the job's processes are listed with no GPU (model.ProcReading.gpu None)
        return []
    own = {key: own_gpu(h, gpus) for key, h in hellos.items()}
    owner = {gpu: key for key, gpu in own.items() if gpu is not None}
    by_pid: dict[int, list[ProcReading]] = {}  # one pass over the processes, not one per rank (the scale audit)
    for p in latest.procs or ():
        if p.gpu is not None:  # None: no GPU used
            by_pid.setdefault(p.pid, []).append(p)
    out = []
    for key, gpu in sorted(own.items(), key=lambda kv: _order(kv[0])):
        if gpu is None:
            continue
        ref = RankRef(key[0], key[1])
        mine = by_pid.get(key[1], [])
        stray = [p for p in mine if p.gpu != gpu and (p.gpu_mem is None or p.gpu_mem >= th.stray_mem_mib)]
        if not stray:
            continue
        parts = []
        for p in sorted(stray, key=lambda p: p.gpu):
            size = "memory" if p.gpu_mem is None else f"{p.gpu_mem} MiB"
            whose = owner.get(p.gpu)
            belongs = f" ({RankRef(whose[0], whose[1]).label}'s)" if whose is not None and whose != key else ""
            parts.append(f"{size} on GPU {p.gpu}{belongs}")
        home = "" if any(p.gpu == gpu for p in mine) else f", nothing on its own GPU {gpu}"
        message = f"{ref.label} (PID {key[1]}) holds {', '.join(parts)}; its own GPU is GPU {gpu}{home}"
        hint = (
            "torch.cuda.set_device(local_rank) before any CUDA work; "
            "torch.load(..., map_location=f'cuda:{local_rank}'); DDP(model, device_ids=[local_rank])."
        )
        code = data_codes.MEMORY_ON_OTHER_GPU
        gpus_named = tuple(sorted({p.gpu for p in stray}))
        out.append(Verdict(code.code, code.name, gpus_named, message, hint, ranks=(ref,)))
    return out


def outside_step(stats: Mapping[Key, RankStats], th: Thresholds) -> list[Verdict]:
    """GD948: time between steps spent neither in the step nor inside next(loader), on one rank or on all."""
    other = {
        key: max(0.0, s.wait_share - s.loader_share)
        for key, s in stats.items()
        if s.wait_share is not None and s.loader_share is not None and s.steps >= th.min_samples
    }
    if not other:
        return []
    code = data_codes.TIME_OUTSIDE_STEP
    hint = "Move evaluation, checkpointing and logging off the step path (less often, asynchronous, or sharded)."
    out = []
    ordered = sorted(other.values())  # the others' median from one sorted list: O(log n) a rank, not a copy
    for key, share in sorted(other.items(), key=lambda kv: _order(kv[0])):
        if len(ordered) < 2 or share < th.outside_share or share < th.outside_ratio * median_without(ordered, share):
            continue
        loader = stats[key].loader_share or 0.0
        ref = stats[key].ref
        template = (
            f"{ref.label} spends {{}}% of its step time between steps outside next(loader) (the loader "
            f"{100 * loader:.0f}%): other ranks wait for it in their next collective"
        )
        figure = Figure(100 * share, template, unit="% outside the loader")
        out.append(Verdict(code.code, code.name, (), figure.message(figure.value), hint, figure=figure, ranks=(ref,)))
    if out:
        return out
    median = statistics.median_low(list(other.values()))
    if median < th.outside_share:
        return []
    template = (
        "the ranks spend {}% of their step time between steps outside next(loader) "
        f"(median of {plural(len(other), 'rank')})"
    )
    figure = Figure(100 * median, template, unit="% outside the loader")
    refs = tuple(sorted((stats[k].ref for k in other), key=lambda r: _order((r.rank, r.pid)))[:MAX_VERDICT_RANKS])
    return [Verdict(code.code, code.name, (), figure.message(figure.value), hint, figure=figure, ranks=refs)]


def worker_load(workers: Mapping[Key, int], hellos: Mapping[Key, Hello]) -> tuple[int, int, int] | None:
    """(workers of all ranks, ranks, CPUs) on this host, when the ranks' CPUs are known and agree."""
    cpus = {h.cpus for k in workers if (h := hellos.get(k)) is not None and h.cpus}
    if len(cpus) != 1 or not workers:
        return None
    return sum(workers.values()), len(workers), cpus.pop()


def oversubscribed(workers: Mapping[Key, int], hellos: Mapping[Key, Hello]) -> list[Verdict]:
    """GD949: the ranks' DataLoader workers and main processes together outnumber the CPUs they may use."""
    load = worker_load(workers, hellos)
    if load is None:
        return []
    total, ranks, cpus = load
    if not total or total + ranks <= cpus:
        return []
    code = data_codes.LOADER_WORKERS
    message = (
        f"{plural(ranks, 'rank')} run {plural(total, 'DataLoader worker')} and their own processes, "
        f"{total + ranks} busy processes on {plural(cpus, 'CPU')}"
    )
    best = max(0, cpus // ranks - 1)
    hint = f"num_workers={best} per rank fits {plural(cpus, 'CPU')}; make samples cheaper rather than adding workers."
    refs = tuple(sorted((RankRef(k[0], k[1]) for k in workers), key=lambda r: _order((r.rank, r.pid))))
    return [Verdict(code.code, code.name, (), message, hint, ranks=refs)]


def advise_input_wait(v: Verdict, workers: Mapping[Key, int], hellos: Mapping[Key, Hello]) -> Verdict:
    """GD910's hint with the workers counted against the CPUs, before more workers are advised."""
    load = worker_load(workers, hellos)
    if load is None:
        return v
    total, ranks, cpus = load
    if total + ranks >= cpus:
        hint = (
            f"More DataLoader workers will not help: {plural(total, 'worker')} and {plural(ranks, 'rank')} already "
            f"take the {plural(cpus, 'CPU')}. Make each sample cheaper (preprocess once, decode on the GPU) or "
            "give the job more CPUs."
        )
    else:
        now = max(workers.values())
        hint = (
            f"Raise num_workers (now {now} per rank) up to {cpus // ranks - 1} per rank ({plural(cpus, 'CPU')} for "
            f"{plural(ranks, 'rank')}), with pin_memory=True and persistent_workers=True."
        )
    return replace(v, hint=hint)


def _order(key: Key) -> tuple[bool, int, int]:
    return (key[0] is None, key[0] or 0, key[1])
