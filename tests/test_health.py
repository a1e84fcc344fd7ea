"""GPU health checks (GD801-826): XID table and matching, memory errors, throttling, MIG, processes."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from gpudoctor import clock_reasons, xid
from gpudoctor.checks import gpu_modes, health, link_errors
from gpudoctor.findings import Finding, Status
from gpudoctor.registry import CheckContext, CheckOptions
from gpudoctor.snapshot import GpuProcess, Missing, RemapHistogram, Snapshot, SramEcc, XidEvent, load
from gpudoctor.topology import normalize_bus_id, nvml_bus_id

FIXTURES = Path(__file__).parent / "fixtures"
REFERENCE = Path(__file__).parent / "reference"


def snap(name: str) -> Snapshot:
    return load(FIXTURES / f"{name}.json")


def gpu_change(s: Snapshot, index: int, **values: object) -> Snapshot:
    return replace(s, gpus=[replace(g, **values) if g.index == index else g for g in s.gpus])


def not_ok(findings: list[Finding]) -> list[tuple[str, str, Status]]:
    return [(f.code, f.subject, f.status) for f in findings if f.status not in (Status.PASS, Status.SKIP)]


@pytest.mark.parametrize(
    ("code", "kind"),
    [
        (48, "hardware"),  # WORKFLOW_XID_48
        (79, "hardware"),  # RESTART_BM
        (95, "hardware"),  # RESET_GPU
        (74, "hardware"),  # WORKFLOW_NVLINK_ERR
        (119, "hardware"),  # RESET_GPU
        (125, "hardware"),  # UNEXPECTED_ERR_REPORT_ISSUE
        (61, "hardware"),  # UNEXPECTED_ERR_REPORT_ISSUE
        (109, "hardware"),  # RESET_GPU
        (13, "application"),  # RESTART_APP
        (31, "application"),
        (8, "application"),
        (94, "application"),  # RESTART_APP: only the context that hit the contained error is stopped
        (43, "other"),  # IGNORE
        (45, "other"),  # WORKFLOW_XID_45: act on the XID before it
        (121, "other"),  # IGNORE
        (999, "other"),  # not in the catalog
    ],
)
def test_xid_classes_follow_nvidias_catalog(code: int, kind: str) -> None:
    assert xid.classify(code) == kind


def test_the_xid_table_is_nvidias_catalog() -> None:
    """tests/reference/xid_catalog.csv is NVIDIA's own file (NVSentinel's copy of the XID catalog's
    immediate-action buckets); the table in gpudoctor/xid.py must say the same for every XID."""
    import csv

    rows = list(csv.reader((REFERENCE / "xid_catalog.csv").open(encoding="utf-8")))
    assert len(rows) == 162
    for number, mnemonic, bucket, _fatal in rows:
        expected = "RECOVERY_ACTION" if number == "154" else bucket
        assert xid.bucket(int(number)) == expected, (number, mnemonic)
    assert xid.bucket(163) is None and xid.kind(163) == "other"
    assert set(xid.ACTIONS) >= set(xid.BUCKETS), "every bucket says what to do"


def test_kernel_log_and_nvml_bus_ids_name_the_same_gpu() -> None:
    key = normalize_bus_id("00000000:3A:00.0")
    assert normalize_bus_id("PCI:0000:3a:00") == normalize_bus_id("0000:3a:00.0") == key == (0, 0x3A, 0, 0)
    assert normalize_bus_id("PCI:0001:3a:00") != key
    assert normalize_bus_id("garbage") != key
    assert nvml_bus_id("PCI:0000:3a:00") == nvml_bus_id("0000:3A:00") == "00000000:3A:00.0"


def test_hardware_xid_on_a_gpu_the_run_does_not_use_only_warns() -> None:
    s = snap("h100_sxm_8x")
    s = replace(
        s,
        env={"CUDA_VISIBLE_DEVICES": "0,1"},
        host=replace(s.host, xid_events=[XidEvent("PCI:0000:db:00", 79, "fallen off the bus")]),
    )
    (f,) = health.xid_errors(CheckContext(s))
    assert (f.code, f.subject, f.status) == ("GD810", "gpu:7", Status.WARN)
    assert "does not use" in f.message


@pytest.mark.parametrize("code", [63, 94])
def test_contained_memory_xid_warns_and_says_a_reset_may_have_cleared_it(code: int) -> None:
    s = snap("h100_sxm_8x")
    s = replace(s, host=replace(s.host, xid_events=[XidEvent("00000000:18:00.0", code, "event")]))
    (f,) = health.xid_errors(CheckContext(s))
    assert (f.code, f.subject, f.status) == ("GD810", "gpu:0", Status.WARN)
    assert "since boot" in f.message and "reset" in f.hint and "ROW_REMAPPER" in f.hint
    assert f.evidence["contained"] is True


def test_a_contained_xid_beside_a_fatal_one_still_fails_the_gpu() -> None:
    s = snap("h100_sxm_8x")
    events = [XidEvent("00000000:18:00.0", 63, "remap"), XidEvent("00000000:18:00.0", 95, "uncontained")]
    s = replace(s, host=replace(s.host, xid_events=events))
    got = sorted((f.status, tuple(f.evidence["xids"])) for f in health.xid_errors(CheckContext(s)))
    assert got == sorted([(Status.WARN, (63,)), (Status.FAIL, (95,))])


def test_fatal_hardware_xid_fails_and_notes_the_log_spans_since_boot() -> None:
    s = snap("h100_sxm_8x")
    s = replace(s, host=replace(s.host, xid_events=[XidEvent("00000000:18:00.0", 64, "remap failure")]))
    (f,) = health.xid_errors(CheckContext(s))
    assert (f.status, f.evidence["contained"]) == (Status.FAIL, False)
    assert "since boot" in f.message and "before the last GPU reset" in f.hint


def test_xid_for_a_device_nvml_does_not_list_is_still_reported() -> None:
    s = snap("a100_sxm_8x")
    s = replace(s, host=replace(s.host, xid_events=[XidEvent("PCI:0000:c1:00", 48, "DBE")]))
    (f,) = health.xid_errors(CheckContext(s))
    assert f.subject == "pci:PCI:0000:c1:00" and f.status is Status.WARN


def test_xid_outside_the_catalog_warns() -> None:
    s = snap("a100_sxm_8x")
    s = replace(s, host=replace(s.host, xid_events=[XidEvent("PCI:0000:10:1c", 999, "future xid")]))
    assert not_ok(health.xid_errors(CheckContext(s))) == [("GD812", "gpu:0", Status.WARN)]


def test_xid_the_catalog_says_to_ignore_is_listed_as_a_pass() -> None:
    s = snap("a100_sxm_8x")
    s = replace(s, host=replace(s.host, xid_events=[XidEvent("PCI:0000:10:1c", 43, "channel reset")]))
    (f,) = health.xid_errors(CheckContext(s))
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
def test_hardware_xid_hint_is_the_catalogs_immediate_action(xid_number: int, words: str) -> None:
    s = snap("h100_sxm_8x")
    s = replace(s, host=replace(s.host, xid_events=[XidEvent("00000000:18:00.0", xid_number, "event")]))
    (f,) = health.xid_errors(CheckContext(s))
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
def test_xid_154_is_judged_by_the_action_it_names(text: str, now: str, status: Status, words: str) -> None:
    # `now` is what NVML still reports for GPU 0 (on 18:00.0): the action is pending, not yet done.
    s = gpu_change(snap("h100_sxm_8x"), 0, recovery_action=now)
    s = replace(s, host=replace(s.host, xid_events=[XidEvent("PCI:0000:18:00", 120, "GSP error"), xid154(text)]))
    by_xid = {tuple(f.evidence["xids"]): f for f in health.xid_errors(CheckContext(s))}
    f = by_xid[(154,)]
    assert (f.code, f.status) == ("GD810", status) and words in f.hint
    assert by_xid[(120,)].status is Status.FAIL  # the GSP error itself still needs its reset


def test_xid_154_already_acted_on_passes_when_nvml_reports_no_action_now() -> None:
    s = gpu_change(snap("h100_sxm_8x"), 0, recovery_action="none")
    text = CHANGED + "0x0 (None) to 0x1 (GPU Reset Required)"
    s = replace(s, host=replace(s.host, xid_events=[xid154(text)]))
    (f,) = health.xid_errors(CheckContext(s))
    assert f.status is Status.PASS and "since done" in f.message


def test_xid_not_collected_says_nothing() -> None:
    s = snap("a100_sxm_8x")
    s = replace(s, host=replace(s.host, xid_events=Missing("not_collected")))
    assert health.xid_errors(CheckContext(s)) == []


def test_retired_pages_pending_fails() -> None:
    s = gpu_change(snap("a100_sxm_8x"), 4, retired_pages_pending=True)
    assert not_ok(health.memory_errors(CheckContext(s))) == [("GD803", "gpu:4", Status.FAIL)]


def test_idle_and_benign_clock_reasons_are_not_throttling() -> None:
    s = gpu_change(snap("h100_sxm_8x"), 0, clock_event_reasons=0x1 | 0x2 | 0x10 | 0x100)
    assert not_ok(health.clocks(CheckContext(s))) == []


def test_software_thermal_slowdown_warns_and_reports_temperature() -> None:
    s = gpu_change(snap("h100_sxm_8x"), 6, clock_event_reasons=0x20, temperature_c=87)
    (f,) = health.clocks(CheckContext(s))
    assert (f.subject, f.status) == ("gpu:6", Status.WARN)
    assert f.evidence["temperature_c"] == 87 and "cooling" in f.hint.lower()


def test_clock_reason_table_uses_nvml_bits_and_one_meaning_per_bit() -> None:
    # nvml.h nvmlClocksEventReason* values, written out here rather than read from the code.
    raw = {0x1: "benign", 0x2: "benign", 0x4: "power", 0x8: "hardware", 0x10: "benign", 0x20: "thermal"}
    raw |= {0x40: "thermal", 0x80: "power", 0x100: "benign"}
    assert {r.bit: r.kind for r in clock_reasons.REASONS} == raw
    assert clock_reasons.kinds(0x8 | 0x1) == {"hardware"}


@pytest.mark.parametrize(
    ("mask", "status", "hint_word"),
    [(0x4, Status.WARN, "power limit"), (0x8, Status.FAIL, "power supplies"), (0x40, Status.FAIL, "cooling")],
)
def test_clock_reason_status_and_hint(mask: int, status: Status, hint_word: str) -> None:
    s = gpu_change(snap("h100_sxm_8x"), 2, clock_event_reasons=mask)
    (f,) = health.clocks(CheckContext(s))
    assert (f.subject, f.status) == ("gpu:2", status)
    assert hint_word in f.hint


def test_mig_fails_unless_allowed() -> None:
    s = snap("a100_mig")
    assert not_ok(gpu_modes.gpu_modes(CheckContext(s))) == [("GD820", "host", Status.FAIL)]
    allowed = gpu_modes.gpu_modes(CheckContext(s, CheckOptions(allow_mig=True)))
    assert not_ok(allowed) == []
    assert any(f.code == "GD820" and "--allow-mig" in f.message for f in allowed)


def test_processes_name_pid_user_command_and_memory() -> None:
    proc = GpuProcess(
        pid=912345, used_memory_mib=20480, local_pid=4711, user="bob", command="/opt/conda/bin/python train.py"
    )
    s = gpu_change(snap("container_32gb_8gpu"), 2, processes=[proc], memory_used_mib=20480 + 300)
    (f,) = gpu_modes.gpu_processes(CheckContext(s))
    assert (f.code, f.subject, f.status) == ("GD825", "gpu:2", Status.WARN)
    assert "pid 912345 python (bob) 20480 MiB" in f.message
    assert f.evidence["processes"][0]["local_pid"] == 4711 and "kill 4711" in f.hint


def test_small_unaccounted_memory_is_driver_overhead_not_a_ghost() -> None:
    s = gpu_change(snap("h100_sxm_8x"), 1, memory_used_mib=600, processes=[])
    assert not_ok(gpu_modes.gpu_processes(CheckContext(s))) == []


def test_ghost_memory_cannot_be_judged_when_a_process_has_no_memory_figure() -> None:
    proc = GpuProcess(pid=1, used_memory_mib=None)
    s = gpu_change(snap("h100_sxm_8x"), 1, memory_used_mib=40000, processes=[proc])
    assert [c for c, _, _ in not_ok(gpu_modes.gpu_processes(CheckContext(s)))] == ["GD825"]


@pytest.mark.parametrize(
    ("action", "status", "words"),
    [
        ("gpu_reset", Status.FAIL, "nvidia-smi -r -i 4"),
        ("node_reboot", Status.FAIL, "Reboot the node"),
        ("drain_p2p", Status.WARN, "UVM persistence"),  # DCGM's health watch warns on this one
        ("drain_and_reset", Status.FAIL, "reduced capacity"),
        ("action_9", Status.FAIL, "nvml.h"),  # a value this gpudoctor does not know: not a pass
    ],
)
def test_recovery_action_names_what_to_do(action: str, status: Status, words: str) -> None:
    s = gpu_change(snap("h100_sxm_8x"), 4, recovery_action=action)
    (f,) = health.recovery_action(CheckContext(s))
    assert (f.code, f.status, f.subject) == ("GD828", status, "gpu:4")
    assert words in f.hint or words in f.message


def test_recovery_action_none_passes_and_unused_gpus_only_warn() -> None:
    s = snap("h100_sxm_8x")
    s = replace(s, gpus=[replace(g, recovery_action="none") for g in s.gpus])
    (f,) = health.recovery_action(CheckContext(s))
    assert f.status is Status.PASS and "GPU 0, 1, 2, 3, 4, 5, 6, 7" in f.message
    s = replace(gpu_change(s, 7, recovery_action="gpu_reset"), env={"CUDA_VISIBLE_DEVICES": "0"})
    (f,) = health.recovery_action(CheckContext(s))
    assert f.status is Status.WARN and "does not use" in f.message


def test_ecc_counts_say_whether_the_errors_are_in_sram_or_dram() -> None:
    s = gpu_change(
        snap("h100_sxm_8x"),
        1,
        ecc_uncorrected_volatile=3,
        ecc_uncorrected_aggregate=3,
        ecc_uncorrected_dram_volatile=1,
        sram_ecc=SramEcc(2, 0, 2, 0, False),
    )
    found = {f.code: f for f in health.memory_errors(CheckContext(s))}
    assert "(SRAM 2, DRAM 1)" in found["GD801"].message
    assert (found["GD801"].evidence["sram"], found["GD801"].evidence["dram"]) == (2, 1)
    assert found["GD829"].status is Status.WARN  # SRAM errors, RMA threshold not reached


def test_an_ecc_split_that_does_not_add_up_is_called_unknown() -> None:
    """A recording whose SRAM/DRAM parts (0, 0) contradict its total (2) does not print them."""
    s = load(FIXTURES / "faults" / "ecc_uncorrectable.json")
    (f,) = [f for f in health.memory_errors(CheckContext(s)) if f.code == "GD801"]
    assert "2 uncorrectable ECC error(s)" in f.message and "(SRAM/DRAM split unknown)" in f.message
    assert "SRAM 0" not in f.message and f.evidence["split"] == "unknown" and "sram" not in f.evidence
    # Only one part known (a driver without the SRAM status): unknown too, not "(DRAM 0)".
    one = gpu_change(snap("h100_sxm_8x"), 2, ecc_uncorrected_aggregate=1, ecc_uncorrected_dram_aggregate=0)
    one = gpu_change(one, 2, sram_ecc=Missing("unsupported"))
    (g,) = [f for f in health.memory_errors(CheckContext(one)) if f.code == "GD802"]
    assert "(SRAM/DRAM split unknown)" in g.message and "DRAM 0" not in g.message


def test_sram_threshold_flag_is_an_rma_case() -> None:
    s = gpu_change(snap("h100_sxm_8x"), 5, sram_ecc=SramEcc(5, 0, 0, 0, True))
    (f,) = [f for f in health.memory_errors(CheckContext(s)) if f.code == "GD829"]
    assert (f.status, f.subject) == (Status.FAIL, "gpu:5")
    assert "RMA" in f.message and "field diagnostic" in f.hint


def test_exhausted_remap_banks_warn_before_the_remap_fails() -> None:
    s = gpu_change(snap("a100_sxm_8x"), 3, remap_histogram=RemapHistogram(630, 4, 2, 3, 1))
    (f,) = not_ok(health.memory_errors(CheckContext(s)))
    assert f == ("GD830", "gpu:3", Status.WARN)
    (full,) = [x for x in health.memory_errors(CheckContext(s)) if x.code == "GD830"]
    assert "1 of 640 DRAM banks have no spare rows" in full.message and "3 more have few" in full.message
    healthy = gpu_change(snap("a100_sxm_8x"), 3, remap_histogram=RemapHistogram(640, 0, 0, 0, 0))
    (p,) = health.memory_errors(CheckContext(healthy))
    assert p.status is Status.PASS and "every DRAM bank has spare rows on GPU 0, 1, 2, 3, 4, 5, 6, 7" in p.message


def smi_reading(title: str) -> dict[str, str]:
    """`Name : value` lines of one verbatim `nvidia-smi -q` excerpt in nvidia_smi_q_h100.md,
    keyed by the section path ("ECC Errors/Aggregate/SRAM Threshold Exceeded")."""
    text = (REFERENCE / "nvidia_smi_q_h100.md").read_text(encoding="utf-8")
    block = text.split(f"## {title}", 1)[1].split("```", 2)[1]
    values: dict[str, str] = {}
    path: list[tuple[int, str]] = []
    for line in block.splitlines():
        if not line.strip():
            continue
        depth = len(line) - len(line.lstrip())
        name, _, value = (part.strip() for part in line.partition(":"))
        path = [(d, n) for d, n in path if d < depth]
        if value:
            values["/".join(n for _, n in path) + ("/" if path else "") + name] = value
        else:
            path.append((depth, name))
    return values


def test_h100_fixture_matches_a_real_h100_reading() -> None:
    smi = smi_reading("NVIDIA H100")
    s = snap("h100_sxm_8x")
    for g in s.gpus:
        assert g.inforom_image == smi["Inforom Version/Image Version"]
        # The GSP firmware carries the driver's version (590.48.01 on 590.48.01).
        assert smi["GSP Firmware Version"] == "590.48.01" and g.gsp_firmware == s.driver.driver_version
        assert g.recovery_action == smi["GPU Recovery Action"].lower()
        h = g.remap_histogram
        assert isinstance(h, RemapHistogram)
        assert (h.max, h.high, h.partial, h.low, h.none) == tuple(
            int(smi[f"Remapped Rows/Bank Remap Availability Histogram/{k}"].split()[0])
            for k in ("Max", "High", "Partial", "Low", "None")
        )
        assert isinstance(g.sram_ecc, SramEcc) and g.sram_ecc.threshold_exceeded is False
        assert smi["ECC Errors/Aggregate/SRAM Threshold Exceeded"] == "No"
        sram = (g.sram_ecc.aggregate_uncorrectable_parity, g.sram_ecc.aggregate_uncorrectable_secded)
        assert sram == (
            int(smi["ECC Errors/Aggregate/SRAM Uncorrectable Parity"]),
            int(smi["ECC Errors/Aggregate/SRAM Uncorrectable SEC-DED"]),
        )
        assert g.ecc_uncorrected_dram_aggregate == int(smi["ECC Errors/Aggregate/DRAM Uncorrectable"])
    # A real, healthy H100 shows replays since reset: a count alone is no verdict, a rise is.
    assert int(smi["Replays Since Reset"]) == 9
    replayed = replace(s, gpus=[replace(g, pcie_replays=9, pcie_replays_later=9) for g in s.gpus])
    assert not_ok(link_errors.link_errors(CheckContext(replayed))) == []
