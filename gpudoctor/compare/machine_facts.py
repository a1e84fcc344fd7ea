"""Machine facts compared for changes (facts.py records them): GPU count, models and UUIDs (GD011),
driver, VBIOS, InfoROM and GSP firmware (GD012), NVLink counts and PCIe links (GD013), power limit
and ECC/MIG/compute/persistence modes (GD017), GPU memory already in use (GD018), the NCCL_* /
TORCH_NCCL_* environment (GD019). A GPU is paired with the baseline's by PCI bus id; equal changes
on several GPUs are one finding.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpudoctor.compare.codes import GPUS, LINKS, MEMORY_HELD, NCCL_ENV, SETTINGS, SOFTWARE, finding
from gpudoctor.engine.codes import Code
from gpudoctor.findings import Finding, Status, gpu_subject


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
            finding(
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
    return finding(GPUS, Status.FAIL, gpu_subject(c["index"]), message, evidence, HINT_LOST)


def compare_gpus(base: dict[str, Any], cur: dict[str, Any]) -> list[Finding]:
    gb, gc = base.get("gpus", []), cur.get("gpus", [])
    pairs, gone, new = pair_gpus(gb, gc)
    out = []
    counts = {"baseline_count": len(gb), "count": len(gc)}
    for g in gone:
        message = f"{_gpu_name(g)} of the baseline is gone: {len(gc)} GPU(s) now, {len(gb)} in the baseline"
        out.append(finding(GPUS, Status.FAIL, gpu_subject(g["index"]), message, {"baseline": g, **counts}, HINT_GONE))
    for g in new:
        if not answers(g):  # a lost GPU whose bus id is unknown pairs with nothing: still lost, not new
            out.append(_lost(None, g, counts))
            continue
        message = f"{_gpu_name(g)} is new: {len(gc)} GPU(s) now, {len(gb)} in the baseline"
        out.append(finding(GPUS, Status.WARN, gpu_subject(g["index"]), message, {"current": g, **counts}, HINT_NEW))
    # A GPU that stopped answering is the baseline's board, lost: its empty name and UUID are no swap.
    for b, c in pairs:
        if not answers(c):
            out.append(_lost(b, c, counts))
        elif not answers(b):
            message = f"GPU {c['index']} answers now; it was lost when the baseline was recorded"
            evidence = {"field": "lost", "baseline": b, "current": c}
            out.append(finding(GPUS, Status.WARN, gpu_subject(c["index"]), message, evidence, HINT_BASELINE_LOST))
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
                    finding(
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
            finding(
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
        out.append(finding(SOFTWARE, Status.WARN, "host", f"{text} since the baseline", evidence, HINT_SOFTWARE))
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
            finding(
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
            out.append(finding(LINKS, Status.FAIL, gpu_subject(c["index"]), message, evidence, HINT_LOST))
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
            finding(LINKS, Status.PASS, "host", f"NVLink and PCIe links of {compared} GPU(s) as in the baseline", {})
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
        return [finding(SETTINGS, Status.SKIP, "host", why, {})]
    words = ", ".join(w for _, w, _ in SETTING_FIELDS if w in compared)
    message = f"{words} of {len(pairs)} GPU(s) as in the baseline"
    return [finding(SETTINGS, Status.PASS, "host", message, {"compared": sorted(compared)})]


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
            out.append(finding(MEMORY_HELD, Status.WARN, gpu_subject(c["index"]), message, evidence))
    if out:
        return out
    if not compared:
        why = "GPU memory in use not compared: the baseline does not record it"
        return [finding(MEMORY_HELD, Status.SKIP, "host", why, {})]
    message = f"GPU memory in use on {compared} GPU(s) within max(1 GiB, 5%) of the baseline's"
    return [finding(MEMORY_HELD, Status.PASS, "host", message, {"gpus": compared})]


def compare_nccl_env(base: dict[str, Any], cur: dict[str, Any]) -> list[Finding]:
    eb, ec = base.get("nccl_env"), cur.get("nccl_env")
    if not isinstance(eb, dict) or not isinstance(ec, dict):
        why = "NCCL environment not compared: the baseline does not record it"
        return [finding(NCCL_ENV, Status.SKIP, "host", why, {})]
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
        out.append(finding(NCCL_ENV, Status.WARN, "host", message, evidence))
    if out:
        return out
    message = f"NCCL environment as in the baseline ({len(ec)} variable(s) set)"
    return [finding(NCCL_ENV, Status.PASS, "host", message, {"nccl_env": ec})]
