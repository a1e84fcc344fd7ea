"""GD2/GD6: environment variables that slow or break a multi-GPU run, priced on the detected topology.

GD230-239 are CUDA debug/profiler switches left set (launch config); GD620-639 are NCCL variables
that switch off a path this machine's hardware has, or name a network interface it lacks.
"""

from __future__ import annotations

import dataclasses
from itertools import combinations
from typing import Any

from gpudoctor.checks.targets import target_gpus
from gpudoctor.engine import CheckContext, Code, check
from gpudoctor.findings import Finding, Status
from gpudoctor.knowledge import interconnect as topology
from gpudoctor.knowledge import nccl_rules
from gpudoctor.knowledge.debug_vars import DCGM_DEBUG_VARS
from gpudoctor.knowledge.expectations import expected_busbw
from gpudoctor.knowledge.gpu_products import rtx40_p2p_broken
from gpudoctor.knowledge.nccl_list import parse_nccl_list, socket_ifname_read
from gpudoctor.knowledge.nccl_rules import nccl_int
from gpudoctor.knowledge.units import listed
from gpudoctor.knowledge.versions import version_tuple
from gpudoctor.records import Record, record
from gpudoctor.snapshot import Gpu, Host, Snapshot, known

LAUNCH_BLOCKING = Code(
    "GD230",
    "cuda-launch-blocking",
    "CUDA_LAUNCH_BLOCKING is not left on",
    what="Looks for CUDA_LAUNCH_BLOCKING=1 in the environment.",
    why="It makes every kernel launch synchronous: training runs several times slower, CPU and GPU no "
    "longer overlap, and NCCL collectives, which rely on asynchronous launches across ranks, can hang.",
    fix="Unset it (`unset CUDA_LAUNCH_BLOCKING`); use it only for a one-off debugging run.",
)
DEBUG_VARS = Code(
    "GD231",
    "cuda-debug-profiler-env",
    "No CUDA debugger or profiler variables left set",
    what="Looks for the CUDA debugger/profiler variables DCGM's diagnostic flags: NSIGHT_CUDA_DEBUGGER, "
    "CUDA_INJECTION32_PATH, CUDA_INJECTION64_PATH, CUDA_AUTO_BOOST, CUDA_ENABLE_COREDUMP_ON_EXCEPTION, "
    "CUDA_COREDUMP_FILE, CUDA_DEVICE_WAITS_ON_EXCEPTION, CUDA_PROFILE, COMPUTE_PROFILE, OPENCL_PROFILE.",
    why="They attach a debugger or tracing library to every CUDA process, change clocks, or make a faulting "
    "kernel stop and wait for a debugger instead of failing: runs are slower, and a crash on one rank "
    "turns into a hang of all ranks.",
    fix="Unset the variable (find where it is set: shell profile, container image ENV, job script).",
)
P2P_DISABLED = Code(
    "GD620",
    "nccl-p2p-disabled",
    "NCCL_P2P_DISABLE does not switch off peer-to-peer the GPUs have",
    what="Looks for NCCL_P2P_DISABLE=1 when GPU pairs the run uses are connected by NVLink or report "
    "PCIe peer-to-peer as supported, and says what the run loses.",
    why="With P2P off NCCL copies through host shared memory: on NVLink machines all-reduce bandwidth "
    "drops from hundreds of GB/s to ~10-20 GB/s; on PCIe boxes with working P2P it costs a fraction "
    "too. It is often left over from a workaround (RTX 40 on old drivers, an old hang).",
    fix="Unset NCCL_P2P_DISABLE unless you need it (RTX 40 with a driver older than 550.40.07: upgrade "
    "the driver instead; ACS/IOMMU trouble: fix ACS, see GD421).",
)
SHM_DISABLED = Code(
    "GD621",
    "nccl-shm-disabled",
    "NCCL_SHM_DISABLE does not switch off the only intra-node path of some GPU pairs",
    what="Looks for NCCL_SHM_DISABLE=1 when some GPU pairs the run uses have neither NVLink nor PCIe P2P "
    "(so NCCL would use shared memory between them).",
    why="Without P2P and SHM those pairs talk through the network transport (sockets or IB loopback), a "
    "large drop in bandwidth (nccl#406).",
    fix="Unset NCCL_SHM_DISABLE; if it was set for a /dev/shm problem, make /dev/shm larger (GD510).",
)
NVLS_DISABLED = Code(
    "GD622",
    "nccl-nvls-disabled",
    "NCCL_NVLS_ENABLE=0 does not switch off NVLink SHARP on NVSwitch Hopper systems",
    what="Looks for NCCL_NVLS_ENABLE=0 when the run uses more than 4 Hopper-or-newer GPUs on NVSwitch.",
    why="NVLink SHARP does the reduction in the NVSwitch: 8x H100/H200 all-reduce reaches ~480 GB/s busbw "
    "with it and ~370 GB/s without (about 1.3x).",
    fix="Unset NCCL_NVLS_ENABLE (NVLS also needs the fabric manager and enough memory; NCCL turns it off "
    "itself when it cannot use it).",
)
P2P_LEVEL = Code(
    "GD623",
    "nccl-p2p-level",
    "NCCL_P2P_LEVEL does not cut off peer-to-peer the GPUs have",
    what="Compares NCCL_P2P_LEVEL with the path between each GPU pair the run uses, as NCCL does "
    "(ncclTopoCheckP2p, src/graph/paths.cc): the names LOC, NVL, NVB, C2C, PIX, PXB, P2C, PXN, PHB, SYS "
    "(case-sensitive) or the legacy integers 0 LOC, 1 PIX, 2 PXB, 3 PHB, 4 and up SYS; nvidia-smi's NODE "
    "and PHB are both NCCL's PHB. NCCL's own default depends on its version and the CPU: from NCCL 2.23, "
    "PXB, or SYS on x86 AMD with at most 2 GPUs; before 2.23, SYS, or PXB on Intel, Zhaoxin and ARM CPUs. "
    "Pairs the set level cuts off from P2P that NCCL would use it on warn; a value NCCL ignores warns.",
    why="Pairs cut off from P2P go through host memory instead: slower all-reduce, and on NVLink machines much "
    "slower. A misspelt value ('pxb' is not 'PXB') is silently ignored by NCCL, so the setting does nothing.",
    fix="Unset NCCL_P2P_LEVEL, or set it to the level of the slowest path you want P2P on (upper case).",
)
ALGO_PROTO = Code(
    "GD624",
    "nccl-algo-proto-forced",
    "NCCL_ALGO / NCCL_PROTO are not forced",
    what="Reads NCCL_ALGO and NCCL_PROTO the way NCCL parses them (parseList, src/graph/tuning.cc): from "
    "NCCL 2.24 a list per collective ('ring,tree;allreduce:^tree'), '^' excluding, case-insensitive "
    "names, and an unknown token, a space or a function prefix NCCL does not know fails communicator "
    "creation; before 2.24 one comma list with unknown tokens silently ignored. It says what all-reduce "
    "may still use here, fails where none of it can run on this machine (NCCL 2.24 no longer falls back "
    "to Ring), and warns on forcing LL128 where NCCL would not enable it (the user guide: 'enabling LL128 "
    "on platforms that don't support it can lead to data corruption').",
    why="They override NCCL's tuning for every message size: leaving out NVLS costs NVSwitch Hopper ~1.3x "
    "all-reduce bandwidth, a protocol list without LL makes small messages slow. They are usually left "
    "over from a benchmark or a bug workaround, and a typo stops every job from starting.",
    fix="Unset NCCL_ALGO and NCCL_PROTO unless a measurement on this machine shows they help; write the "
    "list without spaces, e.g. NCCL_ALGO='^tree' or NCCL_ALGO='allreduce:ring'.",
)
IB_DISABLED = Code(
    "GD625",
    "nccl-ib-disabled",
    "NCCL_IB_DISABLE does not switch off InfiniBand/RoCE the host has",
    what="Looks for NCCL_IB_DISABLE=1 on a host with InfiniBand/RoCE interfaces.",
    why="NCCL then sends inter-node traffic over TCP sockets: multi-node all-reduce drops several-fold. "
    "(A single-node run does not use IB.)",
    fix="Unset NCCL_IB_DISABLE; if IB fails, fix it (`ibstat`, memlock GD511) rather than disabling it.",
)
SOCKET_IFNAME = Code(
    "GD626",
    "nccl-socket-ifname-missing",
    "NCCL_SOCKET_IFNAME names an interface that exists",
    what="Matches NCCL_SOCKET_IFNAME against the host's network interfaces as NCCL does (src/misc/socket.cc "
    "and utils.cc: comma-separated prefixes, '=' for exact names, '^' to exclude, no spaces trimmed; a value "
    "shorter than two characters is ignored). Nothing matched fails; a value NCCL ignores, or one that "
    "matches only interfaces that are down, warns.",
    why="When nothing matches, NCCL cannot bootstrap: 'Bootstrap : no socket interface found' / 'no "
    "usable interface' and every rank fails at init_process_group. Typical after moving a job script "
    "to a machine whose NICs are named differently (eth0 vs ens5 vs enp...).",
    fix="Set NCCL_SOCKET_IFNAME to an interface of this host (`ip -br link`), or unset it to let NCCL choose.",
)
LAUNCH_CODES = [LAUNCH_BLOCKING, DEBUG_VARS]
NCCL_CODES = [P2P_DISABLED, SHM_DISABLED, NVLS_DISABLED, P2P_LEVEL, ALGO_PROTO, IB_DISABLED, SOCKET_IFNAME]

DCGM_BAD_VARS = DCGM_DEBUG_VARS  # listed once, where the environment allow-list keeps them
_RDMA_PREFIXES = ("ib", "roce", "mlx")


def _flag(env: dict[str, str], name: str) -> bool:
    """CUDA_LAUNCH_BLOCKING: set and non-zero means on."""
    value = env.get(name, "").strip()
    try:
        return int(value) != 0
    except ValueError:
        return False


def p2p_disabled(env: dict[str, str]) -> bool:
    """NCCL_P2P_DISABLE counts only when strtol reads it as 1 (ncclGetLevel)."""
    return nccl_int(env.get("NCCL_P2P_DISABLE")) == 1


def shm_disabled(env: dict[str, str]) -> bool:
    return nccl_int(env.get("NCCL_SHM_DISABLE")) == 1  # shm.cc: ncclParamShmDisable() == 1


def ib_disabled(env: dict[str, str]) -> bool:
    return bool(nccl_int(env.get("NCCL_IB_DISABLE")))  # net_ib/init.cc: if (ncclParamIbDisable())


def nvls_disabled(env: dict[str, str]) -> bool:
    return nccl_int(env.get("NCCL_NVLS_ENABLE")) == 0  # nvls.cc: if (!ncclParamNvlsEnable() ...)


@record
class PairPath(Record):
    a: int
    b: int
    nvlinks: int  # direct links, or the switch links of the pair on NVSwitch boxes
    switch: bool
    pcie_level: str | None
    p2p_ok: bool  # NVML says PCIe P2P read+write work

    @property
    def label(self) -> str:
        if self.nvlinks:
            return f"NV{self.nvlinks}"
        return self.pcie_level or "?"

    @property
    def p2p_capable(self) -> bool:
        return self.nvlinks > 0 or self.p2p_ok

    @property
    def path(self) -> str:
        """The path type NCCL sees between the two GPUs (nccl_rules.pair_path)."""
        return nccl_rules.pair_path(self.nvlinks, self.pcie_level)


def _pair_path(snapshot: Snapshot, a: Gpu, b: Gpu, buses: set[tuple[int, int, int, int] | str]) -> PairPath:
    # NVSwitches hidden from a VM count as NVSwitch links, as NCCL and the busbw model read them.
    switch = topology.switch_links(a, buses) > 0 and topology.switch_links(b, buses) > 0
    level = topology.pcie_level(snapshot, a.index, b.index)
    pair = snapshot.pair(a.index, b.index)
    p2p_ok = bool(pair and pair.p2p_read == "ok" and pair.p2p_write == "ok")
    nvlinks = topology.nvlink_count(snapshot, a.index, b.index)
    return PairPath(a.index, b.index, nvlinks, switch, None if level == "?" else level, p2p_ok)


def pair_paths(snapshot: Snapshot, gpus: list[Gpu]) -> list[PairPath]:
    buses = topology.gpu_buses(snapshot)
    return [_pair_path(snapshot, a, b, buses) for a, b in combinations(gpus, 2)]


def _labels(paths: list[PairPath]) -> str:
    kinds = sorted({p.label for p in paths})
    return "/".join(kinds)


def _cost_p2p(paths: list[PairPath]) -> str:
    if any(p.nvlinks for p in paths):
        return (
            f"NVLink ({_labels([p for p in paths if p.nvlinks])}) goes unused and traffic is copied through host "
            "memory: all-reduce drops from hundreds of GB/s to ~10-20 GB/s"
        )
    return "PCIe peer-to-peer goes unused and traffic is staged through host memory (lower bandwidth, more CPU load)"


def launch_env(ctx: CheckContext) -> list[Finding]:
    env = ctx.snapshot.env
    out = []
    if _flag(env, "CUDA_LAUNCH_BLOCKING"):
        out.append(
            Finding(
                LAUNCH_BLOCKING.code,
                Status.WARN,
                "host",
                "CUDA_LAUNCH_BLOCKING=1: every kernel launch waits; training runs several times slower "
                "and NCCL collectives can hang",
                "unset CUDA_LAUNCH_BLOCKING",
                {"CUDA_LAUNCH_BLOCKING": env["CUDA_LAUNCH_BLOCKING"]},
            )
        )
    present = {name: env[name] for name in DCGM_BAD_VARS if env.get(name, "") != ""}
    if present:
        names = ", ".join(present)
        out.append(
            Finding(
                DEBUG_VARS.code,
                Status.WARN,
                "host",
                f"CUDA debugger/profiler variables are set: {names}",
                "unset " + " ".join(present),
                {"variables": present, "expected": "unset"},
            )
        )
    return out


@check("launch_env", "CUDA debug and profiler variables", codes=LAUNCH_CODES)
def launch_env_check(ctx: CheckContext) -> list[Finding]:
    return launch_env(ctx)


def _p2p_disable(env: dict[str, str], paths: list[PairPath], rtx40_old_driver: bool) -> list[Finding]:
    if not p2p_disabled(env):
        return []
    capable = [p for p in paths if p.p2p_capable]
    evidence = {
        "NCCL_P2P_DISABLE": env["NCCL_P2P_DISABLE"],
        "p2p_pairs": len(capable),
        "pairs": len(paths),
        "paths": _labels(capable) if capable else None,
    }
    if not capable or rtx40_old_driver:
        why = "no GPU pair here has P2P" if not capable else "it works around the RTX 40 P2P driver bug (GD104)"
        return [
            Finding(
                P2P_DISABLED.code, Status.PASS, "host", f"NCCL_P2P_DISABLE=1 costs nothing here: {why}", "", evidence
            )
        ]
    return [
        Finding(
            P2P_DISABLED.code,
            Status.WARN,
            "host",
            f"NCCL_P2P_DISABLE=1 on {len(capable)} GPU pair(s) with P2P: {_cost_p2p(capable)}",
            "unset NCCL_P2P_DISABLE (unless it works around a known P2P fault on this machine)",
            evidence,
        )
    ]


def _shm_disable(env: dict[str, str], paths: list[PairPath]) -> list[Finding]:
    if not shm_disabled(env):
        return []
    p2p_off = p2p_disabled(env)
    needing = [p for p in paths if not p.p2p_capable or p2p_off]
    evidence = {"NCCL_SHM_DISABLE": env["NCCL_SHM_DISABLE"], "pairs_using_shm": len(needing), "pairs": len(paths)}
    if not needing:
        return [
            Finding(
                SHM_DISABLED.code,
                Status.PASS,
                "host",
                "NCCL_SHM_DISABLE=1 costs nothing here: every GPU pair uses P2P",
                "",
                evidence,
            )
        ]
    sample = listed([f"{p.a}-{p.b} ({p.label})" for p in needing])
    return [
        Finding(
            SHM_DISABLED.code,
            Status.WARN,
            "host",
            f"NCCL_SHM_DISABLE=1 with {len(needing)} GPU pair(s) that need shared memory ({sample}): they fall "
            "back to the network transport, a large bandwidth drop",
            "unset NCCL_SHM_DISABLE; if /dev/shm is too small, enlarge it instead (GD510)",
            evidence,
        )
    ]


def _nvls_eligible(gpus: list[Gpu], paths: list[PairPath]) -> bool:
    def hopper(g: Gpu) -> bool:
        cc = g.compute_capability
        try:
            return known(cc) and float(cc) >= 9.0
        except ValueError:
            return False

    return len(gpus) > 4 and bool(paths) and all(p.switch for p in paths) and all(hopper(g) for g in gpus)


def _nvls(snapshot: Snapshot, gpus: list[Gpu], paths: list[PairPath]) -> list[Finding]:
    env = snapshot.env
    value = env.get("NCCL_NVLS_ENABLE")
    if value is None or not nvls_disabled(env):
        return []
    evidence = {"NCCL_NVLS_ENABLE": value, "gpus": len(gpus), "nvswitch": bool(paths) and all(p.switch for p in paths)}
    if not _nvls_eligible(gpus, paths):
        return [
            Finding(
                NVLS_DISABLED.code,
                Status.PASS,
                "host",
                "NCCL_NVLS_ENABLE=0 costs nothing here: NVLink SHARP needs more than 4 Hopper GPUs on NVSwitch",
                "",
                evidence,
            )
        ]
    # What this machine should reach with and without NVLS: the calibrated model's own figures.
    indices = [g.index for g in gpus]
    unset = {k: v for k, v in env.items() if k != "NCCL_NVLS_ENABLE"}
    with_nvls = expected_busbw(dataclasses.replace(snapshot, env=unset), indices)
    ring = expected_busbw(snapshot, indices)
    cost = "about 1.3x slower"
    if with_nvls is not None and ring is not None and with_nvls.algorithm == "nvls":
        evidence["expected_busbw_gbps"] = {"nvls": round(with_nvls.busbw_gbps, 1), "ring": round(ring.busbw_gbps, 1)}
        cost = f"~{with_nvls.busbw_gbps:.0f} -> ~{ring.busbw_gbps:.0f} GB/s busbw expected (GD407's model)"
    return [
        Finding(
            NVLS_DISABLED.code,
            Status.WARN,
            "host",
            f"NCCL_NVLS_ENABLE=0 on {len(gpus)} NVSwitch Hopper GPUs: all-reduce loses NVLink SHARP: {cost}",
            "unset NCCL_NVLS_ENABLE",
            evidence,
        )
    ]


def nccl_version(snapshot: Snapshot) -> tuple[int, ...] | None:
    """The NCCL torch runs (its nvidia-nccl wheel), or None when not recorded."""
    value = snapshot.software.torch_nccl
    return version_tuple(str(value)) if known(value) else None


def default_p2p(snapshot: Snapshot, gpus: list[Gpu]) -> nccl_rules.DefaultLevel:
    host = snapshot.host
    arch, vendor = nccl_rules.cpu_kind(
        host.cpu_arch if known(host.cpu_arch) else None, host.cpu_vendor if known(host.cpu_vendor) else None
    )
    return nccl_rules.default_p2p_level(nccl_version(snapshot), arch, vendor, len(gpus))


def _p2p_level(env: dict[str, str], paths: list[PairPath], default: nccl_rules.DefaultLevel) -> list[Finding]:
    value = env.get("NCCL_P2P_LEVEL")
    if value is None or p2p_disabled(env):
        return []
    level = nccl_rules.level(value)
    evidence: dict[str, Any] = {"NCCL_P2P_LEVEL": value, "nccl_default": default.level, "default_basis": default.basis}
    if level is None:
        hint_case = f" (upper case: {value.upper()})" if value.upper() in nccl_rules.PATH_TYPES else ""
        return [
            Finding(
                P2P_LEVEL.code,
                Status.WARN,
                "host",
                f"NCCL_P2P_LEVEL={value!r} is not a level NCCL knows{hint_case}: NCCL ignores it and keeps its "
                f"default {default.level} ({default.basis})",
                "unset NCCL_P2P_LEVEL or set a valid level: LOC, NVL, PIX, PXB, PHB or SYS",
                evidence,
            )
        ]
    rank = nccl_rules.RANK

    def allows(cut: str, p: PairPath) -> bool:
        return p.p2p_capable and rank[p.path] <= rank[cut]

    lost = [p for p in paths if allows(default.level, p) and not allows(level, p)]
    gained = [p for p in paths if allows(level, p) and not allows(default.level, p)]
    evidence.update(
        {
            "nccl_level": level,
            "pairs_losing_p2p": [f"{p.a}-{p.b} {p.label}" for p in lost][:16],
            "pairs_gaining_p2p": [f"{p.a}-{p.b} {p.label}" for p in gained][:16],
        }
    )
    read_as = f" (NCCL reads it as {level})" if level != value else ""
    if lost:
        return [
            Finding(
                P2P_LEVEL.code,
                Status.WARN,
                "host",
                f"NCCL_P2P_LEVEL={value}{read_as} cuts P2P off {len(lost)} GPU pair(s) that NCCL's default "
                f"{default.level} ({default.basis}) keeps: {_cost_p2p(lost)}",
                "unset NCCL_P2P_LEVEL",
                evidence,
            )
        ]
    if gained:
        kinds = _labels(gained)
        msg = (
            f"NCCL_P2P_LEVEL={value}{read_as} turns P2P on for {len(gained)} {kinds} pair(s) NCCL's default "
            f"{default.level} ({default.basis}) leaves off: the link probes (GD421) show whether it pays"
        )
        return [Finding(P2P_LEVEL.code, Status.PASS, "host", msg, "", evidence)]
    msg = f"NCCL_P2P_LEVEL={value}{read_as} changes nothing here: NCCL's default is {default.level} ({default.basis})"
    return [Finding(P2P_LEVEL.code, Status.PASS, "host", msg, "", evidence)]


def _ll128_by_default(gpus: list[Gpu], paths: list[PairPath]) -> bool:
    """NCCL enables LL128 by itself only where every GPU pair talks over NVLink and the GPUs share one
    supported compute capability (tuning.cc: typeIntra <= PATH_NVB, minCompCap == maxCompCap, cc 7.0-10.x)."""
    ccs = {str(g.compute_capability) for g in gpus if known(g.compute_capability)}
    majors = {int(float(cc)) for cc in ccs if cc.replace(".", "", 1).isdigit()}
    return bool(paths) and all(p.nvlinks for p in paths) and len(ccs) == 1 and majors <= {7, 8, 9, 10}


def _algo_proto(snapshot: Snapshot, gpus: list[Gpu], paths: list[PairPath]) -> list[Finding]:
    env = snapshot.env
    forced = {k: env[k] for k in ("NCCL_ALGO", "NCCL_PROTO") if env.get(k, "")}
    if not forced:
        return []
    nccl = nccl_version(snapshot)
    evidence: dict[str, Any] = {**forced, "torch_nccl": snapshot.software.torch_nccl, "expected": "unset"}
    text = " ".join(f"{k}={v}" for k, v in forced.items())
    costs: list[str] = []
    fails: list[str] = []
    eligible = _nvls_eligible(gpus, paths)
    if "NCCL_ALGO" in forced:
        try:
            allowed = nccl_rules.parse_list(forced["NCCL_ALGO"], nccl_rules.ALGORITHMS, nccl)
        except nccl_rules.ListError as exc:
            fails.append(f"NCCL rejects NCCL_ALGO ({exc}) and communicator creation fails")
        else:
            evidence["allreduce_algorithms"] = sorted(allowed["AllReduce"])
            ignored = nccl_rules.unknown_tokens(forced["NCCL_ALGO"], nccl_rules.ALGORITHMS)
            if nccl is not None and nccl < nccl_rules.PER_FUNCTION_SYNTAX and ignored:
                costs.append(f"NCCL {snapshot.software.torch_nccl} ignores {', '.join(map(repr, ignored))}")
            stranded = [f for f in nccl_rules.FUNCTIONS if not allowed[f] & nccl_rules.usable(f, eligible)]
            evidence["collectives_without_algorithm"] = stranded
            if stranded and (nccl is None or nccl >= nccl_rules.PER_FUNCTION_SYNTAX):
                fails.append(
                    f"{', '.join(stranded)} can use none of the algorithms it allows on this machine: NCCL 2.24+ "
                    "fails them ('No algorithm/protocol available', no fallback to Ring)"
                )
            elif stranded:
                costs.append(f"{', '.join(stranded)} fall back to Ring")
            reduce_ok = allowed["AllReduce"] & nccl_rules.usable("AllReduce", eligible)
            if eligible and "NVLS" not in allowed["AllReduce"] and reduce_ok:
                costs.append("no NVLink SHARP (~1.3x slower all-reduce on this NVSwitch Hopper box)")
            if len(gpus) > 1 and "Tree" not in allowed["AllReduce"] and reduce_ok:
                costs.append("no Tree (slower all-reduce across nodes)")
    if "NCCL_PROTO" in forced:
        try:
            protos = nccl_rules.parse_list(forced["NCCL_PROTO"], nccl_rules.PROTOCOLS, nccl)["AllReduce"]
        except nccl_rules.ListError as exc:
            fails.append(f"NCCL rejects NCCL_PROTO ({exc}) and communicator creation fails")
        else:
            evidence["allreduce_protocols"] = sorted(protos)
            if not protos:
                fails.append("NCCL_PROTO leaves all-reduce no protocol at all")
            if "LL" not in protos:
                costs.append("no LL protocol (small messages slower)")
            if "LL128" in protos and not _ll128_by_default(gpus, paths):
                costs.append(
                    "LL128 forced on where NCCL would not enable it (not all pairs on NVLink): NCCL's user "
                    "guide warns this can corrupt data"
                )
    if fails:
        return [
            Finding(
                ALGO_PROTO.code,
                Status.FAIL,
                "host",
                f"{text}: {'; '.join(fails)}",
                "unset " + " ".join(forced) + ", or write a list NCCL accepts (no spaces, e.g. allreduce:ring)",
                evidence,
            )
        ]
    cost = "; ".join(costs) if costs else "overrides NCCL's per-size tuning"
    return [
        Finding(
            ALGO_PROTO.code,
            Status.WARN,
            "host",
            f"{text} forces NCCL's choice: {cost}",
            "unset " + " ".join(forced),
            evidence,
        )
    ]


def _ib_disable(env: dict[str, str], ifaces: list[str] | None) -> list[Finding]:
    if not ib_disabled(env) or ifaces is None:
        return []
    rdma = [i for i in ifaces if i.lower().startswith(_RDMA_PREFIXES)]
    evidence = {"NCCL_IB_DISABLE": env["NCCL_IB_DISABLE"], "ib_interfaces": rdma}
    if not rdma:
        return [
            Finding(
                IB_DISABLED.code,
                Status.PASS,
                "host",
                "NCCL_IB_DISABLE=1 costs nothing here: no InfiniBand/RoCE interface",
                "",
                evidence,
            )
        ]
    return [
        Finding(
            IB_DISABLED.code,
            Status.WARN,
            "host",
            f"NCCL_IB_DISABLE=1 on a host with {len(rdma)} InfiniBand/RoCE interface(s): multi-node traffic "
            "goes over TCP sockets, several times slower",
            "unset NCCL_IB_DISABLE (single-node runs do not use IB)",
            evidence,
        )
    ]


def socket_ifname_matches(value: str, ifaces: list[str]) -> list[str]:
    """The interfaces NCCL would consider for NCCL_SOCKET_IFNAME: NCCL's own list syntax (prefix
    match; '=' exact; '^' exclude), parsed as NCCL_IB_HCA is (gpudoctor.knowledge.nccl_list)."""
    spec = parse_nccl_list(value)
    return [i for i in ifaces if spec.selects(i)]


def _down(host: Host) -> set[str]:
    """Interfaces whose operstate the probe read as down (host.network.interfaces)."""
    net = host.network
    if not known(net) or not known(net.interfaces):
        return set()
    return {i.name for i in net.interfaces if i.operstate == "down"}


def _socket_ifname(env: dict[str, str], ifaces: list[str] | None, host: Host) -> list[Finding]:
    value = env.get("NCCL_SOCKET_IFNAME")
    if value is None or ifaces is None:
        return []
    matched = socket_ifname_matches(value, ifaces)
    evidence: dict[str, Any] = {"NCCL_SOCKET_IFNAME": value, "interfaces": ifaces, "matched": matched}
    if not socket_ifname_read(value):
        evidence["matched"] = "ignored by NCCL (shorter than two characters)"
        msg = (
            f"NCCL_SOCKET_IFNAME={value!r} is ignored: NCCL reads the variable only from two characters on, and "
            "picks an interface itself (ib first, then anything but docker and lo)"
        )
        hint = "Name the interface (`ip -br addr`), e.g. NCCL_SOCKET_IFNAME==eth0, or unset the variable."
        return [Finding(SOCKET_IFNAME.code, Status.WARN, "host", msg, hint, evidence)]
    if matched:
        down = _down(host)
        if all(i in down for i in matched):
            evidence["down"] = sorted(down & set(matched))
            msg = (
                f"NCCL_SOCKET_IFNAME={value} matches only {', '.join(matched)}, which is down: NCCL's bootstrap "
                "cannot reach the other ranks through it"
            )
            hint = "Bring the interface up (`ip link set <name> up`) or name one that is up (`ip -br addr`)."
            return [Finding(SOCKET_IFNAME.code, Status.WARN, "host", msg, hint, evidence)]
        return [
            Finding(
                SOCKET_IFNAME.code,
                Status.PASS,
                "host",
                f"NCCL_SOCKET_IFNAME={value} matches {', '.join(matched)}",
                "",
                evidence,
            )
        ]
    others = [i for i in ifaces if i != "lo"] or ifaces
    return [
        Finding(
            SOCKET_IFNAME.code,
            Status.FAIL,
            "host",
            f"NCCL_SOCKET_IFNAME={value} matches no interface on this host ({', '.join(ifaces)}): NCCL "
            "cannot bootstrap",
            f"export NCCL_SOCKET_IFNAME={others[0]} (an interface that exists), or unset it",
            evidence,
        )
    ]


@check("nccl_env", "NCCL environment variables", codes=NCCL_CODES)
def nccl_env(ctx: CheckContext) -> list[Finding]:
    env = ctx.snapshot.env
    if not any(k.startswith("NCCL_") for k in env):
        return []
    gpus = target_gpus(ctx)
    paths = pair_paths(ctx.snapshot, gpus)
    host = ctx.snapshot.host
    ifaces = host.network_interfaces if known(host.network_interfaces) else None
    return [
        *_p2p_disable(env, paths, rtx40_p2p_broken(ctx.snapshot, gpus)),
        *_shm_disable(env, paths),
        *_nvls(ctx.snapshot, gpus, paths),
        *_p2p_level(env, paths, default_p2p(ctx.snapshot, gpus)),
        *_algo_proto(ctx.snapshot, gpus, paths),
        *_ib_disable(env, ifaces),
        *_socket_ifname(env, ifaces, host),
    ]
