"""Two runs compared: `check --baseline FILE` and `gpudoctor diff A B`.

Each side is a saved `check --json` report or a snapshot. Facts (facts.py) are compared for
changes: GPU count, models and UUIDs (GD011), driver, VBIOS, InfoROM and GSP firmware (GD012), NVLink counts and PCIe
links (GD013), power limit and ECC/MIG/compute/persistence modes (GD017), GPU memory already in use (GD018), the
NCCL_* / TORCH_NCCL_* environment (GD019). Measurements are compared for regressions beyond a tolerance (default 10%):
all-reduce busbw per message size (GD014), the DDP step time (GD015), P2P copy bandwidth per pair
(GD016). Every finding carries both values. The codes are gpudoctor's own (area 0), whatever they
compare, so `--select GD01` is the whole comparison.

Reports of every schema version up to this gpudoctor's are read; a report without `facts`
(written by gpudoctor 0.1.0) is compared on what it holds. A newer schema is refused.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpudoctor.errors import EXIT_USAGE, UserError
from gpudoctor.facts import facts_from_snapshot, measurements_from_checks
from gpudoctor.findings import REPORT_SCHEMA_VERSION, CheckResult, Finding, Status, gpu_subject
from gpudoctor.registry import Code, register_codes
from gpudoctor.user_files import shown

DEFAULT_TOLERANCE = 0.10
# Report schema versions this gpudoctor reads (CHANGELOG.md).
READABLE_REPORT_VERSIONS = range(1, REPORT_SCHEMA_VERSION + 1)

GPUS = Code(
    "GD011",
    "baseline-gpus-changed",
    "The GPUs are those of the baseline: count, models, UUIDs",
    what="Pairs the GPUs of the baseline (a saved `check --json` report or a snapshot) with this run's by "
    "PCI bus id (by index when the bus ids differ, as between two kinds of board) and compares their "
    "count, product name, memory size and UUID. The UUIDs are compared only on the same machine (same "
    "hostname, or UUIDs in common): between two nodes every UUID differs. A GPU NVML could not talk to "
    "(lost: fallen off the bus, or no handle; GD827) has no name or UUID to compare: it is reported as "
    "lost, not as a replaced board, and its links count as down (GD013).",
    why="A GPU that fell off the bus, a board swapped for another model or a node that is not the one the "
    "baseline describes changes what every later measurement means; a fleet gate should say so first.",
    fix="A missing or lost GPU: `nvidia-smi -q`, the kernel log (XID 79 'fallen off the bus', GD827), "
    "power-cycle the node, reseat or RMA it; do not refresh the baseline for it. A replaced board (same "
    "model, new UUID): expected after maintenance; refresh the baseline "
    "(`gpudoctor check --json > base.json`) once the node is verified.",
)
SOFTWARE = Code(
    "GD012",
    "baseline-firmware-changed",
    "Driver, CUDA driver version and GPU firmware are those of the baseline",
    what="Compares the NVIDIA driver version, the CUDA version the driver supports and each GPU's VBIOS, "
    "InfoROM image and GSP firmware version with the baseline's (GSP firmware only when the driver is "
    "unchanged: it ships with the driver). A report that predates a field compares what both sides have.",
    why="A driver or firmware update changes NCCL's behaviour, clocks and fixes: a change in measured "
    "bandwidth after maintenance is often explained here, and nodes of one cluster should match.",
    fix="If the change was intended, refresh the baseline. Otherwise align the node with the fleet "
    "(driver packages pinned, VBIOS from the vendor's firmware bundle).",
)
LINKS = Code(
    "GD013",
    "baseline-links-changed",
    "NVLink and PCIe links are those of the baseline",
    what="Compares each GPU's number of active NVLinks, its PCIe maximum generation and width (of GPU and "
    "slot together) and its current PCIe width (read at idle) with the baseline's. Fewer links or a "
    "narrower link fails; more warns (the baseline was recorded degraded).",
    why="A link that went down or trained narrower cuts all-reduce and P2P bandwidth on that GPU, and the "
    "whole job waits for it, without any error.",
    fix="NVLink: `nvidia-smi nvlink -s`, the fabric manager (GD106), a GPU reset or reboot, then the "
    "vendor. PCIe: reseat the GPU and riser, check the BIOS link settings, compare `lspci -vv` LnkSta.",
)
BUSBW = Code(
    "GD014",
    "baseline-busbw-regressed",
    "All-reduce busbw holds the baseline at every message size",
    what="Compares the all-reduce sweep's busbw with the baseline's, when both ran the same number of ranks "
    "with the same backend, where it is bandwidth-bound: the largest sizes measured on both sides (the "
    "last four doublings, the plateau GD601 judges). When the best busbw there fell by more than the "
    "tolerance (`--tolerance`, default 10%), it fails. Every size's change is in the evidence; slower "
    "small, latency-bound sizes are named but not judged.",
    why="A regression against the machine's own earlier figure is the most sensitive sign of a link, "
    "driver or configuration problem: it catches a 20% loss the absolute model still passes.",
    fix="Read the facts comparison (GD011-GD013) and the topology and NCCL environment findings first; "
    "then `gpudoctor bench allreduce` for the whole curve. Re-run once on an idle machine to rule out "
    "another job sharing the links.",
)
DDP_STEP = Code(
    "GD015",
    "baseline-ddp-step-slower",
    "The DDP sanity step is no slower than the baseline's",
    what="Compares the DDP sanity run's step time (the slowest rank's mean) with the baseline's, for the "
    "same number of ranks and backend; slower by more than the tolerance warns. The sanity run trains "
    "a small model for a few steps, so this is a coarse signal.",
    why="A slower step with the same ranks points at host contention, a throttled GPU or a slower collective path.",
    fix="Look at the busbw comparison (GD014), GPU clocks (GD8) and host resources (GD5); re-run on an "
    "idle machine before concluding.",
)
P2P = Code(
    "GD016",
    "baseline-p2p-regressed",
    "P2P copy bandwidth holds the baseline on every GPU pair",
    what="Compares the timed peer-to-peer copy bandwidth of each GPU pair measured on both sides; a pair "
    "that fell by more than the tolerance fails.",
    why="One slow pair slows every collective that crosses it; a change against the same pair's earlier "
    "figure points at that link or at an ACS/IOMMU change.",
    fix="See GD421/GD422 for the pair, `nvidia-smi topo -m` and `nvidia-smi nvlink -s`; check whether "
    "the kernel's IOMMU settings changed (the finding's evidence holds them).",
)
SETTINGS = Code(
    "GD017",
    "baseline-gpu-settings-changed",
    "GPU power limits and ECC, MIG, compute and persistence modes are those of the baseline",
    what="Compares each GPU's enforced power limit (for the same model only) and its ECC (now and pending), MIG, "
    "compute and persistence modes with the baseline's. A change is judged as the static check judges the new"
    " value: MIG turned on (GD820) and compute mode 'prohibited' (GD821) fail, a power limit lowered by more "
    "than the tolerance (`--tolerance`, default 10%) fails, ECC turned off (GD833), persistence turned off "
    "(GD105), exclusive compute mode and any smaller or upward change warn. A report that predates these "
    "facts is passed over.",
    why="Between two nodes of a cluster, or one node before and after maintenance, a power cap, a MIG or ECC "
    "mode left by a previous tenant or a firmware tool is the usual answer to 'why is this node slower' or "
    "'why does the job no longer start', and none of them shows as an error.",
    fix="Restore the setting (`sudo nvidia-smi -i <gpu> -pl <watts>`, `-e 1` then reboot, `-mig 0` then a "
    "GPU reset, `-c DEFAULT`, `sudo systemctl enable --now nvidia-persistenced`), or refresh the baseline "
    "if the change is intended.",
)
MEMORY_HELD = Code(
    "GD018",
    "baseline-gpu-memory-held",
    "No more GPU memory is in use than in the baseline",
    what="Compares the GPU memory in use when each side was recorded (nvmlDeviceGetMemoryInfo 'used'); more "
    "than max(1 GiB, 5% of the GPU) above the baseline's warns, the margin GD826 allows for memory no "
    "process owns.",
    why="Memory held by a leftover rank, a process in another container or a context that was never torn "
    "down is unavailable to the run: the first step runs out of memory, or the GPU is shared and slower.",
    fix="Find the owner (`nvidia-smi`, `sudo fuser -v /dev/nvidia*`; GD825/GD826) and stop it, or reset the "
    "GPU when no process owns the memory.",
)
NCCL_ENV = Code(
    "GD019",
    "baseline-nccl-env-changed",
    "The NCCL_* and TORCH_NCCL_* environment is that of the baseline",
    what="Compares the NCCL_* and TORCH_NCCL_* environment variables recorded on both sides (the snapshot's "
    "allow-list): a variable newly set, changed or no longer set warns, naming both values. A report that "
    "predates this fact is passed over.",
    why="One variable changes what NCCL does: NCCL_NVLS_ENABLE=0 drops NVLink SHARP (about 480 -> 370 GB/s "
    "on 8x H100), NCCL_P2P_DISABLE=1 or NCCL_IB_DISABLE=1 moves traffic off NVLink or InfiniBand. A module "
    "file or a job script that sets it on one node explains a busbw gap no hardware check finds.",
    fix="Unset or align the variable (the job script, module files, ~/.nccl.conf or /etc/nccl.conf, "
    "whose settings NCCL reads as defaults), or refresh the baseline if the change is intended; the NCCL "
    "environment checks (GD62x, GD63x) say what each one costs on this machine.",
)
CODES = [GPUS, SOFTWARE, LINKS, BUSBW, DDP_STEP, P2P, SETTINGS, MEMORY_HELD, NCCL_ENV]
register_codes("baseline", CODES)

FACT_CODES = {GPUS.code, SOFTWARE.code, LINKS.code, SETTINGS.code, MEMORY_HELD.code, NCCL_ENV.code}
MEASURED = ("allreduce", "ddp", "p2p")  # the report's measurements this comparison reads


@dataclass(frozen=True)
class Side:
    """One side of a comparison: what a report or snapshot says about its machine and run."""

    label: str
    kind: str  # "report" or "snapshot"
    facts: dict[str, Any] | None
    measurements: dict[str, Any]
    written_by: str = ""  # the gpudoctor version that wrote it, when known


def _refuse(path: str, why: str) -> UserError:
    return UserError(f"cannot compare with {path}: {why}", EXIT_USAGE, "input")


def load_side(path: str | Path) -> Side:
    """A saved report or snapshot, refused in one line when it is neither or too new."""
    from gpudoctor.user_files import UserFileError, read_json

    if path == "-":
        raise _refuse("-", "a saved report or snapshot is read from a file (only `check --snapshot -` reads stdin)")
    try:
        data = read_json(path)
    except UserFileError as exc:
        raise _refuse(str(path), str(exc)) from None
    return side_from_json(data, str(path))


def side_from_json(data: Any, label: str) -> Side:
    if not isinstance(data, dict):
        raise _refuse(label, "not a gpudoctor report or snapshot (the top level is not an object)")
    if "command" in data or "checks" in data:
        return _report_side(data, label)
    if "gpus" in data:
        from gpudoctor import snapshot as snap

        try:
            snapshot = snap.from_jsonable(data)
        except snap.SnapshotError as exc:
            raise _refuse(label, f"a snapshot that cannot be read: {exc}") from None
        return Side(label, "snapshot", facts_from_snapshot(snapshot), {}, snapshot.software.gpudoctor)
    raise _refuse(label, "not a gpudoctor report (`check --json`) or snapshot (`gpudoctor snapshot`)")


def _version_words(version: int) -> str:
    """A schema_version as a refusal quotes it: a 400-digit number is not printed whole."""
    digits = str(abs(version))
    return str(version) if len(digits) <= 12 else f"{str(version)[:7]}... ({len(digits)} digits)"


def _report_side(data: dict[str, Any], label: str) -> Side:
    version = data.get("schema_version")
    if not isinstance(version, int) or isinstance(version, bool):
        raise _refuse(label, "a report without a schema_version")
    if version not in READABLE_REPORT_VERSIONS:
        newest = READABLE_REPORT_VERSIONS[-1]
        quoted = _version_words(version)
        if version > newest:
            raise _refuse(
                label,
                f"report schema_version {quoted} is newer than this gpudoctor reads ({newest}): upgrade gpudoctor",
            )
        raise _refuse(label, f"report schema_version {quoted} is not one gpudoctor ever wrote")
    if "checks" not in data and isinstance(data.get("error"), dict):
        why = data["error"].get("message", "")
        why = why if isinstance(why, str) and len(why) <= 200 else shown(why, 200)
        raise _refuse(label, f"the error document of a run that did not finish ({why})")
    command = data.get("command")
    if command != "check" or not isinstance(data.get("checks"), list):
        what = f"`gpudoctor {command}`" if isinstance(command, str) and len(command) <= 20 else shown(command)
        raise _refuse(label, f"a {what} document; only `check` reports and snapshots compare")
    facts = data.get("facts")
    _check_shape(label, "facts", facts)
    if "measurements" in data:
        _check_shape(label, "measurements", data["measurements"])
        # Those this gpudoctor compares; one a newer gpudoctor added is left out, not refused.
        measurements = {k: v for k, v in data["measurements"].items() if k in MEASURED}
    else:  # a schema 1 report from gpudoctor 0.1.0: recover them from its checks
        measurements = measurements_from_checks(data["checks"])
        _check_shape(label, "measurements", measurements, "the measurements in its checks")
    return Side(label, "report", facts, measurements, str(data.get("gpudoctor_version", "")))


def _check_shape(label: str, block: str, value: Any, words: str = "") -> None:
    """Refuse a report block that is not the schema's shape: the comparison reads only well-formed ones.

    A report is a file users keep and may edit or generate; its `facts` and `measurements` are
    held to the shipped report schema (json_shape.py) before anything is compared, so a wrong
    type is one line (exit 2) before a run, never a crash after it."""
    from gpudoctor.json_shape import problem
    from gpudoctor.render.json import report_schema

    schema = report_schema()
    found = problem(value, schema["properties"][block], schema, block)
    if found:
        raise _refuse(label, f"{words or f'its `{block}`'} are not what gpudoctor writes ({found})")


# ---------------------------------------------------------------------------------------------
# Comparing


def _pct(change: float) -> str:
    return f"{change:+.0%}"


def _gpu_name(g: dict[str, Any]) -> str:
    return f"GPU {g.get('index')} ({g.get('name')}, {g.get('pci_bus_id')})"


def pair_gpus(
    base: list[dict[str, Any]], cur: list[dict[str, Any]]
) -> tuple[list[tuple[dict[str, Any], dict[str, Any]]], list[dict[str, Any]], list[dict[str, Any]]]:
    """(pairs, gone, new): by PCI bus id when the two sides share most bus ids, else by index."""
    by_bus_b = {g.get("pci_bus_id"): g for g in base}
    by_bus_c = {g.get("pci_bus_id"): g for g in cur}
    shared = set(by_bus_b) & set(by_bus_c)
    key = "pci_bus_id" if base and cur and len(shared) * 2 >= min(len(base), len(cur)) else "index"
    b = {g.get(key): g for g in base}
    c = {g.get(key): g for g in cur}
    pairs = [(b[k], c[k]) for k in b if k in c]
    return pairs, [b[k] for k in b if k not in c], [c[k] for k in c if k not in b]


def _same_machine(base: dict[str, Any], cur: dict[str, Any]) -> bool:
    hb, hc = base.get("hostname") or "", cur.get("hostname") or ""
    if hb and hc:
        return hb == hc
    uuids_b = {g.get("uuid") for g in base.get("gpus", [])}
    return bool(uuids_b & {g.get("uuid") for g in cur.get("gpus", [])})


def _finding(
    code: Code, status: Status, subject: str, message: str, evidence: dict[str, Any], hint: str = ""
) -> Finding:
    quiet = status in (Status.PASS, Status.SKIP)
    return Finding(code.code, status, subject, message, "" if quiet else (hint or code.fix), evidence)


HINT_GONE = "Look for XID 79 ('fallen off the bus') in the kernel log and `nvidia-smi -q`; reseat or RMA the GPU."
HINT_NEW = "If the GPU was added on purpose, refresh the baseline (`gpudoctor check --json > base.json`)."
HINT_OTHER_HW = "This is not the hardware the baseline describes: compare with the right baseline, or refresh it."
HINT_SWAPPED = "Expected after a board swap: refresh the baseline once the node is verified."
HINT_SOFTWARE = (
    "If the change was intended (maintenance), refresh the baseline; otherwise align the node with the fleet "
    "(pinned driver packages, the vendor's VBIOS bundle)."
)
HINT_FEWER_LINKS = (
    "NVLink: `nvidia-smi nvlink -s`, the fabric manager (GD106), a GPU reset or reboot. PCIe: reseat the GPU and "
    "riser, check the BIOS link settings, compare `lspci -vv` LnkSta."
)
HINT_MORE_LINKS = "The baseline was recorded with fewer or narrower links: refresh it from a healthy run."
HINT_LOST = (
    "The baseline's GPU stopped answering; this is not a board swap: do not refresh the baseline. See GD827 "
    "(`gpudoctor explain GD827`): look for XID 79 in the kernel log, power-cycle the node, then reseat or RMA the GPU."
)
HINT_BASELINE_LOST = "The baseline was recorded with this GPU lost: refresh it from a healthy run."


@dataclass(frozen=True)
class _Change:
    """One fact that differs on one GPU; equal changes on several GPUs become one finding."""

    code: Code
    status: Status
    field: str
    words: str
    baseline: Any
    current: Any
    hint: str


def _grouped(changes: list[tuple[_Change, int]]) -> list[Finding]:
    groups: dict[_Change, list[int]] = {}
    for change, index in changes:
        groups.setdefault(change, []).append(index)
    out = []
    for c, gpus in groups.items():
        who = f"GPU {gpus[0]}" if len(gpus) == 1 else f"GPUs {', '.join(str(i) for i in sorted(gpus))}"
        out.append(
            _finding(
                c.code,
                c.status,
                gpu_subject(gpus[0]) if len(gpus) == 1 else "host",
                f"{who} {c.words}: {c.baseline} in the baseline, {c.current} now",
                {"field": c.field, "baseline": c.baseline, "current": c.current, "gpus": sorted(gpus)},
                c.hint,
            )
        )
    return out


def answers(g: dict[str, Any]) -> bool:
    """NVML could talk to this GPU when the side was recorded: not lost, and it gave a handle.

    A report written before `lost` was recorded shows such a GPU only by its empty name and UUID."""
    return not (g.get("lost") or g.get("unreachable") or (not g.get("name") and not g.get("uuid")))


def _lost_words(g: dict[str, Any]) -> str:
    if g.get("unreachable") and not g.get("lost"):
        return f"NVML gives no handle for it ({g['unreachable']})"
    return "NVML answers GPU_IS_LOST (fallen off the bus)"


def _lost(b: dict[str, Any] | None, c: dict[str, Any], counts: dict[str, int]) -> Finding:
    was = f", {b.get('name')} in the baseline" if b is not None and answers(b) else ""
    again = " as it was in the baseline" if b is not None and not answers(b) else ""
    bus = f" ({c.get('pci_bus_id')}{was})" if c.get("pci_bus_id") else f" ({was.removeprefix(', ')})" if was else ""
    message = f"GPU {c['index']}{bus} is lost{again}: {_lost_words(c)}"
    evidence = {"field": "lost", "baseline": b, "current": c, **counts}
    return _finding(GPUS, Status.FAIL, gpu_subject(c["index"]), message, evidence, HINT_LOST)


def compare_gpus(base: dict[str, Any], cur: dict[str, Any]) -> list[Finding]:
    gb, gc = base.get("gpus", []), cur.get("gpus", [])
    pairs, gone, new = pair_gpus(gb, gc)
    out = []
    counts = {"baseline_count": len(gb), "count": len(gc)}
    for g in gone:
        message = f"{_gpu_name(g)} of the baseline is gone: {len(gc)} GPU(s) now, {len(gb)} in the baseline"
        out.append(_finding(GPUS, Status.FAIL, gpu_subject(g["index"]), message, {"baseline": g, **counts}, HINT_GONE))
    for g in new:
        if not answers(g):  # a lost GPU whose bus id is unknown pairs with nothing: still lost, not new
            out.append(_lost(None, g, counts))
            continue
        message = f"{_gpu_name(g)} is new: {len(gc)} GPU(s) now, {len(gb)} in the baseline"
        out.append(_finding(GPUS, Status.WARN, gpu_subject(g["index"]), message, {"current": g, **counts}, HINT_NEW))
    # A GPU that stopped answering is the baseline's board, lost: its empty name and UUID are no swap.
    for b, c in pairs:
        if not answers(c):
            out.append(_lost(b, c, counts))
        elif not answers(b):
            message = f"GPU {c['index']} answers now; it was lost when the baseline was recorded"
            evidence = {"field": "lost", "baseline": b, "current": c}
            out.append(_finding(GPUS, Status.WARN, gpu_subject(c["index"]), message, evidence, HINT_BASELINE_LOST))
    pairs = [(b, c) for b, c in pairs if answers(b) and answers(c)]
    same = _same_machine(base, cur)
    changes = []
    for b, c in pairs:
        for words, key in (("model", "name"), ("memory (MiB)", "memory_total_mib")):
            if b.get(key) is not None and c.get(key) is not None and b[key] != c[key]:
                changes.append((_Change(GPUS, Status.FAIL, key, words, b[key], c[key], HINT_OTHER_HW), c["index"]))
    out += _grouped(changes)
    if same:
        for b, c in pairs:
            if b.get("uuid") != c.get("uuid"):
                out.append(
                    _finding(
                        GPUS,
                        Status.WARN,
                        gpu_subject(c["index"]),
                        f"GPU {c['index']} was replaced: UUID {b.get('uuid')} in the baseline, {c.get('uuid')} now",
                        {"field": "uuid", "baseline": b.get("uuid"), "current": c.get("uuid")},
                        HINT_SWAPPED,
                    )
                )
    if not out:
        models = ", ".join(sorted({str(g.get("name")) for g in gc})) or "no GPU"
        uuids = "same UUIDs" if same else "another machine, UUIDs not compared"
        out.append(
            _finding(
                GPUS,
                Status.PASS,
                "host",
                f"{len(gc)} GPU(s) as in the baseline: {models}; {uuids}",
                {"count": len(gc), "baseline_hostname": base.get("hostname"), "hostname": cur.get("hostname")},
            )
        )
    return out


def compare_software(base: dict[str, Any], cur: dict[str, Any]) -> list[Finding]:
    out = []
    changed = {
        key: (base.get(key), cur.get(key))
        for key in ("driver_version", "cuda_driver_version")
        if base.get(key) is not None and cur.get(key) is not None and base.get(key) != cur.get(key)
    }
    if changed:
        words = {"driver_version": "driver", "cuda_driver_version": "CUDA (driver)"}
        text = ", ".join(f"{words[k]} {b} -> {c}" for k, (b, c) in changed.items())
        evidence = {k: {"baseline": b, "current": c} for k, (b, c) in changed.items()}
        out.append(_finding(SOFTWARE, Status.WARN, "host", f"{text} since the baseline", evidence, HINT_SOFTWARE))
    pairs, _, _ = pair_gpus(base.get("gpus", []), cur.get("gpus", []))
    firmware = [("vbios", "VBIOS"), ("inforom_image", "InfoROM image")]
    if "driver_version" not in changed:  # GSP firmware ships with the driver: a new driver says it already
        firmware.append(("gsp_firmware", "GSP firmware"))
    out += _grouped(
        [
            (_Change(SOFTWARE, Status.WARN, key, words, b[key], c[key], HINT_SOFTWARE), c["index"])
            for key, words in firmware
            for b, c in pairs
            if b.get(key) and c.get(key) and b[key] != c[key]  # a report older than the field has none
        ]
    )
    if not out:
        out.append(
            _finding(
                SOFTWARE,
                Status.PASS,
                "host",
                f"driver {cur.get('driver_version') or '?'} and GPU firmware as in the baseline",
                {"driver_version": cur.get("driver_version")},
            )
        )
    return out


# (key, words, status when lower than the baseline): a lower current width at idle only warns.
LINK_FIELDS = (
    ("nvlinks_active", "active NVLinks", Status.FAIL),
    ("pcie_gen_max", "PCIe max generation", Status.FAIL),
    ("pcie_width_max", "PCIe max width", Status.FAIL),
    ("pcie_width_current", "PCIe width (idle)", Status.WARN),
)


def _links_words(g: dict[str, Any]) -> str:
    parts = []
    if g.get("nvlinks_active"):
        parts.append(f"{g['nvlinks_active']} active NVLinks")
    if g.get("pcie_width_max"):
        gen = f"Gen{g['pcie_gen_max']} " if g.get("pcie_gen_max") else ""
        parts.append(f"PCIe {gen}x{g['pcie_width_max']}")
    return " and ".join(parts)


def compare_links(base: dict[str, Any], cur: dict[str, Any]) -> list[Finding]:
    changes = []
    out = []
    pairs, _, _ = pair_gpus(base.get("gpus", []), cur.get("gpus", []))
    compared = 0
    for b, c in pairs:
        if not answers(c) and answers(b) and _links_words(b):
            # A lost GPU's links carry nothing: they count as down, whatever NVML could not read.
            was = {key: b[key] for key, _, _ in LINK_FIELDS if b.get(key)}
            message = f"GPU {c['index']}'s links are down, the GPU is lost: {_links_words(b)} in the baseline, none now"
            evidence = {"field": "links", "baseline": was, "current": dict.fromkeys(was, 0), "gpus": [c["index"]]}
            out.append(_finding(LINKS, Status.FAIL, gpu_subject(c["index"]), message, evidence, HINT_LOST))
            continue
        if not (answers(b) and answers(c)):
            continue
        compared += 1
        for key, words, lower in LINK_FIELDS:
            vb, vc = b.get(key), c.get(key)
            if vb is None or vc is None or vb == vc:
                continue
            fewer = vc < vb
            status, hint = (lower, HINT_FEWER_LINKS) if fewer else (Status.WARN, HINT_MORE_LINKS)
            changes.append((_Change(LINKS, status, key, words, vb, vc, hint), c["index"]))
    out += _grouped(changes)
    if not out:
        out.append(
            _finding(LINKS, Status.PASS, "host", f"NVLink and PCIe links of {compared} GPU(s) as in the baseline", {})
        )
    return out


def _on_off(value: Any) -> str:
    return "on" if value else "off"


def _setting_status(key: str, before: Any, now: Any, tolerance: float) -> Status:
    """A changed setting judged as the static check judges its new value (GD820, GD821, GD833, GD105)."""
    if key in ("mig_mode", "mig_mode_pending") and now:
        return Status.FAIL
    if key == "compute_mode" and now == "prohibited":
        return Status.FAIL
    if key == "power_limit_w" and now < before * (1 - tolerance):
        return Status.FAIL
    return Status.WARN


# (key, words, how a value is shown): the settings GD017 compares; equal when shown alike.
SETTING_FIELDS = (
    ("power_limit_w", "power limit", lambda w: f"{w:.0f} W"),
    ("ecc_mode", "ECC mode", _on_off),
    ("ecc_mode_pending", "ECC mode after the next reboot", _on_off),
    ("mig_mode", "MIG mode", _on_off),
    ("mig_mode_pending", "MIG mode after the next GPU reset", _on_off),
    ("compute_mode", "compute mode", str),
    ("persistence_mode", "persistence mode", _on_off),
)


def compare_settings(base: dict[str, Any], cur: dict[str, Any], tolerance: float) -> list[Finding]:
    pairs, _, _ = pair_gpus(base.get("gpus", []), cur.get("gpus", []))
    pairs = [(b, c) for b, c in pairs if answers(b) and answers(c)]
    changes = []
    compared: set[str] = set()
    for b, c in pairs:
        for key, words, show in SETTING_FIELDS:
            vb, vc = b.get(key), c.get(key)
            if vb is None or vc is None:  # a report older than the fact, or NVML could not read it
                continue
            if key == "power_limit_w" and b.get("name") != c.get("name"):
                continue  # each model has its own limits: another model is GD011's finding
            compared.add(words)
            if show(vb) == show(vc):
                continue
            status = _setting_status(key, vb, vc, tolerance)
            hint = HINT_HEALTHIER if _healthier(key, vb, vc) else HINT_RESTORE[key].format(was=show(vb))
            changes.append((_Change(SETTINGS, status, key, words, show(vb), show(vc), hint), c["index"]))
    out = _grouped(changes)
    if out:
        return out
    if not compared:
        why = "GPU settings not compared: the baseline records none (written before they were recorded)"
        return [_finding(SETTINGS, Status.SKIP, "host", why, {})]
    words = ", ".join(w for _, w, _ in SETTING_FIELDS if w in compared)
    message = f"{words} of {len(pairs)} GPU(s) as in the baseline"
    return [_finding(SETTINGS, Status.PASS, "host", message, {"compared": sorted(compared)})]


_REFRESH = "; if the change is intended, refresh the baseline"
HINT_RESTORE = {
    "power_limit_w": "Restore the limit ({was} in the baseline): `sudo nvidia-smi -i <gpu> -pl <watts>` (allowed "
    "range: `nvidia-smi -q -d POWER`), and look for a startup script or BMC that set it" + _REFRESH + ".",
    "ecc_mode": "Turn ECC back on: `sudo nvidia-smi -i <gpu> -e 1`, then reboot" + _REFRESH + ".",
    "ecc_mode_pending": "Set ECC on again before the next reboot: `sudo nvidia-smi -i <gpu> -e 1`" + _REFRESH + ".",
    "mig_mode": "Turn MIG off: `sudo nvidia-smi -i <gpu> -mig 0`, then reset the GPU" + _REFRESH + ".",
    "mig_mode_pending": "Cancel it before the GPU is reset: `sudo nvidia-smi -i <gpu> -mig 0`" + _REFRESH + ".",
    "compute_mode": "Restore the compute mode: `sudo nvidia-smi -i <gpu> -c {was}`" + _REFRESH + ".",
    "persistence_mode": "Turn persistence back on: `sudo systemctl enable --now nvidia-persistenced`" + _REFRESH + ".",
}
HINT_HEALTHIER = "The baseline was recorded with a setting gpudoctor warns about: refresh it from this run."


def _healthier(key: str, before: Any, now: Any) -> bool:
    """A change towards what the static checks want (ECC, persistence on; MIG off; default compute)."""
    if key in ("ecc_mode", "ecc_mode_pending", "persistence_mode"):
        return bool(now) and not before
    if key in ("mig_mode", "mig_mode_pending"):
        return not now and bool(before)
    if key == "compute_mode":
        return now == "default"
    return False


MEMORY_MARGIN_MIB = 1024  # GD826's margin: max(1 GiB, 5% of the GPU) (checks/gpu_modes.py)
MEMORY_MARGIN_SHARE = 0.05


def compare_memory_held(base: dict[str, Any], cur: dict[str, Any]) -> list[Finding]:
    pairs, _, _ = pair_gpus(base.get("gpus", []), cur.get("gpus", []))
    out, compared = [], 0
    for b, c in pairs:
        vb, vc = b.get("memory_used_mib"), c.get("memory_used_mib")
        if not (answers(b) and answers(c)) or vb is None or vc is None:
            continue
        compared += 1
        total = c.get("memory_total_mib") or 0
        margin = max(MEMORY_MARGIN_MIB, MEMORY_MARGIN_SHARE * total)
        if vc - vb > margin:
            message = (
                f"GPU {c['index']} has {vc / 1024:.1f} GiB in use, {vb / 1024:.1f} GiB in the baseline: "
                f"{(vc - vb) / 1024:.1f} GiB held that the run cannot have"
            )
            evidence = {"field": "memory_used_mib", "baseline": vb, "current": vc, "margin_mib": round(margin)}
            out.append(_finding(MEMORY_HELD, Status.WARN, gpu_subject(c["index"]), message, evidence))
    if out:
        return out
    if not compared:
        why = "GPU memory in use not compared: the baseline does not record it"
        return [_finding(MEMORY_HELD, Status.SKIP, "host", why, {})]
    message = f"GPU memory in use on {compared} GPU(s) within max(1 GiB, 5%) of the baseline's"
    return [_finding(MEMORY_HELD, Status.PASS, "host", message, {"gpus": compared})]


def compare_nccl_env(base: dict[str, Any], cur: dict[str, Any]) -> list[Finding]:
    eb, ec = base.get("nccl_env"), cur.get("nccl_env")
    if not isinstance(eb, dict) or not isinstance(ec, dict):
        why = "NCCL environment not compared: the baseline does not record it"
        return [_finding(NCCL_ENV, Status.SKIP, "host", why, {})]
    out = []
    for name in sorted(set(eb) | set(ec)):
        vb, vc = eb.get(name), ec.get(name)
        if vb == vc:
            continue
        if vb is None:
            message = f"{name}={vc!r} is set now, not in the baseline"
        elif vc is None:
            message = f"{name} is no longer set ({vb!r} in the baseline)"
        else:
            message = f"{name} is {vc!r} now, {vb!r} in the baseline"
        evidence = {"variable": name, "baseline": vb, "current": vc}
        out.append(_finding(NCCL_ENV, Status.WARN, "host", message, evidence))
    if out:
        return out
    message = f"NCCL environment as in the baseline ({len(ec)} variable(s) set)"
    return [_finding(NCCL_ENV, Status.PASS, "host", message, {"nccl_env": ec})]


def _size(n: int) -> str:
    for unit, div in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= div:
            return f"{n / div:g} {unit}"
    return f"{n} B"


def _comparable(base: dict[str, Any], cur: dict[str, Any], what: str) -> str:
    """Why two runs' measurements cannot be compared ('' when they can)."""
    for key, words in (("device", "device"), ("backend", "backend"), ("ranks", "ranks")):
        if base.get(key) is not None and cur.get(key) is not None and base[key] != cur[key]:
            return f"{what} not compared: the baseline ran {words} {base[key]}, this run {cur[key]}"
    return ""


def _change(now: float, before: float) -> float | None:
    """now / before - 1, or None when `before` is not above 0 or the ratio is no finite number."""
    if before <= 0:
        return None
    change = now / before - 1
    return change if math.isfinite(change) else None


def compare_busbw(base: dict[str, Any], cur: dict[str, Any], tolerance: float) -> Finding:
    """Judged where the sweep is bandwidth-bound, as GD601 judges it: the best busbw of the plateau.

    Small messages are latency-bound: their busbw is a few percent of the link's and swings with
    scheduling noise (a busy host, another job's launch), so one slow small size says nothing about
    the links. allreduce.plateau() picks the largest sizes (the last four doublings), and the best
    busbw among them on each side is compared: a link that went down lowers every size of the
    plateau; one slow repetition of one size does not decide. Every size stays in the evidence."""
    from gpudoctor.checks.allreduce import plateau

    why = _comparable(base, cur, "busbw")
    if why:
        return _finding(
            BUSBW, Status.SKIP, "host", why, {"baseline_ranks": base.get("ranks"), "ranks": cur.get("ranks")}
        )
    b = {s["bytes"]: s["busbw_gbps"] for s in base.get("sizes", [])}
    rows = []
    for s in cur.get("sizes", []):
        change = _change(s["busbw_gbps"], b[s["bytes"]]) if s["bytes"] in b else None
        if change is not None:
            rows.append(
                {
                    "bytes": s["bytes"],
                    "baseline_gbps": b[s["bytes"]],
                    "measured_gbps": s["busbw_gbps"],
                    "change": round(change, 4),
                }
            )
    evidence: dict[str, Any] = {"tolerance": tolerance, "backend": cur.get("backend"), "ranks": cur.get("ranks")}
    if not rows:
        return _finding(
            BUSBW, Status.SKIP, "host", "busbw not compared: no message size measured on both sides", evidence
        )
    _, judged = plateau([{"bytes": r["bytes"], "busbw_gbps": r["measured_gbps"]} for r in rows])
    for r in rows:
        r["bandwidth_bound"] = r["bytes"] in judged
    evidence["sizes"] = rows
    tail = [r for r in rows if r["bandwidth_bound"]]
    best_b, best_c = max(r["baseline_gbps"] for r in tail), max(r["measured_gbps"] for r in tail)
    change = _change(best_c, best_b)
    evidence |= {"bandwidth_bound_bytes": judged, "baseline_best_gbps": best_b, "best_gbps": best_c}
    if change is not None:
        evidence["change"] = round(change, 4)
    span = _size(min(judged)) if len(judged) == 1 else f"{_size(min(judged))} to {_size(max(judged))}"
    values = f"best {best_c:.2f} GB/s, baseline {best_b:.2f} GB/s"
    if change is not None and change < -tolerance:
        fell = sorted((r for r in tail if r["change"] < -tolerance), key=lambda r: r["change"])
        each = ", ".join(
            f"{_size(r['bytes'])} {r['baseline_gbps']:.2f} -> {r['measured_gbps']:.2f} GB/s ({_pct(r['change'])})"
            for r in fell[:3]
        )
        more = f" (+{len(fell) - 3} more)" if len(fell) > 3 else ""
        message = (
            f"busbw fell more than {tolerance:.0%} where it is bandwidth-bound ({span}): {values} ({_pct(change)}); "
            f"{each}{more}"
        )
        return _finding(BUSBW, Status.FAIL, "host", message, evidence)
    slower = [r for r in rows if not r["bandwidth_bound"] and r["change"] < -tolerance]
    note = f"; {len(slower)} latency-bound size(s) slower, not judged" if slower else ""
    message = (
        f"busbw within {tolerance:.0%} of the baseline (or better) where it is bandwidth-bound ({span}): {values}{note}"
    )
    return _finding(BUSBW, Status.PASS, "host", message, evidence)


def compare_ddp(base: dict[str, Any], cur: dict[str, Any], tolerance: float) -> Finding:
    why = _comparable(base, cur, "DDP step time")
    evidence = {"tolerance": tolerance, "baseline_step_s": base["step_s"], "step_s": cur["step_s"]}
    if why:
        return _finding(DDP_STEP, Status.SKIP, "host", why, evidence)
    change = _change(cur["step_s"], base["step_s"]) or 0.0
    evidence["change"] = round(change, 4)
    values = f"{base['step_s'] * 1000:.1f} ms in the baseline, {cur['step_s'] * 1000:.1f} ms now ({_pct(change)})"
    if change > tolerance:
        return _finding(
            DDP_STEP, Status.WARN, "host", f"DDP step slower by more than {tolerance:.0%}: {values}", evidence
        )
    return _finding(DDP_STEP, Status.PASS, "host", f"DDP step time {values}", evidence)


def compare_p2p(base: dict[str, Any], cur: dict[str, Any], tolerance: float) -> list[Finding]:
    out = []
    common = [p for p in cur if p in base and _change(cur[p]["p2p_gbps"], base[p]["p2p_gbps"]) is not None]
    for pair in common:
        b, c = base[pair]["p2p_gbps"], cur[pair]["p2p_gbps"]
        change = _change(c, b) or 0.0
        if change < -tolerance:
            out.append(
                _finding(
                    P2P,
                    Status.FAIL,
                    f"pair:{pair}",
                    f"GPU {pair.replace('-', ' -> ')} P2P copy {b:.1f} GB/s in the baseline, {c:.1f} GB/s now "
                    f"({_pct(change)}, tolerance {tolerance:.0%})",
                    {"baseline_gbps": b, "measured_gbps": c, "change": round(change, 4), "path": cur[pair].get("path")},
                )
            )
    if not common:
        return [_finding(P2P, Status.SKIP, "host", "P2P not compared: no GPU pair measured on both sides", {})]
    if not out:
        out.append(
            _finding(
                P2P,
                Status.PASS,
                "host",
                f"P2P copies within {tolerance:.0%} of the baseline (or better) on {len(common)} pair(s)",
                {"tolerance": tolerance, "pairs": len(common)},
            )
        )
    return out


def compare(base: Side, cur: Side, tolerance: float = DEFAULT_TOLERANCE) -> list[CheckResult]:
    """The comparison as two check results: machine facts, then measurements."""
    results = []
    facts: list[Finding]
    if base.facts is None or cur.facts is None:
        old = base if base.facts is None else cur
        why = (
            f"{old.label} records no machine facts (written by gpudoctor {old.written_by or 'before 0.2'}); "
            "save a new report with this gpudoctor to compare them"
        )
        facts = [_finding(GPUS, Status.SKIP, "host", why, {})]
    else:
        facts = compare_gpus(base.facts, cur.facts) + compare_software(base.facts, cur.facts)
        facts += compare_links(base.facts, cur.facts) + compare_settings(base.facts, cur.facts, tolerance)
        facts += compare_memory_held(base.facts, cur.facts) + compare_nccl_env(base.facts, cur.facts)
    results.append(CheckResult("baseline_facts", f"Machine facts against {base.label}", facts, 0.0))
    results.append(
        CheckResult(
            "baseline_measurements",
            f"Measurements against {base.label}",
            compare_measurements(base, cur, tolerance),
            0.0,
        )
    )
    return results


def compare_measurements(base: Side, cur: Side, tolerance: float) -> list[Finding]:
    mb, mc = base.measurements, cur.measurements
    if not mb and not mc:
        why = "nothing measured on either side (snapshots, or runs with --quick/--snapshot): facts only"
        return [_finding(BUSBW, Status.SKIP, "host", why, {})]
    out: list[Finding] = []
    for key, code, what in (
        ("allreduce", BUSBW, "all-reduce sweep"),
        ("ddp", DDP_STEP, "DDP run"),
        ("p2p", P2P, "P2P"),
    ):
        if key not in mb or key not in mc:
            where = "the baseline" if key not in mb else "this run"
            out.append(_finding(code, Status.SKIP, "host", f"{what} not compared: none in {where}", {}))
        elif key == "allreduce":
            out.append(compare_busbw(mb[key], mc[key], tolerance))
        elif key == "ddp":
            out.append(compare_ddp(mb[key], mc[key], tolerance))
        else:
            out.extend(compare_p2p(mb[key], mc[key], tolerance))
    return out
