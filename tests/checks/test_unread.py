"""A reading NVML could not give is unknown, not a fact: the checks that judge it say so.

The review's variants (a GPU, or every GPU, whose every field is Missing for one reason) are built
here from the recorded H100 box: an error or a refused permission never passes as "alike", "no
NVLink" or "GSP firmware off"; NOT_SUPPORTED stays a fact only where the GPU may lack the feature.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from gpudoctor.checks import gpu_modes, identity, registry
from gpudoctor.checks.unread import unread
from gpudoctor.engine import CheckContext, Selection
from gpudoctor.engine.runner import run_checks
from gpudoctor.findings import Finding, Status
from gpudoctor.knowledge import interconnect as topo
from gpudoctor.snapshot import Gpu, Missing, Snapshot
from tests.helpers.cli import run_cli
from tests.helpers.findings import by_code
from tests.helpers.snapshots import load, with_gpu, write_variant

# Identity and the fields the probe reads before anything else: what a GPU with a handle keeps.
KEEP = {"index", "uuid", "name", "pci_bus_id", "lost", "unreachable"}
UNKNOWN_REASONS = ["error", "no_permission"]
# How a check says it could not read something, by reason: an error is a warning; a reading NVML
# refused this user "needs root", a skip (never a warning: a healthy GPU read without sudo must pass
# a --fail-on warn gate).
SAID = {"error": (Status.WARN, "unreadable on"), "no_permission": (Status.SKIP, "needs root on")}


def all_missing(gpu: Gpu, reason: str) -> Gpu:
    """Every reading of `gpu` (past its identity) answered with `reason`."""
    gone = Missing(reason, "test")
    return dataclasses.replace(gpu, **{f.name: gone for f in dataclasses.fields(gpu) if f.name not in KEEP})


def one_unread(reason: str, index: int = 3) -> Snapshot:
    s = load("h100_sxm_8x")
    return dataclasses.replace(s, gpus=[all_missing(g, reason) if g.index == index else g for g in s.gpus])


def every_unread(reason: str) -> Snapshot:
    s = load("h100_sxm_8x")
    return dataclasses.replace(s, gpus=[all_missing(g, reason) for g in s.gpus])


def findings(s: Snapshot, *checks: str) -> list[Finding]:
    results = run_checks(registry(), CheckContext(s), Selection(select=checks))
    return [f for r in results for f in r.findings]


# ---------------------------------------------------------------------------------- the reasons


def test_which_reasons_are_facts() -> None:
    assert unread(Missing("not_collected")) is None, "an older recording: never asked"
    assert unread(Missing("unsupported")) is None, "an optional feature the GPU lacks: a fact"
    assert unread(Missing("unsupported"), always_there=True) == Missing("unsupported")
    assert unread(Missing("error")) == Missing("error") and unread(Missing("no_permission")) is not None
    assert unread(80) is None


# ------------------------------------------------------------------------------------- topology


@pytest.mark.parametrize("reason", UNKNOWN_REASONS)
def test_unreadable_nvlinks_are_unknown_not_missing(reason: str) -> None:
    found = findings(one_unread(reason), "topology")
    gd401 = by_code(found, "GD401")[0]
    assert gd401.message.startswith("8 GPUs: 21 pairs NV18, 7 pairs ?"), gd401.message
    assert "SYS" not in gd401.message and "NODE" not in gd401.message, "no PCIe level passed off as the link"
    status, said = SAID[reason]
    (unknown,) = [f for f in by_code(found, "GD402") if f.status is status]
    assert unknown.subject == "gpu:3" and f"NVLink state {said} GPU 3" in unknown.message
    (gd403,) = by_code(found, "GD403")
    assert gd403.status is Status.PASS and "have no NVLink" not in gd403.message
    assert "pairs with GPU 3 not judged" in gd403.message
    width = [f for f in by_code(found, "GD404") if f.status is status]
    assert width and f"PCIe link width {said} GPU 3" in width[0].message


def test_a_pair_with_an_unreadable_end_is_labelled_unknown() -> None:
    s = one_unread("error")
    assert topo.link_label(s, 0, 3) == "?" and not topo.nvlink_known(s, 0, 3)
    assert topo.link_label(s, 0, 1) == "NV18"
    pcie = load("rtx4090_pcie_4x")  # NVML: NOT_SUPPORTED for NVLink, a fact: the PCIe path is the link
    assert topo.nvlink_known(pcie, 0, 1) and topo.link_label(pcie, 0, 1) != "?"


def test_an_sxm_gpu_nvml_says_has_no_nvlink_among_linked_twins_fails_gd402() -> None:
    # NOT_SUPPORTED on link 0 is NVML's "no NVLink": on one H100 SXM of eight, that GPU's traffic is on PCIe.
    found = findings(one_unread("unsupported"), "topology")
    (gd402,) = [f for f in by_code(found, "GD402") if f.status is not Status.PASS]
    assert (gd402.status, gd402.subject) == (Status.FAIL, "gpu:3")
    assert "NVML reports no NVLink on it" in gd402.message


@pytest.mark.parametrize("reason", UNKNOWN_REASONS)
def test_a_machine_whose_links_are_all_unreadable_claims_no_pcie_topology(reason: str) -> None:
    found = findings(every_unread(reason), "topology")
    gd401 = by_code(found, "GD401")[0]
    assert gd401.message.startswith("8 GPUs: all 28 pairs ?"), gd401.message
    assert not by_code(found, "GD403"), "no pair is known to lack NVLink"
    assert [f.status for f in by_code(found, "GD402")] == [SAID[reason][0]]


# ------------------------------------------------------------------------------------- identity


@pytest.mark.parametrize("reason", UNKNOWN_REASONS)
def test_unreadable_traits_are_named_not_found_alike(reason: str) -> None:
    found = identity.identity(CheckContext(one_unread(reason)))
    status, said = SAID[reason]
    warned = {f.code: f for f in found if f.status is status}
    assert set(warned) == {"GD302", "GD303", "GD304", "GD305", "GD306", "GD307"}
    assert all(f.subject == "gpu:3" and f"{said} GPU 3" in f.message for f in warned.values())
    assert "persistence mode, compute mode, MIG mode, ECC mode" in warned["GD305"].message
    assert not any("GSP firmware off" in f.message for f in found), "an unread GSP version is not 'off'"
    assert (
        "/dev/nvidia" in warned["GD302"].hint if reason == "no_permission" else "nvidia-smi -q" in warned["GD302"].hint
    )


def test_gsp_not_supported_is_off_but_a_missing_call_is_not() -> None:
    s = load("h100_sxm_8x")
    off = with_gpu(s, 3, gsp_firmware=Missing("unsupported", "Not Supported"))
    (odd,) = [f for f in identity.identity(CheckContext(off)) if f.code == "GD307" and f.status is Status.WARN]
    assert odd.message.startswith("GPU 3 has GSP firmware off, the others 550.54.15")
    no_call = dataclasses.replace(
        s, gpus=[dataclasses.replace(g, gsp_firmware=Missing("unsupported", "Function Not Found")) for g in s.gpus]
    )
    gsp = [f for f in identity.identity(CheckContext(no_call)) if "GSP" in f.message]
    assert gsp == [], "an NVML without the call says nothing about the GPUs' firmware"


def test_a_machine_whose_every_reading_is_unsupported_is_not_a_clean_pass() -> None:
    # NOT_SUPPORTED for memory size, VBIOS, compute mode or the PCIe link is not a fact about an H100.
    found = findings(every_unread("unsupported"), "identity", "topology", "gpu_modes")
    warned = {f.code for f in found if f.status is Status.WARN}
    assert {"GD302", "GD303", "GD305", "GD306", "GD404", "GD405", "GD821"} <= warned
    assert not any(f.status is Status.PASS and "memory" in f.message for f in by_code(found, "GD302"))


# ------------------------------------------------------------------------------------ gpu modes


@pytest.mark.parametrize("reason", UNKNOWN_REASONS)
def test_mig_and_compute_mode_are_not_off_or_default_on_a_guess(reason: str) -> None:
    found = gpu_modes.gpu_modes(CheckContext(one_unread(reason)))
    mig = by_code(found, "GD820")
    assert [(f.status, f.subject) for f in mig] == [(SAID[reason][0], "gpu:3"), (Status.PASS, "host")]
    assert mig[1].message == "MIG is off on GPU 0, 1, 2, 4, 5, 6, 7"
    mode = by_code(found, "GD821")
    assert [f.status for f in mode] == [SAID[reason][0], Status.PASS]
    assert mode[1].message == "compute mode is default on GPU 0, 1, 2, 4, 5, 6, 7"


def test_the_healthy_box_says_nothing_is_unreadable(capsys, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    path = write_variant(tmp_path, load("h100_sxm_8x"))
    r = run_cli(capsys, "check", "--snapshot", path, "--json")
    assert not [f for f in r.findings() if "unreadable" in f["message"]]


# ------------------------------------------------------------------------------ health counters

HEALTH_CHECKS = ("memory_errors", "clocks", "recovery_action", "link_errors")
# (code, what its warning names) for each health check.
HEALTH_WARNINGS = {
    "GD801": "volatile ECC errors",
    "GD815": "clock event reasons",
    "GD828": "GPU recovery action",
    "GD831": "PCIe replay counter",
}
NO_ECC = (
    "ecc_uncorrected_volatile",
    "ecc_uncorrected_aggregate",
    "retired_pages_pending",
    "remapped_rows",
    "sram_ecc",
    "remap_histogram",
)


@pytest.mark.parametrize("reason", UNKNOWN_REASONS)
def test_health_checks_never_pass_on_counters_they_could_not_read(reason: str) -> None:
    found = findings(every_unread(reason), *HEALTH_CHECKS)
    assert not [f for f in found if f.status is Status.PASS], [f.message for f in found if f.status is Status.PASS]
    status, said = SAID[reason]
    for code, what in HEALTH_WARNINGS.items():
        (warning,) = by_code(found, code)
        assert warning.status is status and what in warning.message
        assert f"{said} GPU 0, 1, 2, 3, 4, 5, 6, 7" in warning.message and warning.hint


@pytest.mark.parametrize("reason", UNKNOWN_REASONS)
def test_a_health_pass_names_only_the_gpus_that_were_read(reason: str) -> None:
    found = findings(one_unread(reason), *HEALTH_CHECKS)
    status, said = SAID[reason]
    for code in ("GD801", "GD815", "GD828"):
        warn, ok = by_code(found, code)
        assert (warn.status, warn.subject) == (status, "gpu:3") and f"{said} GPU 3" in warn.message
        assert ok.status is Status.PASS and "GPU 0, 1, 2, 4, 5, 6, 7" in ok.message and "3" not in ok.evidence["gpus"]
    if reason == "no_permission":
        hint = by_code(found, "GD801")[0].hint
        assert "sudo gpudoctor check" in hint and "/dev/nvidia" in hint, "the hint fits the reason"


def test_a_card_without_ecc_is_not_supported_not_unreadable() -> None:
    s = load("h100_sxm_8x")
    s = dataclasses.replace(
        s, gpus=[dataclasses.replace(g, **dict.fromkeys(NO_ECC, Missing("unsupported"))) for g in s.gpus]
    )
    (gd801,) = by_code(findings(s, "memory_errors"), "GD801")
    assert gd801.status is Status.SKIP and "not supported on GPU 0, 1, 2, 3, 4, 5, 6, 7" in gd801.message
    assert "unreadable" not in gd801.message


@pytest.mark.parametrize("reason", UNKNOWN_REASONS)
def test_a_gpu_that_answers_nothing_fails_the_run(capsys, tmp_path: Path, reason: str) -> None:  # type: ignore[no-untyped-def]
    # Eleven 'unreadable' warnings used to leave such a machine READY: nothing about GPU 3 was checked.
    r = run_cli(capsys, "check", "--snapshot", write_variant(tmp_path, one_unread(reason)), "--json")
    assert r.exit_code == 1 and r.doc["summary"]["fail"] >= 1
    (lost,) = [f for f in r.findings("GD827") if f["status"] == "fail"]
    assert lost["subject"] == "gpu:3" and "answers no NVML query" in lost["message"]


def test_an_xid_on_an_address_nvml_could_not_give_may_be_that_gpu() -> None:
    # GPU 2 logged XID 79; had NVML not given GPU 2's PCI address, the XID still blocks the run.
    s = with_gpu(load("faults/xid_hardware"), 2, pci_bus_id="")
    (gd810,) = by_code(findings(s, "xid"), "GD810")
    assert gd810.status is Status.FAIL and "maybe GPU 2, whose PCI address NVML could not give" in gd810.message


def test_a_reading_nvml_refuses_this_user_needs_root_and_passes_a_warn_gate(capsys, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    # nvml.h 8111: nvmlDeviceGetSramEccErrorStatus "Requires root/admin permissions." (driver 580.159.04
    # answered it as uid 65534 all the same; a driver that enforces it answers NO_PERMISSION).
    s = load("h100_sxm_8x")
    refused = Missing("no_permission", "Insufficient Permissions")
    s = dataclasses.replace(s, gpus=[dataclasses.replace(g, sram_ecc=refused) for g in s.gpus])
    r = run_cli(capsys, "check", "--snapshot", write_variant(tmp_path, s), "--json", "--fail-on", "warn")
    (sram,) = [f for f in r.findings("GD829") if "SRAM" in f["message"]]
    assert sram["status"] == "skip" and "needs root on GPU 0, 1, 2, 3, 4, 5, 6, 7" in sram["message"]
    assert "sudo gpudoctor check" in sram["hint"]
    assert r.exit_code == 0 and r.doc["summary"]["warn"] == 0
