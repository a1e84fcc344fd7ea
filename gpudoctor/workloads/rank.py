"""The program each spawned rank runs: `python -m gpudoctor.workloads.rank SPEC.json RANK`.

It guards itself first (dies with its parent, has its own deadline), reports every step as a
JSON line in `<outdir>/rank<R>.jsonl`, sets its CUDA device before anything touches CUDA, joins
the process group once, runs the requested workloads in that group and shuts the group down.
What it reads (the spec) and reports (the events, through `EventWriter`, also the workloads'
`ctx.events`) is gpudoctor/launch/protocol.py, the definition the parent reads them with.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import socket
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from datetime import timedelta
from importlib import import_module
from pathlib import Path
from typing import Any

from gpudoctor.launch.faults import Faults
from gpudoctor.launch.protocol import RENDEZVOUS_ENV, EventWriter, Peer, RankSpec, Stage, events_path, read_spec
from gpudoctor.workloads import placement
from gpudoctor.workloads.precision import exact_fp32

PR_SET_PDEATHSIG = 1


def _die_with_parent(parent_pid: int) -> None:
    """SIGKILL this rank when gpudoctor dies, even by SIGKILL (Linux), and poll as a fallback."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(1)

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=watch, daemon=True).start()


def _self_deadline(deadline_epoch: float) -> None:
    """A rank never outlives its deadline by more than a few seconds, whatever the parent does."""

    def watch() -> None:
        time.sleep(max(0.0, deadline_epoch + 5.0 - time.time()))
        os._exit(3)

    threading.Thread(target=watch, daemon=True).start()


@dataclass
class RankContext:
    """What a workload function gets: who it is, where it runs, and how to report."""

    rank: int
    world_size: int
    local_rank: int
    device: Any  # torch.device
    backend: str  # "nccl" or "gloo"
    faults: Faults
    events: EventWriter  # the rank's reports to the parent: `ctx.events.phase(name)` names a step
    hostname: str = field(default_factory=socket.gethostname)

    def sync(self) -> None:
        """Wait for this rank's queued device work (a no-op on CPU)."""
        import torch

        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def progress(self, message: str) -> None:
        self.events.progress(message)

    def all_gather_json(self, obj: Any) -> list[Any]:
        """Every rank's `obj` (JSON-able), in rank order: see `all_gather_json`."""
        return all_gather_json(obj, self.world_size, self.device)


def host_bytes(tensor: Any) -> bytes:
    """A tensor's bytes as `tensor.numpy().tobytes()` gives them, without numpy (copied to the host)."""
    import ctypes

    host = tensor.detach().cpu().contiguous()
    return ctypes.string_at(host.data_ptr(), host.numel() * host.element_size())


def all_gather_json(obj: Any, world: int, device: Any = None, group: Any = None) -> list[Any]:
    """`dist.all_gather_object` without numpy and without pickle.

    torch's all_gather_object turns the received bytes back into objects with
    `tensor.numpy()` (torch/distributed/distributed_c10d.py `_tensor_to_object`), so a torch
    installed without numpy fails there with "Numpy is not available"; and it unpickles what
    peers send. This sends JSON as a uint8 tensor: sizes first, then the padded payloads.
    `device`: where the group's collectives run (default: this rank's GPU under NCCL, else CPU);
    `group`: a process group other than the default one (e.g. a gloo group: device CPU).
    """
    import torch
    import torch.distributed as dist

    if device is None:
        nccl = dist.get_backend() == "nccl"
        device = torch.device("cuda", torch.cuda.current_device()) if nccl else torch.device("cpu")

    payload = json.dumps(obj, separators=(",", ":")).encode("utf-8")
    size = torch.tensor([len(payload)], dtype=torch.int64, device=device)
    sizes = [torch.zeros_like(size) for _ in range(world)]
    dist.all_gather(sizes, size, group=group)
    lengths = [int(s.item()) for s in sizes]
    longest = max(1, *lengths)
    mine = torch.zeros(longest, dtype=torch.uint8, device=device)
    if payload:
        mine[: len(payload)] = torch.frombuffer(bytearray(payload), dtype=torch.uint8).to(device)
    gathered = [torch.empty(longest, dtype=torch.uint8, device=device) for _ in range(world)]
    dist.all_gather(gathered, mine, group=group)
    return [json.loads(bytes(t[:n].cpu().tolist()).decode("utf-8")) for t, n in zip(gathered, lengths, strict=True)]


def _device_id_supported(version: str) -> bool:
    """init_process_group(device_id=) exists from 2.3 and hangs in 2.6.0 < torch < 2.7.1 (pytorch#153960)."""
    from gpudoctor.knowledge.versions import version_tuple  # torch-free; the one version parser

    parsed = version_tuple(version) or (0,)
    v = (parsed + (0, 0, 0))[:3]
    return v >= (2, 3, 0) and not ((2, 6, 0) < v < (2, 7, 1))


# Tasks that run in one rank driving every GPU and call no collective: a one-rank run of only these
# makes no process group (an eager NCCL join, init_process_group(device_id=), costs a communicator
# per GPU set-up for nothing; 479 ms on a warm H200, more on a cold VM).
GROUPLESS = frozenset({"link_pcie", "link_p2p"})


def needs_group(task_names: Any, world: int) -> bool:
    """Whether the ranks make a process group: with a peer, or for a task that calls a collective."""
    return world > 1 or any(name not in GROUPLESS for name in task_names)


# Modules a task needs that cost seconds to import: DistributedDataParallel's constructor reads
# torch._dynamo (about 1.6 s of CPU here), so it is imported in a thread while the ranks
# rendezvous and run the all-reduce sweep, whose waits release the GIL.
_PREWARM = {"ddp": "torch._dynamo"}


def _prewarm(task_names: Any) -> threading.Thread:
    modules = [_PREWARM[name] for name in task_names if name in _PREWARM]

    def run() -> None:
        for module in modules:
            try:
                import_module(module)
            except Exception:  # noqa: BLE001  (the task's own import reports the real error)
                pass

    thread = threading.Thread(target=run, name="prewarm-imports", daemon=True)
    thread.start()
    return thread


def _store(spec: RankSpec, world: int, timeout: timedelta) -> Any:
    """The single-node rendezvous: a FileStore in the launcher's private directory.

    A TCPStore, even bound to 127.0.0.1, lets every local user connect and read or write the
    keys (gloo's address exchange among them) for the whole run; the FileStore is a file (0600,
    created by the launcher: launch.private_store) in a 0700 directory that only this user can
    enter. The store's own timeout is set here (init_process_group sets it only for the stores
    it makes itself), so a missing peer ends the wait as the launcher's deadlines expect.
    Under torchrun/srun the launcher's env:// rendezvous is used instead.
    """
    path = Path(spec["rendezvous"]["path"])
    home = path.parent.stat()
    if home.st_uid != os.geteuid() or home.st_mode & 0o077:
        raise PermissionError(f"{path.parent} is not a private directory: the rendezvous store must not be shared")
    import torch.distributed as dist

    store = dist.FileStore(str(path), world)
    store.set_timeout(timeout)
    return store


def main(argv: list[str]) -> int:
    spec = read_spec(argv[0])
    _die_with_parent(int(spec["parent_pid"]))
    _self_deadline(float(spec["deadline_epoch"]))
    rdzv = spec["rendezvous"]
    env_mode = rdzv["mode"] == RENDEZVOUS_ENV
    # Under torchrun/srun the launcher read (and checked) RANK, LOCAL_RANK and GROUP_RANK for us.
    rank = int(argv[1])
    world = int(spec["world_size"])
    local_rank = int(rdzv["local_rank"]) if env_mode else rank
    node_rank = int(rdzv.get("node_rank", 0))
    events = EventWriter(events_path(spec["outdir"], rank))
    events.started(
        pid=os.getpid(),
        rank=rank,
        world_size=world,
        local_rank=local_rank,
        host=socket.gethostname(),
        node_rank=node_rank,
    )
    faults = Faults(rank)
    phase: str = Stage.START
    try:
        faults.at("start")
        phase = Stage.IMPORT
        events.importing(phase)
        faults.at("import")
        t0 = time.perf_counter()
        import torch
        import torch.distributed as dist

        if spec["device"] == "cuda":
            phase = Stage.CUDA_INIT
            events.importing(phase)
            # Before anything else touches CUDA, so exclusive-process GPUs and the right device work.
            torch.cuda.set_device(local_rank)
            device = torch.device("cuda", local_rank)
            exact_fp32(torch)
        else:
            device = torch.device("cpu")
        events.imported(import_s=time.perf_counter() - t0, torch=torch.__version__)
        warm = _prewarm(task["name"] for task in spec["tasks"])

        phase = Stage.JOIN
        t0 = time.perf_counter()
        grouped = needs_group([task["name"] for task in spec["tasks"]], world)
        timeout = timedelta(seconds=float(spec["op_timeout_s"]))
        kwargs: dict[str, Any] = {"backend": spec["backend"], "timeout": timeout}
        if spec["device"] == "cuda" and _device_id_supported(torch.__version__):
            kwargs["device_id"] = device
        if not grouped:
            pass  # alone, and no task calls a collective: ready as it is
        elif env_mode:
            dist.init_process_group(init_method="env://", **kwargs)
        else:
            store = _store(spec, world, timeout)
            dist.init_process_group(store=store, rank=rank, world_size=world, **kwargs)
        events.joined(join_s=time.perf_counter() - t0)

        phase = Stage.PEERS
        me: Peer = {
            "rank": rank,
            "local_rank": local_rank,
            "host": socket.gethostname(),
            "node_rank": node_rank,
            "device": str(device),
        }
        peers = all_gather_json(me, world, device) if grouped else [me]
        events.peers(peers)
        faults.at("joined")  # after the first collective, so the peers are left waiting in the next

        ctx = RankContext(rank, world, local_rank, device, spec["backend"], faults, events)
        with placement.guarded(device, spec["backend"]):  # NCCL's tensors on the GPU, refused before NCCL sees them
            for task in spec["tasks"]:
                phase = task["name"]
                events.phase(phase)
                if phase in _PREWARM:
                    warm.join()  # the import must be complete before the task imports the same modules
                from gpudoctor.workloads import WORKLOADS

                module, func = WORKLOADS[phase].split(":")
                t0 = time.perf_counter()
                result = getattr(import_module(module), func)(ctx, task.get("params", {}))
                events.result(phase, result, time.perf_counter() - t0)

        phase = Stage.SHUTDOWN
        t0 = time.perf_counter()
        done = all_gather_json(rank, world, device) if grouped else [rank]  # every rank reached the end
        if grouped:
            dist.destroy_process_group()
        events.done(shutdown_s=time.perf_counter() - t0, finished_ranks=done)
        return 0
    except BaseException as exc:  # noqa: BLE001  (any failure is reported, then the rank exits)
        text = f"{type(exc).__name__}: {exc}"
        events.error(phase=phase, message=text.strip()[:4000], traceback=traceback.format_exc()[-4000:])
        return 1


if __name__ == "__main__":
    code = main(sys.argv[1:])
    sys.stdout.flush()
    sys.stderr.flush()
    # os._exit: skip interpreter teardown, where a broken NCCL/gloo group can block for minutes.
    os._exit(code)
