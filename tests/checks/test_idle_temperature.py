"""An idle GPU hotter than its peers (GD834, a heuristic): warm or busy GPUs are not flagged."""

from __future__ import annotations

import pytest

from gpudoctor.checks import idle_temperature
from gpudoctor.engine import CheckContext
from gpudoctor.findings import Status
from tests.helpers.findings import judged
from tests.helpers.snapshots import load, with_gpu


def test_an_idle_gpu_far_hotter_than_its_peers_warns_as_a_heuristic() -> None:
    s = with_gpu(load("h100_sxm_8x"), 2, temperature_c=92)
    (f,) = idle_temperature.idle_temperature(CheckContext(s))
    assert (f.code, f.status, f.subject) == ("GD834", Status.WARN, "gpu:2")
    assert "92 C while idle" in f.message and "heuristic" in f.message and f.evidence["heuristic"] is True
    assert f.evidence["peers_median_c"] == 29


@pytest.mark.parametrize(
    ("changes", "why"),
    [
        ({"temperature_c": 52}, "23 C above its peers: within the heuristic's gap"),
        ({"temperature_c": 92, "clock_event_reasons": 0}, "busy (not idle): heat is expected"),
    ],
)
def test_warm_or_busy_gpus_are_not_flagged(changes: dict[str, object], why: str) -> None:
    s = with_gpu(load("h100_sxm_8x"), 2, **changes)
    assert judged(idle_temperature.idle_temperature(CheckContext(s))) == [], why


def test_idle_temperatures_alike_pass() -> None:
    (f,) = idle_temperature.idle_temperature(CheckContext(load("h100_sxm_8x")))
    assert f.status is Status.PASS and "8 idle GPUs" in f.message
