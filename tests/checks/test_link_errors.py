"""GD831/GD832: link error counters read twice; DCGM's health-watch limits decide."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gpudoctor.checks import link_errors
from gpudoctor.engine import CheckContext
from gpudoctor.findings import Status
from gpudoctor.snapshot import Gpu, Missing, NvLinkErrors, Snapshot
from tests.helpers.snapshots import load

QUIET = NvLinkErrors(0, 0, 0, 0)


def h100(window: float = 0.4, **gpu2: object) -> Snapshot:
    """The H100 box with every link's counters read twice, `window` seconds apart; GPU 2 changed."""
    s = load("h100_sxm_8x")

    def counted(g: Gpu) -> Gpu:
        links = [replace(link, errors=QUIET, errors_later=QUIET) for link in g.nvlinks]
        return replace(g, nvlinks=links, pcie_replays=9, pcie_replays_later=9, error_window_s=window)

    gpus = [counted(g) for g in s.gpus]
    gpus[2] = replace(gpus[2], **gpu2)
    return replace(s, gpus=gpus)


def link(s: Snapshot, n: int, first: NvLinkErrors, later: NvLinkErrors) -> list:
    links = list(s.gpu(2).nvlinks)
    links[n] = replace(links[n], errors=first, errors_later=later)
    return links


def findings(s: Snapshot, code: str) -> list:
    return [f for f in link_errors.link_errors(CheckContext(s)) if f.code == code]


def test_quiet_links_pass_and_say_how_many_were_read() -> None:
    (f,) = findings(h100(), "GD831")
    assert f.status is Status.PASS and "144 active link(s)" in f.message
    (p,) = findings(h100(), "GD832")
    assert p.status is Status.PASS


@pytest.mark.parametrize(
    ("later", "status"),
    [
        (NvLinkErrors(1, 0, 0, 0), Status.FAIL),  # one replay: DCGM fails replay errors at 1
        (NvLinkErrors(0, 1, 0, 0), Status.FAIL),  # one recovery (retraining)
        (NvLinkErrors(0, 0, 3, 0), Status.WARN),  # a few CRC errors: DCGM warns below 100/s
        (NvLinkErrors(0, 0, 60, 60), Status.FAIL),  # 120 CRC errors within a second: the storm DCGM fails
    ],
)
def test_a_counter_that_rises_during_the_probe_names_gpu_and_link(later: NvLinkErrors, status: Status) -> None:
    s = h100()
    s = replace(s, gpus=[replace(g, nvlinks=link(s, 7, QUIET, later)) if g.index == 2 else g for g in s.gpus])
    (f,) = findings(s, "GD831")
    assert (f.status, f.subject) == (status, "gpu:2")
    assert "link 7" in f.message and "during the 0.40 s probe" in f.message
    assert f.evidence["links"][0]["rise"] and "nvlink -e -i 2" in f.hint


def test_crc_rate_is_never_taken_over_less_than_a_second() -> None:
    # 50 CRC errors in a 0.1 s window would be 500/s; over the one-second floor they are 50/s: a warning.
    s = h100(window=0.1)
    s = replace(
        s,
        gpus=[replace(g, nvlinks=link(s, 0, QUIET, NvLinkErrors(0, 0, 50, 0))) if g.index == 2 else g for g in s.gpus],
    )
    (f,) = findings(s, "GD831")
    assert f.status is Status.WARN and f.evidence["links"][0]["crc_per_s_at_least"] == 50.0


def test_recoveries_since_the_driver_loaded_warn_even_when_quiet_now() -> None:
    retrained = NvLinkErrors(0, 2, 0, 0)
    s = h100()
    s = replace(s, gpus=[replace(g, nvlinks=link(s, 3, retrained, retrained)) if g.index == 2 else g for g in s.gpus])
    (f,) = findings(s, "GD831")
    assert f.status is Status.WARN and "2 recovery (retraining) since the driver loaded" in f.message


def test_replays_and_crc_since_the_driver_loaded_alone_are_evidence_not_a_verdict() -> None:
    old = NvLinkErrors(4, 0, 17, 2)
    s = h100()
    s = replace(s, gpus=[replace(g, nvlinks=link(s, 3, old, old)) if g.index == 2 else g for g in s.gpus])
    assert [f.status for f in findings(s, "GD831")] == [Status.PASS]


def test_inactive_links_are_not_judged() -> None:
    s = h100()
    links = link(s, 5, QUIET, NvLinkErrors(9, 9, 0, 0))
    links[5] = replace(links[5], active=False)
    s = replace(s, gpus=[replace(g, nvlinks=links) if g.index == 2 else g for g in s.gpus])
    assert [f.status for f in findings(s, "GD831")] == [Status.PASS]


def test_counters_not_read_twice_only_speak_for_recoveries() -> None:
    s = h100()
    links = [replace(x, errors_later=Missing("unsupported")) for x in s.gpu(2).nvlinks]
    links[1] = replace(links[1], errors=NvLinkErrors(9, 0, 0, 0))  # replays, but no second reading
    s = replace(s, gpus=[replace(g, nvlinks=links) if g.index == 2 else g for g in s.gpus])
    assert [f.status for f in findings(s, "GD831")] == [Status.PASS]


def test_gpus_the_run_does_not_use_are_not_judged() -> None:
    s = h100()
    s = replace(
        s, gpus=[replace(g, nvlinks=link(s, 7, QUIET, NvLinkErrors(5, 0, 0, 0))) if g.index == 2 else g for g in s.gpus]
    )
    s = replace(s, env={"CUDA_VISIBLE_DEVICES": "0,1"})
    assert [f.status for f in findings(s, "GD831")] == [Status.PASS]


@pytest.mark.parametrize(
    ("gen", "width", "allowed"),
    # DCGM: ceil(GT/s * 1e9 * 1e-12 * 60 * lanes): Gen5 x16 1.92*16 = 30.72 -> 31; Gen4 x16 -> 16; Gen3 x8 -> 4
    [(5, 16, 31), (4, 16, 16), (3, 8, 4), (1, 1, 1)],
)
def test_pcie_allowance_is_dcgms_per_minute_rate(gen: int, width: int, allowed: int) -> None:
    assert link_errors.pcie_allowance(gen, width, 0.4) == allowed
    assert link_errors.pcie_allowance(gen, width, 120.0) == 2 * allowed  # a longer window allows more


def test_pcie_replays_above_a_minutes_allowance_within_the_probe_warn() -> None:
    s = h100(pcie_replays=9, pcie_replays_later=9 + 40)  # Gen5 x16 allows 31 a minute
    (f,) = findings(s, "GD832")
    assert (f.status, f.subject) == (Status.WARN, "gpu:2")
    assert "40 PCIe packets" in f.message and "Gen5 x16" in f.message
    quiet = h100(pcie_replays=9, pcie_replays_later=9 + 31)
    assert [x.status for x in findings(quiet, "GD832")] == [Status.PASS]
