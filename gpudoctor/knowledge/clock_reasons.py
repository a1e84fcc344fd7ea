"""NVML clock event (throttle) reasons: the one table of bits, names and classes.

The bit values are nvml.h's ``nvmlClocksEventReason*`` (formerly ``nvmlClocksThrottleReason*``)
constants. Both `gpudoctor check` (GD815) and `gpudoctor watch` read this table, so a bit means
the same thing everywhere. Torch-free and NVML-free: it is plain data.

Classes:

- ``thermal``: the GPU slows itself because it is hot (software or hardware thermal slowdown).
- ``power``: the GPU slows itself to stay under a power limit (software power cap, or the
  power brake that the system's power supply asserts).
- ``hardware``: HW_SLOWDOWN, the hardware halving clocks or worse. NVML documents several
  causes (temperature, external power brake, power draw too high for the fast trigger), so it
  is neither thermal nor power alone; treat it as a hardware fault until shown otherwise.
- ``benign``: the GPU is idle or its clocks are set on purpose (application clocks, sync
  boost, display clock); nothing is slowed down.

``severe`` marks the reasons that the hardware itself engages (HW_SLOWDOWN, HW thermal,
power brake): GD815 fails on them and warns on the software ones.
"""

from __future__ import annotations

from gpudoctor.records import Record, record

GPU_IDLE = 0x1
APPLICATIONS_CLOCKS_SETTING = 0x2
SW_POWER_CAP = 0x4
HW_SLOWDOWN = 0x8
SYNC_BOOST = 0x10
SW_THERMAL_SLOWDOWN = 0x20
HW_THERMAL_SLOWDOWN = 0x40
HW_POWER_BRAKE_SLOWDOWN = 0x80
DISPLAY_CLOCK_SETTING = 0x100

THERMAL = "thermal"
POWER = "power"
HARDWARE = "hardware"
BENIGN = "benign"


@record
class ClockReason(Record):
    bit: int
    nvml_name: str  # the nvml.h suffix, e.g. "HwSlowdown"
    label: str  # what gpudoctor prints
    kind: str  # THERMAL, POWER, HARDWARE or BENIGN
    severe: bool = False  # engaged by the hardware itself: GD815 fails rather than warns


REASONS: tuple[ClockReason, ...] = (
    ClockReason(GPU_IDLE, "GpuIdle", "gpu idle", BENIGN),
    ClockReason(APPLICATIONS_CLOCKS_SETTING, "ApplicationsClocksSetting", "applications clocks setting", BENIGN),
    ClockReason(SW_POWER_CAP, "SwPowerCap", "software power cap", POWER),
    ClockReason(HW_SLOWDOWN, "HwSlowdown", "hardware slowdown", HARDWARE, severe=True),
    ClockReason(SYNC_BOOST, "SyncBoost", "sync boost", BENIGN),
    ClockReason(SW_THERMAL_SLOWDOWN, "SwThermalSlowdown", "software thermal slowdown", THERMAL),
    ClockReason(HW_THERMAL_SLOWDOWN, "HwThermalSlowdown", "hardware thermal slowdown", THERMAL, severe=True),
    ClockReason(HW_POWER_BRAKE_SLOWDOWN, "HwPowerBrakeSlowdown", "hardware power brake slowdown", POWER, severe=True),
    ClockReason(DISPLAY_CLOCK_SETTING, "DisplayClockSetting", "display clock setting", BENIGN),
)
BY_BIT: dict[int, ClockReason] = {r.bit: r for r in REASONS}


def _mask(kind: str) -> int:
    out = 0
    for r in REASONS:
        if r.kind == kind:
            out |= r.bit
    return out


THERMAL_BITS = _mask(THERMAL)
POWER_BITS = _mask(POWER)
HARDWARE_BITS = _mask(HARDWARE)
BENIGN_BITS = _mask(BENIGN)
SLOWDOWN_BITS = THERMAL_BITS | POWER_BITS | HARDWARE_BITS  # every bit that means "slowed down"


def active(mask: int) -> list[ClockReason]:
    """The known reasons set in ``mask``, in bit order (unknown bits are ignored)."""
    return [r for r in REASONS if mask & r.bit]


def slowdowns(mask: int) -> list[ClockReason]:
    """The reasons in ``mask`` that mean the clocks are held down (not benign)."""
    return [r for r in active(mask) if r.kind != BENIGN]


def kinds(mask: int) -> set[str]:
    """The classes of the slowdown reasons set in ``mask`` (benign ones left out)."""
    return {r.kind for r in slowdowns(mask)}
