"""The environment variables a snapshot may hold: an allow-list BY NAME, never the whole environment.

Snapshots are attached to tickets, so a variable is kept only when it is named below: prefixes
would let `NCCL_PASSWORD`, `TORCH_SECRET_KEY` or a site's own `CUDA_TOKEN` through. The list is
every variable a check reads (tests/probe/test_host.py scans the checks for them) and the
documented variables of the stack that change how a multi-GPU run behaves:

- NCCL: the section titles of NCCL's user guide, docs/userguide/source/env.rst (NVIDIA/nccl
  master, 2026-06), plus the renamed/removed names it still mentions (NCCL_IB_GDR_LEVEL,
  NCCL_MIN_NRINGS, NCCL_MAX_NRINGS) and NCCL_COMM_ID. Left out on purpose: NCCL_SOCKET_MAGIC,
  the value NCCL's socket handshake checks (a shared secret in all but name).
- PyTorch: the ProcessGroupNCCL table of https://pytorch.org/docs/stable/torch_nccl_environment_variables.html,
  their pre-2.2 NCCL_* spellings, the distributed debug switches, torchrun/torchelastic's
  rendezvous variables and the CUDA allocator's.
- CUDA: the runtime's device selection and debugging variables, and DCGM's list of
  debugger/profiler variables that slow or break a run (DCGM_DEBUG_VARS, which the lint reads).
- Launchers: torchrun's and Slurm's job geometry.

A value is kept when it fits its variable's grammar (`GRAMMARS`), else it is replaced by
`[redacted]`: MASTER_ADDR a host, NCCL_COMM_ID a host:port, NCCL_IB_HCA NCCL's device list
(knowledge/nccl_list.py; an item that is not `name[:port...]` goes, so `token=x` does),
NCCL_SOCKET_IFNAME interface names, the *_FILE and plugin variables paths of ordinary words,
CUDA_VISIBLE_DEVICES indices and UUIDs, and every other variable a setting: numbers and
ordinary words (`INFO`, `^LL128`, `allreduce:tree;broadcast:ring`, `expandable_segments:True`,
`8(x2)`). The same grammars show these variables in other processes' command lines
(`env NCCL_IB_HCA=... python`: `shown_value` is redact.argv's `known_value`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping

from gpudoctor.knowledge.debug_vars import DCGM_DEBUG_VARS
from gpudoctor.knowledge.nccl_list import split_nccl_list
from gpudoctor.safety.redact import MARKER, host, host_port, ordinary

NCCL_DOCUMENTED = frozenset(
    {
        "NCCL_ALGO",
        "NCCL_ALLOC_P2P_NET_LL_BUFFERS",
        "NCCL_BUFFSIZE",
        "NCCL_CGA_CLUSTER_SIZE",
        "NCCL_CHECKS_DISABLE",
        "NCCL_CHECK_MODE",
        "NCCL_CHECK_POINTERS",
        "NCCL_COLLNET_ENABLE",
        "NCCL_COLLNET_NODE_THRESHOLD",
        "NCCL_COMM_BLOCKING",
        "NCCL_COMM_ID",
        "NCCL_CONF_FILE",
        "NCCL_CROSS_NIC",
        "NCCL_CTA_POLICY",
        "NCCL_CUMEM_ENABLE",
        "NCCL_CUMEM_HOST_ENABLE",
        "NCCL_DEBUG",
        "NCCL_DEBUG_FILE",
        "NCCL_DEBUG_SUBSYS",
        "NCCL_DEBUG_TIMESTAMP_FORMAT",
        "NCCL_DEBUG_TIMESTAMP_LEVELS",
        "NCCL_DMABUF_ENABLE",
        "NCCL_ENV_PLUGIN",
        "NCCL_GRAPH_MIXING_SUPPORT",
        "NCCL_GRAPH_REGISTER",
        "NCCL_GRAPH_STREAM_ORDERING",
        "NCCL_IB_ADAPTIVE_ROUTING",
        "NCCL_IB_ADDR_FAMILY",
        "NCCL_IB_ADDR_RANGE",
        "NCCL_IB_AR_THRESHOLD",
        "NCCL_IB_CUDA_SUPPORT",
        "NCCL_IB_DISABLE",
        "NCCL_IB_ECE_ENABLE",
        "NCCL_IB_FIFO_TC",
        "NCCL_IB_GDR_LEVEL",
        "NCCL_IB_GID_INDEX",
        "NCCL_IB_HCA",
        "NCCL_IB_MERGE_NICS",
        "NCCL_IB_OOO_RQ",
        "NCCL_IB_PCI_RELAXED_ORDERING",
        "NCCL_IB_QPS_PER_CONNECTION",
        "NCCL_IB_RETRY_CNT",
        "NCCL_IB_RETURN_ASYNC_EVENTS",
        "NCCL_IB_ROCE_VERSION_NUM",
        "NCCL_IB_SL",
        "NCCL_IB_SPLIT_DATA_ON_QPS",
        "NCCL_IB_TC",
        "NCCL_IB_TIMEOUT",
        "NCCL_IGNORE_COLLNET_MISMATCH",
        "NCCL_IGNORE_CPU_AFFINITY",
        "NCCL_IGNORE_NET_MISMATCH",
        "NCCL_IPC_USE_ABSTRACT_SOCKET",
        "NCCL_LAUNCH_MODE",
        "NCCL_LAUNCH_ORDER_IMPLICIT",
        "NCCL_LAUNCH_RACE_FATAL",
        "NCCL_LEGACY_CUDA_REGISTER",
        "NCCL_LL_THRESHOLD",
        "NCCL_LOCAL_REGISTER",
        "NCCL_MAX_CTAS",
        "NCCL_MAX_NCHANNELS",
        "NCCL_MAX_NRINGS",
        "NCCL_MEM_SYNC_DOMAIN",
        "NCCL_MIN_CTAS",
        "NCCL_MIN_NCHANNELS",
        "NCCL_MIN_NRINGS",
        "NCCL_MNNVL_CLIQUE_ID",
        "NCCL_MNNVL_ENABLE",
        "NCCL_MNNVL_UUID",
        "NCCL_MULTI_RANK_GPU_ENABLE",
        "NCCL_NET",
        "NCCL_NETDEVS_POLICY",
        "NCCL_NET_GDR_C2C",
        "NCCL_NET_GDR_LEVEL",
        "NCCL_NET_GDR_READ",
        "NCCL_NET_MERGE_LEVEL",
        "NCCL_NET_MERGE_POLICY",
        "NCCL_NET_PLUGIN",
        "NCCL_NET_SHARED_BUFFERS",
        "NCCL_NET_SHARED_COMMS",
        "NCCL_NSOCKS_PERTHREAD",
        "NCCL_NTHREADS",
        "NCCL_NVB_DISABLE",
        "NCCL_NVLS_ENABLE",
        "NCCL_OOB_NET_ENABLE",
        "NCCL_OOB_NET_IFNAME",
        "NCCL_P2P_DIRECT_DISABLE",
        "NCCL_P2P_DISABLE",
        "NCCL_P2P_LEVEL",
        "NCCL_P2P_LL_THRESHOLD",
        "NCCL_P2P_NET_CHUNKSIZE",
        "NCCL_P2P_PXN_LEVEL",
        "NCCL_PROFILER_PLUGIN",
        "NCCL_PROTO",
        "NCCL_PXN_C2C",
        "NCCL_PXN_DISABLE",
        "NCCL_RAS_ADDR",
        "NCCL_RAS_ENABLE",
        "NCCL_RAS_TIMEOUT_FACTOR",
        "NCCL_RUNTIME_CONNECT",
        "NCCL_SET_STACK_SIZE",
        "NCCL_SET_THREAD_NAME",
        "NCCL_SHM_DISABLE",
        "NCCL_SINGLE_RING_THRESHOLD",
        "NCCL_SOCKET_FAMILY",
        "NCCL_SOCKET_IFNAME",
        "NCCL_SOCKET_NTHREADS",
        "NCCL_SOCKET_POLL_TIMEOUT_MSEC",
        "NCCL_SOCKET_RETRY_CNT",
        "NCCL_SOCKET_RETRY_SLEEP_MSEC",
        "NCCL_SYM_GIN_KERNELS_ENABLE",
        "NCCL_TOPO_DUMP_FILE",
        "NCCL_TOPO_FILE",
        "NCCL_TREE_THRESHOLD",
        "NCCL_TUNER_PLUGIN",
        "NCCL_UID_STAGGER_RATE",
        "NCCL_UID_STAGGER_THRESHOLD",
        "NCCL_WIN_ENABLE",
        # torch < 2.2 spellings of TORCH_NCCL_BLOCKING_WAIT / TORCH_NCCL_ASYNC_ERROR_HANDLING
        "NCCL_BLOCKING_WAIT",
        "NCCL_ASYNC_ERROR_HANDLING",
        "NCCL_DESYNC_DEBUG",
    }
)

TORCH_DOCUMENTED = frozenset(
    {
        # ProcessGroupNCCL (torch_nccl_environment_variables)
        "TORCH_NCCL_ASYNC_ERROR_HANDLING",
        "TORCH_NCCL_HIGH_PRIORITY",
        "TORCH_NCCL_BLOCKING_WAIT",
        "TORCH_NCCL_DUMP_ON_TIMEOUT",
        "TORCH_NCCL_DESYNC_DEBUG",
        "TORCH_NCCL_ENABLE_TIMING",
        "TORCH_NCCL_ENABLE_MONITORING",
        "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC",
        "TORCH_NCCL_TRACE_BUFFER_SIZE",
        "TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC",
        "TORCH_NCCL_DEBUG_INFO_TEMP_FILE",
        "TORCH_NCCL_DEBUG_INFO_PIPE_FILE",
        "TORCH_NCCL_NAN_CHECK",
        "TORCH_NCCL_AVOID_RECORD_STREAMS",
        "TORCH_NCCL_COORD_CHECK_MILSEC",
        "TORCH_NCCL_ABORT_IN_DESTROY_PG",
        "TORCH_NCCL_USE_TENSOR_REGISTER_ALLOCATOR_HOOK",
        "TORCH_NCCL_USE_COMM_NONBLOCKING",
        "TORCH_NCCL_CUDA_EVENT_CACHE",
        "TORCH_NCCL_PROPAGATE_ERROR",
        "TORCH_NCCL_RETHROW_CUDA_ERRORS",
        "TORCH_NCCL_LOG_CPP_STACK_ON_UNCLEAN_SHUTDOWN",
        # distributed debugging and logging
        "TORCH_DISTRIBUTED_DEBUG",
        "TORCH_CPP_LOG_LEVEL",
        "TORCH_SHOW_CPP_STACKTRACES",
        "TORCH_LOGS",
        "TORCH_GLOO_LAZY_INIT",
        "TORCH_USE_CUDA_DSA",
        # the CUDA caching allocator and device checks
        "PYTORCH_CUDA_ALLOC_CONF",
        "PYTORCH_ALLOC_CONF",
        "PYTORCH_NO_CUDA_MEMORY_CACHING",
        "PYTORCH_NVML_BASED_CUDA_CHECK",
        # gloo's and tensorpipe's interface choice
        "GLOO_SOCKET_IFNAME",
        "GLOO_DEVICE_TRANSPORT",
        "TP_SOCKET_IFNAME",
    }
)


CUDA_DOCUMENTED = frozenset(
    {
        "CUDA_VISIBLE_DEVICES",
        "CUDA_DEVICE_ORDER",
        "CUDA_LAUNCH_BLOCKING",
        "CUDA_DEVICE_MAX_CONNECTIONS",
        "CUDA_MODULE_LOADING",
        "CUDA_CACHE_DISABLE",
        "CUDA_FORCE_PTX_JIT",
        "CUDA_DISABLE_PTX_JIT",
        "CUDA_MPS_PIPE_DIRECTORY",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
        "NVIDIA_VISIBLE_DEVICES",
        "NVIDIA_DRIVER_CAPABILITIES",
        *DCGM_DEBUG_VARS,
    }
)

LAUNCHER_DOCUMENTED = frozenset(
    {
        # torchrun / torchelastic
        "MASTER_ADDR",
        "MASTER_PORT",
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "LOCAL_WORLD_SIZE",
        "GROUP_RANK",
        "GROUP_WORLD_SIZE",
        "ROLE_RANK",
        "ROLE_NAME",
        "ROLE_WORLD_SIZE",
        "TORCHELASTIC_RESTART_COUNT",
        "TORCHELASTIC_MAX_RESTARTS",
        "NNODES",
        "OMP_NUM_THREADS",
        # Slurm job geometry: how many tasks and GPUs, and where this task sits.
        "SLURM_NTASKS",
        "SLURM_NTASKS_PER_NODE",
        "SLURM_NNODES",
        "SLURM_JOB_NUM_NODES",
        "SLURM_NODEID",
        "SLURM_PROCID",
        "SLURM_LOCALID",
        "SLURM_GPUS",
        "SLURM_GPUS_ON_NODE",
        "SLURM_GPUS_PER_NODE",
        "SLURM_GPUS_PER_TASK",
        "SLURM_JOB_GPUS",
        "SLURM_STEP_GPUS",
        "SLURM_CPUS_PER_TASK",
        "SLURM_JOB_ID",
    }
)

ALLOWED_NAMES = NCCL_DOCUMENTED | TORCH_DOCUMENTED | CUDA_DOCUMENTED | LAUNCHER_DOCUMENTED


def allowed(name: str) -> bool:
    return name in ALLOWED_NAMES


MAX_VALUE = 1024  # a longer value is no setting


def _words_of(chars: str, split: str) -> Callable[[str], bool]:
    """Values made of `chars` whose words (cut at `split`) are numbers or ordinary words."""
    allowed_chars, cut = re.compile(f"[{chars}]*"), re.compile(f"[{split}]+")
    return lambda v: bool(allowed_chars.fullmatch(v)) and all(ordinary(w) for w in cut.split(v) if w)


_setting = _words_of(r"A-Za-z0-9_.,;:^=+%()\[\]>\- ", r",;:^=+%()\[\]> ")
_path = _words_of(r"A-Za-z0-9_./%+~\-", r"/%")  # `/tmp/nccl.%h.%p.log`, `libnccl-net.so`
_format = _words_of(r"A-Za-z0-9%\[\]:._/\- ", r"%\[\]:./ ")  # NCCL_DEBUG_TIMESTAMP_FORMAT (strftime)
_IFNAME = re.compile(r"[A-Za-z0-9_.@\-]{1,15}")  # Linux: IFNAMSIZ is 16 with the NUL
_HCA = re.compile(r"[A-Za-z0-9_.\-]{1,64}(?::\d{1,5}){0,3}")  # name[:port[:rail[:plane]]]
_DEVICE = re.compile(r"-?\d{1,4}|(?:GPU-|MIG-(?:GPU-)?)[0-9A-Fa-f/\-]{1,64}|all|none|void|NoDevFiles")
_HEX_ID = re.compile(r"(?:0x)?[0-9A-Fa-f\-]{1,64}")
_CIDR = re.compile(r"[0-9A-Fa-f:.]{2,39}/\d{1,3}")


def _nccl_items(item: re.Pattern[str]) -> Callable[[str], str]:
    """A NCCL list (`^=mlx5_0:1,mlx5_1`): its flags and every item that fits `item`, the others replaced."""

    def shown(value: str) -> str:
        flags, items = split_nccl_list(value)
        kept = [i if not i or item.fullmatch(i) else MARKER for i in items]
        return flags + ",".join(k for n, k in enumerate(kept) if not (k == MARKER and n and kept[n - 1] == MARKER))

    return shown


def _whole(fits: Callable[[str], bool]) -> Callable[[str], str]:
    return lambda value: value if fits(value) else MARKER


_PATHS = (
    "NCCL_DEBUG_FILE NCCL_TOPO_FILE NCCL_TOPO_DUMP_FILE NCCL_CONF_FILE NCCL_NET_PLUGIN NCCL_TUNER_PLUGIN "
    "NCCL_PROFILER_PLUGIN NCCL_ENV_PLUGIN TORCH_NCCL_DEBUG_INFO_TEMP_FILE TORCH_NCCL_DEBUG_INFO_PIPE_FILE "
    "CUDA_MPS_PIPE_DIRECTORY CUDA_INJECTION32_PATH CUDA_INJECTION64_PATH CUDA_COREDUMP_FILE"
).split()
_IFNAMES = ("NCCL_SOCKET_IFNAME", "NCCL_OOB_NET_IFNAME", "GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME")
# Each kept variable's grammar: how its value is shown. Every name not listed is a setting.
GRAMMARS: dict[str, Callable[[str], str]] = {
    "MASTER_ADDR": _whole(host),
    "NCCL_COMM_ID": _whole(host_port),
    "NCCL_RAS_ADDR": _whole(host_port),
    "NCCL_IB_HCA": _nccl_items(_HCA),
    **dict.fromkeys(_IFNAMES, _nccl_items(_IFNAME)),
    **dict.fromkeys(_PATHS, _whole(_path)),
    **dict.fromkeys(("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES"), _nccl_items(_DEVICE)),
    **dict.fromkeys(("NCCL_MNNVL_UUID", "NCCL_MNNVL_CLIQUE_ID"), _whole(lambda v: bool(_HEX_ID.fullmatch(v)))),
    "NCCL_IB_ADDR_RANGE": _whole(lambda v: bool(_CIDR.fullmatch(v))),
    "NCCL_DEBUG_TIMESTAMP_FORMAT": _whole(_format),
}
_SETTING = _whole(_setting)


def shown_value(name: str, value: str) -> str | None:
    """A kept variable's value as gpudoctor shows it (its grammar's), None for a name not kept."""
    if not allowed(name):
        return None
    return GRAMMARS.get(name, _SETTING)(value) if len(value) <= MAX_VALUE else MARKER


def allowed_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The allow-listed variables of `environ`, each value as its grammar shows it."""
    return {name: str(shown_value(name, str(value))) for name, value in sorted(environ.items()) if allowed(name)}
