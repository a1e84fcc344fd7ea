"""What a recorded reading may be, and the checks that hold a line of a recording to it.

Two ways through, one set of rules. The strict checks (`number`, `index`, `in_ranges`, `physical`)
say what is wrong with a value: a damaged one raises ValueError with the field named, one outside
its physical range is dropped (n/a) and said. They cost a few function calls per value, and a day's
recording holds millions of values (issue 22: `report` spent most of its time in them). So each
reading type also has a plain check (`plain_gpu`, `plain_proc`, `plain_rank`, `plain_host`): one
pass over the fields against bounds made once per type, which takes a reading only when it is
exactly what the strict checks would keep unchanged (the right types, in range, nothing to drop or
convert). Anything else (a bool, 4.0 in a whole-number field, NaN, an out-of-range value) goes the
strict way, which alone words the rejections: the messages and the drops are the same whichever
way a reading would have gone.

The bounds per line (`MAX_GPUS`, `MAX_RANKS`) keep one line's cost small: see their comments.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from typing import Any

from gpudoctor.snapshot import MAX_GPUS as MAX_GPUS  # one machine's, defined with its source

OK = "ok"
STALE = "stale"  # no fresh reading arrived in time (NVML stalled)
LOST = "lost"  # NVML says GPU_IS_LOST; not asked again
STATES = (OK, STALE, LOST)

# What a reading can physically be (inclusive bounds; None: unbounded). Outside: dropped as n/a.
RANGES: dict[str, tuple[float | None, float | None]] = {
    "util": (0, 100),
    "mem_util": (0, 100),
    "mem_used": (0, None),
    "mem_total": (0, None),
    "power": (0, None),
    "power_limit": (0, None),
    "temp": (-50, 200),
    "sm_clock": (0, None),
    "pcie_rx": (0, None),
    "pcie_tx": (0, None),
    "throttle": (0, None),
}
PROC_RANGES: dict[str, tuple[float | None, float | None]] = {
    "gpu_mem": (0, None),
    "cpu": (0, None),
    "rss": (0, None),
    "sm": (0, 100),
    "started": (0, None),
}
PROC_INTEGERS = {"gpu_mem", "rss", "sm"}
HOST_RANGES: dict[str, tuple[float | None, float | None]] = {
    "load1": (0, None),
    "ram_used": (0, None),
    "ram_total": (0, None),
    "swap_used": (0, None),
    "swap_total": (0, None),
}
HOST_INTEGERS = {"ram_used", "ram_total", "swap_used", "swap_total"}
# The last second Python's time and datetime can show (9999-12-31 23:59:59 UTC): a sample stamped
# later is damaged (a replay would crash formatting it); a step's end later is out of range.
LAST_TIME = 253402300799
# Bounds on what a training process's step record may say (heuristics: beyond them it is damage, not a
# training loop), the same for the live channel (gpudoctor.watch.steps) and a recording. A step longer
# than a day is none; step numbers stay where a JSON number is exact (2**53).
MAX_STEP_S = 86_400.0
MAX_STEP_NUMBER = 2**53
# A threshold in seconds (the [watch] keys in seconds, --warmup, --hang-after, --join-after) is at most a
# day (a heuristic: no verdict need wait longer, and a window of a day at 1 Hz already holds 86,400
# samples in memory); beyond it is a typo, and 1e308 would be printed with 309 digits.
MAX_THRESHOLD_S = 86_400.0
RANK_RANGES: dict[str, tuple[float | None, float | None]] = {
    "steps": (0, MAX_STEP_NUMBER),
    "step_s": (0, MAX_STEP_S),
    "step_max": (0, MAX_STEP_S),
    "wait_s": (0, MAX_STEP_S),
    "waited": (0, MAX_STEP_NUMBER),
    "wait_step_s": (0, MAX_STEP_S),
    "last_step": (0, MAX_STEP_NUMBER),
    "last_end": (0, LAST_TIME),
}
RANK_INTEGERS = {"steps", "waited", "last_step"}
CPU_RANGE = (0, 100)  # host CPU busy, % of all cores
# Whole-number readings: a recorded 4.0 reads as 4; a fraction (util 96.5, a bitmask 4.5) is not a reading.
INTEGERS = {"util", "mem_util", "mem_used", "mem_total", "temp", "sm_clock", "pcie_rx", "pcie_tx", "throttle"}


def check_number(value: Any, what: str) -> float | int | None:
    """None, or a finite int/float (never a bool); anything else is a damaged value (ValueError)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{what} is not a number: {value!r}")
    if isinstance(value, int) and abs(value) > sys.float_info.max:
        raise ValueError(f"{what} is too large for a number: {str(value)[:12]}... ({len(str(value))} digits)")
    if not math.isfinite(value):
        raise ValueError(f"{what} is not finite: {value!r}")
    return value


def whole(value: Any) -> Any:
    """4.0 -> 4 (a JSON writer may write a whole number as a float); anything else unchanged."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


MAX_ID = 2**32  # GPU indices and PIDs are 32-bit numbers


def check_index(value: Any, what: str) -> int:
    value = whole(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < MAX_ID:
        raise ValueError(f"{what} is not an index: {short(value)}")
    return value


def short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def check_text(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{what} is not text: {value!r}")
    return value


def in_range(value: float | int | None, bounds: tuple[float | None, float | None]) -> bool:
    low, high = bounds
    return value is None or ((low is None or value >= low) and (high is None or value <= high))


def in_ranges(
    kwargs: dict[str, Any],
    ranges: dict[str, tuple[float | None, float | None]],
    integers: set[str],
    dropped: list[str],
    where: str = "",
) -> dict[str, Any]:
    """`kwargs` with each reading named in `ranges` checked: a whole float in an integer field becomes
    an int; a fraction there, or a value outside its bounds, is set to None and said in `dropped`."""
    for name, bounds in ranges.items():
        if kwargs.get(name) is None:
            continue
        given = kwargs[name]
        value = kwargs[name] = whole(given) if name in integers else given
        if not in_range(value, bounds) or (name in integers and not isinstance(value, int)):
            dropped.append(f"{where}{name} {short(given)}")  # as written: 1e+308, not its 309 digits
            kwargs[name] = None
    return kwargs


def parse_numbers(kwargs: dict[str, Any], names: Any, where: str) -> None:
    """Raise ValueError (a damaged line) if a field in `names` is there but not a finite number."""
    for name in names:
        check_number(kwargs.get(name), f"{where}{name}")


def physical(kwargs: dict[str, Any], dropped: list[str], where: str = "") -> dict[str, Any]:
    """`kwargs` (GpuReading fields) with out-of-range readings set to None, each said in `dropped`."""
    in_ranges(kwargs, RANGES, INTEGERS, dropped, where)
    used, total = kwargs.get("mem_used"), kwargs.get("mem_total")
    if used is not None and total and used > total:
        dropped.append(f"{where}mem_used {used!r} > mem_total {total!r}")
        kwargs["mem_used"] = None
    return kwargs


# Bounds per line of a recording. One line is one sample of one machine (`watch` reads the GPUs its
# NVML sees): a line with more than one machine's GPUs (snapshot.MAX_GPUS, where its source is cited;
# an NVL72 rack is 18 nodes of 4, and 256 is the count the dashboard's cost target is set at, issue 22)
# is no machine's reading. Its ranks are the step channel's (gpudoctor.watch.steps follows at most
# MAX_RANKS processes).
MAX_RANKS = 4096

_BIG = sys.float_info.max  # past it an int is no float: the strict check says so

Checker = Callable[[dict[str, Any]], bool]


def plain_numbers(ranges: dict[str, tuple[float | None, float | None]], integers: set[str]) -> Checker:
    """A check made once per reading type: every reading of `ranges` in a dict is None, an int in
    range, or (where fractions are readings) a float in range: what the strict checks keep as it is.

    Made as the source of one function (a line per field, from our own tables: no input reaches it),
    so a value costs a dict lookup and a comparison, not calls. NaN fails every comparison; an int
    past the largest float fails its bound and goes the strict way, which says it is too large."""
    lines = ["def check(kw):", "    get = kw.get"]
    for name, (lo, hi) in ranges.items():
        low, high = -_BIG if lo is None else lo, _BIG if hi is None else hi
        kinds = "type(v) is not int" if name in integers else "(type(v) is not int and type(v) is not float)"
        lines += [f"    v = get({name!r})", f"    if v is not None and ({kinds} or not {low!r} <= v <= {high!r}):"]
        lines.append("        return False")
    lines.append("    return True")
    namespace: dict[str, Any] = {}
    exec("\n".join(lines), namespace)  # noqa: S102 (the source is made from the tables above only)
    checker: Checker = namespace["check"]
    return checker


GPU_NUMBERS = plain_numbers(RANGES, INTEGERS)
PROC_NUMBERS = plain_numbers(PROC_RANGES, PROC_INTEGERS)
HOST_NUMBERS = plain_numbers(HOST_RANGES, HOST_INTEGERS)
RANK_NUMBERS = plain_numbers(RANK_RANGES, RANK_INTEGERS)


def known(data: Any, names: frozenset[str]) -> dict[str, Any] | None:
    """The fields of a recorded object that its type knows (a copy), or None if it is no object."""
    if type(data) is not dict:
        return None
    return dict(data) if data.keys() <= names else {k: v for k, v in data.items() if k in names}


def _pid(value: Any) -> bool:
    return type(value) is int and 0 < value < MAX_ID


def _plain_id(value: Any) -> bool:
    return value is None or (type(value) is int and 0 <= value < MAX_ID)


def _texts(kwargs: dict[str, Any], names: tuple[str, ...]) -> bool:
    return all(type(kwargs.get(n, "")) is str for n in names)


def plain_gpu(data: Any, names: frozenset[str]) -> dict[str, Any] | None:
    """A GPU reading's fields, when they are plainly what the strict checks keep; else None."""
    kw = known(data, names)
    if kw is None or type(kw.get("index")) is not int or not 0 <= kw["index"] < MAX_ID:
        return None
    if not _texts(kw, ("name", "uuid")) or kw.get("state", OK) not in STATES or not GPU_NUMBERS(kw):
        return None
    used, total = kw.get("mem_used"), kw.get("mem_total")
    if used is not None and total and used > total:
        return None
    if "xids" in kw:
        xids = kw["xids"]
        if type(xids) is not list or not all(type(x) is int and 0 <= x < MAX_ID for x in xids):
            return None
        kw["xids"] = tuple(xids)
    return kw


def plain_proc(data: Any, names: frozenset[str]) -> dict[str, Any] | None:
    kw = known(data, names)
    if kw is None or not _pid(kw.get("pid")) or not _plain_id(kw.get("gpu")):
        return None
    if not _texts(kw, ("user", "command", "note")) or not PROC_NUMBERS(kw):
        return None
    kw["gpu"] = kw.get("gpu")  # no default: an absent GPU is None
    return kw


def plain_rank(data: Any, names: frozenset[str]) -> dict[str, Any] | None:
    kw = known(data, names)
    if kw is None or not _pid(kw.get("pid")) or not _plain_id(kw.get("rank")) or not RANK_NUMBERS(kw):
        return None
    if kw.get("steps") is None:
        kw["steps"] = 0
    return kw


def plain_host(data: Any, names: frozenset[str]) -> dict[str, Any] | None:
    kw = known(data, names)
    return kw if kw is not None and HOST_NUMBERS(kw) else None
