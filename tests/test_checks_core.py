"""Verdicts of the visibility, identity, topology and host-RAM checks on recorded machines.

Every case runs the real CLI (`gpudoctor check --snapshot F --json`) in-process and validates
the JSON against the shipped schema (Result.doc does).
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from gpudoctor import snapshot as snapshot_io
from gpudoctor.snapshot import GpuPair, Missing, NvLink
from tests.clirun import FIXTURE_NAMES, FIXTURES, MY_CHECKS, fixture, load, run_cli, with_env, with_gpu, write_variant

FAULT_NAMES = sorted(f"faults/{p.stem}" for p in (FIXTURES / "faults").glob("*.json"))


def path_of(name: str):  # type: ignore[no-untyped-def]
    return FIXTURES / f"{name}.json"


def load_any(name: str) -> snapshot_io.Snapshot:
    return snapshot_io.load(path_of(name))


# ------------------------------------------------------------------------------ fixtures


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


# ------------------------------------------------------------------------------ variants


def check_variant(capsys, tmp_path, snapshot, *extra: str):  # type: ignore[no-untyped-def]
    path = write_variant(tmp_path, snapshot)
    return run_cli(capsys, "check", "--snapshot", path, "--json", "--select", MY_CHECKS, *extra)


def test_fewer_gpus_than_local_world_size_fails(capsys, tmp_path) -> None:  # type: ignore[no-untyped-def]
    snap = with_env(load("h100_sxm_8x"), CUDA_VISIBLE_DEVICES="0,1,2,3", LOCAL_WORLD_SIZE="8")
    r = check_variant(capsys, tmp_path, snap)
    assert r.exit_code == 1
    geo = r.one("GD203")
    assert geo["status"] == "fail"
    assert geo["message"] == "LOCAL_WORLD_SIZE=8 starts 8 ranks on this node but only 4 GPU(s) are visible"


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"SLURM_NTASKS_PER_NODE": "8(x2)"}, 8),
        ({"WORLD_SIZE": "6"}, 6),
        ({"WORLD_SIZE": "16", "SLURM_NNODES": "2"}, None),  # multi-node: WORLD_SIZE is not per node
        ({"SLURM_GPUS_ON_NODE": "2"}, 2),
    ],
)
def test_launch_geometry_sources(env: dict[str, str], expected: int | None) -> None:
    from gpudoctor.checks.visibility import expected_local_ranks

    got = expected_local_ranks(env)
    assert (got[0] if got else None) == expected


@pytest.mark.parametrize(
    ("cvd", "visible", "problem"),
    [
        ("", 0, "empty"),
        ("0,1,1", 0, "duplicate"),
        ("0,1,9,2", 2, "out_of_range"),
        ("0 1", 1, "trailing_junk"),
    ],
)
def test_cuda_visible_devices_that_drop_gpus_warn(capsys, tmp_path, cvd: str, visible: int, problem: str) -> None:  # type: ignore[no-untyped-def]
    r = check_variant(capsys, tmp_path, with_env(load("h100_sxm_8x"), CUDA_VISIBLE_DEVICES=cvd))
    dropped = r.one("GD204")
    assert dropped["status"] == "warn" and dropped["evidence"]["problem"] == problem
    seen = r.one("GD201")
    if visible == 0:
        assert seen["status"] == "fail" and r.exit_code == 1
        # the GPU checks say why they have nothing to do instead of failing too
        assert r.one("GD301")["message"] == "no visible GPUs to check: see GD201"
    else:
        assert seen["evidence"]["visible"] == visible


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
    return any(snapshot_io.known(g.unreachable) for g in load_any(name).gpus)


@pytest.mark.parametrize(
    "name",
    [n for n in FIXTURE_NAMES + FAULT_NAMES if len(load_any(n).gpus) >= 2],
    ids=lambda n: n,
)
def test_every_fixture_with_two_gpus_states_its_expected_busbw(capsys, name: str) -> None:  # type: ignore[no-untyped-def]
    r = run_cli(capsys, "check", "--snapshot", str(path_of(name)), "--json", "--select", "GD407")
    f = r.one("GD407")
    assert f["status"] == "pass" and f["evidence"]["expected_busbw_gbps"] > 0
    assert f["evidence"]["basis"] and f["evidence"]["source"] and f["evidence"]["fabric"]
    assert f"{f['evidence']['expected_busbw_gbps']:.1f} GB/s" in f["message"]


def test_a_gpu_without_a_handle_is_left_out_of_the_busbw_stated(capsys) -> None:  # type: ignore[no-untyped-def]
    # CUDA does not enumerate the lost GPU: the run has 7, and the figure is theirs (GD201 says it is left out).
    assert no_handle("faults/gpu_fallen_off_bus")
    r = run_cli(capsys, "check", "--snapshot", str(path_of("faults/gpu_fallen_off_bus")), "--json", "--select", "GD407")
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
    from tests.reference_machines import build
    from tests.test_calibration import DGX1

    dgx1 = build(DGX1)
    r = check_variant(capsys, tmp_path, dgx1)
    f = r.one("GD403")
    assert f["status"] == "pass" and "12 of 28 GPU pairs have no direct NVLink, but a ring" in f["message"]
    assert r.one("GD407")["evidence"]["fabric"] == "mesh"
    chain = check_variant(capsys, tmp_path, with_env(dgx1, CUDA_VISIBLE_DEVICES="0,1,5"))
    assert chain.one("GD403")["status"] == "warn"


def test_narrow_pcie_link_warns_and_busy_gen_drop_warns(capsys, tmp_path) -> None:  # type: ignore[no-untyped-def]
    snap = with_gpu(load("h100_sxm_8x"), 5, pcie_width_current=8)
    snap = with_gpu(snap, 6, pcie_gen_current=3, clock_event_reasons=0)
    r = check_variant(capsys, tmp_path, snap)
    width = r.one("GD404")
    assert (width["status"], width["subject"], width["evidence"]) == ("warn", "gpu:5", {"width": 8, "expected": 16})
    gen = r.one("GD405")
    assert (gen["status"], gen["subject"]) == ("warn", "gpu:6")
    assert "Gen3 of Gen5 while busy" in gen["message"]
    assert "25% of its host bandwidth" in gen["message"]  # Gen3 lanes carry a quarter of Gen5's


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


@pytest.mark.parametrize(
    ("change", "code", "text"),
    [
        ({"power_limit_w": 350.0}, "GD304", "GPU 4 has power limit 350 W, the others 700 W"),
        ({"vbios": "96.00.89.00.01"}, "GD303", "GPU 4 has VBIOS 96.00.89.00.01, the others 96.00.74.00.01"),
        ({"compute_mode": "exclusive_process"}, "GD305", "GPU 4 has compute mode exclusive_process, the others"),
        ({"pcie_width_max": 8}, "GD306", "GPU 4 has max PCIe link Gen5 x8, the others Gen5 x16"),
    ],
)
def test_odd_settings_warn_by_majority(capsys, tmp_path, change, code, text) -> None:  # type: ignore[no-untyped-def]
    r = check_variant(capsys, tmp_path, with_gpu(load("h100_sxm_8x"), 4, **change))
    odd = [f for f in r.findings(code) if f["status"] != "pass"]
    assert len(odd) == 1
    assert (odd[0]["status"], odd[0]["subject"]) == ("warn", "gpu:4")
    assert odd[0]["message"].startswith(text)


def test_two_against_two_has_no_majority(capsys, tmp_path) -> None:  # type: ignore[no-untyped-def]
    snap = load("rtx4090_pcie_4x")
    snap = with_gpu(with_gpu(snap, 2, power_limit_w=300.0), 3, power_limit_w=300.0)
    f = check_variant(capsys, tmp_path, snap).one("GD304")
    assert (f["status"], f["subject"]) == ("warn", "host")
    assert "GPUs 0,1: 450 W; GPUs 2,3: 300 W" in f["message"]


def test_ram_per_gpu_option_sets_the_bar(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["check", "--snapshot", str(fixture("single_gpu")), "--json", "--select", "GD501"]
    assert run_cli(capsys, *args).exit_code == 0
    r = run_cli(capsys, *args, "--ram-per-gpu", "128")
    assert r.exit_code == 1
    assert r.one("GD501")["evidence"]["expected_per_gpu_gb"] == 128.0


def test_replayed_snapshot_keeps_its_own_hostname(capsys, tmp_path) -> None:  # type: ignore[no-untyped-def]
    import socket

    s = load("h100_sxm_8x")
    named = check_variant(capsys, tmp_path, replace(s, host=replace(s.host, hostname="gpu-node-17")))
    assert named.doc["hostname"] == "gpu-node-17"
    unnamed = check_variant(capsys, tmp_path, replace(s, host=replace(s.host, hostname="")))
    assert unnamed.doc["hostname"] == "" != socket.gethostname()  # never this machine's name


@pytest.mark.parametrize(
    ("n_bytes", "text"),
    [
        (81559 * 2**20, "80 GiB"),  # H100 80GB: 81559 MiB
        (16376 * 2**20, "16 GiB"),  # RTX 4080: binary, never a decimal "17 GB"
        (1152 * 2**30, "1152 GiB"),
        (2**30, "1 GiB"),
        (int(7.5 * 2**30), "7.5 GiB"),
        (64 * 2**20, "64 MiB"),
        (64 * 1024, "64 KiB"),
    ],
)
def test_one_size_convention_binary_units_labelled_gib_mib(n_bytes: int, text: str) -> None:
    from gpudoctor import units

    assert units.size(n_bytes) == text
    assert units.size_mib(n_bytes / 2**20) == text


def test_gen_check_docs_help_writes_nothing_and_check_lists_stale_pages(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    from scripts import gen_check_docs as gen

    wanted = {"GD999.md": "page\n", "README.md": "index\n"}
    (tmp_path / "GD998.md").write_text("gone\n")
    assert gen.stale_pages(tmp_path, wanted) == ["GD998.md", "GD999.md", "README.md"]
    assert gen.write(tmp_path, wanted) == 2
    assert gen.stale_pages(tmp_path, wanted) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["GD999.md", "README.md"]
    with pytest.raises(SystemExit) as exc:
        gen.main(["--help"])
    assert exc.value.code == 0 and "--check" in capsys.readouterr().out
