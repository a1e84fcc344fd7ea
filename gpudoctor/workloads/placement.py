"""The rank-side guard: every tensor of a collective is where its backend needs it.

Under NCCL a collective's tensors must all be on the rank's GPU, outputs too: ProcessGroupNCCL's
allgather checks only the input's device and allocates its flat output like `outputs[0]`, so an
output list on the host is written by NCCL's kernel through a host pointer. One rank gets away with
it (NCCL copies with cudaMemcpy: the H200 run, /work/gpurun1/summary.txt "all_gather into CPU
tensors ... ok"); two or more GPUs without HMM take an illegal memory access (XID 31) instead of
an error (issue 19, the DDP sanity run's `firsts` gather). `guarded(ctx)` wraps torch.distributed's
collectives while the workloads run: under NCCL a tensor not on the rank's GPU is refused at once,
with the collective named, before NCCL sees it; a collective on a gloo group (CPU by design) is
left alone.

CPU-only runs use gloo, where the host is the right place, so the same mistake passes there
unseen. With GPUDOCTOR_CHECK_PLACEMENT=1 (the test suite sets it, tests/conftest.py) a gloo rank
checks placement as NCCL would need it: `HostTracker`, a TorchFunctionMode, follows the tensors
made on the default device (a factory call without `device=`, or `.cpu()`) and never moved to the
rank's device (`.to(device)`, `.cuda()`, `device=`), and the guard refuses those in a collective.
"""

from __future__ import annotations

import contextlib
import os
import traceback
import weakref
from collections.abc import Callable, Iterator
from typing import Any

CHECK_ENV = "GPUDOCTOR_CHECK_PLACEMENT"
COLLECTIVES = (
    "all_reduce",
    "all_gather",
    "all_gather_into_tensor",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "broadcast",
    "reduce",
    "all_to_all",
    "all_to_all_single",
    "gather",
    "scatter",
    "send",
    "recv",
    "batch_isend_irecv",  # checks its P2POps' tensors
)
# Not isend/irecv: P2POp(op, ...) accepts only torch's own two functions (distributed_c10d._check_op
# compares identity), so a wrapped dist.isend would break every batch_isend_irecv built from it. The
# workloads send point to point through batch_isend_irecv only (workloads/collectives.py).


class PlacementError(RuntimeError):
    """A collective was handed a tensor its backend cannot use where it is."""


def _tensors(value: Any) -> Iterator[Any]:
    """The tensors in a collective's arguments: tensors, lists of them, P2POp's tensor."""
    import torch

    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _tensors(item)
    elif hasattr(value, "tensor") and isinstance(value.tensor, torch.Tensor):  # dist.P2POp
        yield value.tensor


class HostTracker:
    """Which tensors were made on the default (host) device and not moved to the rank's device.

    A TorchFunctionMode sees every torch call: a factory call without `device=` (or `.cpu()`) makes
    a host tensor; `.to()`/`.cuda()`/`device=` naming the rank's device make a placed one; any other
    op gives a host tensor only when all its tensor inputs are host ones. Tensors it never saw
    (autograd's gradients, DDP's buckets) are not host: it never cries wolf on them.
    """

    MOVES = {"to", "cuda", "_to_copy"}

    def __init__(self, device: Any) -> None:
        self.device = device
        self._host: dict[int, weakref.ref[Any]] = {}

    def is_host(self, tensor: Any) -> bool:
        ref = self._host.get(id(tensor))
        return ref is not None and ref() is tensor

    def _mark(self, out: Any, host: bool) -> None:
        for t in _tensors(out):
            key = id(t)
            if host:
                self._host[key] = weakref.ref(t, self._forget(key))
            else:
                self._host.pop(key, None)

    def _forget(self, key: int) -> Callable[[Any], None]:
        return lambda _ref: self._host.pop(key, None)

    def _placed(self, target: Any) -> bool | None:
        """Whether a `device=`/`.to()` target is the rank's device (None: no device named)."""
        import torch

        if isinstance(target, torch.Tensor):
            return not self.is_host(target)
        if isinstance(target, (str, torch.device)):
            return torch.device(target).type == self.device.type
        return None

    def after(self, func: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> None:
        name = getattr(func, "__name__", "")
        inputs = [t for a in (*args, *kwargs.values()) for t in _tensors(a)]
        target = kwargs.get("device")
        if name in self.MOVES and target is None:
            target = next((a for a in args[1:] if self._placed(a) is not None), None)
            if name == "cuda":
                target = "cuda"
        placed = self._placed(target) if target is not None else None
        if name == "cpu":
            self._mark(out, True)  # to the host, whatever the rank's device: what NCCL would be given
        elif placed is not None:
            self._mark(out, not placed)
        elif not inputs:
            self._mark(out, True)  # a factory call on the default device
        else:
            self._mark(out, all(self.is_host(t) for t in inputs))

    def mode(self) -> Any:
        from torch.overrides import TorchFunctionMode

        tracker = self

        class Mode(TorchFunctionMode):
            def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
                kwargs = kwargs or {}
                out = func(*args, **kwargs)
                tracker.after(func, args, kwargs, out)
                return out

        return Mode()


def _caller() -> str:
    """file:line of the workload's call (the first frame outside this module)."""
    for frame in reversed(traceback.extract_stack()[:-2]):
        if frame.filename != __file__:
            return f"{os.path.basename(frame.filename)}:{frame.lineno}"
    return "?"


def _check(name: str, args: tuple[Any, ...], kwargs: dict[str, Any], device: Any, tracker: HostTracker | None) -> None:
    import torch.distributed as dist

    group = kwargs.get("group")
    if tracker is None and dist.get_backend(group) != "nccl":
        return  # gloo: the host is the right place
    for i, t in enumerate(t for a in (*args, *kwargs.values()) for t in _tensors(a)):
        if tracker is not None and tracker.is_host(t):
            raise PlacementError(
                f"dist.{name} at {_caller()}: tensor {i} was made on the host and never moved to the rank's "
                f"device ({device}); NCCL would write it through a host pointer (illegal memory access on 2+ GPUs)"
            )
        if tracker is None and t.device != device:
            raise PlacementError(
                f"dist.{name} at {_caller()}: tensor {i} is on {t.device}, not this rank's {device}: "
                "NCCL needs it there"
            )


@contextlib.contextmanager
def guarded(device: Any, backend: str, environ: Any = None) -> Iterator[HostTracker | None]:
    """Wrap torch.distributed's collectives for the duration: under NCCL always, under gloo when
    GPUDOCTOR_CHECK_PLACEMENT=1 (then also following host tensors; the tracker is yielded)."""
    import torch.distributed as dist

    environ = os.environ if environ is None else environ
    audit = backend != "nccl" and environ.get(CHECK_ENV) == "1"
    if backend != "nccl" and not audit:
        yield None
        return
    tracker = HostTracker(device) if audit else None
    originals = {name: getattr(dist, name) for name in COLLECTIVES if hasattr(dist, name)}

    def wrap(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def collective(*args: Any, **kwargs: Any) -> Any:
            _check(name, args, kwargs, device, tracker)
            return fn(*args, **kwargs)

        return collective

    for name, fn in originals.items():
        setattr(dist, name, wrap(name, fn))
    try:
        if tracker is None:
            yield None
        else:
            with tracker.mode():
                yield tracker
    finally:
        for name, fn in originals.items():
            setattr(dist, name, fn)
