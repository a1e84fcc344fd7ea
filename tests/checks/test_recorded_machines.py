"""The static checks (visibility, identity, topology, host RAM) on each machine recorded in tests/fixtures/,
and the recordings themselves.

Every case runs the real CLI (`gpudoctor check --snapshot F --json`) in-process and validates
the JSON against the shipped schema (Result.doc does).
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from gpudoctor.checks import link_errors
from gpudoctor.engine import CheckContext
from gpudoctor.snapshot import RemapHistogram, SramEcc
from tests.helpers.cli import MY_CHECKS, check_variant, run_cli
from tests.helpers.findings import not_ok
from tests.helpers.snapshots import SnapshotOf, fixture, load, with_env, write_variant
from tests.paths import REFERENCE


def test_h100_hgx_is_ready_with_nv18_everywhere(capsys: pytest.CaptureFixture[str]) -> None:
    r = run_cli(capsys, "check", "--snapshot", str(fixture("h100_sxm_8x")), "--json")
    assert r.exit_code == 0, r.statuses()
    mine = {c: s for c, s in r.statuses().items() if c[2] in "2345" and int(c[2:]) < 510}
    assert all(s == {"pass"} for s in mine.values()), mine
    assert "all 28 pairs NV18 (NVLink 4, through NVSwitch)" in r.one("GD401")["message"]
    visible = r.one("GD201")
    assert visible["evidence"]["visible"] == 8
    assert [d["nvml_index"] for d in visible["evidence"]["devices"]] == list(range(8))
    assert all(d["uuid"].startswith("GPU-") for d in visible["evidence"]["devices"])
    topo = next(c for c in r.doc["checks"] if c["name"] == "topology")["details"]
    assert topo["topology"]["matrix"][0] == ["X"] + ["NV18"] * 7
    assert topo["tables"][0]["columns"][1:4] == ["GPU0", "GPU1", "GPU2"]
    assert topo["tables"][0]["rows"][4][-2:] == ["56-111,168-223", "1"]


def test_a100_hgx_is_ready_with_nv12(capsys: pytest.CaptureFixture[str]) -> None:
    r = run_cli(capsys, "check", "--snapshot", str(fixture("a100_sxm_8x")), "--json", "--select", MY_CHECKS)
    assert r.exit_code == 0
    assert "NV12" in r.one("GD401")["message"]
    assert r.one("GD402")["message"] == "8 GPUs with 12 active NVLinks each"
    assert r.one("GD502")["evidence"]["gpu_memory_gb"] == 640.0


def test_rtx4090_box_warns_about_missing_p2p_only(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["check", "--snapshot", str(fixture("rtx4090_pcie_4x")), "--json", "--select", MY_CHECKS]
    r = run_cli(capsys, *args)
    assert r.exit_code == 0
    warns = [f for f in r.findings() if f["status"] != "pass"]
    assert [(f["code"], f["status"], f["subject"]) for f in warns] == [("GD406", "warn", "host")]
    assert "GeForce" in warns[0]["message"] and "chipset_not_supported" in warns[0]["message"]
    assert len(warns[0]["evidence"]["pairs"]) == 6
    # Gen1 of Gen4 at idle is power saving, not a fault.
    gen = r.one("GD405")
    assert gen["status"] == "pass" and "idle" in gen["message"]
    assert run_cli(capsys, *args, "--fail-on", "warn").exit_code == 1


def test_mixed_desktop_names_the_odd_card_and_the_cuda_order(capsys: pytest.CaptureFixture[str]) -> None:
    r = run_cli(capsys, "check", "--snapshot", str(fixture("rtx4090_2x_rtx4080_1x")), "--json", "--select", MY_CHECKS)
    assert r.exit_code == 1
    model = r.one("GD301")
    assert (model["status"], model["subject"]) == ("fail", "gpu:1")
    assert model["message"].startswith(
        "GPU 1 is an NVIDIA GeForce RTX 4080, the others NVIDIA GeForce RTX 4090: every step waits"
    )
    memory = r.one("GD302")
    assert (memory["status"], memory["subject"]) == ("fail", "gpu:1")
    assert memory["evidence"] == {"memory": "16 GiB", "expected": "24 GiB", "others": [0, 2]}
    order = r.one("GD205")
    assert order["status"] == "warn"
    assert "cuda:1 is nvidia-smi's GPU 2" in order["message"]
    assert order["evidence"]["cuda_order"] == [0, 2, 1]
    # VBIOS and power limit differ only because the model does: not reported twice.
    assert all(f["status"] == "pass" for f in r.findings("GD303") + r.findings("GD304"))


def test_mixed_desktop_with_pci_bus_id_order_has_no_order_warning(capsys: pytest.CaptureFixture[str], tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = write_variant(tmp_path, with_env(load("rtx4090_2x_rtx4080_1x"), CUDA_DEVICE_ORDER="PCI_BUS_ID"))
    r = run_cli(capsys, "check", "--snapshot", path, "--json", "--select", "visibility")
    assert r.findings("GD205") == []
    assert r.one("GD201")["evidence"]["devices"][1]["nvml_index"] == 1


def test_single_gpu_is_ready_with_nothing_to_compare(capsys: pytest.CaptureFixture[str]) -> None:
    r = run_cli(capsys, "check", "--snapshot", str(fixture("single_gpu")), "--json", "--select", MY_CHECKS)
    assert r.exit_code == 0
    assert r.one("GD201")["message"] == "1 GPU(s) visible: cuda:0=GPU 0"
    assert "nothing to compare" in r.one("GD301")["message"]
    assert "no GPU pairs" in r.one("GD401")["message"]


def test_mig_machine_shows_one_mig_instance(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["check", "--snapshot", str(fixture("a100_mig")), "--json", "--select", MY_CHECKS]
    r = run_cli(capsys, *args)
    assert r.exit_code == 0
    visible = r.one("GD201")
    assert visible["evidence"]["visible"] == 1
    assert visible["evidence"]["devices"][0]["uuid"].startswith("MIG-")
    assert "MIG" in visible["message"]
    short = run_cli(capsys, *args, "--expect-gpus", "4")
    assert short.exit_code == 1
    assert short.one("GD202")["evidence"] == {"visible": 1, "expected": 4}


def test_no_driver_fails_once_and_the_gpu_checks_skip(capsys: pytest.CaptureFixture[str]) -> None:
    r = run_cli(capsys, "check", "--snapshot", str(fixture("no_driver")), "--json")
    assert r.exit_code == 1
    assert r.one("GD101")["status"] == "fail"
    for code in ("GD201", "GD301", "GD401", "GD501"):
        f = r.one(code)
        assert (f["status"], f["message"]) == ("skip", "no GPUs to check: see GD101")
    mine = [c for c in r.doc["checks"] if c["name"] in MY_CHECKS.split(",")]
    assert [c["status"] for c in mine] == ["skip"] * 4


def test_container_with_32gb_for_8_gpus_fails_host_ram(capsys: pytest.CaptureFixture[str]) -> None:
    r = run_cli(capsys, "check", "--snapshot", str(fixture("container_32gb_8gpu")), "--json", "--select", MY_CHECKS)
    assert r.exit_code == 1
    per_gpu = r.one("GD501")
    assert per_gpu["status"] == "fail"
    assert "32 GiB usable RAM (container limit; the machine has 1152 GiB) for 8 GPU(s)" in per_gpu["message"]
    assert "4 GiB per GPU, below 16 GiB" in per_gpu["message"]
    assert per_gpu["evidence"]["source"] == "cgroup limit"
    assert per_gpu["evidence"]["per_gpu_gb"] == 4.0 and per_gpu["evidence"]["expected_per_gpu_gb"] == 16.0
    total = r.one("GD502")
    assert total["status"] == "warn" and total["evidence"]["gpu_memory_gb"] == 320.0
    assert r.one("GD203")["status"] == "pass"  # LOCAL_WORLD_SIZE=8 and 8 GPUs


def test_replayed_snapshot_keeps_its_own_hostname(capsys, tmp_path) -> None:  # type: ignore[no-untyped-def]
    import socket

    s = load("h100_sxm_8x")
    named = check_variant(capsys, tmp_path, replace(s, host=replace(s.host, hostname="gpu-node-17")))
    assert named.doc["hostname"] == "gpu-node-17"
    unnamed = check_variant(capsys, tmp_path, replace(s, host=replace(s.host, hostname="")))
    assert unnamed.doc["hostname"] == "" != socket.gethostname()  # never this machine's name


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


def test_h100_fixture_matches_a_real_h100_reading(snapshot_of: SnapshotOf) -> None:
    smi = smi_reading("NVIDIA H100")
    s = snapshot_of("h100_sxm_8x")
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
