"""GPU XID errors from the kernel log (GD810-812): the catalog's verdict and hint for each, contained
memory errors, XIDs on GPUs the run does not use, and XID 154's recovery action."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gpudoctor.checks import xid_errors
from gpudoctor.engine import CheckContext
from gpudoctor.findings import Status
from gpudoctor.knowledge import xid
from gpudoctor.snapshot import Missing, XidEvent
from tests.helpers.findings import not_ok
from tests.helpers.snapshots import SnapshotOf, with_gpu


def test_hardware_xid_on_a_gpu_the_run_does_not_use_only_warns(snapshot_of: SnapshotOf) -> None:
    s = snapshot_of("h100_sxm_8x")
    s = replace(
        s,
        env={"CUDA_VISIBLE_DEVICES": "0,1"},
        host=replace(s.host, xid_events=[XidEvent("PCI:0000:db:00", 79, "fallen off the bus")]),
    )
    (f,) = xid_errors.xid_errors(CheckContext(s))
    assert (f.code, f.subject, f.status) == ("GD810", "gpu:7", Status.WARN)
    assert "does not use" in f.message


@pytest.mark.parametrize("code", [63, 94])
def test_contained_memory_xid_warns_and_says_a_reset_may_have_cleared_it(code: int, snapshot_of: SnapshotOf) -> None:
    s = snapshot_of("h100_sxm_8x")
    s = replace(s, host=replace(s.host, xid_events=[XidEvent("00000000:18:00.0", code, "event")]))
    (f,) = xid_errors.xid_errors(CheckContext(s))
    assert (f.code, f.subject, f.status) == ("GD810", "gpu:0", Status.WARN)
    assert "since boot" in f.message and "reset" in f.hint and "ROW_REMAPPER" in f.hint
    assert f.evidence["contained"] is True


def test_a_contained_xid_beside_a_fatal_one_still_fails_the_gpu(snapshot_of: SnapshotOf) -> None:
    s = snapshot_of("h100_sxm_8x")
    events = [XidEvent("00000000:18:00.0", 63, "remap"), XidEvent("00000000:18:00.0", 95, "uncontained")]
    s = replace(s, host=replace(s.host, xid_events=events))
    got = sorted((f.status, tuple(f.evidence["xids"])) for f in xid_errors.xid_errors(CheckContext(s)))
    assert got == sorted([(Status.WARN, (63,)), (Status.FAIL, (95,))])


def test_fatal_hardware_xid_fails_and_notes_the_log_spans_since_boot(snapshot_of: SnapshotOf) -> None:
    s = snapshot_of("h100_sxm_8x")
    s = replace(s, host=replace(s.host, xid_events=[XidEvent("00000000:18:00.0", 64, "remap failure")]))
    (f,) = xid_errors.xid_errors(CheckContext(s))
    assert (f.status, f.evidence["contained"]) == (Status.FAIL, False)
    assert "since boot" in f.message and "before the last GPU reset" in f.hint


def test_xid_for_a_device_nvml_does_not_list_is_still_reported(snapshot_of: SnapshotOf) -> None:
    s = snapshot_of("a100_sxm_8x")
    s = replace(s, host=replace(s.host, xid_events=[XidEvent("PCI:0000:c1:00", 48, "DBE")]))
    (f,) = xid_errors.xid_errors(CheckContext(s))
    assert f.subject == "pci:PCI:0000:c1:00" and f.status is Status.WARN


def test_xid_outside_the_catalog_warns(snapshot_of: SnapshotOf) -> None:
    s = snapshot_of("a100_sxm_8x")
    s = replace(s, host=replace(s.host, xid_events=[XidEvent("PCI:0000:10:1c", 999, "future xid")]))
    assert not_ok(xid_errors.xid_errors(CheckContext(s))) == [("GD812", "gpu:0", Status.WARN)]


def test_xid_the_catalog_says_to_ignore_is_listed_as_a_pass(snapshot_of: SnapshotOf) -> None:
    s = snapshot_of("a100_sxm_8x")
    s = replace(s, host=replace(s.host, xid_events=[XidEvent("PCI:0000:10:1c", 43, "channel reset")]))
    (f,) = xid_errors.xid_errors(CheckContext(s))
    assert (f.code, f.status, f.evidence["catalog"]) == ("GD812", Status.PASS, {"43": "IGNORE"})
    assert "no action needed" in f.hint


@pytest.mark.parametrize(
    ("xid_number", "words"),
    [
        (79, "power-cycle"),  # RESTART_BM
        (48, "SRAM threshold"),  # WORKFLOW_XID_48
        (74, "nvlink -e"),  # WORKFLOW_NVLINK_ERR
        (62, "nvidia-smi -r"),  # RESET_GPU
        (54, "power connectors"),  # CHECK_MECHANICALS
        (61, "nvidia-bug-report"),  # UNEXPECTED_ERR_REPORT_ISSUE
    ],
)
def test_hardware_xid_hint_is_the_catalogs_immediate_action(
    xid_number: int, words: str, snapshot_of: SnapshotOf
) -> None:
    s = snapshot_of("h100_sxm_8x")
    s = replace(s, host=replace(s.host, xid_events=[XidEvent("00000000:18:00.0", xid_number, "event")]))
    (f,) = xid_errors.xid_errors(CheckContext(s))
    assert (f.code, f.status) == ("GD810", Status.FAIL)
    assert words in f.hint and f.evidence["catalog"] == {str(xid_number): xid.bucket(xid_number)}


CHANGED = "GPU recovery action changed from "


def xid154(text: str) -> XidEvent:
    return XidEvent("PCI:0000:18:00", 154, f"NVRM: Xid (PCI:0000:18:00): 154, {text}")


@pytest.mark.parametrize(
    ("text", "now", "status", "words"),
    [
        (CHANGED + "0x0 (None) to 0x1 (GPU Reset Required)", "gpu_reset", Status.FAIL, "reset it"),
        (CHANGED + "0x0 (None) to 0x2 (Node Reboot Required)", "node_reboot", Status.FAIL, "Reboot the node"),
        (CHANGED + "0x0 (None) to 0x3 (Drain P2P)", "drain_p2p", Status.WARN, "peer-to-peer"),
        (CHANGED + "0x0 (None) to 0x4 (Drain and Reset)", "drain_and_reset", Status.FAIL, "drained"),
        (CHANGED + "0x1 (GPU Reset Required) to 0x0 (None)", "none", Status.PASS, ""),
    ],
)
def test_xid_154_is_judged_by_the_action_it_names(
    text: str, now: str, status: Status, words: str, snapshot_of: SnapshotOf
) -> None:
    # `now` is what NVML still reports for GPU 0 (on 18:00.0): the action is pending, not yet done.
    s = with_gpu(snapshot_of("h100_sxm_8x"), 0, recovery_action=now)
    s = replace(s, host=replace(s.host, xid_events=[XidEvent("PCI:0000:18:00", 120, "GSP error"), xid154(text)]))
    by_xid = {tuple(f.evidence["xids"]): f for f in xid_errors.xid_errors(CheckContext(s))}
    f = by_xid[(154,)]
    assert (f.code, f.status) == ("GD810", status) and words in f.hint
    assert by_xid[(120,)].status is Status.FAIL  # the GSP error itself still needs its reset


def test_xid_154_already_acted_on_passes_when_nvml_reports_no_action_now(snapshot_of: SnapshotOf) -> None:
    s = with_gpu(snapshot_of("h100_sxm_8x"), 0, recovery_action="none")
    text = CHANGED + "0x0 (None) to 0x1 (GPU Reset Required)"
    s = replace(s, host=replace(s.host, xid_events=[xid154(text)]))
    (f,) = xid_errors.xid_errors(CheckContext(s))
    assert f.status is Status.PASS and "since done" in f.message


def test_xid_not_collected_says_nothing(snapshot_of: SnapshotOf) -> None:
    s = snapshot_of("a100_sxm_8x")
    s = replace(s, host=replace(s.host, xid_events=Missing("not_collected")))
    assert xid_errors.xid_errors(CheckContext(s)) == []
