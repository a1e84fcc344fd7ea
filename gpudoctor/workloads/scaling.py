"""Scaling bench inside a rank: one synthetic model trained with DDP on the first 1, 2, 4, ...
ranks (subgroups of one process group, the same batch per rank), each step split into input
wait, compute, and communication not hidden by compute; on GPUs, nn.DataParallel beside DDP.

Models (plain torch, random data, nothing downloaded): "cnn", a small residual-free ConvNet
(conv-BN-ReLU stages, channels doubling), and "transformer", a stack of pre-norm
TransformerEncoder layers over token embeddings with a vocabulary head. Sizes come in params.

How one step is split, per rank (`_Trainer`):
- input: the device is synchronised, the rank's micro-batches are copied from pinned host
  memory to the device (what a DataLoader with pin_memory hands over), synchronised again;
- compute: the same step on the module without DDP (no gradient synchronisation, no buffer
  broadcast): forward, backward, optimizer step, synchronised. Timed in steps of its own,
  interleaved with the DDP steps so both see the same machine;
- communication not hidden (`_CommTimer`), in the DDP steps: DDP's buffer broadcast before each
  forward, and the time from the last gradient bucket being ready (a comm hook notes it) to
  backward() having waited for every all-reduce (CUDA events on the compute stream on GPUs, the
  training thread's clock on CPU): what the backward pass did not hide;
- step: the DDP step's wall time, input included.
The median over steps of (input + compute + communication) / step, each DDP step paired with
the bare step beside it, must be within 10 % of 1 (the parent checks): the three are measured
apart. A rank that waits for a slower one waits inside
the all-reduce, so on the other ranks the communication figure includes that wait.

Idle ranks (outside the first k) wait in a barrier of a CPU (gloo) group, so no NCCL kernel
spins on their GPUs. The fault switch `slow` makes a rank sleep five times as long as each
forward pass took, before its backward (a straggler: about 2.5x the compute).
"""

from __future__ import annotations

import contextlib
import statistics
import time
from typing import Any

from gpudoctor.workloads.precision import tf32_convolutions
from gpudoctor.workloads.rank import RankContext, all_gather_json

MODELS = ("cnn", "transformer")


def build_model(name: str, sizes: dict[str, int]) -> Any:
    """The synthetic model `name` at `sizes` (see gpudoctor/checks/active/scaling.py DEFAULT_SIZES)."""
    import torch
    import torch.nn as nn

    if name == "cnn":
        width = int(sizes["width"])
        layers: list[Any] = [
            nn.Conv2d(3, width, 3, padding=1, bias=False),
            nn.BatchNorm2d(width),
            nn.ReLU(inplace=True),
        ]
        channels = width
        for stage in range(int(sizes["depth"])):
            out = width << stage
            layers += [
                nn.Conv2d(channels, out, 3, stride=1 if stage == 0 else 2, padding=1, bias=False),
                nn.BatchNorm2d(out),
                nn.ReLU(inplace=True),
                nn.Conv2d(out, out, 3, padding=1, bias=False),
                nn.BatchNorm2d(out),
                nn.ReLU(inplace=True),
            ]
            channels = out
        layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(channels, int(sizes["classes"]))]
        return nn.Sequential(*layers)
    if name == "transformer":

        class TinyLM(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                d, seq, vocab = int(sizes["width"]), int(sizes["seq"]), int(sizes["vocab"])
                self.embed = nn.Embedding(vocab, d)
                self.position = nn.Parameter(torch.zeros(1, seq, d))
                layer = nn.TransformerEncoderLayer(
                    d, int(sizes["heads"]), 4 * d, dropout=0.0, batch_first=True, norm_first=True
                )
                self.blocks = nn.TransformerEncoder(layer, int(sizes["layers"]), enable_nested_tensor=False)
                self.head = nn.Linear(d, vocab)

            def forward(self, tokens: Any) -> Any:
                return self.head(self.blocks(self.embed(tokens) + self.position))

        return TinyLM()
    raise ValueError(f"unknown model {name!r} (choose from {', '.join(MODELS)})")


def make_batches(name: str, sizes: dict[str, int], batch: int, count: int, pin: bool) -> list[tuple[Any, Any]]:
    """`count` random (input, target) batches in host memory (pinned for GPUs)."""
    import torch

    g = torch.Generator().manual_seed(1234)
    out = []
    for _ in range(count):
        if name == "cnn":
            x = torch.randn(batch, 3, int(sizes["image"]), int(sizes["image"]), generator=g)
            y = torch.randint(0, int(sizes["classes"]), (batch,), generator=g)
        else:
            x = torch.randint(0, int(sizes["vocab"]), (batch, int(sizes["seq"])), generator=g)
            y = torch.randint(0, int(sizes["vocab"]), (batch, int(sizes["seq"])), generator=g)
        out.append((x.pin_memory(), y.pin_memory()) if pin else (x, y))
    return out


def loss_of(output: Any, target: Any) -> Any:
    import torch.nn.functional as F

    return F.cross_entropy(output.reshape(-1, output.shape[-1]).float(), target.reshape(-1))


class _CommTimer:
    """Times the communication of a DDP step that compute did not hide, where the step waits
    for it: DDP's buffer broadcast before each forward (from the DDP module's forward entry to the
    inner module's), and the gradient all-reduce at the end of the backward (from the moment the
    last gradient bucket was ready, noted by a comm hook running DDP's default all-reduce, to the
    moment backward() has waited for every all-reduce). On GPUs the marks are CUDA events on the
    compute stream (DDP makes it wait for the all-reduce), on CPU the clock of the training thread."""

    def __init__(self, cuda: bool) -> None:
        self.cuda = cuda
        self.reset()

    def reset(self) -> None:
        self.ready: list[Any] = []
        self.backward_end: Any = None
        self.forwards: list[tuple[Any, Any]] = []
        self._entered: Any = None

    def mark(self) -> Any:
        import torch

        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def _between(self, start: Any, end: Any) -> float:
        return start.elapsed_time(end) / 1000.0 if self.cuda else end - start

    def ddp_forward(self, module: Any, args: Any) -> None:
        self._entered = self.mark()

    def module_forward(self, module: Any, args: Any) -> None:
        if self._entered is not None:  # reached through DDP, after its buffer broadcast
            self.forwards.append((self._entered, self.mark()))
            self._entered = None

    def hook(self, group, bucket):  # type: ignore[no-untyped-def]  (DDP rejects a non-GradBucket annotation)
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        self.ready.append(self.mark())
        return default_hooks.allreduce_hook(group, bucket)

    def exposed_s(self) -> float:
        """Seconds of communication the step waited for (call once the device is synchronised)."""
        total = sum(max(0.0, self._between(a, b)) for a, b in self.forwards)
        if self.ready and self.backward_end is not None:
            last_ready = self.ready[-1] if self.cuda else max(self.ready)
            total += max(0.0, self._between(last_ready, self.backward_end))
        return total


class _Trainer:
    """One model on one rank for one subgroup size, with its timers."""

    def __init__(self, ctx: RankContext, name: str, sizes: dict[str, int], k: int, group: Any, cfg: dict) -> None:
        import torch
        from torch.nn.parallel import DistributedDataParallel as DDP

        self.ctx, self.k, self.cfg = ctx, k, cfg
        dev = ctx.device
        torch.manual_seed(0)
        self.model = build_model(name, sizes).to(dev)
        self.timer = _CommTimer(dev.type == "cuda")
        self.ddp = None
        if k > 1:
            self.ddp = DDP(
                self.model,
                device_ids=[dev.index] if dev.type == "cuda" else None,
                process_group=group,
                bucket_cap_mb=cfg["bucket_cap_mb"],
                gradient_as_bucket_view=cfg["gradient_as_bucket_view"],
                static_graph=cfg["static_graph"],
            )
            self.ddp.register_comm_hook(group, self.timer.hook)
            self.ddp.register_forward_pre_hook(self.timer.ddp_forward)
            self.model.register_forward_pre_hook(self.timer.module_forward)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=1e-3, momentum=0.9)
        amp = cfg["amp"]
        self.autocast_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(amp)
        self.scaler = torch.amp.GradScaler(dev.type) if amp == "fp16" else None
        self.pool = make_batches(name, sizes, int(sizes["batch"]), 4, pin=dev.type == "cuda")
        self.next = 0
        self.slow = ctx.faults.has("slow")

    def _autocast(self) -> Any:
        import torch

        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.ctx.device.type, dtype=self.autocast_dtype)

    def _micro(self, net: Any, x: Any, y: Any) -> None:
        t0 = time.perf_counter()
        with self._autocast():
            loss = loss_of(net(x), y)
        if self.slow:  # the test fault: this rank is a straggler
            self.ctx.sync()
            time.sleep(5 * (time.perf_counter() - t0))
        (self.scaler.scale(loss) if self.scaler is not None else loss).backward()
        if net is self.ddp:
            self.timer.backward_end = self.timer.mark()  # DDP's backward returns once its all-reduces are done

    def step(self, sync: bool) -> tuple[float, float, float]:
        """One optimizer step: (input s, step s after the input, exposed communication s).
        sync=True: through DDP (gradients all-reduced); False: the bare module (compute only)."""
        ctx = self.ctx
        accum = self.cfg["accum"]
        ctx.sync()
        t0 = time.perf_counter()
        micro = []
        for _ in range(accum):
            x, y = self.pool[self.next % len(self.pool)]
            self.next += 1
            micro.append((x.to(ctx.device, non_blocking=True), y.to(ctx.device, non_blocking=True)))
        ctx.sync()
        t1 = time.perf_counter()
        self.timer.reset()
        net = self.ddp if (sync and self.ddp is not None) else self.model
        for i, (x, y) in enumerate(micro):
            last = i == accum - 1
            quiet = self.ddp is not None and net is self.ddp and not last  # accumulate without syncing
            with self.ddp.no_sync() if quiet else contextlib.nullcontext():
                self._micro(net, x, y)
        if self.scaler is not None:
            self.scaler.step(self.opt)
            self.scaler.update()
        else:
            self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        ctx.sync()
        t2 = time.perf_counter()
        exposed = self.timer.exposed_s() if net is self.ddp else 0.0
        return t1 - t0, t2 - t1, exposed

    def grad_allreduce(self, group: Any, reps: int = 3) -> dict[str, Any]:
        """An all-reduce of the gradients' size in this subgroup: the busbw that explains the
        communication time (nccl-tests: busbw = algbw x 2(k-1)/k)."""
        import torch
        import torch.distributed as dist

        from gpudoctor.knowledge.busbw import algbw_gbps, busbw_factor

        numel = sum(p.numel() for p in self.model.parameters())
        buf = torch.zeros(numel, dtype=torch.float32, device=self.ctx.device)
        dist.all_reduce(buf, group=group)
        self.ctx.sync()
        t0 = time.perf_counter()
        for _ in range(reps):
            dist.all_reduce(buf, group=group)
        self.ctx.sync()
        t = torch.tensor([(time.perf_counter() - t0) / reps], dtype=torch.float64, device=self.ctx.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
        seconds = t.item()
        algbw = algbw_gbps(numel * 4, seconds)
        return {
            "bytes": numel * 4,
            "time_ms": round(seconds * 1e3, 4),
            "busbw_gbps": round(algbw * busbw_factor("allreduce", self.k), 6),
        }


def _ms(seconds: float) -> float:
    return round(seconds * 1e3, 4)


def _train(ctx: RankContext, name: str, sizes: dict, k: int, group: Any, cfg: dict) -> dict[str, Any]:
    import torch

    cuda = ctx.device.type == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats(ctx.device)
    trainer = _Trainer(ctx, name, sizes, k, group, cfg)
    for _ in range(cfg["warmup"]):
        trainer.step(sync=True)
    trainer.step(sync=False)
    synced, bare = [], []
    for _ in range(cfg["steps"]):  # interleaved: both kinds of step see the same machine
        synced.append(trainer.step(sync=True))
        bare.append(trainer.step(sync=False))
    steps = [s[0] + s[1] for s in synced]
    # How much of each step the split accounts for, pairing each DDP step with the bare step
    # beside it: the median of those ratios holds on a busy host where a mean would not.
    accounted = statistics.median((s[0] + b[1] + s[2]) / (s[0] + s[1]) for s, b in zip(synced, bare, strict=True))
    row: dict[str, Any] = {  # the split in medians (one slow step on a busy host moves a mean)
        "rank": ctx.rank,
        "input_ms": _ms(statistics.median(s[0] for s in synced)),
        "compute_ms": _ms(statistics.median(b[1] for b in bare)),
        "comm_ms": _ms(statistics.median(s[2] for s in synced)),
        "step_median_ms": _ms(statistics.median(steps)),
        "step_ms": _ms(sum(steps) / len(steps)),  # the mean: what throughput is made of
        "step_ms_max": _ms(max(steps)),
        "accounted": round(accounted, 4),
        "peak_mem_bytes": int(torch.cuda.max_memory_allocated(ctx.device)) if cuda else None,
    }
    grad = trainer.grad_allreduce(group) if k > 1 else None
    params = sum(p.numel() for p in trainer.model.parameters())
    del trainer
    if cuda:
        torch.cuda.empty_cache()
    return {"row": row, "grad_allreduce": grad, "params": params}


def _dataparallel(ctx: RankContext, name: str, sizes: dict, n: int, cfg: dict) -> dict[str, Any]:
    """nn.DataParallel over the n GPUs from this (rank 0's) process, the same per-GPU batch."""
    import torch
    import torch.nn as nn

    devices = list(range(n))
    for d in devices:
        torch.cuda.reset_peak_memory_stats(d)
    torch.manual_seed(0)
    model = build_model(name, sizes).to(ctx.device)
    dp = nn.DataParallel(model, device_ids=devices)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    pool = make_batches(name, sizes, int(sizes["batch"]) * n, 2, pin=True)

    def sync_all() -> None:
        for d in devices:
            torch.cuda.synchronize(d)

    def step(i: int) -> None:
        for j in range(cfg["accum"]):
            x, y = pool[(i + j) % len(pool)]
            loss_of(dp(x.to(ctx.device, non_blocking=True)), y.to(ctx.device, non_blocking=True)).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for i in range(cfg["warmup"]):
        step(i)
    sync_all()
    t0 = time.perf_counter()
    for i in range(cfg["steps"]):
        step(i)
    sync_all()
    step_s = (time.perf_counter() - t0) / cfg["steps"]
    peaks = [int(torch.cuda.max_memory_allocated(d)) for d in devices]
    return {"gpus": n, "step_ms": round(step_s * 1e3, 4), "peak_mem_bytes": peaks}


def run(ctx: RankContext, params: dict[str, Any]) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    n, me = ctx.world_size, ctx.rank
    cuda = ctx.device.type == "cuda"
    if cuda:
        tf32_convolutions(torch)  # PyTorch's own default (the rank turned it off for exact checks)
    cfg = {
        "steps": int(params["steps"]),
        "warmup": int(params["warmup"]),
        "accum": int(params.get("accum", 1)),
        "amp": params.get("amp", "off"),
        "bucket_cap_mb": float(params.get("bucket_cap_mb", 25.0)),
        "gradient_as_bucket_view": bool(params.get("gradient_as_bucket_view", False)),
        "static_graph": bool(params.get("static_graph", False)),
    }
    counts = sorted({int(k) for k in params["counts"] if 1 <= int(k) <= n})
    # Every rank creates every group, in the same order (torch.distributed requires it).
    cpu_group = dist.new_group(backend="gloo") if ctx.backend != "gloo" else None
    groups = {k: (dist.new_group(ranks=list(range(k))) if k < n else None) for k in counts if k > 1}
    unit = "GPU" if cuda else "rank"
    models = []
    for name in params["models"]:
        sizes = params["sizes"][name]
        runs = []
        params_count = 0
        for k in counts:
            ctx.events.phase(f"scaling {name} on {k} {unit}{'s' if k > 1 else ''}")
            mine = _train(ctx, name, sizes, k, groups.get(k), cfg) if me < k else None
            every = all_gather_json(mine, n, torch.device("cpu"), cpu_group)  # numpy-free, on the CPU group
            done = [e for e in every[:k] if e is not None]
            params_count = done[0]["params"]
            runs.append({"gpus": k, "ranks": [e["row"] for e in done], "grad_allreduce": done[0]["grad_allreduce"]})
        record: dict[str, Any] = {"model": name, "sizes": sizes, "params": params_count, "runs": runs}
        if cuda and n >= 2 and params.get("dataparallel", True):
            ctx.events.phase(f"dataparallel {name} on {n} GPUs")
            mine = _dataparallel(ctx, name, sizes, n, cfg) if me == 0 else None
            torch.cuda.empty_cache()  # DataParallel's replicas and batches are gone with its frame
            every = all_gather_json(mine, n, torch.device("cpu"), cpu_group)  # the others wait here, on the CPU
            record["dataparallel"] = every[0]
        models.append(record)
    ctx.events.phase("scaling")
    return {
        "device": ctx.device.type,
        "backend": ctx.backend,
        "world_size": n,
        "counts": counts,
        "config": cfg,
        "models": models,
    }
