"""The job's own verdicts beside the machine's: data across ranks (watch/data.py), numerics
(watch/numerics.py), resources (watch/resources.py), kept over the whole run for SummaryBuilder.

What is a fact is judged at once, warm-up or not (ranks reading the same samples, a NaN loss, a context on
another rank's GPU, workers outnumbering CPUs); what is a measurement over the window waits for the
warm-up and is left out while the job hangs, like the balance verdicts (loss divergence, time outside the
step). `seen()` says what was seen when nothing was judged yet: a short job still learns something.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from gpudoctor.watch import codes
from gpudoctor.watch.analysis import RankStats, Verdict
from gpudoctor.watch.data import DataBook, is_eval
from gpudoctor.watch.data_model import DataReading
from gpudoctor.watch.model import Sample, plural
from gpudoctor.watch.numerics import LossBook, divergence
from gpudoctor.watch.resources import advise_input_wait, foreign_memory, outside_step, oversubscribed
from gpudoctor.watch.thresholds import Thresholds

HANGS = {codes.HUNG_COLLECTIVE.code, codes.STEPS_STALLED.code}


class JobBook:
    def __init__(self, th: Thresholds) -> None:
        self.th = th
        self.data = DataBook(th)
        self.losses = LossBook()
        self.workers: dict[tuple[int | None, int], int] = {}  # rank -> its loaders' num_workers
        self.placement: dict[tuple[int | None, int], dict[int, int | None]] = {}  # rank -> GPU -> MiB

    def add(self, s: Sample) -> None:
        if s.data:
            self.add_data(s.data)
        if s.ranks:
            self.data.stepping({r.pid for r in s.ranks if r.steps})
        if s.procs:  # each rank's GPUs as last seen (the reading after the job ended lists none)
            pids = {key[1]: key for key in self.data.hellos()}
            seen: dict[tuple[int | None, int], dict[int, int | None]] = {}
            for p in s.procs:
                key = pids.get(p.pid)
                if key is not None:
                    seen.setdefault(key, {})[p.gpu] = p.gpu_mem
            self.placement.update(seen)
            self._prune()

    def _prune(self) -> None:
        """Hold the workers and placement of the processes that hold a rank now (a restarted rank's old
        process, or one folded past MAX_RANKS, leaves them too)."""
        held = self.data.ranks
        if len(self.placement) > len(held):
            self.placement = {k: v for k, v in self.placement.items() if k in held}
        if len(self.workers) > len(held):
            self.workers = {k: v for k, v in self.workers.items() if k in held}

    def add_data(self, readings: Iterable[DataReading]) -> None:
        readings = list(readings)
        self.data.add(readings)
        self.losses.add(readings)
        for r in readings:
            if r.loader is not None:
                self.workers[r.key] = r.loader.workers
        self._prune()

    def verdicts(
        self,
        win: Sequence[Sample],
        judged: Sequence[Verdict],
        warming: float | None,
        ranks: dict[tuple[int | None, int], RankStats],
    ) -> tuple[Verdict, ...]:
        """The window's balance verdicts `judged` (GD910's advice counted against the CPUs) and the job's;
        `warming`: the warm-up left (None: over), `ranks`: the window's per-rank figures."""
        hellos = self.data.hellos()
        out = [advise_input_wait(v, self.workers, hellos) if v.code == codes.INPUT_WAIT.code else v for v in judged]
        out += self.data.verdicts() + self.losses.not_finite()
        out += foreign_memory(win, hellos, self.th) + oversubscribed(self.workers, hellos)
        if warming is None and not any(v.code in HANGS for v in judged):
            out += divergence(win, self.th) + outside_step(ranks, self.th)
        return tuple(out)

    def to_json(self) -> dict[str, Any] | None:
        """What the summary says about the job's data, losses and GPU placement (None: nothing was sent)."""
        data = []
        for rd in sorted(self.data.ranks.values(), key=lambda rd: (rd.ref.rank is None, rd.ref.rank or 0, rd.ref.pid)):
            for role, epochs in sorted(rd.epochs.items()):
                last = epochs[max(epochs)]
                data.append(
                    {
                        "rank": rd.ref.rank,
                        "pid": rd.ref.pid,
                        "role": role,
                        "epochs": max(epochs) + 1,
                        "last_epoch": {
                            "epoch": last.epoch,
                            "samples": last.n,
                            "batches": last.batches,
                            "complete": last.final,
                        },
                        "sampler": last.sampler,
                        "workers": last.workers,
                    }
                )
        losses = self.losses.to_json()
        placement = [
            {"rank": k[0], "pid": k[1], "gpus": [{"gpu": g, "mem_mib": m} for g, m in sorted(gpus.items())]}
            for k, gpus in sorted(self.placement.items(), key=lambda kv: (kv[0][0] is None, kv[0][0] or 0, kv[0][1]))
        ]
        if not (data or losses or placement):
            return None
        return {"data": data, "losses": losses, "placement": placement}


def seen(job: dict[str, Any] | None) -> list[str]:
    """Lines saying what the job's ranks sent, for a summary with no verdict yet."""
    if not job:
        return []
    lines = []
    for role in sorted({d["role"] for d in job["data"]}):
        rows = [d for d in job["data"] if d["role"] == role]
        epochs = max(d["epochs"] for d in rows)
        per = ", ".join(f"{'?' if d['rank'] is None else d['rank']}: {d['last_epoch']['samples']}" for d in rows)
        kind = "evaluation" if is_eval(role) else "training"
        lines.append(
            f"{role} data ({kind}): {plural(epochs, 'epoch')} begun; samples in the last epoch per rank {per}; "
            "no overlap or order problem found"
        )
    losses = job["losses"]
    if losses:
        bad = [x for x in losses if x["not_finite"]]
        last = [x["last"] for x in losses if x["last"] is not None]
        span = f"last {min(last):.4g}..{max(last):.4g}" if last else "no finite loss"
        state = f"{plural(len(bad), 'rank')} with a non-finite loss" if bad else "all finite"
        lines.append(f"loss: {plural(len(losses), 'rank')} reported, {state}; {span}")
    for p in job["placement"]:
        where = ", ".join(
            f"GPU {g['gpu']}" + ("" if g["mem_mib"] is None else f" {g['mem_mib']} MiB") for g in p["gpus"]
        )
        who = f"rank {p['rank']}" if p["rank"] is not None else f"PID {p['pid']}"
        lines.append(f"{who} holds memory on {where or 'no GPU'}")
    return lines
