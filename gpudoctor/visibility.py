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
GPUs this is PCI order, which matches what CUDA does.

MIG: a CUDA process can use one MIG instance only. A selected GPU in MIG mode contributes its
first MIG instance if no instance was taken yet, and nothing otherwise; `MIG-` UUID lists keep
their first instance. (NVIDIA MIG user guide; pytorch#130181.)
"""

from __future__ import annotations

from dataclasses import dataclass

from gpudoctor.snapshot import Gpu, MigDevice, Snapshot

PCI_BUS_ID = "PCI_BUS_ID"
FASTEST_FIRST = "FASTEST_FIRST"
ALL = object()  # parse result for an unset variable: every device


@dataclass(frozen=True)
class VisibleDevice:
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


@dataclass(frozen=True)
class Problem:
    """Why an entry of CUDA_VISIBLE_DEVICES (or the order) does not do what it seems to."""

    kind: str  # "empty", "invalid", "out_of_range", "duplicate", "unknown_uuid", "ambiguous_uuid",
    # "trailing_junk", "mig_one_instance", "mig_no_instance", "unknown_order"
    entry: str  # the entry as written ("" when about the whole value)
    message: str  # one line for the user
    dropped: tuple[str, ...] = ()  # the entries CUDA ignores because of it


@dataclass(frozen=True)
class Visibility:
    raw: str | None  # CUDA_VISIBLE_DEVICES as set; None when unset
    order: str  # the order CUDA uses: PCI_BUS_ID or FASTEST_FIRST
    order_raw: str | None  # CUDA_DEVICE_ORDER as set
    enumeration: tuple[Gpu, ...]  # every physical GPU in CUDA's enumeration order
    devices: tuple[VisibleDevice, ...]  # cuda:0, cuda:1, ...
    problems: tuple[Problem, ...]

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


@dataclass(frozen=True)
class Parsed:
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
    for i, entry in enumerate(entries):
        if entry in values:
            msg = f"{entry!r} is listed twice: CUDA then sees no devices at all"
            return Parsed(prefix, (), (), (Problem("duplicate", entry, msg, tuple(entries)),))
        if not entry.startswith(prefix):
            why = "has a stray space" if entry.strip().startswith(prefix) else f"does not start with {prefix}"
            msg = f"entry {entry!r} {why}: CUDA stops reading there"
            problem = Problem("invalid", entry, msg, _rest(entries, i))
            return Parsed(prefix, tuple(entries[:i]), tuple(values), (problem,))
        values.append(entry)
    return Parsed(prefix, tuple(entries), tuple(values), ())


def _parse_ints(raw: str, entries: list[str]) -> Parsed:
    if raw.strip() == "":
        msg = "CUDA_VISIBLE_DEVICES is set but empty: CUDA sees no devices"
        return Parsed("int", (), (), (Problem("empty", raw, msg),))
    values: list[int] = []
    problems: list[Problem] = []
    for i, entry in enumerate(entries):
        value = strtoul(entry)
        if value in values:
            msg = f"device {value} is listed twice ({raw!r}): CUDA then sees no devices at all"
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
    return Parsed("int", tuple(entries[: len(values)]), tuple(values), tuple(problems))


# ---------------------------------------------------------------------------------------
# Resolution against a snapshot


def _cc_key(gpu: Gpu) -> tuple[int, int]:
    if isinstance(gpu.compute_capability, str):
        try:
            major, minor = gpu.compute_capability.split(".")
            return int(major), int(minor)
        except ValueError:
            pass
    return (0, 0)


def enumeration_order(gpus: list[Gpu], order: str) -> tuple[Gpu, ...]:
    by_pci = sorted(gpus, key=lambda g: g.index)
    if order == PCI_BUS_ID:
        return tuple(by_pci)

    def speed(g: Gpu) -> tuple[int, int, int, int]:
        cc = _cc_key(g)
        mem = g.memory_total_mib if isinstance(g.memory_total_mib, int) else 0
        return (-cc[0], -cc[1], -mem, g.index)

    return tuple(sorted(by_pci, key=speed))


def _match_uuid(candidate: str, uuids: list[str]) -> tuple[int, str]:
    """Index of the one UUID that starts with `candidate`: (-1, "unknown") / (-1, "ambiguous")."""
    hits = [i for i, u in enumerate(uuids) if u.startswith(candidate)]
    if len(hits) == 1:
        return hits[0], ""
    return -1, "ambiguous" if hits else "unknown"


def resolve(snapshot: Snapshot) -> Visibility:
    raw = snapshot.env.get("CUDA_VISIBLE_DEVICES")
    order_raw = snapshot.env.get("CUDA_DEVICE_ORDER")
    problems: list[Problem] = []
    order = FASTEST_FIRST
    if order_raw is not None:
        if order_raw.strip() == PCI_BUS_ID:
            order = PCI_BUS_ID
        elif order_raw.strip() != FASTEST_FIRST:
            msg = f"CUDA_DEVICE_ORDER={order_raw!r} is not PCI_BUS_ID or FASTEST_FIRST: CUDA uses FASTEST_FIRST"
            problems.append(Problem("unknown_order", order_raw, msg))
    gpus = list(snapshot.gpus)
    enumeration = enumeration_order(gpus, order)
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
                msg = f"entry {entry!r}: there is no GPU {value} (this machine has {have}): CUDA stops there"
                problems.append(Problem("out_of_range", entry, msg, rest))
                break
            selected.append((enumeration[value], None))
    elif parsed.kind == "GPU-":
        selected = _select_uuids(parsed, gpus, problems, raw or "")
    else:
        return _resolve_mig(raw or "", order, order_raw, enumeration, parsed, problems)

    devices = _apply_mig(selected, problems)
    return Visibility(raw, order, order_raw, enumeration, tuple(devices), tuple(problems))


def _select_uuids(parsed: Parsed, gpus: list[Gpu], problems: list[Problem], raw: str) -> list[tuple[Gpu, None]]:
    uuids = [g.uuid for g in gpus]
    picked: list[int] = []
    for i, candidate in enumerate(parsed.values):
        assert isinstance(candidate, str)
        idx, why = _match_uuid(candidate, uuids)
        rest = tuple(raw.split(",")[i:])
        if idx < 0:
            what = "matches no GPU on this machine" if why == "unknown" else "matches more than one GPU"
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
