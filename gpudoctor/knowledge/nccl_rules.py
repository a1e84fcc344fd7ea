"""How NCCL itself reads its environment, re-modelled so checks can price a variable on a machine.

Every rule cites the NCCL source it follows (NVIDIA/nccl, read at v2.22.3, v2.23.4 and master
2.30); the user guide's env.rst is the documented side. Pure functions: no snapshot, no I/O.

- Path types (src/include/graph.h): LOC 0, NVL 1, NVB 2, C2C 3, PIX 4, PXB 5, P2C 6, PXN 7,
  PHB 8, SYS 9. nvidia-smi's PHB and NODE are both NCCL's PHB: any path through the CPU of
  one socket (nvidia-smi's NODE only adds that it crosses host bridges).
- NCCL_P2P_LEVEL / NCCL_NET_GDR_LEVEL (src/graph/paths.cc, ncclGetLevel): a path name, matched
  case-sensitively (strcmp against topoPathTypeStr), or a legacy integer read with strtol and
  mapped through levelsOldToNew = {LOC, PIX, PXB, PHB, SYS, SYS}: 0 LOC, 1 PIX, 2 PXB, 3 PHB,
  4 and above SYS. Anything else is ignored: NCCL keeps its default. NCCL_P2P_DISABLE counts
  only when it reads as exactly 1.
- NCCL's default P2P cut-off (ncclTopoCheckP2p in src/graph/paths.cc):
  NCCL 2.23 and later: PXB, raised to SYS on x86 AMD CPUs when the node has at most 2 GPUs.
  Before 2.23: SYS, lowered to PXB on ARM and on x86 Intel and Zhaoxin CPUs.
  The CPU is NCCL's reading of CPUID's vendor string (src/graph/topo.cc kvDictCpuVendor:
  GenuineIntel, AuthenticAMD, CentaurHauls and "  Shanghai  " for Zhaoxin).
- NCCL_ALGO / NCCL_PROTO (src/graph/tuning.cc, parseList): from 2.24, "[func:]list[;func:list]...",
  elements and functions case-insensitive, "^" inverts the list, an unknown token or function is
  an error that fails communicator creation; a function whose allowed algorithms cannot run
  there fails too (env.rst: "it will not implicitly fall back to ring ... Instead, it will
  fail"): the collective returns "No algorithm/protocol available for function ..." (src/enqueue.cc).
  Before 2.24, one comma list, "^" to exclude, unknown tokens silently ignored, and a collective
  left with nothing falls back to Ring (tuning.cc "at least set ring algo available").
- Integer variables (src/misc/param.cc, ncclLoadParam): strtoll(value, NULL, 0), so "4M" is 4;
  see nccl_int.
"""

from __future__ import annotations

from gpudoctor.records import Record, record

PATH_TYPES = ("LOC", "NVL", "NVB", "C2C", "PIX", "PXB", "P2C", "PXN", "PHB", "SYS")
RANK = {name: i for i, name in enumerate(PATH_TYPES)}
LEGACY_LEVELS = ("LOC", "PIX", "PXB", "PHB", "SYS", "SYS")  # levelsOldToNew
# nvidia-smi's path names (the snapshot's pcie_level) as NCCL's path types.
NVIDIA_SMI_TO_NCCL = {"SAME": "PIX", "PIX": "PIX", "PXB": "PXB", "PHB": "PHB", "NODE": "PHB", "SYS": "SYS"}

P2P_DEFAULT_CHANGED = (2, 23)  # ncclTopoCheckP2p: v2.22.3 defaults to SYS, v2.23.4 to PXB
PER_FUNCTION_SYNTAX = (2, 24)  # parseList with function prefixes and strict tokens (env.rst "since 2.24")

FUNCTIONS = ("Broadcast", "Reduce", "AllGather", "ReduceScatter", "AllReduce")  # ncclFuncStr
ALGORITHMS = ("Tree", "Ring", "CollNetDirect", "CollNetChain", "NVLS", "NVLSTree", "PAT")  # ncclAlgoStr
PROTOCOLS = ("LL", "LL128", "Simple")  # ncclProtoStr
# The algorithms each collective has kernels for (the RunWorkColl specialisations in src/device/*.h).
SUPPORTED = {
    "Broadcast": {"Ring"},
    "Reduce": {"Ring"},
    "AllGather": {"Ring", "NVLS", "CollNetDirect", "PAT"},
    "ReduceScatter": {"Ring", "NVLS", "CollNetDirect", "PAT"},
    "AllReduce": {"Ring", "Tree", "NVLS", "NVLSTree", "CollNetDirect", "CollNetChain"},
}


def usable(function: str, nvls: bool) -> set[str]:
    """What a collective among the GPUs of one node can run: Ring, Tree, and NVLS on NVSwitch Hopper+.
    (CollNet needs an in-network-reduction plugin, NVLSTree several nodes, PAT one GPU per node.)"""
    return SUPPORTED[function] & ({"Ring", "Tree"} | ({"NVLS"} if nvls else set()))


def nccl_int(value: str | None) -> int | None:
    """An integer environment variable as NCCL reads it (NCCL_PARAM: strtoll(str, NULL, 0)): leading
    space and a sign allowed, 0x hex and leading-0 octal, and whatever follows the digits ignored,
    so "4M" is 4 and "yes" is 0. None when unset or empty (NCCL then keeps its default)."""
    if value is None or not value.strip():
        return None
    text = value.lstrip()
    sign = -1 if text.startswith("-") else 1
    text = text[1:] if text[:1] in "+-" else text
    base, digits = 10, "0123456789"
    if text[:2].lower() == "0x" and len(text) > 2 and text[2] in "0123456789abcdefABCDEF":
        base, digits, text = 16, "0123456789abcdefABCDEF", text[2:]
    elif text.startswith("0"):
        base, digits = 8, "01234567"
    end = 0
    while end < len(text) and text[end] in digits:
        end += 1
    return sign * int(text[:end], base) if end else 0


def level(value: str) -> str | None:
    """The path type NCCL makes of a level variable, or None when NCCL ignores the value."""
    if value in PATH_TYPES:
        return value
    if value[:1].isdigit():  # NCCL tests the first character, then strtol(str, NULL, 0)
        number = nccl_int(value) or 0
        return LEGACY_LEVELS[min(max(number, 0), len(LEGACY_LEVELS) - 1)]
    return None


def cpu_kind(arch: str | None, vendor: str | None) -> tuple[str, str]:
    """(arch, vendor) in NCCL's terms: ("x86", "intel"), ("x86", "amd"), ("arm", ""), ..."""
    arch_kind = {"x86_64": "x86", "amd64": "x86", "aarch64": "arm", "arm64": "arm"}.get((arch or "").lower(), "")
    if (arch or "").lower().startswith("ppc64"):
        arch_kind = "power"
    vendors = {"genuineintel": "intel", "authenticamd": "amd", "centaurhauls": "zhaoxin", "shanghai": "zhaoxin"}
    vendor_kind = vendors.get((vendor or "").strip().lower(), "") if arch_kind == "x86" else ""
    return arch_kind, vendor_kind


@record
class DefaultLevel(Record):
    level: str  # a path type
    basis: str  # why, in words


def default_p2p_level(nccl: tuple[int, ...] | None, arch: str, vendor: str, gpus: int) -> DefaultLevel:
    """NCCL's P2P cut-off when no variable sets it (ncclTopoCheckP2p). `arch`/`vendor` as cpu_kind
    gives them (empty when unknown); `nccl` None means "assume a current NCCL"."""
    cpu = _CPU_NAMES.get((arch, vendor), f"{arch} CPU" if arch else "a CPU of unknown make")
    if nccl is None or nccl >= P2P_DEFAULT_CHANGED:
        version = "NCCL 2.23+" if nccl is None else "NCCL " + ".".join(map(str, nccl[:3]))
        if arch == "x86" and vendor == "amd" and gpus <= 2:
            return DefaultLevel("SYS", f"{version} on {cpu} with at most 2 GPUs")
        return DefaultLevel("PXB", f"{version} on {cpu}")
    version = "NCCL " + ".".join(map(str, nccl[:3]))
    if arch == "arm" or (arch == "x86" and vendor in ("intel", "zhaoxin")):
        return DefaultLevel("PXB", f"{version} on {cpu}")
    return DefaultLevel("SYS", f"{version} on {cpu}")


_CPU_NAMES = {
    ("x86", "intel"): "an Intel x86 CPU",
    ("x86", "amd"): "an AMD x86 CPU",
    ("x86", "zhaoxin"): "a Zhaoxin x86 CPU",
    ("x86", ""): "an x86 CPU of unknown make",
    ("arm", ""): "an ARM CPU",
    ("power", ""): "a POWER CPU",
}


def pair_path(nvlinks: int, pcie_level: str | None) -> str:
    """The NCCL path type between two GPUs of one node (NVLink first, as NCCL's search does)."""
    if nvlinks:
        return "NVL"
    return NVIDIA_SMI_TO_NCCL.get(pcie_level or "", "SYS")


class ListError(ValueError):
    """NCCL refuses the value (2.24+): 'Unrecognized element token' / 'prefix token'."""


def parse_list(value: str, elements: tuple[str, ...], nccl: tuple[int, ...] | None) -> dict[str, set[str]]:
    """The elements NCCL enables per function for NCCL_ALGO / NCCL_PROTO (parseList). Names come
    back as spelled in `elements`. Raises ListError where NCCL 2.24+ fails to initialise."""
    if nccl is not None and nccl < PER_FUNCTION_SYNTAX:
        return _parse_list_old(value, elements)
    enabled = {f: set(elements) for f in FUNCTIONS}
    lookup = {e.lower(): e for e in elements}
    functions = {f.lower(): f for f in FUNCTIONS}
    tokens = [t for t in value.split(";") if t]  # strtok skips empty tokens
    for i, token in enumerate(tokens):
        parts = [p for p in token.split(":") if p]
        if not parts:
            continue
        if len(parts) == 1:
            if i > 0:
                raise ListError(f"all entries except the first must have a prefix: {value!r}")
            prefix, elem_list = None, parts[0]
        else:
            prefix, elem_list = parts[0], parts[1]
        invert = elem_list.startswith("^")
        names = [e for e in elem_list[1:].split(",") if e] if invert else [e for e in elem_list.split(",") if e]
        unknown = [e for e in names if e.lower() not in lookup]
        if unknown:
            raise ListError(f"unrecognized element token {unknown[0]!r}")
        if prefix is not None and prefix.lower() not in functions:
            raise ListError(f"unrecognized prefix token {prefix!r}")
        chosen = {lookup[e.lower()] for e in names}
        targets = [functions[prefix.lower()]] if prefix else list(FUNCTIONS)
        for f in targets:
            enabled[f] = set(elements) - chosen if invert else chosen
    return enabled


def _parse_list_old(value: str, elements: tuple[str, ...]) -> dict[str, set[str]]:
    """Before 2.24: one list for every function; '^' excludes; unknown tokens are ignored."""
    invert = value.startswith("^")
    body = value[1:] if invert else value
    lookup = {e.lower(): e for e in elements}
    chosen = {lookup[t.lower()] for t in body.split(",") if t.lower() in lookup}
    allowed = set(elements) - chosen if invert else chosen
    return {f: set(allowed) for f in FUNCTIONS}


def unknown_tokens(value: str, elements: tuple[str, ...]) -> list[str]:
    """Tokens NCCL before 2.24 silently ignores (misspellings, spaces, function prefixes)."""
    body = value[1:] if value.startswith("^") else value
    known_names = {e.lower() for e in elements}
    return [t for t in body.split(",") if t and t.lower() not in known_names]
