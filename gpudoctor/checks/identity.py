"""GD3 (GPU identity): are the visible GPUs alike? Name the odd one out and what it costs.

A data-parallel step finishes when the slowest rank does, and every rank holds the same
model, so the weakest card sets the pace and the largest batch. Traits are compared across
the visible GPUs; the majority value is the reference, and each GPU that differs gets a
finding (subject gpu:<nvidia-smi index>). Without a majority (2 vs 2) one host finding lists
the groups. A reading NVML could not give is left out of the comparison and named in a warning
(checks/unread.py: an error or a refused permission is unknown, not "alike"); NOT_SUPPORTED for an
optional feature is a fact (no GSP firmware reads as "off") and stays silent otherwise. GPUs NVML
cannot talk to at all (lost, no handle) are not among the visible GPUs: GD827 names those.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gpudoctor.checks.unread import unread, unreadable_finding
from gpudoctor.engine import CheckContext, Code, check
from gpudoctor.findings import Finding, Status, gpu_subject
from gpudoctor.knowledge.gpu_products import ecc_expected_on
from gpudoctor.knowledge.pcie_model import PCIE_GBPS_PER_LANE
from gpudoctor.knowledge.units import size_mib
from gpudoctor.records import Record, record
from gpudoctor.snapshot import Gpu, Missing

MODEL = Code(
    "GD301",
    "gpu-model-mismatch",
    "The visible GPUs are the same model",
    what="Compares the product name (nvmlDeviceGetName) of every visible GPU.",
    why="In data-parallel training every step waits for the slowest rank, so one slower card paces "
    "the whole run; NCCL also tunes for the weakest link.",
    fix="Train on identical GPUs: hide the odd card with CUDA_VISIBLE_DEVICES (set "
    "CUDA_DEVICE_ORDER=PCI_BUS_ID first so the indices match nvidia-smi), or move it to another machine.",
)
MEMORY = Code(
    "GD302",
    "gpu-memory-mismatch",
    "The visible GPUs have the same memory size",
    what="Compares total framebuffer memory (nvmlDeviceGetMemoryInfo) of the visible GPUs, in GiB "
    "(sizes that round to the same whole GiB count as equal).",
    why="Each rank holds the same model and batch, so the smallest card decides the largest batch "
    "or model that fits; the memory of the larger cards goes unused, or the small one runs out of memory.",
    fix="Use GPUs with the same memory size, or size batch and model for the smallest card "
    "(hide the small card with CUDA_VISIBLE_DEVICES).",
)
VBIOS = Code(
    "GD303",
    "vbios-mismatch",
    "The visible GPUs run the same VBIOS",
    what="Compares the VBIOS version string (nvmlDeviceGetVbiosVersion) of GPUs of the same model.",
    why="Different firmware can mean different clocks, power behaviour and fixes; a card that was "
    "serviced or swapped often carries another VBIOS and behaves differently under load.",
    fix="Ask the vendor for the matching VBIOS (data-centre boards are flashed with the vendor's tools, "
    "e.g. nvflash or the OEM firmware bundle); until then, watch the odd card for clock differences.",
)
POWER = Code(
    "GD304",
    "power-limit-mismatch",
    "The visible GPUs have the same power limit",
    what="Compares the enforced power limit (nvmlDeviceGetEnforcedPowerLimit) of the visible GPUs.",
    why="A GPU capped lower than its peers clocks down under load and becomes the straggler that every step waits for.",
    fix="Set the same limit on every GPU: `sudo nvidia-smi -i <gpu> -pl <watts>` (check the allowed "
    "range with `nvidia-smi -q -d POWER`), and look for a cap set by a startup script or a BMC.",
)
MODES = Code(
    "GD305",
    "gpu-mode-mismatch",
    "The visible GPUs have the same compute, MIG and ECC modes",
    what="Compares compute mode, MIG mode and ECC mode (current) of the visible GPUs. Two of them have an "
    "owner that names every GPU concerned, so GD305 leaves them out: persistence mode off is GD105's, ECC "
    "off on a data-centre GPU GD833's; GD305 compares ECC among GeForce and workstation cards. A mode NVML "
    "could not read (persistence included) is named here as unreadable.",
    why="A GPU whose modes differ from its peers behaves differently in the same job: refused contexts in "
    "exclusive mode, a MIG GPU that cannot be used whole, "
    "a little less memory with ECC on.",
    fix="Set the modes alike: `sudo nvidia-smi -c DEFAULT` (compute), `sudo nvidia-smi -mig 0` (MIG, needs "
    "a GPU reset), `sudo nvidia-smi -e 1` (ECC, "
    "takes effect after a reboot).",
)
PCIE = Code(
    "GD306",
    "pcie-max-link-mismatch",
    "The visible GPUs have the same maximum PCIe link",
    what="Compares the maximum PCIe generation and width each GPU can reach in its slot "
    "(nvmlDeviceGetMaxPcieLinkGeneration / Width, limited by GPU and slot together).",
    why="A card in a narrower or older slot has less host bandwidth: data loading, checkpointing and "
    "NCCL traffic over PCIe are slower for that rank, and every step waits for it.",
    fix="Move the card to a full x16 slot of the same generation as the others, or check the BIOS "
    "slot settings (bifurcation, forced generation) and riser cables.",
)
FIRMWARE = Code(
    "GD307",
    "firmware-mismatch",
    "GPUs of one model run the same InfoROM and GSP firmware",
    what="Compares, among GPUs of the same model, the InfoROM image version (nvmlDeviceGetInforomImageVersion, "
    "nvidia-smi -q 'Inforom Version / Image Version') and the GSP firmware version "
    "(nvmlDeviceGetGspFirmwareVersion; 'off' where NVML answers NOT_SUPPORTED, as it does for a GPU "
    "without GSP firmware: nvidia-smi prints N/A), beside the VBIOS (GD303). Like every GD3 comparison, "
    "a reading NVML could not give (an error) is named as unreadable (warn; one NVML refused this user "
    "needs root: a skip) and left out, never taken as alike or as 'off'.",
    why="The InfoROM holds the board's configuration and its ECC, power and error records, the GSP firmware "
    "runs the GPU's management: a card that was serviced, swapped or flashed apart from its peers behaves "
    "differently under faults and load, and NVIDIA support asks for matching firmware before anything else.",
    fix="Bring the odd board to the fleet's firmware with the vendor's update bundle (nvflash / the OEM "
    "firmware package for the InfoROM and VBIOS); GSP firmware comes with the driver: the same driver with "
    "GSP enabled on every GPU (NVreg_EnableGpuFirmware) makes it alike.",
)
CODES = [MODEL, MEMORY, VBIOS, POWER, MODES, PCIE, FIRMWARE]


def _article(name: str) -> str:
    return "an" if name[:1].upper() in "AEIOU" or name.startswith("NVIDIA") else "a"


def _on_off(value: Any) -> str:
    return "on" if value else "off"


# How pynvml words NVML_ERROR_FUNCTION_NOT_FOUND, and how the probe notes a call this nvidia-ml-py
# lacks: both are Missing("unsupported") about the driver or library, not about the GPU.
_NO_CALL = ("Function Not Found", "not in this nvidia-ml-py")


def _gsp(gpu: Gpu) -> Any:
    """The GSP firmware version, or "off" where NVML says the GPU runs none: NOT_SUPPORTED is how
    NVML answers for a GPU without GSP firmware (pre-Turing, or NVreg_EnableGpuFirmware=0; nvidia-smi
    prints N/A: NVIDIA driver README, "GSP Firmware"). An error or a refused permission is unknown,
    and a driver without the call says nothing about the GPU (not collected)."""
    value = gpu.gsp_firmware
    if isinstance(value, Missing) and value.reason == "unsupported":
        return Missing("not_collected", value.detail) if any(s in value.detail for s in _NO_CALL) else "off"
    return value


def _pcie(gpu: Gpu) -> Any:
    gen, width = gpu.pcie_gen_max, gpu.pcie_width_max
    if isinstance(gen, Missing):
        return gen
    if isinstance(width, Missing):
        return width
    return (gen, width)


@record
class Trait(Record):
    code: Code
    label: str  # evidence key and wording
    get: Callable[[Gpu], Any]
    show: Callable[[Any], str]
    status: Status
    cost: str
    key: Callable[[Any], Any] = lambda v: v  # values with the same key count as equal
    per_model: bool = False  # compare only GPUs of the same model (a 4080 has its own VBIOS)
    always_there: bool = False  # every GPU has it: NOT_SUPPORTED is a missing reading, not a fact
    # GPUs another check judges on this trait (its owner says it once): left out of the comparison,
    # still named here when NVML could not read it.
    judged_elsewhere: Callable[[Gpu], bool] = lambda g: False
    # For traits where one value is worse (less memory, a lower power cap, a slower PCIe link): the
    # value's capacity, higher better. The finding then names the GPUs that are worse off, whether
    # they are the odd ones or the majority (a faster odd card is no fault of that card).
    capacity: Callable[[Any], float] | None = None

    def lead(self, value: Any) -> str:
        """'is an NVIDIA GeForce RTX 4080' / 'has power limit 350 W'."""
        if self.label == "model":
            return f"is {_article(value)} {value}"
        return f"has {self.label} {self.show(value)}"


TRAITS = [
    Trait(MODEL, "model", lambda g: g.name, str, Status.FAIL, "every step waits for the slowest card"),
    Trait(
        MEMORY,
        "memory",
        lambda g: g.memory_total_mib,
        size_mib,
        Status.FAIL,
        "the smallest card caps the batch and model size of every rank",
        key=lambda mib: round(mib / 1024),
        always_there=True,
        capacity=lambda mib: round(mib / 1024),
    ),
    Trait(
        VBIOS,
        "VBIOS",
        lambda g: g.vbios,
        str,
        Status.WARN,
        "different firmware can clock and behave differently",
        per_model=True,
        always_there=True,
    ),
    Trait(
        POWER,
        "power limit",
        lambda g: g.power_limit_w,
        lambda w: f"{w:.0f} W",
        Status.WARN,
        "a lower cap clocks the card down under load and every step waits for it",
        key=lambda w: round(w),
        per_model=True,
        capacity=lambda w: round(w),
    ),
    Trait(
        MODES,
        "persistence mode",
        lambda g: g.persistence_mode,
        _on_off,
        Status.WARN,
        "without persistence the driver re-initialises the GPU for each process (slower start, settings reset)",
        judged_elsewhere=lambda g: True,  # GD105 names every GPU without persistence
    ),
    Trait(
        MODES,
        "compute mode",
        lambda g: g.compute_mode,
        str,
        Status.WARN,
        "an exclusive or prohibited GPU refuses contexts the others accept",
        always_there=True,
    ),
    Trait(
        MODES,
        "MIG mode",
        lambda g: g.mig_mode_current,
        _on_off,
        Status.WARN,
        "a GPU in MIG mode cannot be used as a whole GPU by the run",
    ),
    Trait(
        MODES,
        "ECC mode",
        lambda g: g.ecc_mode_current,
        _on_off,
        Status.WARN,
        "ECC changes usable memory and speed, and only the ECC GPUs catch memory errors",
        judged_elsewhere=ecc_expected_on,  # GD833: ECC off on a data-centre GPU is a warning of its own
    ),
    Trait(
        FIRMWARE,
        "InfoROM image",
        lambda g: g.inforom_image,
        str,
        Status.WARN,
        "a board serviced or flashed apart from its peers can behave differently",
        per_model=True,
    ),
    Trait(
        FIRMWARE,
        "GSP firmware",
        _gsp,
        str,
        Status.WARN,
        "the GPU's management firmware differs: different behaviour under faults and load",
        per_model=True,
    ),
    Trait(
        PCIE,
        "max PCIe link",
        _pcie,
        lambda v: f"Gen{v[0]} x{v[1]}",
        Status.WARN,
        "less host bandwidth for that rank's data loading and PCIe traffic",
        per_model=True,
        always_there=True,
        capacity=lambda v: PCIE_GBPS_PER_LANE.get(v[0], 0.0) * v[1],
    ),
]


def _gpu_names(indices: list[int]) -> str:
    return ("GPU " if len(indices) == 1 else "GPUs ") + ",".join(str(i) for i in indices)


def compare(gpus: list[Gpu], trait: Trait) -> list[Finding]:
    """Findings for one trait over the visible GPUs: one pass, or the odd ones out."""
    known = [(g, trait.get(g)) for g in gpus]
    known = [(g, v) for g, v in known if not isinstance(v, Missing)]
    per_gpu = {str(g.index): trait.show(v) for g, v in known}
    if len(known) < 2:
        return []
    groups: dict[Any, list[tuple[Gpu, Any]]] = {}
    for g, v in known:
        groups.setdefault(trait.key(v), []).append((g, v))
    ranked = sorted(groups.values(), key=len, reverse=True)
    evidence_all = {trait.label: per_gpu}
    if len(ranked) == 1:
        value = ranked[0][0][1]
        msg = f"{len(known)} GPUs alike: {trait.label} {trait.show(value)}"
        return [Finding(trait.code.code, Status.PASS, "host", msg, "", evidence_all)]
    if trait.capacity is not None:
        return _worse_off(ranked, trait, evidence_all)
    majority = ranked[0]
    if len(ranked[1]) == len(majority):  # no majority: list the groups
        parts = "; ".join(f"{_gpu_names([g.index for g, _ in grp])}: {trait.show(grp[0][1])}" for grp in ranked)
        msg = f"{trait.label} differs between the GPUs ({parts}): {trait.cost}"
        return [Finding(trait.code.code, trait.status, "host", msg, trait.code.fix, evidence_all)]
    expected = trait.show(majority[0][1])
    out = []
    for grp in ranked[1:]:
        for g, v in grp:
            msg = f"GPU {g.index} {trait.lead(v)}, the others {expected}: {trait.cost}"
            evidence = {trait.label: trait.show(v), "expected": expected, "others": [h.index for h, _ in majority]}
            out.append(Finding(trait.code.code, trait.status, gpu_subject(g.index), msg, trait.code.fix, evidence))
    return out


def _worse_off(ranked: list[list[tuple[Gpu, Any]]], trait: Trait, evidence_all: dict[str, Any]) -> list[Finding]:
    """An ordered trait that differs: name the GPUs below the best value, each against the best. When
    they are the fewer, one finding each; when they are as many as the others or more (a faster odd
    card), one host finding that names them."""
    assert trait.capacity is not None
    by_capacity = sorted(ranked, key=lambda grp: trait.capacity(grp[0][1]), reverse=True)  # type: ignore[misc]
    best = by_capacity[0]
    worse = [(g, v) for grp in by_capacity[1:] for g, v in grp]
    best_text = trait.show(best[0][1])
    best_gpus = _gpu_names([g.index for g, _ in best])
    if len(worse) < len(best):
        out = []
        for g, v in worse:
            msg = f"GPU {g.index} {trait.lead(v)}, the others {best_text}: {trait.cost}"
            evidence = {trait.label: trait.show(v), "expected": best_text, "others": [h.index for h, _ in best]}
            out.append(Finding(trait.code.code, trait.status, gpu_subject(g.index), msg, trait.code.fix, evidence))
        return out
    parts = "; ".join(f"{_gpu_names([g.index for g, _ in grp])}: {trait.show(grp[0][1])}" for grp in by_capacity[1:])
    msg = f"{trait.label} differs: {parts}, below {best_gpus}'s {best_text}: {trait.cost}"
    evidence = {**evidence_all, "below_best": [g.index for g, _ in worse], "best": best_text}
    return [Finding(trait.code.code, trait.status, "host", msg, trait.code.fix, evidence)]


def _unreadable(gpus: list[Gpu]) -> list[Finding]:
    """One warning per code for the traits NVML could not read on some GPUs (those with the same
    GPUs and reasons share it): they were left out of the comparison, not found alike."""
    groups: dict[tuple[str, tuple[tuple[int, str], ...]], tuple[list[str], dict[int, Missing]]] = {}
    for trait in TRAITS:
        where = {g.index: m for g in gpus if (m := unread(trait.get(g), always_there=trait.always_there)) is not None}
        if where:
            key = (trait.code.code, tuple((i, m.reason) for i, m in sorted(where.items())))
            groups.setdefault(key, ([], where))[0].append(trait.label)
    out = []
    for (code, _), (labels, where) in groups.items():
        judged = "not compared" if len(where) == len(gpus) else "left out of the comparison with the other GPUs"
        out.append(unreadable_finding(code, ", ".join(labels), where, judged))
    return out


@check("identity", "GPU models and settings alike", codes=CODES, needs="visible")
def identity(ctx: CheckContext) -> list[Finding]:
    gpus = list(ctx.visible.gpus)  # GPUs NVML cannot talk to are not among them (GD827)
    if len(gpus) < 2:
        g = gpus[0]
        msg = f"one GPU visible ({g.name}): nothing to compare"
        return [Finding(MODEL.code, Status.PASS, gpu_subject(g.index), msg, "", {"model": g.name})]
    models: dict[str, list[Gpu]] = {}
    for g in gpus:
        models.setdefault(g.name, []).append(g)
    out: list[Finding] = []
    for trait in TRAITS:
        for group in models.values() if trait.per_model else [gpus]:
            out.extend(compare([g for g in group if not trait.judged_elsewhere(g)], trait))
    return _unreadable(gpus) + out
