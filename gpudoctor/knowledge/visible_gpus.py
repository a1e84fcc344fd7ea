"""Which physical GPUs a CUDA process started now would see, and in which order.

`resolve(snapshot)` reads `CUDA_VISIBLE_DEVICES` and `CUDA_DEVICE_ORDER` from the snapshot's
environment and returns a `Visibility`: the devices as `cuda:0..n-1` mapped to NVML indices
and UUIDs, plus the problems that made CUDA drop entries. Never imports torch.

The parser agrees with torch 2.x (`torch.cuda._parse_visible_devices` and the counting in
`_device_count_nvml` / `_transform_uuid_to_ordinals`), which mirror CUDA's own rules:

- Unset: every GPU. Set but empty: no GPU.
- The first entry decides the kind: `GPU-` UUIDs, `MIG-` UUIDs, or integers.
- Integers read like C `strtoul`: surrounding whitespace and a sign are accepted, trailing
  junk is ignored (`"1gpu"` is 1, `"0 1"` is 0). A negative or unreadable entry ends the list.
- UUID entries must start with the prefix (no spaces) and may be unique prefixes of a
  UUID; an unknown or ambiguous one ends the list.
- A repeated device makes CUDA see no devices at all.
- An index past the device count ends the list there.

Where torch's parser raises (a bare sign such as `"+"`), we read the entry as invalid, which
is what CUDA's `strtoul`-based parsing does.

Order: integers index CUDA's enumeration, which is `CUDA_DEVICE_ORDER`. `PCI_BUS_ID` is NVML
order (nvidia-smi's numbers). The default `FASTEST_FIRST` uses a speed heuristic inside the
driver that NVML does not expose; we approximate it as: higher compute capability first, then
more memory (a proxy for the bigger chip of a generation), then PCI bus order. On identical
GPUs this is PCI order, which matches what CUDA does. An unreadable compute capability or memory
size never reorders (a heuristic of ours, documented in docs/checks/GD205.md): a GPU takes the
reading of another GPU of the same name (the same product is the same chip and memory), and when
a model's reading is unknown on every GPU of it, the order cannot be predicted: we assume PCI bus
order for all (what CUDA does among equals) and list those GPUs in `Visibility.order_unknown`, so
GD205 can say the cuda: numbering is a guess.

Lost GPUs: a GPU NVML reports as lost (GPU_IS_LOST: fallen off the bus) or gives no handle for
(`unreadable`) is not in CUDA's enumeration: the driver did not bring it up, so CUDA numbers the
remaining GPUs 0..n-1 (integer entries then pick other GPUs than before: a "lost_shift" problem),
and a UUID entry naming it ends the list like any unknown UUID. `Visibility.lost` lists them, and
`lost_wanted` those the run would have used had they answered (GD827 fails for those). This is
the one place the exclusion happens: every check that asks which GPUs the run uses gets the same
answer. (When the driver loses a GPU, cuInit may also fail on every GPU of the node until a
reboot; GD827's power-cycle advice covers that case.)

MIG: a CUDA process can use one MIG instance only. A selected GPU in MIG mode contributes its
first MIG instance if no instance was taken yet, and nothing otherwise; `MIG-` UUID lists keep
their first instance. (NVIDIA MIG user guide; pytorch#130181.)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from gpudoctor.errors import shown
from gpudoctor.records import Record, record
from gpudoctor.snapshot import Gpu, MigDevice, Snapshot, known

PCI_BUS_ID = "PCI_BUS_ID"
FASTEST_FIRST = "FASTEST_FIRST"
ALL = object()  # parse result for an unset variable: every device


def unreadable(gpu: Gpu) -> bool:
    """NVML cannot talk to this GPU: lost (GPU_IS_LOST) or no handle at all. CUDA does not
    enumerate it; GD827 reports it."""
    return gpu.lost or known(gpu.unreachable)


@record
class VisibleDevice(Record):
    """One `cuda:<cuda_index>` device: a physical GPU, or one MIG instance of it."""

    cuda_index: int
    gpu: Gpu
    mig: MigDevice | None = None

    @property
    def nvml_index(self) -> int:
        return self.gpu.index

    @property
    def uuid(self) -> str:
        """The UUID CUDA reports for this device (the MIG instance's UUID under MIG)."""
        return self.mig.uuid if self.mig is not None else self.gpu.uuid


@record
class Problem(Record):
    """Why an entry of CUDA_VISIBLE_DEVICES (or the order) does not do what it seems to."""

    kind: str  # "empty", "invalid", "out_of_range", "duplicate", "unknown_uuid", "ambiguous_uuid",
    # "lost_uuid", "lost_shift", "trailing_junk", "mig_one_instance", "mig_no_instance", "unknown_order"
    entry: str  # the entry as written ("" when about the whole value)
    message: str  # one line for the user
    dropped: tuple[str, ...] = ()  # the entries CUDA ignores because of it


@record
class Visibility(Record):
    raw: str | None  # CUDA_VISIBLE_DEVICES as set; None when unset
    order: str  # the order CUDA uses: PCI_BUS_ID or FASTEST_FIRST
    order_raw: str | None  # CUDA_DEVICE_ORDER as set
    enumeration: tuple[Gpu, ...]  # every physical GPU CUDA enumerates (lost ones aside), in its order
    devices: tuple[VisibleDevice, ...]  # cuda:0, cuda:1, ...
    problems: tuple[Problem, ...]
    lost: tuple[Gpu, ...] = ()  # GPUs NVML lists but CUDA does not enumerate (lost, no handle), NVML order
    lost_wanted: tuple[int, ...] = ()  # NVML indices of lost GPUs the run would use had they answered
    order_unknown: tuple[int, ...] = ()  # FASTEST_FIRST only: GPUs whose place cannot be read (PCI assumed)

    @property
    def gpus(self) -> tuple[Gpu, ...]:
        """The physical GPUs the run uses, in CUDA order."""
        return tuple(d.gpu for d in self.devices)

    @property
    def nvml_indices(self) -> tuple[int, ...]:
        return tuple(d.nvml_index for d in self.devices)

    @property
    def count(self) -> int:
        return len(self.devices)


def mig_gpus(vis: Visibility) -> list[Gpu]:
    """The GPUs in MIG mode the run selected: the one whose instance it got and those the
    one-instance rule dropped. GD201 and GD820 both speak of these."""
    by_index = {g.index: g for g in vis.enumeration}
    picked = {d.nvml_index for d in vis.devices if d.mig is not None}
    picked |= {int(p.entry) for p in vis.problems if p.kind == "mig_no_instance" and p.entry.isdigit()}
    return [by_index[i] for i in sorted(picked) if i in by_index]


# ---------------------------------------------------------------------------------------
# Parsing (no snapshot needed): the same answers as torch.cuda._parse_visible_devices


def strtoul(text: str) -> int:
    """The number an entry starts with, as CUDA reads it; -1 when there is none or it is negative."""
    text = text.strip()
    end = 0
    while end < len(text) and (text[end] in "0123456789" or (end == 0 and text[end] in "+-")):
        end += 1
    digits = text[:end]
    if not digits.lstrip("+-"):
        return -1
    return int(digits)


@record
class Parsed(Record):
    kind: str  # "all", "int", "GPU-", "MIG-"
    entries: tuple[str, ...]  # the entries as written, in order, that CUDA reads
    values: tuple[int, ...] | tuple[str, ...]  # ints, or UUID (prefix) strings
    problems: tuple[Problem, ...]


def parse(raw: str | None) -> Parsed:
    if raw is None:
        return Parsed("all", (), (), ())
    entries = raw.split(",")
    if raw.startswith(("GPU-", "MIG-")):
        return _parse_prefixed(raw[:4], entries)
    return _parse_ints(raw, entries)


def _rest(entries: list[str], i: int) -> tuple[str, ...]:
    return tuple(entries[i:])


def _parse_prefixed(prefix: str, entries: list[str]) -> Parsed:
    values: list[str] = []
    seen: set[str] = set()  # a set beside the list: a long list stays linear (hostile review M7)
    for i, entry in enumerate(entries):
        if entry in seen:
            msg = f"{entry!r} is listed twice: CUDA then sees no devices at all"
            return Parsed(prefix, (), (), (Problem("duplicate", entry, msg, tuple(entries)),))
        if not entry.startswith(prefix):
            why = "has a stray space" if entry.strip().startswith(prefix) else f"does not start with {prefix}"
            msg = f"entry {entry!r} {why}: CUDA stops reading there"
            problem = Problem("invalid", entry, msg, _rest(entries, i))
            return Parsed(prefix, tuple(entries[:i]), tuple(values), (problem,))
        values.append(entry)
        seen.add(entry)
    return Parsed(prefix, tuple(entries), tuple(values), ())


def _parse_ints(raw: str, entries: list[str]) -> Parsed:
    if raw.strip() == "":
        msg = "CUDA_VISIBLE_DEVICES is set but empty: CUDA sees no devices"
        return Parsed("int", (), (), (Problem("empty", raw, msg),))
    values: list[int] = []
    seen: set[int] = set()
    problems: list[Problem] = []
    for i, entry in enumerate(entries):
        value = strtoul(entry)
        if value in seen:
            msg = f"device {value} is listed twice ({shown(raw, 80)}): CUDA then sees no devices at all"
            return Parsed("int", (), (), (Problem("duplicate", entry, msg, tuple(entries)),))
        if value < 0:
            hint = " (UUIDs must not be preceded by a space)" if entry.strip().startswith(("GPU-", "MIG-")) else ""
            msg = f"entry {entry!r} is not a device number{hint}: CUDA stops reading there"
            problems.append(Problem("invalid", entry, msg, _rest(entries, i)))
            break
        number = entry.strip().lstrip("+")
        if number != str(value) and not (number.isdigit() and int(number) == value):
            msg = f"entry {entry!r} reads as {value}: CUDA ignores what follows the number"
            problems.append(Problem("trailing_junk", entry, msg))
        values.append(value)
        seen.add(value)
    return Parsed("int", tuple(entries[: len(values)]), tuple(values), tuple(problems))


# ---------------------------------------------------------------------------------------
# Resolution against a snapshot


def _speed(gpu: Gpu) -> tuple[int, int, int] | None:
    """(compute capability major, minor, memory MiB), or None when NVML could not read them."""
    if not isinstance(gpu.compute_capability, str) or not isinstance(gpu.memory_total_mib, int):
        return None
    try:
        major, minor = gpu.compute_capability.split(".")
        return int(major), int(minor), gpu.memory_total_mib
    except ValueError:
        return None


def unknown_speed(gpus: list[Gpu]) -> tuple[int, ...]:
    """The GPUs whose FASTEST_FIRST place cannot be read: no readable compute capability and
    memory, neither their own nor another GPU's of the same name. Empty when every GPU is the
    same model (identical GPUs keep PCI order whatever their readings)."""
    if len({g.name for g in gpus}) < 2:
        return ()
    by_name = {g.name: _speed(g) for g in gpus if _speed(g) is not None}
    return tuple(g.index for g in gpus if _speed(g) is None and g.name not in by_name)


def enumeration_order(gpus: list[Gpu], order: str) -> tuple[Gpu, ...]:
    by_pci = sorted(gpus, key=lambda g: g.index)
    if order == PCI_BUS_ID or len({g.name for g in gpus}) < 2 or unknown_speed(gpus):
        return tuple(by_pci)  # identical GPUs, or an unknown (never reorders): PCI order, as CUDA orders equals
    by_name = {g.name: _speed(g) for g in gpus if _speed(g) is not None}

    def speed(g: Gpu) -> tuple[int, int, int, int]:
        major, minor, mem = _speed(g) or by_name[g.name]
        return (-major, -minor, -mem, g.index)

    return tuple(sorted(by_pci, key=speed))


def _match_uuid(candidate: str, uuids: list[str]) -> tuple[int, str]:
    """Index of the one UUID that starts with `candidate`: (-1, "unknown") / (-1, "ambiguous")."""
    hits = [i for i, u in enumerate(uuids) if u.startswith(candidate)]
    if len(hits) == 1:
        return hits[0], ""
    return -1, "ambiguous" if hits else "unknown"


def _lost_text(lost: tuple[Gpu, ...]) -> str:
    """'GPU 3 is lost' / 'GPU 3, 5 are lost' (GD827 says how)."""
    names = ", ".join(str(g.index) for g in lost)
    return f"GPU {names} {'is' if len(lost) == 1 else 'are'} lost"


def resolve(snapshot: Snapshot) -> Visibility:
    lost = tuple(g for g in snapshot.gpus if unreadable(g))
    alive = [g for g in snapshot.gpus if not unreadable(g)]
    vis = _resolve(alive, snapshot.env, lost)
    if not lost:
        return vis
    # What the same variables would select had every GPU answered: which lost GPUs the run
    # wanted (GD827 fails for those), and whether integer entries now pick other GPUs.
    whole = _resolve(list(snapshot.gpus), snapshot.env, ())
    wanted = tuple(sorted(d.nvml_index for d in whole.devices if unreadable(d.gpu)))
    problems = list(vis.problems)
    intended = whole.nvml_indices
    same_order = tuple(g for g in whole.enumeration if not unreadable(g)) == vis.enumeration
    shifted = vis.nvml_indices != tuple(i for i in intended if i not in wanted)
    if parse(vis.raw).kind == "int" and same_order and shifted:
        n = len(vis.enumeration)
        got = ", ".join(str(i) for i in vis.nvml_indices) or "none"
        meant = ", ".join(str(i) for i in intended)
        msg = (
            f"CUDA_VISIBLE_DEVICES={shown(vis.raw, 120)} now selects GPU {got}, not GPU {meant}: "
            f"{_lost_text(lost)}, so CUDA "
            f"numbers the remaining {n} GPU(s) 0-{n - 1}; list GPUs by UUID (nvidia-smi -L) to pin them"
        )
        problems.append(Problem("lost_shift", vis.raw or "", msg))
    return replace(vis, problems=tuple(problems), lost=lost, lost_wanted=wanted)


def _resolve(gpus: list[Gpu], env: Mapping[str, str], lost: tuple[Gpu, ...]) -> Visibility:
    """CUDA's view of `gpus` (those it enumerates); `lost` only words the problems."""
    raw = env.get("CUDA_VISIBLE_DEVICES")
    order_raw = env.get("CUDA_DEVICE_ORDER")
    problems: list[Problem] = []
    order = FASTEST_FIRST
    if order_raw is not None:
        if order_raw.strip() == PCI_BUS_ID:
            order = PCI_BUS_ID
        elif order_raw.strip() != FASTEST_FIRST:
            msg = (
                f"CUDA_DEVICE_ORDER={shown(order_raw, 60)} is not PCI_BUS_ID or FASTEST_FIRST: CUDA uses FASTEST_FIRST"
            )
            problems.append(Problem("unknown_order", order_raw, msg))
    enumeration = enumeration_order(gpus, order)
    order_unknown = unknown_speed(gpus) if order == FASTEST_FIRST else ()
    parsed = parse(raw)
    problems.extend(parsed.problems)

    selected: list[tuple[Gpu, MigDevice | None]] = []
    if parsed.kind == "all":
        selected = [(g, None) for g in enumeration]
    elif parsed.kind == "int":
        for i, value in enumerate(parsed.values):
            assert isinstance(value, int)
            if value >= len(enumeration):
                entry = parsed.entries[i]
                rest = tuple((raw or "").split(",")[i:])
                have = len(enumeration)
                seen = f"CUDA sees {have}: {_lost_text(lost)}" if lost else f"this machine has {have}"
                msg = f"entry {entry!r}: there is no GPU {value} ({seen}): CUDA stops there"
                problems.append(Problem("out_of_range", entry, msg, rest))
                break
            selected.append((enumeration[value], None))
    elif parsed.kind == "GPU-":
        selected = _select_uuids(parsed, gpus, problems, raw or "", lost)
    else:
        vis = _resolve_mig(raw or "", order, order_raw, enumeration, parsed, problems)
        return replace(vis, order_unknown=order_unknown)

    devices = _apply_mig(selected, problems)
    return Visibility(raw, order, order_raw, enumeration, tuple(devices), tuple(problems), order_unknown=order_unknown)


def _select_uuids(
    parsed: Parsed, gpus: list[Gpu], problems: list[Problem], raw: str, lost: tuple[Gpu, ...]
) -> list[tuple[Gpu, None]]:
    uuids = [g.uuid for g in gpus]
    picked: list[int] = []
    for i, candidate in enumerate(parsed.values):
        assert isinstance(candidate, str)
        idx, why = _match_uuid(candidate, uuids)
        rest = tuple(raw.split(",")[i:])
        gone = [g for g in lost if g.uuid and g.uuid.startswith(candidate)]
        if idx < 0 and why == "unknown" and len(gone) == 1:
            msg = f"entry {candidate!r} is GPU {gone[0].index}, which is lost (GD827): CUDA stops there"
            problems.append(Problem("lost_uuid", candidate, msg, rest))
            break
        if idx < 0:
            nameless = [g.index for g in lost if not g.uuid]  # lost before NVML gave their UUID
            maybe = f" (perhaps lost GPU {', '.join(map(str, nameless))}, whose UUID NVML cannot give: GD827)"
            what = "matches no GPU on this machine" if why == "unknown" else "matches more than one GPU"
            what += maybe if why == "unknown" and nameless else ""
            problems.append(Problem(f"{why}_uuid", candidate, f"entry {candidate!r} {what}: CUDA stops there", rest))
            break
        if idx in picked:
            msg = f"entry {candidate!r} names GPU {gpus[idx].index} again: CUDA then sees no devices at all"
            problems.append(Problem("duplicate", candidate, msg, tuple(raw.split(","))))
            return []
        picked.append(idx)
    return [(gpus[i], None) for i in picked]


def _apply_mig(selected: list[tuple[Gpu, MigDevice | None]], problems: list[Problem]) -> list[VisibleDevice]:
    devices: list[VisibleDevice] = []
    mig_taken = False
    for gpu, _ in selected:
        if gpu.mig_mode_current is True:
            instances = gpu.mig_devices if isinstance(gpu.mig_devices, list) else []
            if mig_taken or not instances:
                why = "no MIG instances are configured" if not instances else "a process can use one MIG instance only"
                problems.append(Problem("mig_no_instance", str(gpu.index), f"GPU {gpu.index} is in MIG mode and {why}"))
                continue
            mig_taken = True
            devices.append(VisibleDevice(len(devices), gpu, instances[0]))
            continue
        devices.append(VisibleDevice(len(devices), gpu))
    return devices


def _resolve_mig(
    raw: str,
    order: str,
    order_raw: str | None,
    enumeration: tuple[Gpu, ...],
    parsed: Parsed,
    problems: list[Problem],
) -> Visibility:
    owners = [(g, m) for g in enumeration if isinstance(g.mig_devices, list) for m in g.mig_devices]
    uuids = [m.uuid for _, m in owners]
    devices: list[VisibleDevice] = []
    for i, candidate in enumerate(parsed.values):
        assert isinstance(candidate, str)
        idx, why = _match_uuid(candidate, uuids)
        if idx < 0:
            what = "matches no MIG instance on this machine" if why == "unknown" else "matches more than one instance"
            msg = f"entry {candidate!r} {what}: CUDA stops there"
            problems.append(Problem(f"{why}_uuid", candidate, msg, tuple(raw.split(","))[i:]))
            break
        if devices:
            rest = tuple(str(v) for v in parsed.values[i:])
            msg = f"{len(rest)} more MIG instance(s) listed: a CUDA process can use only the first"
            problems.append(Problem("mig_one_instance", candidate, msg, rest))
            break
        gpu, mig = owners[idx]
        devices.append(VisibleDevice(0, gpu, mig))
    return Visibility(raw, order, order_raw, enumeration, tuple(devices), tuple(problems))
