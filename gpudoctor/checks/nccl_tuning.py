"""GD627-635: NCCL and torch variables that slow or break jobs without switching a transport off.

GPUDirect RDMA, cross-rail NICs, channel counts, buffer size, cuMem, debug output, CPU affinity
(NCCL's user guide, env.rst, and source where the guide is silent), and torch's ProcessGroupNCCL
switches (torch/csrc/distributed/c10d: getCvarBool/getCvarInt read TORCH_* first, the deprecated
NCCL_* name second with a "deprecated" warning; booleans y/yes/1/t/true and n/no/0/f/false, case
insensitive; anything else makes the process group raise "Invalid value for environment variable").
Each finding prices the variable on this machine where the machine decides the cost.
"""

from __future__ import annotations

from typing import Any

from gpudoctor.checks.nccl_env import pair_paths
from gpudoctor.engine import CheckContext, Code, check
from gpudoctor.findings import Finding, Status
from gpudoctor.knowledge import nccl_rules
from gpudoctor.knowledge.nccl_rules import nccl_int
from gpudoctor.snapshot import Snapshot, known

NET_GDR = Code(
    "GD627",
    "nccl-net-gdr",
    "GPUDirect RDMA between NICs and GPUs is not switched off",
    what="Reads NCCL_NET_GDR_LEVEL (the farthest GPU-NIC path GPUDirect RDMA is used over: LOC never, PIX, "
    "PXB, PHB, SYS always, or the legacy 0-4) and NCCL_NET_GDR_READ on hosts with InfiniBand/RoCE NICs. "
    "LOC, or NCCL_NET_GDR_READ=0 on an NVLink machine (where NCCL's default is 1, env.rst), warns. "
    "NCCL_IB_GDR_LEVEL, the name before NCCL 2.4, is no longer read at all.",
    why="Without GPUDirect RDMA every inter-node message is copied through host memory on both sides: "
    "multi-node all-reduce loses a large share of its bandwidth and costs CPU time.",
    fix="Unset NCCL_NET_GDR_LEVEL / NCCL_NET_GDR_READ; if GPUDirect RDMA fails, load nvidia-peermem and fix "
    "ACS on the PCIe switches rather than turning it off. Rename NCCL_IB_GDR_LEVEL to NCCL_NET_GDR_LEVEL.",
)
CROSS_NIC = Code(
    "GD628",
    "nccl-cross-nic",
    "NCCL_CROSS_NIC suits the fabric",
    what="Reads NCCL_CROSS_NIC on hosts with more than one InfiniBand/RoCE NIC: 1 lets a ring or tree "
    "leave one node on one NIC and enter the next on another, which the user guide says suits only "
    "fabrics where all NICs of a node share one switch; 0 and the default 2 keep rails apart. A value "
    "other than 0, 1, 2 warns.",
    why="On the rail-optimised fabrics most GPU clusters use (one switch per NIC rank), crossing rails "
    "sends traffic over the slow inter-rail links and collides flows: inter-node bandwidth drops.",
    fix="Unset NCCL_CROSS_NIC (default 2: same NIC where possible) unless the fabric has one switch for all NICs.",
)
CHANNELS = Code(
    "GD629",
    "nccl-channels-forced",
    "NCCL picks its own channel count",
    what="Reads NCCL_MAX_NCHANNELS / NCCL_MIN_NCHANNELS (and their old names NCCL_MAX_NRINGS / "
    "NCCL_MIN_NRINGS, and NCCL_MAX_CTAS / NCCL_MIN_CTAS that replace them since NCCL 2.17). A maximum "
    "below 32 caps bandwidth (NCCL uses up to 32 channels, 64 since 2.25, to fill NVLink); a minimum "
    "takes SMs from compute on every collective.",
    why="Each channel is a CUDA block moving data: too few cannot saturate fast links, too many steal "
    "streaming multiprocessors from the training kernels that overlap with communication.",
    fix="Unset the variable unless a measurement on this machine shows it helps (it is often left from "
    "a benchmark or an old workaround).",
)
BUFFSIZE = Code(
    "GD630",
    "nccl-buffsize",
    "NCCL_BUFFSIZE is NCCL's default or a sane size",
    what="Reads NCCL_BUFFSIZE the way NCCL does (strtoll: '4M' is 4 bytes, '4MB' too) and compares it with "
    "the 4 MiB default. A value that is not a plain number of bytes fails; a smaller buffer warns (lower "
    "bandwidth), a larger one warns (more GPU memory and /dev/shm per connection).",
    why="The buffer is what NCCL pipelines through per peer and channel: a tiny one crawls, a large one "
    "is multiplied by every peer, channel and protocol and eats GPU memory and shared memory.",
    fix="Unset NCCL_BUFFSIZE, or give it in plain bytes, a power of two (e.g. 8388608 for 8 MiB).",
)
CUMEM = Code(
    "GD631",
    "nccl-cumem-disabled",
    "NCCL's cuMem allocations are not switched off",
    what="Reads NCCL_CUMEM_ENABLE=0 (cuMem is on by default since NCCL 2.19 where the system supports it) and "
    "NCCL_CUMEM_HOST_ENABLE=0 (cuMem host memory instead of /dev/shm, default since 2.24 with CUDA 12.6 "
    "drivers).",
    why="With cuMem off NCCL cannot use multi-node NVLink (src/mnnvl.cc returns early: traffic between "
    "NVL72 trays goes over the network), its symmetric-memory kernels, or cuMem host buffers, so it falls "
    "back to /dev/shm (GD510 then judges its size). Some inference stacks set it on purpose to save memory "
    "with CUDA graphs (NVIDIA/nccl#1234); a training job usually does not want it.",
    fix="Unset NCCL_CUMEM_ENABLE (and NCCL_CUMEM_HOST_ENABLE) unless you know why they are set.",
)
DEBUG_VERBOSE = Code(
    "GD632",
    "nccl-debug-verbose",
    "NCCL debug output is not per-call",
    what="Reads NCCL_DEBUG and NCCL_DEBUG_SUBSYS: TRACE prints a line for every NCCL call (env.rst: "
    "'replayable trace information on every call'); INFO with a subsystem list that includes COLL (or "
    "ALL) prints a line for every collective on every rank (src/enqueue.cc). INFO with the default "
    "subsystems (INIT, BOOTSTRAP, ENV) only prints at start-up and passes.",
    why="Thousands of log lines a second per rank slow the training loop on I/O and fill disks and log "
    "collectors; it is meant for one debugging run.",
    fix="Unset NCCL_DEBUG (or set NCCL_DEBUG=WARN) and NCCL_DEBUG_SUBSYS once the debugging is done.",
)
IGNORE_AFFINITY = Code(
    "GD633",
    "nccl-ignore-cpu-affinity",
    "NCCL keeps to the job's CPU binding",
    what="Reads NCCL_IGNORE_CPU_AFFINITY=1 and whether this process is bound to a subset of the machine's "
    "CPUs (Slurm --cpu-bind, a cpuset): NCCL then pins its threads to all CPUs near the GPU instead of the "
    "job's share of them (ncclTopoGetCpuAffinity, src/graph/topo.cc).",
    why="NCCL's proxy threads land on CPUs given to other ranks or other jobs: they compete with data "
    "loading and with each other, and step times jitter.",
    fix="Unset NCCL_IGNORE_CPU_AFFINITY, and bind each rank to CPUs near its GPU instead.",
)
TORCH_WAIT = Code(
    "GD634",
    "torch-nccl-error-handling",
    "torch's NCCL error handling neither blocks every wait nor hangs on errors",
    what="Reads TORCH_NCCL_BLOCKING_WAIT and TORCH_NCCL_ASYNC_ERROR_HANDLING (and their deprecated "
    "NCCL_* names) as ProcessGroupNCCL does. Blocking wait on warns; async error handling 0 (no "
    "handling) warns; a value torch cannot read fails, since the process group then raises at creation.",
    why="Blocking wait makes every wait() hold the CPU until the collective finishes (torch's "
    "init_process_group docs: 'due to its blocking nature, it has a performance overhead'); with error "
    "handling 0 a failed or timed-out collective never tears the process down, so every rank hangs. An "
    "invalid value ('on', 'enabled') stops every run at init_process_group.",
    fix="Unset TORCH_NCCL_BLOCKING_WAIT and leave TORCH_NCCL_ASYNC_ERROR_HANDLING at its default (3); use "
    "1/0 (or true/false) where you set them.",
)
TORCH_DEPRECATED = Code(
    "GD635",
    "torch-nccl-deprecated-env",
    "torch's NCCL switches use their current names",
    what="Looks for NCCL_BLOCKING_WAIT, NCCL_ASYNC_ERROR_HANDLING and NCCL_DESYNC_DEBUG, the names torch "
    "used before TORCH_NCCL_*: torch 2.x still reads them but warns 'Environment variable X is deprecated; "
    "use TORCH_X instead', and the TORCH_ name wins when both are set.",
    why="The old name is easy to believe in and silently overridden by the new one, and a later torch may "
    "stop reading it at all.",
    fix="Rename it: NCCL_BLOCKING_WAIT -> TORCH_NCCL_BLOCKING_WAIT, NCCL_ASYNC_ERROR_HANDLING -> "
    "TORCH_NCCL_ASYNC_ERROR_HANDLING, NCCL_DESYNC_DEBUG -> TORCH_NCCL_DESYNC_DEBUG.",
)
CODES = [NET_GDR, CROSS_NIC, CHANNELS, BUFFSIZE, CUMEM, DEBUG_VERBOSE, IGNORE_AFFINITY, TORCH_WAIT, TORCH_DEPRECATED]

DEFAULT_BUFFSIZE = 4 * 1024 * 1024  # env.rst: "The default is 4194304 (4 MiB)"
FULL_CHANNELS = 32  # NCCL's channel count ceiling before 2.25 (MAXCHANNELS; 64 since)
_RDMA_PREFIXES = ("ib", "roce", "mlx", "rdma")
TORCH_TRUE = ("y", "yes", "1", "t", "true")
TORCH_FALSE = ("n", "no", "0", "f", "false")
DEPRECATED = {
    "NCCL_BLOCKING_WAIT": "TORCH_NCCL_BLOCKING_WAIT",
    "NCCL_ASYNC_ERROR_HANDLING": "TORCH_NCCL_ASYNC_ERROR_HANDLING",
    "NCCL_DESYNC_DEBUG": "TORCH_NCCL_DESYNC_DEBUG",
}


def _plain(value: str) -> bool:
    """A number NCCL reads whole: decimal digits, or 0x hex (strtoll stops at anything else)."""
    text = value.strip().lstrip("+")
    return text.isdigit() or (text.lower().startswith("0x") and all(c in "0123456789abcdefABCDEF" for c in text[2:]))


def _rdma(snapshot: Snapshot) -> list[str]:
    ifaces = snapshot.host.network_interfaces
    return [i for i in ifaces if i.lower().startswith(_RDMA_PREFIXES)] if known(ifaces) else []


def _one(code: Code, status: Status, message: str, hint: str = "", **evidence: Any) -> Finding:
    return Finding(code.code, status, "host", message, hint if status is not Status.PASS else "", evidence)


def net_gdr(snapshot: Snapshot) -> list[Finding]:
    env, out = snapshot.env, []
    rdma = _rdma(snapshot)
    if "NCCL_IB_GDR_LEVEL" in env:
        out.append(
            _one(
                NET_GDR,
                Status.WARN,
                f"NCCL_IB_GDR_LEVEL={env['NCCL_IB_GDR_LEVEL']} is ignored: NCCL renamed it NCCL_NET_GDR_LEVEL in 2.4",
                "rename it to NCCL_NET_GDR_LEVEL (or unset it)",
                NCCL_IB_GDR_LEVEL=env["NCCL_IB_GDR_LEVEL"],
            )
        )
    value = env.get("NCCL_NET_GDR_LEVEL")
    if value is not None:
        level = nccl_rules.level(value)
        evidence = {"NCCL_NET_GDR_LEVEL": value, "nccl_level": level, "rdma_interfaces": rdma}
        if level is None:
            out.append(
                _one(NET_GDR, Status.WARN, f"NCCL_NET_GDR_LEVEL={value!r} is not a level NCCL knows: it is ignored",
                     "use LOC, PIX, PXB, PHB or SYS (upper case), or unset it", **evidence)
            )  # fmt: skip
        elif level == "LOC" and rdma:
            out.append(
                _one(
                    NET_GDR,
                    Status.WARN,
                    f"NCCL_NET_GDR_LEVEL={value} switches GPUDirect RDMA off on a host with {len(rdma)} RDMA "
                    "NIC(s): inter-node traffic is staged through host memory",
                    "unset NCCL_NET_GDR_LEVEL (fix nvidia-peermem or ACS if GPUDirect RDMA fails)",
                    **evidence,
                )
            )
        else:
            where = "no RDMA NIC here" if not rdma else f"GPUDirect RDMA up to {level}"
            out.append(_one(NET_GDR, Status.PASS, f"NCCL_NET_GDR_LEVEL={value}: {where}", **evidence))
    read = nccl_int(env.get("NCCL_NET_GDR_READ"))
    nvlink = any(p.nvlinks for p in pair_paths(snapshot, list(snapshot.gpus)))
    if read == 0 and rdma and nvlink:
        out.append(
            _one(
                NET_GDR,
                Status.WARN,
                "NCCL_NET_GDR_READ=0 on an NVLink machine with RDMA NICs (NCCL's default there is 1): sends are "
                "staged through host memory",
                "unset NCCL_NET_GDR_READ",
                NCCL_NET_GDR_READ=env["NCCL_NET_GDR_READ"],
                rdma_interfaces=rdma,
            )
        )
    return out


def cross_nic(snapshot: Snapshot) -> list[Finding]:
    value = snapshot.env.get("NCCL_CROSS_NIC")
    if value is None:
        return []
    rdma = _rdma(snapshot)
    number = nccl_int(value)
    evidence = {"NCCL_CROSS_NIC": value, "rdma_interfaces": rdma}
    if number not in (0, 1, 2) or not _plain(value):
        msg = f"NCCL_CROSS_NIC={value!r} is not 0, 1 or 2 (NCCL reads it as {number})"
        return [_one(CROSS_NIC, Status.WARN, msg, "set NCCL_CROSS_NIC to 0, 1 or 2, or unset it", **evidence)]
    if len(rdma) < 2:
        return [
            _one(
                CROSS_NIC, Status.PASS, f"NCCL_CROSS_NIC={value} has no effect with {len(rdma)} RDMA NIC(s)", **evidence
            )
        ]
    if number == 1:
        return [
            _one(
                CROSS_NIC,
                Status.WARN,
                f"NCCL_CROSS_NIC=1 lets rings cross between the {len(rdma)} NICs' rails: on a rail-optimised "
                "fabric that sends traffic over inter-rail links",
                "unset NCCL_CROSS_NIC unless all NICs of a node share one switch",
                **evidence,
            )
        ]
    return [_one(CROSS_NIC, Status.PASS, f"NCCL_CROSS_NIC={value} keeps rails apart", **evidence)]


def channels(snapshot: Snapshot) -> list[Finding]:
    env, out = snapshot.env, []
    for name in ("NCCL_MAX_NCHANNELS", "NCCL_MAX_NRINGS", "NCCL_MAX_CTAS"):
        number = nccl_int(env.get(name))
        if number is None:
            continue
        if number < FULL_CHANNELS:
            out.append(
                _one(
                    CHANNELS,
                    Status.WARN,
                    f"{name}={env[name]} caps NCCL at {number} channel(s): large messages cannot fill fast links "
                    f"(NCCL uses up to {FULL_CHANNELS}, 64 since 2.25)",
                    f"unset {name}",
                    **{name: env[name]},
                )
            )
        else:
            out.append(
                _one(
                    CHANNELS, Status.PASS, f"{name}={env[name]} leaves NCCL its full channel count", **{name: env[name]}
                )
            )
    for name in ("NCCL_MIN_NCHANNELS", "NCCL_MIN_NRINGS", "NCCL_MIN_CTAS"):
        number = nccl_int(env.get(name))
        if number is None or number <= 1:
            continue
        out.append(
            _one(
                CHANNELS,
                Status.WARN,
                f"{name}={env[name]} forces at least {number} channels: that many SMs are taken from compute "
                "by every collective",
                f"unset {name}",
                **{name: env[name]},
            )
        )
    return out


def buffsize(snapshot: Snapshot) -> list[Finding]:
    value = snapshot.env.get("NCCL_BUFFSIZE")
    number = nccl_int(value)
    if value is None or number is None:
        return []
    evidence = {"NCCL_BUFFSIZE": value, "nccl_reads_bytes": number, "default_bytes": DEFAULT_BUFFSIZE}
    if not _plain(value) or number <= 0:
        return [
            _one(
                BUFFSIZE,
                Status.FAIL,
                f"NCCL_BUFFSIZE={value!r} reads as {number} byte(s) to NCCL (it takes a plain number of bytes): "
                "collectives crawl or fail",
                "give it in bytes, e.g. NCCL_BUFFSIZE=8388608, or unset it",
                **evidence,
            )
        ]
    if number == DEFAULT_BUFFSIZE:
        return [_one(BUFFSIZE, Status.PASS, f"NCCL_BUFFSIZE={value} is NCCL's default", **evidence)]
    pow2 = "" if number & (number - 1) == 0 else "; not a power of two, as the user guide recommends"
    if number < DEFAULT_BUFFSIZE:
        msg = f"NCCL_BUFFSIZE={value} is below the 4 MiB default: lower bandwidth for large messages{pow2}"
    else:
        msg = (
            f"NCCL_BUFFSIZE={value} is {number / DEFAULT_BUFFSIZE:.3g}x the 4 MiB default: that much more GPU "
            f"memory for every peer and channel, and /dev/shm where NCCL uses shared memory{pow2}"
        )
    return [_one(BUFFSIZE, Status.WARN, msg, "unset NCCL_BUFFSIZE unless a measurement shows it helps", **evidence)]


def cumem(snapshot: Snapshot) -> list[Finding]:
    env, out = snapshot.env, []
    if nccl_int(env.get("NCCL_CUMEM_ENABLE")) == 0:
        out.append(
            _one(
                CUMEM,
                Status.WARN,
                "NCCL_CUMEM_ENABLE=0: no multi-node NVLink, no symmetric-memory kernels, and NCCL's shared "
                "buffers go back to /dev/shm (GD510)",
                "unset NCCL_CUMEM_ENABLE unless it was set on purpose (some inference stacks do, to save memory)",
                NCCL_CUMEM_ENABLE=env["NCCL_CUMEM_ENABLE"],
            )
        )
    if nccl_int(env.get("NCCL_CUMEM_HOST_ENABLE")) == 0:
        out.append(
            _one(
                CUMEM,
                Status.PASS,
                "NCCL_CUMEM_HOST_ENABLE=0: NCCL keeps its shared buffers in /dev/shm (GD510 judges its size)",
                NCCL_CUMEM_HOST_ENABLE=env["NCCL_CUMEM_HOST_ENABLE"],
            )
        )
    return out


def _logs_collectives(value: str | None) -> bool:
    """Does NCCL_DEBUG_SUBSYS let INFO print per-collective lines (COLL)? A comma list; a leading
    '^' means every subsystem but those listed; unset is INIT,BOOTSTRAP,ENV (env.rst)."""
    if value is None:
        return False
    names = {n.strip().upper() for n in value.lstrip("^").split(",") if n.strip()}
    if value.startswith("^"):
        return not names & {"COLL", "ALL"}
    return bool(names & {"COLL", "ALL"})


def debug_verbose(snapshot: Snapshot) -> list[Finding]:
    env = snapshot.env
    level = env.get("NCCL_DEBUG", "").strip().upper()
    if not level:
        return []
    subsys = env.get("NCCL_DEBUG_SUBSYS")
    evidence = {"NCCL_DEBUG": env["NCCL_DEBUG"], "NCCL_DEBUG_SUBSYS": subsys}
    hint = "unset NCCL_DEBUG (or NCCL_DEBUG=WARN) and NCCL_DEBUG_SUBSYS after debugging"
    if level == "TRACE":
        msg = "NCCL_DEBUG=TRACE logs every NCCL call on every rank: the training loop slows on I/O"
        return [_one(DEBUG_VERBOSE, Status.WARN, msg, hint, **evidence)]
    if level == "INFO" and _logs_collectives(subsys):
        msg = f"NCCL_DEBUG=INFO with NCCL_DEBUG_SUBSYS={subsys} logs every collective on every rank"
        return [_one(DEBUG_VERBOSE, Status.WARN, msg, hint, **evidence)]
    return [_one(DEBUG_VERBOSE, Status.PASS, f"NCCL_DEBUG={env['NCCL_DEBUG']} logs at start-up only", **evidence)]


def ignore_affinity(snapshot: Snapshot) -> list[Finding]:
    env, host = snapshot.env, snapshot.host
    if nccl_int(env.get("NCCL_IGNORE_CPU_AFFINITY")) in (None, 0):
        return []
    mine = host.cpu_affinity if known(host.cpu_affinity) else None
    total = host.cpu_count if known(host.cpu_count) else None
    evidence = {
        "NCCL_IGNORE_CPU_AFFINITY": env["NCCL_IGNORE_CPU_AFFINITY"],
        "process_cpus": len(mine or []),
        "cpus": total,
    }
    if mine and total and len(mine) < total:
        msg = (
            f"NCCL_IGNORE_CPU_AFFINITY=1 while this job is bound to {len(mine)} of {total} CPUs: NCCL's threads run "
            "on every CPU near each GPU, also those of other ranks or jobs"
        )
        return [_one(IGNORE_AFFINITY, Status.WARN, msg, "unset NCCL_IGNORE_CPU_AFFINITY", **evidence)]
    msg = "NCCL_IGNORE_CPU_AFFINITY=1 changes nothing here: this process may run on every CPU"
    return [_one(IGNORE_AFFINITY, Status.PASS, msg, **evidence)]


def _torch_value(env: dict[str, str], name: str) -> tuple[str, str] | None:
    """(the variable torch goes by, its value): the TORCH_ name wins over the deprecated one."""
    old = next((o for o, new in DEPRECATED.items() if new == name), None)
    for candidate in (name, old):
        if candidate and candidate in env:
            return candidate, env[candidate]
    return None


def torch_error_handling(snapshot: Snapshot) -> list[Finding]:
    env, out = snapshot.env, []
    blocking = _torch_value(env, "TORCH_NCCL_BLOCKING_WAIT")
    if blocking:
        name, value = blocking
        word = value.strip().lower()
        if word not in TORCH_TRUE + TORCH_FALSE:
            msg = f"{name}={value!r} is not a boolean torch reads: creating the NCCL process group raises"
            out.append(_one(TORCH_WAIT, Status.FAIL, msg, f"set {name}=0 or 1, or unset it", **{name: value}))
        elif word in TORCH_TRUE:
            msg = f"{name}={value}: every wait() blocks its CPU thread until the collective ends (a performance cost)"
            out.append(_one(TORCH_WAIT, Status.WARN, msg, f"unset {name}; set a timeout instead", **{name: value}))
    handling = _torch_value(env, "TORCH_NCCL_ASYNC_ERROR_HANDLING")
    if handling:
        name, value = handling
        try:
            mode = int(value.strip())
        except ValueError:
            msg = f"{name}={value!r} is not an integer: creating the NCCL process group raises"
            out.append(_one(TORCH_WAIT, Status.FAIL, msg, f"set {name}=3 (the default), or unset it", **{name: value}))
        else:
            if mode == 0:
                msg = f"{name}=0: a failed or timed-out collective never tears the process down; every rank hangs"
                out.append(_one(TORCH_WAIT, Status.WARN, msg, f"unset {name} (default 3)", **{name: value}))
    return out


def torch_deprecated(snapshot: Snapshot) -> list[Finding]:
    env, out = snapshot.env, []
    for old, new in DEPRECATED.items():
        if old not in env:
            continue
        overridden = f"; {new}={env[new]} overrides it" if new in env and env[new] != env[old] else ""
        out.append(
            _one(
                TORCH_DEPRECATED,
                Status.WARN,
                f"{old} is deprecated: torch reads it but warns to use {new}{overridden}",
                f"rename {old} to {new}",
                **{old: env[old], **({new: env[new]} if new in env else {})},
            )
        )
    return out


@check("nccl_tuning", "NCCL and torch communication settings", codes=CODES)
def nccl_tuning(ctx: CheckContext) -> list[Finding]:
    snapshot = ctx.snapshot
    if not any(k.startswith(("NCCL_", "TORCH_NCCL_")) for k in snapshot.env):
        return []
    return [
        *net_gdr(snapshot),
        *cross_nic(snapshot),
        *channels(snapshot),
        *buffsize(snapshot),
        *cumem(snapshot),
        *debug_verbose(snapshot),
        *ignore_affinity(snapshot),
        *torch_error_handling(snapshot),
        *torch_deprecated(snapshot),
    ]
