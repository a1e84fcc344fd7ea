"""Clock throttling (GD815): which clock event reasons are throttling, and what each says."""

from __future__ import annotations

import pytest

from gpudoctor.checks import clocks
from gpudoctor.engine import CheckContext
from gpudoctor.findings import Status
from tests.helpers.findings import not_ok
from tests.helpers.snapshots import SnapshotOf, with_gpu


def test_idle_and_benign_clock_reasons_are_not_throttling(snapshot_of: SnapshotOf) -> None:
    s = with_gpu(snapshot_of("h100_sxm_8x"), 0, clock_event_reasons=0x1 | 0x2 | 0x10 | 0x100)
    assert not_ok(clocks.clocks(CheckContext(s))) == []


def test_software_thermal_slowdown_warns_and_reports_temperature(snapshot_of: SnapshotOf) -> None:
    s = with_gpu(snapshot_of("h100_sxm_8x"), 6, clock_event_reasons=0x20, temperature_c=87)
    (f,) = clocks.clocks(CheckContext(s))
    assert (f.subject, f.status) == ("gpu:6", Status.WARN)
    assert f.evidence["temperature_c"] == 87 and "cooling" in f.hint.lower()


@pytest.mark.parametrize(
    ("mask", "status", "hint_word"),
    [(0x4, Status.WARN, "power limit"), (0x8, Status.FAIL, "power supplies"), (0x40, Status.FAIL, "cooling")],
)
def test_clock_reason_status_and_hint(mask: int, status: Status, hint_word: str, snapshot_of: SnapshotOf) -> None:
    s = with_gpu(snapshot_of("h100_sxm_8x"), 2, clock_event_reasons=mask)
    (f,) = clocks.clocks(CheckContext(s))
    assert (f.subject, f.status) == ("gpu:2", status)
    assert hint_word in f.hint
