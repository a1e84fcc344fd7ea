"""The network probe reads sysfs/procfs trees laid out as the kernel lays them out, and the
GPU-to-NIC levels come out as nvidia-smi topo -m prints them for the same layouts."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from gpudoctor import snapshot as snap
from gpudoctor.knowledge import nic_locality
from gpudoctor.knowledge.nic_locality import sysfs_bus_id
from gpudoctor.probe.machine import collect_machine
from gpudoctor.probe.network import (
    ROOT_ENV,
    network_root,
    parse_rate,
    parse_state,
    read_counters,
    read_gpudirect,
    read_interfaces,
    read_network,
    read_rdma,
)
from gpudoctor.probe.nvml import Nvml
from gpudoctor.snapshot import GpuDirect, Missing, PciPlace
from tests.fakes.fake_nvml import FakeNvml
from tests.fakes.machines import h100_nvswitch_8x
from tests.fakes.sysfs import DISABLED, DOWN, Port, SysfsTree, cpu_node, h100_gpu_bus_ids, hgx_h100_node
from tests.paths import FIXTURES, REPO

DOC = (REPO / "docs" / "snapshot-format.md").read_text(encoding="utf-8")


# Real sysfs strings, as `ibstatus` (rdma-core, which cats these files) printed them in public
# issues: NVIDIA/nccl#1412 (HDR), NVIDIA/nccl#489 (a port down and disabled, an old kernel's rate
# without a speed name), deepseek-ai/DeepEP#17 (RoCE NDR), the kernel's own rate_show for SDR.
@pytest.mark.parametrize(
    ("text", "gbps"),
    [
        ("200 Gb/sec (4X HDR)", 200.0),
        ("400 Gb/sec (4X NDR)", 400.0),
        ("10 Gb/sec (4X)", 10.0),
        ("2.5 Gb/sec (1X SDR)", 2.5),
        ("56 Gb/sec (4X FDR)", 56.0),
        ("garbage", None),
    ],
)
def test_rate_as_the_kernel_prints_it(text: str, gbps: float | None) -> None:
    assert parse_rate(text) == gbps


@pytest.mark.parametrize(
    ("text", "name"), [("4: ACTIVE", "ACTIVE"), ("1: DOWN", "DOWN"), ("5: LinkUp", "LinkUp"), ("2: Polling", "Polling")]
)
def test_state_names_without_the_number(text: str, name: str) -> None:
    assert parse_state(text) == name


def test_hgx_h100_node_reads_every_hca_port_and_counter(tmp_path: Path) -> None:
    hgx_h100_node(tmp_path, ports={3: Port(state=DOWN, phys_state=DISABLED, rate="10 Gb/sec (4X)")})
    devices = read_rdma(tmp_path)
    assert [d.name for d in devices] == [f"mlx5_{i}" for i in range(8)]
    first = devices[0]
    assert (first.pci_bus_id, first.hca_type, first.fw_ver, first.netdevs) == (
        "0000:19:00.0",
        "MT4129",
        "28.41.1000",
        ["ibp25s0"],
    )
    port = first.ports[0]
    assert (port.state, port.phys_state, port.rate_gbps, port.link_layer) == ("ACTIVE", "LinkUp", 400.0, "InfiniBand")
    assert port.counters == {
        "symbol_error": 0,
        "link_error_recovery": 0,
        "link_downed": 0,
        "port_rcv_errors": 0,
        "excessive_buffer_overrun_errors": 0,
    }
    down = devices[3].ports[0]
    assert (down.state, down.phys_state, down.rate, down.rate_gbps) == ("DOWN", "Disabled", "10 Gb/sec (4X)", 10.0)


def test_devices_sort_as_numbers_and_a_host_without_rdma_has_none(tmp_path: Path) -> None:
    tree = SysfsTree(tmp_path)
    for n in (10, 2, 1):
        nic = tree.pci("pci0000:00", ["0000:00:01.0", f"0000:{n:02x}:00.0"], cls="0x020700")
        tree.hca(f"mlx5_{n}", nic, ports=[Port()])
    assert [d.name for d in read_rdma(tmp_path)] == ["mlx5_1", "mlx5_2", "mlx5_10"]
    assert read_rdma(tmp_path / "nothing") == []


def test_counters_read_again_after_they_rise(tmp_path: Path) -> None:
    tree = cpu_node(tmp_path)
    assert read_counters(tmp_path)["mlx5_1:1"]["link_downed"] == 0
    tree.set_port("mlx5_1", 1, counters__link_downed="3")
    assert read_counters(tmp_path)["mlx5_1:1"]["link_downed"] == 3


def test_a_port_without_counters_is_missing_not_zero(tmp_path: Path) -> None:
    tree = SysfsTree(tmp_path)
    nic = tree.pci("pci0000:00", ["0000:00:01.0", "0000:01:00.0"], cls="0x020700")
    tree.hca("mlx5_0", nic, ports=[Port(counters={})])
    counters = read_rdma(tmp_path)[0].ports[0].counters
    assert isinstance(counters, Missing) and counters.reason == "unsupported"
    assert read_counters(tmp_path) == {}


def test_interfaces_kind_speed_mtu_and_virtual(tmp_path: Path) -> None:
    tree = hgx_h100_node(tmp_path)
    tree.netdev("docker0", None, speed=-1, mtu=1500, operstate="down")
    by_name = {i.name: i for i in read_interfaces(tmp_path)}
    assert (by_name["eno1"].kind, by_name["eno1"].speed_mbps, by_name["eno1"].mtu, by_name["eno1"].virtual) == (
        "ether",
        100000,
        1500,
        False,
    )
    assert by_name["eno1"].pci_bus_id == "0000:01:00.0"
    assert (by_name["ibp25s0"].kind, by_name["ibp25s0"].mtu) == ("infiniband", 4092)
    assert (by_name["lo"].kind, by_name["lo"].virtual, by_name["lo"].pci_bus_id) == ("loopback", True, None)
    assert (by_name["docker0"].speed_mbps, by_name["docker0"].operstate) == (None, "down")  # -1: unknown


@pytest.mark.parametrize(
    ("module", "open_module", "expected"),
    [
        ("nvidia_peermem", False, GpuDirect("nvidia_peermem", False)),
        ("nv_mem", True, GpuDirect("nv_mem", True)),
        (None, True, GpuDirect(None, True)),
    ],
)
def test_gpudirect_as_nccl_looks_for_it(
    tmp_path: Path, module: str | None, open_module: bool, expected: GpuDirect
) -> None:
    tree = SysfsTree(tmp_path)
    if module:
        tree.peermem(module)
    tree.nvidia_version(open_module=open_module)
    assert read_gpudirect(tmp_path) == expected


def test_no_nvidia_module_means_open_module_unknown(tmp_path: Path) -> None:
    gd = read_gpudirect(tmp_path)
    assert gd.peermem is None
    assert isinstance(gd.open_kernel_module, Missing) and gd.open_kernel_module.reason == "unsupported"


def test_pci_places_of_gpus_given_as_nvml_writes_their_bus_ids(tmp_path: Path) -> None:
    hgx_h100_node(tmp_path)
    network = read_network(tmp_path, h100_gpu_bus_ids())
    assert isinstance(network.pci, dict)
    assert network.pci["0000:18:00.0"] == PciPlace("pci0000:15/0000:15:01.0/0000:16:00.0/0000:17:00.0/0000:18:00.0", 0)
    assert network.pci["0000:db:00.0"].numa_node == 1
    assert "0000:19:00.0" in network.pci  # the NICs too
    assert sysfs_bus_id("00000000:DB:00.0") == "0000:db:00.0"


def test_h100_node_levels_read_like_its_topo_m(tmp_path: Path) -> None:
    """Each GPU shares a PCIe switch with its own NIC (PIX), the other NICs of its socket are on
    other host bridges (NODE), the other socket's are SYS: NVIDIA/nccl#1591's H100 topo -m shape."""
    hgx_h100_node(tmp_path)
    network = read_network(tmp_path, h100_gpu_bus_ids())
    pci = network.pci
    assert isinstance(pci, dict) and isinstance(network.rdma, list)
    nics = {d.name: pci[d.pci_bus_id] for d in network.rdma if isinstance(d.pci_bus_id, str)}
    row = [nic_locality.level(pci["0000:18:00.0"], nics[f"mlx5_{i}"]) for i in range(8)]
    assert row == ["PIX", "NODE", "NODE", "NODE", "SYS", "SYS", "SYS", "SYS"]


def dgx_a100_quadrant(root: Path) -> dict[str, PciPlace]:
    """GPU0 and NIC0/NIC1 of a DGX A100 as NCCL's topology dump in NVIDIA/nccl#1505 nests them:
    GPU 0000:07:00.0 three switches below the quadrant's top Broadcom switch, mlx5_0 (0000:0c:00.0)
    below switch 0000:0a:00.0 beside them; NIC2 on another NUMA node. Bus ids of the switches the
    dump does not show are filled in."""
    tree = SysfsTree(root)
    top = ["0000:00:01.1", "0000:01:00.0", "0000:02:00.0"]  # root port, top switch USP, its DSP
    gpu = tree.pci(
        "pci0000:00", [*top, "0000:03:00.0", "0000:04:00.0", "0000:05:00.0", "0000:06:00.0", "0000:07:00.0"], numa=3
    )
    nic0 = tree.pci(
        "pci0000:00",
        ["0000:00:01.1", "0000:01:00.0", "0000:02:04.0", "0000:0a:00.0", "0000:0b:00.0", "0000:0c:00.0"],
        numa=3,
        cls="0x020700",
    )
    nic1 = tree.pci(
        "pci0000:00",
        ["0000:00:01.1", "0000:01:00.0", "0000:02:04.0", "0000:0a:00.0", "0000:0b:01.0", "0000:0d:00.0"],
        numa=3,
        cls="0x020700",
    )
    nic2 = tree.pci(
        "pci0000:40", ["0000:40:01.1", "0000:41:00.0", "0000:42:00.0", "0000:43:00.0"], numa=1, cls="0x020700"
    )
    places = {}
    for name, path in (("gpu0", gpu), ("nic0", nic0), ("nic1", nic1), ("nic2", nic2)):
        places[name] = PciPlace(path.removeprefix("sys/devices/"), int((root / path / "numa_node").read_text()))
    return places


def test_dgx_a100_gpu0_row_matches_its_published_topo_m(tmp_path: Path) -> None:
    """NVIDIA/nccl#1505's `nvidia-smi topo -m` on a DGX A100: GPU0 NIC0 PXB, NIC1 PXB, NIC2 SYS."""
    p = dgx_a100_quadrant(tmp_path)
    assert [nic_locality.level(p["gpu0"], p[n]) for n in ("nic0", "nic1", "nic2")] == ["PXB", "PXB", "SYS"]


@pytest.mark.parametrize(
    ("a", "b", "level"),
    [
        # two root ports of one host bridge: through the CPU
        ("pci0000:00/0000:00:01.0/0000:01:00.0", "pci0000:00/0000:00:02.0/0000:02:00.0", "PHB"),
        # one switch, two downstream ports
        (
            "pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:00.0/0000:03:00.0",
            "pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:01.0/0000:04:00.0",
            "PIX",
        ),
        # VMD: the second pci domain below a root port is the host bridge
        (
            "pci0000:00/0000:00:0e.0/pci10000:e0/10000:e0:02.0/10000:e1:00.0",
            "pci0000:00/0000:00:0e.0/pci10000:e0/10000:e0:03.0/10000:e2:00.0",
            "PHB",
        ),
    ],
)
def test_levels_of_small_trees(a: str, b: str, level: str) -> None:
    assert nic_locality.level(PciPlace(a, 0), PciPlace(b, 0)) == level
    assert nic_locality.level(PciPlace(b, 0), PciPlace(a, 0)) == level


def test_network_root_env_is_for_this_module_alone(tmp_path: Path) -> None:
    assert network_root({ROOT_ENV: str(tmp_path)}, Path("/")) == tmp_path
    assert network_root({}, Path("/r")) == Path("/r")


def test_collect_machine_records_the_network_and_it_round_trips(tmp_path: Path) -> None:
    fixture = h100_nvswitch_8x()
    hgx_h100_node(tmp_path)
    machine = collect_machine(Nvml(FakeNvml(fixture)), {}, root=tmp_path, systemctl=lambda unit: "active")
    network = machine.host.network
    assert isinstance(network, snap.Network) and isinstance(network.rdma, list) and len(network.rdma) == 8
    assert isinstance(network.pci, dict) and sysfs_bus_id(fixture.gpus[0].pci_bus_id) in network.pci
    assert snap.loads(snap.dumps(machine)) == machine


def test_snapshots_without_network_read_and_write_unchanged() -> None:
    text = (FIXTURES / "h100_sxm_8x.json").read_text()
    assert '"network"' not in text
    assert snap.dumps(snap.loads(text)) == text


def test_a_broken_tree_is_data_not_an_escape(tmp_path: Path) -> None:
    (tmp_path / "sys/class/infiniband").mkdir(parents=True)
    (tmp_path / "sys/class/infiniband/mlx5_0").mkdir()  # no device link, no files, no ports
    network = read_network(tmp_path)
    assert isinstance(network.rdma, list)
    dev = network.rdma[0]
    assert isinstance(dev.pci_bus_id, Missing) and isinstance(dev.fw_ver, Missing) and dev.ports == []
    assert isinstance(network.interfaces, Missing)  # no /sys/class/net at all


@pytest.mark.parametrize(
    "cls", [snap.Network, snap.RdmaDevice, snap.RdmaPort, snap.NetInterface, snap.PciPlace, snap.GpuDirect]
)
def test_every_network_field_is_documented(cls: type) -> None:
    undocumented = [f.name for f in dataclasses.fields(cls) if f"`{f.name}`" not in DOC and f'"{f.name}"' not in DOC]
    assert undocumented == []


def test_network_json_has_the_documented_shape(tmp_path: Path) -> None:
    hgx_h100_node(tmp_path)
    doc = snap.to_jsonable(read_network(tmp_path, h100_gpu_bus_ids()))
    assert set(doc) == {"rdma", "interfaces", "gpudirect", "pci"}
    assert doc["rdma"][0]["ports"][0]["rate"] == "400 Gb/sec (4X NDR)"
    assert json.loads(json.dumps(doc)) == doc
