"""A recorded reading goes one of two ways (gpudoctor.watch.bounds): the plain check takes it as it is,
or the strict checks say what is wrong. Whichever way, the reading, the drops and the rejection are
the same as the strict checks alone make them."""

from __future__ import annotations

import math
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from gpudoctor.watch.model import GpuReading, HostReading, ProcReading, RankReading

# Values that each rule of the strict checks has an opinion about: bools (not numbers), whole floats
# in whole-number fields, fractions there, NaN and infinities, ints past the largest float, values at
# and beyond each bound, the wrong types, and None.
odd_values = st.one_of(
    st.sampled_from(
        [
            None,
            True,
            False,
            0,
            -1,
            1,
            100,
            101,
            -50,
            -51,
            200,
            201,
            4.0,
            4.5,
            -0.5,
            0.0,
            -0.0,
            1e308,
            math.nan,
            math.inf,
            -math.inf,
            10**400,
            2**32,
            2**32 - 1,
            "",
            "7",
            "name\x1b[31m",
            [],
            [48],
            [48.0],
            [True],
            {},
        ]
    ),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
)
GOOD = {
    GpuReading: {
        "index": 3,
        "name": "NVIDIA H100 80GB HBM3",
        "uuid": "GPU-1",
        "util": 97,
        "mem_util": 40,
        "mem_used": 61000,
        "mem_total": 81559,
        "power": 612.5,
        "power_limit": 700.0,
        "temp": 65,
        "sm_clock": 1980,
        "pcie_rx": 2000,
        "pcie_tx": 1000,
        "throttle": 0,
        "xids": [48],
    },
    ProcReading: {
        "pid": 4100,
        "gpu": 0,
        "gpu_mem": 60000,
        "user": "train",
        "cpu": 97.5,
        "rss": 9000,
        "command": "python train.py",
        "sm": 90,
        "started": 1.7e9,
    },
    RankReading: {
        "pid": 4100,
        "rank": 0,
        "steps": 2,
        "step_s": 0.5,
        "step_max": 0.52,
        "wait_s": 0.01,
        "last_step": 120,
        "last_end": 1.7e9,
    },
    HostReading: {"load1": 3.5, "ram_used": 1000, "ram_total": 2000, "swap_used": 0, "swap_total": 0},
}


def outcome(parse: Any, data: Any) -> tuple[str, str, list[str]]:
    dropped: list[str] = []
    try:
        reading = parse(data, dropped)
    except (ValueError, TypeError, KeyError, AttributeError) as exc:  # what RecordingStream catches
        return ("rejected", f"{type(exc).__name__}: {exc}", dropped)
    return ("taken", repr(reading), dropped)  # repr: 4 and 4.0 differ, so a kept type is compared too


@st.composite
def recorded(draw: st.DrawFn) -> tuple[type, Any]:
    cls = draw(st.sampled_from(sorted(GOOD, key=lambda c: c.__name__)))
    data = dict(GOOD[cls])
    for name in draw(st.lists(st.sampled_from([*data, "state", "note", "extra_field"]), max_size=4)):
        if draw(st.booleans()) and name in data:
            del data[name]
        else:
            data[name] = draw(odd_values)
    if cls is GpuReading and draw(st.booleans()):
        data["state"] = draw(st.sampled_from(["ok", "stale", "lost", "gone", None]))
    return cls, data if draw(st.integers(0, 30)) else draw(odd_values)


@settings(max_examples=3000, deadline=None)
@given(recorded())
def test_the_plain_way_and_the_strict_way_read_a_reading_alike(case: tuple[type, Any]) -> None:
    cls, data = case
    assert outcome(cls.parse, data) == outcome(cls.parse_strict, data)


def test_a_sound_reading_is_taken_the_plain_way_and_equals_the_strict_one() -> None:
    for cls, data in GOOD.items():
        dropped: list[str] = []
        plain, strict = cls.parse(data, dropped), cls.parse_strict(data, [])
        assert plain == strict and repr(plain) == repr(strict) and not dropped
    assert GpuReading.parse({"index": 0, "name": "a\x1b[2Jb"}, []).name == "a?[2Jb"  # cleaned either way
