"""GD2/GD6: environment variables that slow or break a multi-GPU run, priced on the detected topology.

GD230-239 are CUDA debug/profiler switches left set (launch config); GD620-639 are NCCL variables
that switch off a path this machine's hardware has, or name a network interface it lacks.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import combinations

from gpudoctor import topology
from gpudoctor.checks.driver_stack import rtx40_p2p_broken
from gpudoctor.checks.targets import listed, target_gpus
from gpudoctor.findings import Finding, Status
from gpudoctor.registry import CheckContext, Code, check
from gpudoctor.snapshot import Gpu, Snapshot, known

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
    what="Compares NCCL_P2P_LEVEL (LOC, NVL, PIX, PXB, PHB, SYS or 0-5) with the path between each GPU "
    "pair the run uses; pairs that would use P2P by default (NVLink, or PCIe up to PXB) but not at "
    "the set level are reported.",
    why="Pairs cut off from P2P go through host memory instead: slower all-reduce, and on NVLink machines much slower.",
    fix="Unset NCCL_P2P_LEVEL, or set it to the level of the slowest path you want P2P on.",
)
ALGO_PROTO = Code(
    "GD624",
    "nccl-algo-proto-forced",
    "NCCL_ALGO / NCCL_PROTO are not forced",
    what="Looks for NCCL_ALGO or NCCL_PROTO in the environment.",
    why="They override NCCL's tuning for every message size: NCCL_ALGO=Ring drops NVLink SHARP and Tree "
    "(on NVSwitch Hopper ~1.3x slower all-reduce), NCCL_PROTO=Simple makes small messages slow. They "
    "are usually left over from a benchmark or a bug workaround.",
    fix="Unset NCCL_ALGO and NCCL_PROTO unless a measurement on this machine shows they help.",
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
    what="Matches NCCL_SOCKET_IFNAME (comma-separated prefixes; '=' for exact names; '^' to exclude) "
    "against the host's network interfaces.",
    why="When nothing matches, NCCL cannot bootstrap: 'Bootstrap : no socket interface found' / 'no "
    "usable interface' and every rank fails at init_process_group. Typical after moving a job script "
    "to a machine whose NICs are named differently (eth0 vs ens5 vs enp...).",
    fix="Set NCCL_SOCKET_IFNAME to an interface of this host (`ip -br link`), or unset it to let NCCL choose.",
)
LAUNCH_CODES = [LAUNCH_BLOCKING, DEBUG_VARS]
NCCL_CODES = [P2P_DISABLED, SHM_DISABLED, NVLS_DISABLED, P2P_LEVEL, ALGO_PROTO, IB_DISABLED, SOCKET_IFNAME]

DCGM_BAD_VARS = (
    "NSIGHT_CUDA_DEBUGGER",
    "CUDA_INJECTION32_PATH",
    "CUDA_INJECTION64_PATH",
    "CUDA_AUTO_BOOST",
    "CUDA_ENABLE_COREDUMP_ON_EXCEPTION",
    "CUDA_COREDUMP_FILE",
    "CUDA_DEVICE_WAITS_ON_EXCEPTION",
    "CUDA_PROFILE",
    "COMPUTE_PROFILE",
    "OPENCL_PROFILE",
)
# NCCL_P2P_LEVEL names, as ranks of path length; NCCL's default PCIe cut-off is PXB.
LEVELS = {"LOC": 0, "NVL": 1, "PIX": 2, "PXB": 3, "PHB": 4, "SYS": 5}
PCIE_RANK = {"SAME": 2, "PIX": 2, "PXB": 3, "PHB": 4, "NODE": 4.5, "SYS": 5}
DEFAULT_P2P_RANK = LEVELS["PXB"]
_RDMA_PREFIXES = ("ib", "roce", "mlx")


def _flag(env: dict[str, str], name: str) -> bool:
    """NCCL reads these as integers: set and non-zero means on."""
    value = env.get(name, "").strip()
    try:
        return int(value) != 0
    except ValueError:
        return False


@dataclass(frozen=True)
class PairPath:
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
    def rank(self) -> float:
        return 1 if self.nvlinks else PCIE_RANK.get(self.pcie_level or "", 5)


def _pair_path(snapshot: Snapshot, a: Gpu, b: Gpu) -> PairPath:
    switch = topology.switch_links(a) > 0 and topology.switch_links(b) > 0
    level = topology.pcie_level(snapshot, a.index, b.index)
    pair = snapshot.pair(a.index, b.index)
    p2p_ok = bool(pair and pair.p2p_read == "ok" and pair.p2p_write == "ok")
    nvlinks = topology.nvlink_count(snapshot, a.index, b.index)
    return PairPath(a.index, b.index, nvlinks, switch, None if level == "?" else level, p2p_ok)


def pair_paths(snapshot: Snapshot, gpus: list[Gpu]) -> list[PairPath]:
    return [_pair_path(snapshot, a, b) for a, b in combinations(gpus, 2)]


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
    if not _flag(env, "NCCL_P2P_DISABLE"):
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
    if not _flag(env, "NCCL_SHM_DISABLE"):
        return []
    p2p_off = _flag(env, "NCCL_P2P_DISABLE")
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


def _nvls(env: dict[str, str], gpus: list[Gpu], paths: list[PairPath]) -> list[Finding]:
    value = env.get("NCCL_NVLS_ENABLE")
    if value is None or _flag(env, "NCCL_NVLS_ENABLE"):
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
    evidence["expected_busbw_gbps"] = {"nvls": 480, "ring": 370}
    return [
        Finding(
            NVLS_DISABLED.code,
            Status.WARN,
            "host",
            f"NCCL_NVLS_ENABLE=0 on {len(gpus)} NVSwitch Hopper GPUs: all-reduce loses NVLink SHARP "
            "(~480 -> ~370 GB/s busbw, about 1.3x slower)",
            "unset NCCL_NVLS_ENABLE",
            evidence,
        )
    ]


def _level_rank(value: str) -> float | None:
    value = value.strip().upper()
    if value in LEVELS:
        return LEVELS[value]
    try:
        return max(0, min(5, int(value)))
    except ValueError:
        return None


def _p2p_level(env: dict[str, str], paths: list[PairPath]) -> list[Finding]:
    value = env.get("NCCL_P2P_LEVEL")
    if value is None or _flag(env, "NCCL_P2P_DISABLE"):
        return []
    rank = _level_rank(value)
    if rank is None:
        return [
            Finding(
                P2P_LEVEL.code,
                Status.WARN,
                "host",
                f"NCCL_P2P_LEVEL={value!r} is not a level NCCL knows (LOC, NVL, PIX, PXB, PHB, SYS or 0-5)",
                "unset NCCL_P2P_LEVEL or set a valid level",
                {"NCCL_P2P_LEVEL": value},
            )
        ]
    lost = [p for p in paths if p.p2p_capable and p.rank <= max(DEFAULT_P2P_RANK, 1) and p.rank > rank]
    evidence = {"NCCL_P2P_LEVEL": value, "pairs_losing_p2p": [f"{p.a}-{p.b} {p.label}" for p in lost][:16]}
    if not lost:
        return [
            Finding(
                P2P_LEVEL.code,
                Status.PASS,
                "host",
                f"NCCL_P2P_LEVEL={value} keeps P2P on every GPU pair that has it",
                "",
                evidence,
            )
        ]
    return [
        Finding(
            P2P_LEVEL.code,
            Status.WARN,
            "host",
            f"NCCL_P2P_LEVEL={value} cuts P2P off {len(lost)} GPU pair(s): {_cost_p2p(lost)}",
            "unset NCCL_P2P_LEVEL",
            evidence,
        )
    ]


def _algo_proto(env: dict[str, str], gpus: list[Gpu], paths: list[PairPath]) -> list[Finding]:
    forced = {k: env[k] for k in ("NCCL_ALGO", "NCCL_PROTO") if env.get(k, "").strip()}
    if not forced:
        return []
    costs = []
    algo = forced.get("NCCL_ALGO", "").lower()
    if algo and _nvls_eligible(gpus, paths) and ("nvls" not in algo or algo.startswith("^")):
        costs.append("no NVLink SHARP (~1.3x slower all-reduce on this NVSwitch Hopper box)")
    if algo and "tree" not in algo and len(gpus) > 1:
        costs.append("no Tree (slower all-reduce across nodes)")
    proto = forced.get("NCCL_PROTO", "").lower()
    if proto and not proto.startswith("^") and "ll" not in proto.replace("ll128", ""):
        costs.append("no LL protocol (small messages slower)")
    text = " ".join(f"{k}={v}" for k, v in forced.items())
    cost = "; ".join(costs) if costs else "overrides NCCL's per-size tuning"
    return [
        Finding(
            ALGO_PROTO.code,
            Status.WARN,
            "host",
            f"{text} forces NCCL's choice: {cost}",
            "unset " + " ".join(forced),
            {**forced, "expected": "unset"},
        )
    ]


def _ib_disable(env: dict[str, str], ifaces: list[str] | None) -> list[Finding]:
    if not _flag(env, "NCCL_IB_DISABLE") or ifaces is None:
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
    """The interfaces NCCL would consider for NCCL_SOCKET_IFNAME (prefix match; '=' exact; '^' exclude)."""
    spec = value.strip()
    exclude = spec.startswith("^")
    if exclude:
        spec = spec[1:]
    exact = spec.startswith("=")
    if exact:
        spec = spec[1:]
    names = [n.strip() for n in spec.split(",") if n.strip()]

    def hit(iface: str) -> bool:
        return any(iface == n if exact else iface.startswith(n) for n in names)

    return [i for i in ifaces if hit(i) != exclude]


def _socket_ifname(env: dict[str, str], ifaces: list[str] | None) -> list[Finding]:
    value = env.get("NCCL_SOCKET_IFNAME")
    if value is None or ifaces is None:
        return []
    matched = socket_ifname_matches(value, ifaces)
    evidence = {"NCCL_SOCKET_IFNAME": value, "interfaces": ifaces, "matched": matched}
    if matched:
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
        *_nvls(env, gpus, paths),
        *_p2p_level(env, paths),
        *_algo_proto(env, gpus, paths),
        *_ib_disable(env, ifaces),
        *_socket_ifname(env, ifaces),
    ]
