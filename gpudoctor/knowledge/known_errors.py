"""Known failure texts of CUDA, NCCL, c10d and torch, turned into a kind with its words and fix (torch-free).

One classifier for gpudoctor's own ranks (`check`'s workloads: `classify`) and for the ranks of a job
`watch` follows (`identify`, which adds what the text says: the size that did not fit, the port in use,
how many clients joined). The first kind whose pattern matches wins, so specific causes come before the
generic "timeout". Each pattern matches the stable core of the message (tracebacks carry `[rankN]:`
prefixes; wording drifts between torch versions) and says where torch (or NCCL, or CUDA) prints it; the
texts were reproduced or found as listed in tests/fixtures/runtime_errors/README.md.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Kind:
    kind: str
    pattern: re.Pattern[str]
    title: str  # what happened, in a few words
    fix: str
    victim: bool = False  # raised by a rank that another rank's failure left waiting or cut off


def _re(text: str) -> re.Pattern[str]:
    return re.compile(text, re.I)


KINDS: list[Kind] = [
    Kind(
        "port_in_use",
        # c10d socket.cpp: "The server socket has failed to listen on any local network address. port: N,
        # useIpv6: false, code: -98, name: EADDRINUSE, message: address already in use" (libuv store,
        # torch 2.x); older: "... failed to bind to [::]:N (errno: 98 - Address already in use)".
        _re(r"address already in use|errno: 98|EADDRINUSE"),
        "the rendezvous port is already in use",
        "Another job (or a leftover rank of this one) holds MASTER_PORT: pick a free port "
        "(`--master-port`, `--rdzv-endpoint host:PORT`, or `--standalone` for one node), or stop the "
        "process that holds it (`ss -ltnp | grep PORT`).",
    ),
    Kind(
        "fabric_manager",
        _re(r"error \(?802\)?|system not yet initialized|cudaErrorSystemNotReady"),  # CUDA runtime error 802
        "the NVSwitch fabric is not ready (Fabric Manager)",
        "Start nvidia-fabricmanager (its version must match the driver's) and wait for it before training.",
    ),
    Kind(
        "devices_busy",
        _re(r"all CUDA-capable devices are busy or unavailable"),  # CUDA runtime: cudaErrorDevicesUnavailable
        "the GPUs are in exclusive mode and taken",
        "Another process holds the GPU in EXCLUSIVE_PROCESS compute mode: wait for it or pick another GPU.",
    ),
    Kind(
        "shm",
        # NCCL shm transport (posix_fallocate / shm segment creation) and torch's shared-memory DataLoader.
        _re(
            r"posix_fallocate failed|Error while creating shared memory segment|/dev/shm.*No space left|"
            r"No space left on device.*shm|unable to (?:allocate|create) shared memory"
        ),
        "shared memory (/dev/shm) is too small",
        "Give the container more shared memory (`docker run --shm-size=16g`, or `--ipc=host`).",
    ),
    Kind(
        "oom",
        # c10/cuda/CUDACachingAllocator.cpp: "CUDA out of memory. Tried to allocate 22.00 MiB. GPU 0 has a
        # total capacity of ..."; raised as torch.OutOfMemoryError (torch.cuda.OutOfMemoryError).
        _re(r"CUDA out of memory|OutOfMemoryError"),
        "CUDA out of memory",
        "Lower the per-rank batch size, use activation checkpointing, mixed precision or a sharded "
        "optimizer (FSDP/ZeRO); if only one GPU runs out, look for extra CUDA contexts or tensors on it "
        "(a missing torch.cuda.set_device(local_rank), torch.load without map_location). "
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True helps against fragmentation.",
    ),
    Kind(
        "unused_parameters",
        # torch/csrc/distributed/c10d/reducer.cpp: "Expected to have finished reduction in the prior
        # iteration before starting a new one. ... Parameter indices which did not receive grad for rank N";
        # with static_graph: "... marked as ready twice".
        _re(
            r"Expected to have finished reduction in the prior iteration|"
            r"did not receive grad for rank|has been marked as ready twice"
        ),
        "DDP found parameters that did not take part in the loss",
        "Make every parameter take part in the loss on every step, or pass "
        "`DistributedDataParallel(..., find_unused_parameters=True)` (slower); parameters used only on some "
        "steps need find_unused_parameters, and a model whose graph changes must not set static_graph=True. "
        "TORCH_DISTRIBUTED_DEBUG=DETAIL names the parameters.",
    ),
    Kind(
        "invalid_device",
        # CUDA runtime cudaErrorInvalidDevice, raised by torch as "CUDA error: invalid device ordinal"
        # (torch.AcceleratorError in torch >= 2.8, RuntimeError before).
        _re(r"invalid device ordinal"),
        "a rank asked for a GPU that does not exist",
        "Use the LOCAL rank as the device index (`torch.cuda.set_device(int(os.environ['LOCAL_RANK']))`), "
        "not the global rank, and start no more ranks per node than it has GPUs (`--nproc-per-node`, "
        "CUDA_VISIBLE_DEVICES).",
    ),
    Kind(
        "duplicate_gpu",
        # NCCL init.cc: "Duplicate GPU detected : rank 3 and rank 0 both on CUDA device f000", under
        # torch's "NCCL error in: ... invalid usage".
        _re(r"Duplicate GPU detected"),
        "two ranks use the same GPU",
        "Give each rank its own GPU: `torch.cuda.set_device(local_rank)` before any CUDA work and "
        "`device_ids=[local_rank]` for DDP; an mp.spawn script must not be launched by torchrun.",
    ),
    Kind(
        "peer_lost",
        # gloo pair.cc: "Connection closed by peer [ADDR]:PORT. This is typically caused by a remote worker
        # crashing"; NCCL: ncclRemoteError "A call failed possibly due to a network error or a remote
        # process exiting prematurely".
        _re(
            r"Connection reset by peer|Connection closed by peer|remote process exited|"
            r"Broken pipe|remote worker|ncclRemoteError"
        ),
        "another rank went away (this rank lost its peer)",
        "This rank is a victim: look for the rank that failed or finished first (its own error, or uneven "
        "numbers of batches across ranks).",
        victim=True,
    ),
    Kind(
        "nccl_error",
        # torch/csrc/distributed/c10d/NCCLUtils.cpp: "NCCL error in: FILE:LINE, <reason>, NCCL version X"
        # with ncclSystemError / ncclInternalError / ncclUnhandledCudaError / ncclInvalidArgument /
        # ncclInvalidUsage and NCCL's "Last error:" line.
        _re(
            r"NCCL error in:|ncclSystemError|ncclInternalError|ncclUnhandledCudaError|"
            r"ncclInvalidArgument|ncclInvalidUsage|unhandled system error"
        ),
        "NCCL failed",
        "Rerun with NCCL_DEBUG=WARN (or INFO) to see NCCL's own reason; an 'unhandled system error' is "
        "usually the network interface (NCCL_SOCKET_IFNAME), InfiniBand or /dev/shm; `gpudoctor check` "
        "tests the machine.",
    ),
    Kind(
        "sampler_shuffle",
        _re(r"sampler option is mutually exclusive with shuffle"),  # torch/utils/data/dataloader.py
        "the DataLoader got both a sampler and shuffle=True",
        "Pass `shuffle=False` to the DataLoader when it has a DistributedSampler (shuffle in the sampler, "
        "and call `sampler.set_epoch(epoch)` each epoch).",
    ),
    Kind(
        "no_process_group",
        # torch/distributed/distributed_c10d.py: "Default process group has not been initialized, please
        # make sure to call init_process_group."
        _re(r"Default process group has not been initialized"),
        "torch.distributed was used before init_process_group",
        "Call `dist.init_process_group(...)` in each rank before building a DistributedSampler or DDP (with "
        "mp.spawn: inside the spawned function, not in the parent).",
    ),
    Kind(
        "killed",
        # torch/distributed/elastic/multiprocessing/errors: "Signal 9 (SIGKILL) received by PID N",
        # "exitcode  : -9"; torch/multiprocessing/spawn.py: "process N terminated with signal SIGKILL".
        _re(r"Signal 9 \(SIGKILL\)|exitcode\s*:\s*-9\b|terminated with signal SIGKILL"),
        "the rank was killed (SIGKILL): usually the host's out-of-memory killer",
        "Look at `dmesg` / the cgroup's memory events for an OOM kill; lower host memory use (DataLoader "
        "workers x ranks, pinned memory, a dataset loaded whole in every rank) or raise the job's memory limit.",
    ),
    Kind(
        "timeout",
        # c10d: the NCCL watchdog ("Watchdog caught collective operation timeout"), gloo ("Timed out waiting
        # Nms for recv operation to complete"), the store ("The client socket has timed out after Nms while
        # trying to connect to (HOST, PORT)", TCPStore "Timed out after N seconds waiting for clients. K/N
        # clients joined."), torchrun's RendezvousTimeoutError.
        _re(r"timed out|timeout|Socket Timeout|DistStoreError: .*wait"),
        "a rank timed out waiting for the others",
        "This rank waited for others that never came: look for the rank that failed or hung first; a "
        "world size larger than the ranks started, a wrong MASTER_ADDR/MASTER_PORT, or a node that never "
        "joined leaves the others waiting.",
        victim=True,
    ),
    Kind(
        "cpp_abort",
        # Last, so that a specific cause printed with it wins (an NCCL watchdog's abort is "terminate called
        # after throwing ... Watchdog caught collective operation timeout": a timeout). libstdc++'s
        # std::terminate handler with no exception in flight: a joinable std::thread destroyed, or a thread
        # unwound through a destructor that may not throw. With torch, mostly the exit-time abort of
        # https://github.com/pytorch/pytorch/pull/179291 (a script that ends without destroy_process_group():
        # gloo's threads free a collective's tensor while Python shuts down); with DDP on gloo the group
        # outlives destroy_process_group() too (reproduced: tests/fixtures/runtime_errors/gloo_exit_abort.*).
        _re(r"terminate called without an active exception"),
        "the process aborted in C++ (std::terminate)",
        "If the rank had finished its work, this is torch's exit-time abort: gloo's threads still held a "
        "collective's tensor as Python shut down. Call dist.destroy_process_group() before the script ends and "
        "wait for every async collective (work.wait()). With DistributedDataParallel on gloo the threads "
        "outlive destroy_process_group(): if it persists, end the script with os._exit(0) after the last save "
        "(exit handlers do not run then: flush logs first; under `gpudoctor watch` the last steps since the "
        "previous report are not counted). If it came mid-run, get the C++ stack: "
        "`gdb -batch -ex run -ex bt --args python script.py`.",
    ),
]
BY_KIND = {k.kind: k for k in KINDS}
VICTIMS = frozenset(k.kind for k in KINDS if k.victim)

# What the message says, where it says it (the first group of each).
_DETAILS: dict[str, list[tuple[str, re.Pattern[str]]]] = {
    "oom": [("tried to allocate {}", _re(r"Tried to allocate ([\d.]+ ?[KMGT]?i?B)")), ("on GPU {}", _re(r"GPU (\d+)"))],
    "port_in_use": [("port {}", _re(r"port: (\d+)|:(\d+) \(errno: 98"))],
    "unused_parameters": [
        ("parameter indices {}", _re(r"did not receive grad for rank \d+: ([\d ]+)")),
    ],
    "duplicate_gpu": [("{}", _re(r"Duplicate GPU detected : (rank \d+ and rank \d+ both on CUDA device \w+)"))],
    "timeout": [
        ("{} clients joined", _re(r"(\d+/\d+) clients joined")),
        ("could not reach the store at {}", _re(r"trying to connect to \(([^)]+)\)")),
        ("a collective timed out ({})", _re(r"Watchdog caught collective operation timeout: (WorkNCCL\([^)]*\))")),
    ],
}


@dataclass(frozen=True)
class KnownError:
    kind: str
    title: str
    fix: str
    victim: bool
    line: str  # the line of the text that matched, trimmed
    detail: str = ""  # what the message adds: "tried to allocate 20.00 GiB, on GPU 0"

    @property
    def summary(self) -> str:
        return self.title + (f" ({self.detail})" if self.detail else "")


def identify(text: str) -> KnownError | None:
    """The known failure in `text` (an exception message, a traceback or a log), with its details."""
    for k in KINDS:
        m = k.pattern.search(text)
        if m is None:
            continue
        start = text.rfind("\n", 0, m.start()) + 1
        end = text.find("\n", m.end())
        line = text[start : end if end >= 0 else len(text)].strip()
        details = []
        for template, pattern in _DETAILS.get(k.kind, []):
            found = pattern.search(text)
            if found is not None:
                value = next((g for g in found.groups() if g), "")
                details.append(template.format(value.strip()))
        return KnownError(
            k.kind, k.title, k.fix, k.victim, re.sub(r"^\[rank\d+\]:\s*", "", line)[:300], ", ".join(details)
        )
    return None


def classify(text: str) -> str | None:
    """The kind of a known failure found in `text` (an exception message or a log), or None."""
    found = identify(text)
    return None if found is None else found.kind
