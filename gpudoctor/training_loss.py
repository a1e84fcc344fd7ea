"""The loss a rank gives `gpudoctor.step(loss=...)`, collected for `gpudoctor watch` (sent by
gpudoctor/training_data.py with the rest of the rank's data).

A float, or a one-element tensor on the CPU, is read at once (`float(t)`: about a microsecond). A loss on
an accelerator is not: reading it (`.item()`) makes the host wait until the device has run everything
queued before it, every step, which removes the run-ahead that keeps a GPU busy. Instead the tensor is
kept (detached: its 4 bytes, no graph) and, once per flush (every 50 ms at most), the held losses are
stacked and copied to the host with `non_blocking=True` (into pinned memory: asynchronous) behind a CUDA
event; they are read at a later flush when `event.query()` says the copy is done, and at exit after
`event.synchronize()`. The trade-off: a loss is seen one or two flushes late (~0.1 s), and a kernel (the
stack) and a copy are queued per flush, never per step. Other accelerators (no CUDA event here) are
copied with a plain `.to("cpu")`, which waits, once per flush.

The steps are numbered by the losses given (the k-th loss a rank gives is its step k), so the ranks'
numbers agree however they count their own steps. Standard library only: torch is taken from
sys.modules (it is there when a tensor is given), never imported.
"""

from __future__ import annotations

import math
import sys
from typing import Any

MAX_PENDING = 1024  # accelerator losses held before a copy is launched anyway


class Losses:
    """The losses given to step(): statistics per flush, the first non-finite one, device values read late."""

    def __init__(self) -> None:
        self.k = 0  # losses given so far (the step number a loss is told by)
        self.pending: list[tuple[int, Any]] = []  # (k, detached accelerator tensor)
        self.inflight: list[tuple[list[int], Any, Any]] = []  # (ks, host tensor, event or None)
        self.reset()

    def reset(self) -> None:
        self.n = self.bad = 0
        self.sum = self.sq = 0.0
        self.min = math.inf
        self.max = -math.inf
        self.last: int | None = None
        self.last_value: float | None = None
        self.first_bad: tuple[int, str] | None = None

    def add(self, value: Any, note: Any) -> None:
        self.k += 1
        kind = type(value)
        if kind is float:
            self.number(self.k, value)
            return
        if kind is int:
            self.number(self.k, float(value))
            return
        device = getattr(value, "device", None)
        if device is None or not hasattr(value, "detach"):
            note(f"loss= takes a float or a one-element tensor, not {kind.__name__}: ignored")
            return
        try:
            if value.numel() != 1:
                note("loss= takes one number (a 0-d or one-element tensor): a larger tensor is ignored")
                return
            if getattr(device, "type", "cpu") == "cpu":
                self.number(self.k, float(value.detach()))  # detached: no autograd warning in the user's loop
                return
            self.pending.append((self.k, value.detach()))
        except Exception as exc:  # noqa: BLE001  (never raise into the training loop)
            note(f"loss= could not be read ({type(exc).__name__}): ignored")
            return
        if len(self.pending) >= MAX_PENDING:
            self.launch()

    def number(self, k: int, x: float) -> None:
        # Per step: comparisons, not math.isfinite()/min()/max() (each builtin call ~0.05-0.15 us).
        self.last = k
        if x - x == 0.0:  # finite: inf - inf and nan - nan are nan
            self.last_value = x
            self.n += 1
            self.sum += x
            self.sq += x * x
            if x < self.min:
                self.min = x
            if x > self.max:
                self.max = x
            return
        self.last_value = None
        self.bad += 1
        if self.first_bad is None:
            self.first_bad = (k, "nan" if x != x else ("inf" if x > 0 else "-inf"))

    def launch(self) -> None:
        """Copy the held accelerator losses to the host without waiting: one stack and one non-blocking
        copy per device, read when the copy's event is done (collect)."""
        if not self.pending:
            return
        torch = sys.modules.get("torch")
        held, self.pending = self.pending, []
        if torch is None:
            return
        groups: dict[str, list[tuple[int, Any]]] = {}
        for k, t in held:
            groups.setdefault(str(t.device), []).append((k, t))
        for items in groups.values():
            ks = [k for k, _ in items]
            try:
                values = torch.stack([t.float() for _, t in items])
                if getattr(items[0][1].device, "type", "") == "cuda":
                    host = values.to("cpu", non_blocking=True)  # into pinned memory: asynchronous
                    event = torch.cuda.Event()
                    event.record()
                else:  # other accelerators: a plain copy, once per flush
                    host, event = values.to("cpu"), None
            except Exception:  # noqa: BLE001  (a device that cannot: these losses are lost, training goes on)
                continue
            self.inflight.append((ks, host, event))

    def collect(self, wait: bool = False) -> None:
        """Read the copies that are done (all of them, waiting, at exit)."""
        keep = []
        for ks, host, event in self.inflight:
            try:
                if event is not None and not event.query():
                    if not wait:
                        keep.append((ks, host, event))
                        continue
                    event.synchronize()
                for k, x in zip(ks, host.tolist(), strict=False):
                    self.number(k, float(x))
            except Exception:  # noqa: BLE001
                continue
        self.inflight = keep

    def to_json(self) -> dict[str, Any] | None:
        if self.last is None:
            return None
        doc: dict[str, Any] = {"n": self.n, "bad": self.bad, "last": self.last}
        if self.n and math.isfinite(self.sq):
            doc.update(sum=self.sum, sq=self.sq, min=self.min, max=self.max)
        if self.last_value is not None:
            doc["last_value"] = self.last_value
        if self.first_bad is not None:
            doc["first_bad"], doc["bad_kind"] = self.first_bad
        return doc
