"""How the GPUs connect (GD401-407): NVLinks down, PCIe levels and widths, P2P, and the all-reduce
bandwidth the machine should reach; on variants of the recorded machines through the in-process CLI."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gpudoctor import snapshot as snapshot_io
from gpudoctor.snapshot import GpuPair, Missing, NvLink
from tests.helpers.cli import check_variant, run_cli
from tests.helpers.snapshots import FIXTURE_NAMES, fixture, load, with_env, with_gpu
from tests.paths import FIXTURES

FAULT_NAMES = sorted(f"faults/{p.stem}" for p in (FIXTURES / "faults").glob("*.json"))


def test_gpu_with_links_down_is_named(capsys, tmp_path) -> None:  # type: ignore[no-untyped-def]
    base = load("h100_sxm_8x")
    links = base.gpu(3).nvlinks
    assert isinstance(links, list)
    twelve = [replace(link, active=link.link < 12) for link in links]
    r = check_variant(capsys, tmp_path, with_gpu(base, 3, nvlinks=twelve))
    f = r.one("GD402")
    assert (f["status"], f["subject"]) == ("fail", "gpu:3")
    assert f["message"].startswith("GPU 3 has 12 of 18 NVLinks active, its peers 18")
    assert f["evidence"] == {"active_links": 12, "expected": 18, "links": 18}
    seventeen = [replace(link, active=link.link != 5) for link in links]
    assert check_variant(capsys, tmp_path, with_gpu(base, 3, nvlinks=seventeen)).one("GD402")["status"] == "warn"
    # the matrix shows the weaker GPU's pairs as NV12
    topo = next(c for c in r.doc["checks"] if c["name"] == "topology")["details"]["topology"]["matrix"]
    assert topo[3][0] == "NV12" and topo[0][1] == "NV18"


def test_bridged_pairs_across_sockets_warn_about_sys(capsys, tmp_path) -> None:  # type: ignore[no-untyped-def]
    base = load("a100_mig")
    buses = {g.index: g.pci_bus_id for g in base.gpus}
    peer = {0: 1, 1: 0, 2: 3, 3: 2}
    gpus = [
        replace(
            g,
            mig_mode_current=False,
            mig_devices=[],
            nvlinks=[NvLink(i, True, 3, buses[peer[g.index]], "gpu") for i in range(4)],
        )
        for g in base.gpus
    ]
    r = check_variant(capsys, tmp_path, replace(base, gpus=gpus))
    f = r.one("GD403")
    assert f["status"] == "warn"
    assert f["evidence"]["pairs_without_nvlink"] == {"0-2": "SYS", "0-3": "SYS", "1-2": "SYS", "1-3": "SYS"}
    assert "4 of 6 GPU pairs have no NVLink while others have NV4; 4 cross SYS" in f["message"]


def test_every_gpu_down_the_same_links_warns_against_the_healthy_count(capsys, tmp_path) -> None:  # type: ignore[no-untyped-def]
    # All 8 A100s lost their last 2 links (a switch tray out): the majority no longer shows it.
    base = load("a100_sxm_8x")
    snap = base
    for g in base.gpus:
        snap = with_gpu(snap, g.index, nvlinks=[replace(link, active=link.link < 10) for link in g.nvlinks])
    r = check_variant(capsys, tmp_path, snap)
    found = r.findings("GD402")
    assert [(f["status"], f["subject"]) for f in found] == [("warn", f"gpu:{i}") for i in range(8)]
    assert found[0]["message"].startswith("GPU 0 has 10 of 12 NVLinks active, its peers 10")
    assert found[0]["evidence"] == {"active_links": 10, "expected": 12, "links": 12}
    # GD407 keeps the healthy figure: what GD601 will hold the run to.
    assert r.one("GD407")["evidence"]["expected_busbw_gbps"] == 228.0


def test_links_down_leave_the_expected_busbw_at_the_healthy_figure(capsys, tmp_path) -> None:  # type: ignore[no-untyped-def]
    base = load("h100_sxm_8x")
    dead = [replace(link, active=False, remote_type=Missing("error")) for link in base.gpu(0).nvlinks]
    r = check_variant(capsys, tmp_path, with_gpu(base, 0, nvlinks=dead))
    assert (r.one("GD402")["status"], r.one("GD402")["subject"]) == ("fail", "gpu:0")
    healthy = check_variant(capsys, tmp_path, base).one("GD407")["evidence"]
    assert r.one("GD407")["evidence"] == healthy


def no_handle(name: str) -> bool:
    """A GPU NVML gave no handle for (GD827): CUDA does not enumerate it, so the busbw stated is
    that of the GPUs that answer."""
    return any(snapshot_io.known(g.unreachable) for g in load(name).gpus)


@pytest.mark.parametrize(
    "name",
    [n for n in FIXTURE_NAMES + FAULT_NAMES if len(load(n).gpus) >= 2],
    ids=lambda n: n,
)
def test_every_fixture_with_two_gpus_states_its_expected_busbw(capsys, name: str) -> None:  # type: ignore[no-untyped-def]
    r = run_cli(capsys, "check", "--snapshot", str(fixture(name)), "--json", "--select", "GD407")
    f = r.one("GD407")
    assert f["status"] == "pass" and f["evidence"]["expected_busbw_gbps"] > 0
    assert f["evidence"]["basis"] and f["evidence"]["source"] and f["evidence"]["fabric"]
    assert f"{f['evidence']['expected_busbw_gbps']:.1f} GB/s" in f["message"]


def test_a_gpu_without_a_handle_is_left_out_of_the_busbw_stated(capsys) -> None:  # type: ignore[no-untyped-def]
    # CUDA does not enumerate the lost GPU: the run has 7, and the figure is theirs (GD201 says it is left out).
    assert no_handle("faults/gpu_fallen_off_bus")
    r = run_cli(capsys, "check", "--snapshot", str(fixture("faults/gpu_fallen_off_bus")), "--json", "--select", "GD407")
    f = r.one("GD407")
    assert f["status"] == "pass" and f["evidence"]["gpus"] == [0, 1, 2, 4, 5, 6, 7]
    assert "these 7 GPUs" in f["message"]


def test_one_gpu_has_no_expected_busbw(capsys) -> None:  # type: ignore[no-untyped-def]
    r = run_cli(capsys, "check", "--snapshot", str(fixture("single_gpu")), "--json", "--select", "GD407,GD101")
    assert r.one("GD407")["status"] == "skip"


def test_p2p_missing_exactly_across_the_sockets_says_so(capsys, tmp_path) -> None:  # type: ignore[no-untyped-def]
    # Four data-centre PCIe GPUs on two sockets: P2P within a socket, not across (NVML: TNS).
    base = load("rtx4090_pcie_4x")
    gpus = [replace(g, name="NVIDIA L40S", compute_capability="8.9") for g in base.gpus]

    def pair(p: GpuPair) -> GpuPair:
        same = p.a // 2 == p.b // 2
        status = "ok" if same else "topology_not_supported"
        return GpuPair(p.a, p.b, "NODE" if same else "SYS", status, status)

    pairs = [pair(p) for p in base.pairs]
    r = check_variant(capsys, tmp_path, replace(base, gpus=gpus, pairs=pairs))
    f = r.one("GD406")
    assert (f["status"], f["subject"]) == ("warn", "host")
    assert f["message"].startswith("P2P is unsupported exactly on the 4 GPU pair(s) that cross the CPU sockets (SYS)")
    assert "CPU interconnect" in f["hint"] and "GeForce" not in f["hint"]
    assert f["evidence"]["cause"] == "cpu interconnect"
    assert set(f["evidence"]["pairs"]) == {"0-2", "0-3", "1-2", "1-3"}


def test_a_mesh_with_pairs_without_nvlink_still_rings_on_nvlink(capsys, tmp_path) -> None:  # type: ignore[no-untyped-def]
    from tests.helpers.reference_machines import DGX1, build

    dgx1 = build(DGX1)
    r = check_variant(capsys, tmp_path, dgx1)
    f = r.one("GD403")
    assert f["status"] == "pass" and "12 of 28 GPU pairs have no direct NVLink, but a ring" in f["message"]
    assert r.one("GD407")["evidence"]["fabric"] == "mesh"
    chain = check_variant(capsys, tmp_path, with_env(dgx1, CUDA_VISIBLE_DEVICES="0,1,5"))
    assert chain.one("GD403")["status"] == "warn"


def test_narrow_pcie_link_warns_and_a_busy_link_at_a_quarter_fails(capsys, tmp_path) -> None:  # type: ignore[no-untyped-def]
    snap = with_gpu(load("h100_sxm_8x"), 5, pcie_width_current=8)
    snap = with_gpu(snap, 6, pcie_gen_current=3, clock_event_reasons=0)
    snap = with_gpu(snap, 7, pcie_gen_current=4, clock_event_reasons=0)
    r = check_variant(capsys, tmp_path, snap)
    width = r.one("GD404")
    assert (width["status"], width["subject"], width["evidence"]) == ("warn", "gpu:5", {"width": 8, "expected": 16})
    gen = {f["subject"]: f for f in r.findings("GD405")}
    # Severity from what the link still carries (issue 21): Gen3 lanes carry a quarter of Gen5's.
    assert gen["gpu:6"]["status"] == "fail" and "Gen3 of Gen5 while busy" in gen["gpu:6"]["message"]
    assert "25% of its host bandwidth" in gen["gpu:6"]["message"]
    assert gen["gpu:7"]["status"] == "warn"  # Gen4 of Gen5: half
    quarter = check_variant(capsys, tmp_path, with_gpu(load("h100_sxm_8x"), 5, pcie_width_current=4))
    assert quarter.one("GD404")["status"] == "fail"  # x4 of x16


def test_nvlink_pair_without_p2p_fails(capsys, tmp_path) -> None:  # type: ignore[no-untyped-def]
    base = load("h100_sxm_8x")
    pairs = [
        GpuPair(p.a, p.b, p.pcie_level, "disabled_by_regkey", "disabled_by_regkey") if (p.a, p.b) == (2, 5) else p
        for p in base.pairs
    ]
    r = check_variant(capsys, tmp_path, replace(base, pairs=pairs))
    f = r.one("GD406")
    assert (f["status"], f["subject"]) == ("fail", "pair:2-5")
    assert "NV18" in f["message"] and "disabled_by_regkey" in f["message"]
