"""The network check (GD44x, GD240-241) on machines whose sysfs the real probe read."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from gpudoctor.checks import registry
from gpudoctor.checks.network import gdr_threshold
from gpudoctor.engine import CheckContext, Selection
from gpudoctor.engine.runner import run_checks
from gpudoctor.findings import Finding, Status
from gpudoctor.knowledge.nccl_list import parse_nccl_list
from gpudoctor.probe.network import read_network
from gpudoctor.snapshot import Snapshot, dumps, load
from tests.fakes.machines import h100_nvswitch_8x
from tests.fakes.sysfs import HDR, Port, SysfsTree, h100_gpu_bus_ids, hgx_h100_node
from tests.fixtures.network.make_network import FIXTURES, HERE
from tests.helpers.cli import run_cli

SEL = Selection(("network",))


def findings(snap: Snapshot) -> list[Finding]:
    return [f for r in run_checks(registry(), CheckContext(snap), SEL) for f in r.findings]


def bad(snap: Snapshot) -> list[tuple[str, str, str]]:
    return [(f.code, f.status.value, f.subject) for f in findings(snap) if f.status in (Status.WARN, Status.FAIL)]


def machine(
    tmp_path: Path, *, kernel: str | None = None, env: dict[str, str] | None = None, **tree: object
) -> Snapshot:
    hgx_h100_node(tmp_path, **tree)  # type: ignore[arg-type]
    base = h100_nvswitch_8x()
    host = replace(base.host, network=read_network(tmp_path, h100_gpu_bus_ids()), kernel=kernel or base.host.kernel)
    return replace(base, host=host, env={**base.env, **(env or {})})


@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_fixture_is_what_its_generator_writes(name: str) -> None:
    assert (HERE / f"{name}.json").read_text(encoding="utf-8") == dumps(FIXTURES[name][0]())


@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_fixture_gives_its_finding(name: str) -> None:
    snap = load(HERE / f"{name}.json")
    expected = FIXTURES[name][1]
    got = {(f.code, f.status.value) for f in findings(snap)}
    if expected is None:
        assert bad(snap) == []
    else:
        assert expected in got


def test_a_downed_ib_port_is_named_through_the_cli(capsys: pytest.CaptureFixture[str]) -> None:
    r = run_cli(capsys, "check", "--snapshot", str(HERE / "h100_ib_port_down.json"), "--select", "GD440", "--json")
    doc = json.loads(r.out)
    assert r.exit_code == 1
    [f] = [f for c in doc["checks"] for f in c["findings"] if f["status"] == "fail"]
    assert f["code"] == "GD440" and "mlx5_3 port 1 is DOWN (Polling)" in f["message"]
    assert (f["evidence"]["device"], f["evidence"]["port"], f["evidence"]["rail"]) == ("mlx5_3", 1, True)


def test_healthy_node_shows_its_ports_and_topo_m_rows(tmp_path: Path) -> None:
    snap = machine(tmp_path)
    [result] = run_checks(registry(), CheckContext(snap), SEL)
    assert result.status is Status.PASS
    ports, matrix = result.details["tables"]
    assert [row[:5] for row in ports["rows"]][0] == ["mlx5_0", 1, "ACTIVE", "LinkUp", "400 Gb/sec (4X NDR)"]
    assert ports["rows"][0][-1] == "GPU 0 PIX"
    assert matrix["rows"][0] == ["GPU0", "PIX", "NODE", "NODE", "NODE", "SYS", "SYS", "SYS", "SYS"]


def test_a_rail_at_half_rate_fails_and_names_its_peers_rate(tmp_path: Path) -> None:
    snap = machine(tmp_path, ports={5: Port(rate=HDR)})
    [f] = [f for f in findings(snap) if f.code == "GD441" and f.status is Status.FAIL]
    assert "mlx5_5 port 1 runs at 200 Gb/sec (4X HDR)" in f.message and "400 Gb/sec" in f.message


def imbue_like(root: Path) -> SysfsTree:
    """imbue-ai/cluster-health#4: 8 CX-7 InfiniBand rails plus two dual-port CX-6 Ethernet cards
    with only their first ports cabled (ibdev2netdev: enp27s0f1np1 Down)."""
    tree = hgx_h100_node(root)
    for bus, first in ((0x1B, 8), (0x9D, 10)):
        for fn, state in ((0, Port(link_layer="Ethernet", rate="200 Gb/sec (4X HDR)")), (1, None)):
            dev = tree.pci(
                f"pci0000:{bus - 2:02x}", [f"0000:{bus - 2:02x}:03.0", f"0000:{bus:02x}:00.{fn}"], cls="0x020000"
            )
            port = state or Port(
                state="1: DOWN",
                phys_state="3: Disabled" if bus == 0x9D else "2: Polling",
                link_layer="Ethernet",
                rate="10 Gb/sec (4X)",
            )
            tree.hca(f"mlx5_{first + fn}", dev, ports=[port], hca_type="MT4123", fw_ver="20.35.2000")
    return tree


def test_uncabled_second_ports_of_ethernet_cards_are_not_rails(tmp_path: Path) -> None:
    imbue_like(tmp_path)
    base = h100_nvswitch_8x()
    snap = replace(base, host=replace(base.host, network=read_network(tmp_path, h100_gpu_bus_ids())))
    gd440 = [f for f in findings(snap) if f.code == "GD440"]
    assert {f.status for f in gd440} == {Status.PASS}
    assert any("mlx5_9 port 1 is DOWN (Polling), not a rail (the card's other port is up)" in f.message for f in gd440)
    assert any("mlx5_11 port 1 is DOWN (Disabled), not a rail (administratively disabled)" in f.message for f in gd440)


def test_a_lone_non_rail_port_down_warns(tmp_path: Path) -> None:
    tree = hgx_h100_node(tmp_path)
    dev = tree.pci("pci0000:70", ["0000:70:03.0", "0000:71:00.0"], cls="0x020000")
    tree.hca(
        "mlx5_8", dev, ports=[Port(state="1: DOWN", phys_state="2: Polling", link_layer="Ethernet")], hca_type="MT4125"
    )
    base = h100_nvswitch_8x()
    snap = replace(base, host=replace(base.host, network=read_network(tmp_path, h100_gpu_bus_ids())))
    assert ("GD440", "warn", "host") in bad(snap)


def test_counters_over_ibcheckerrs_thresholds_warn_and_say_saturated(tmp_path: Path) -> None:
    snap = machine(tmp_path, ports={2: Port(counters={"link_downed": 255, "symbol_error": 9})})
    [f] = [f for f in findings(snap) if f.code == "GD442"]
    assert f.status is Status.WARN and "link_downed 255 (saturated)" in f.message and "symbol_error" not in f.message


@pytest.mark.parametrize(
    ("value", "level"),
    [(None, "PXB"), ("SYS", "SYS"), ("phb", "PHB"), ("4", "SYS"), ("7", "SYS"), ("2", "PXB"), ("x", "PXB")],
)
def test_gdr_level_names_and_legacy_integers(value: str | None, level: str) -> None:
    assert gdr_threshold({} if value is None else {"NCCL_NET_GDR_LEVEL": value})[0] == level


def test_far_nics_warn_unless_nccl_is_told_to_use_gdr_that_far(tmp_path: Path) -> None:
    far = machine(tmp_path / "a", nics_on_cpu=True)
    assert [s for c, st, s in bad(far) if c == "GD444"] == [f"gpu:{i}" for i in range(8)]
    told = machine(tmp_path / "b", nics_on_cpu=True, env={"NCCL_NET_GDR_LEVEL": "PHB"})
    assert [c for c, _, _ in bad(told)] == []


@pytest.mark.parametrize(
    ("peermem", "open_module", "kernel", "status"),
    [
        (True, False, None, Status.PASS),
        (False, True, "6.5.0-1018-nvidia", Status.PASS),  # dma-buf
        (False, True, "5.4.0-150-generic", Status.WARN),  # dma-buf needs 5.12
        (False, False, "6.5.0-1018-nvidia", Status.WARN),  # proprietary module: no dma-buf
    ],
)
def test_gpudirect_rdma(tmp_path: Path, peermem: bool, open_module: bool, kernel: str | None, status: Status) -> None:
    snap = machine(tmp_path, peermem=peermem, open_module=open_module, kernel=kernel)
    [f] = [f for f in findings(snap) if f.code == "GD445"]
    assert f.status is status


# NCCL_IB_HCA, as NCCL reads it (src/misc/utils.cc parseStringList/matchIfList, net_ib/init.cc),
# with the examples of NCCL's env docs.
@pytest.mark.parametrize(
    ("value", "selected"),
    [
        ("mlx5", {"mlx5_0:1", "mlx5_1:1", "mlx5_10:1", "mlx5_11:1"}),  # all cards starting with mlx5
        ("=mlx5_0:1,mlx5_1:1", {"mlx5_0:1", "mlx5_1:1"}),  # ports 1 of mlx5_0 and mlx5_1
        ("^=mlx5_1,mlx5_10", {"mlx5_0:1", "mlx5_11:1"}),  # not mlx5_1 and mlx5_10
        ("mlx5_1", {"mlx5_1:1", "mlx5_10:1", "mlx5_11:1"}),  # a prefix: mlx5_10 and mlx5_11 too
        ("^mlx5_1", {"mlx5_0:1"}),
        ("mlx5_0:2", set()),  # no port 2
        ("mlx5_0:x", set()),  # atoi("x") is port 0
        (",=mlx5_0", set()),  # '=' only counts at the start; "=mlx5_0" is then a prefix nothing has
        ("^", set()),  # an empty exclude list matches everything, so excludes everything
        ("", {"mlx5_0:1", "mlx5_1:1", "mlx5_10:1", "mlx5_11:1"}),
    ],
)
def test_ib_hca_selection_follows_nccl(value: str, selected: set[str]) -> None:
    spec = parse_nccl_list(value)
    names = ["mlx5_0", "mlx5_1", "mlx5_10", "mlx5_11"]
    assert {f"{n}:1" for n in names if spec.selects(n, 1)} == selected


@pytest.mark.parametrize(
    ("value", "selected"),
    [("eth", ["eth0", "eth1"]), ("=eth0", ["eth0"]), ("^eth,lo", ["ib0"]), ("eth0:1", ["eth0"])],
)
def test_the_same_syntax_selects_socket_interfaces(value: str, selected: list[str]) -> None:
    """NCCL_SOCKET_IFNAME goes through the same parser with no port (src/os/linux.cc: port -1)."""
    spec = parse_nccl_list(value)
    assert [i for i in ["eth0", "eth1", "ib0", "lo"] if spec.selects(i)] == selected


def many_nics(root: Path) -> SysfsTree:
    tree = SysfsTree(root)
    for n in (0, 1, 10, 11):
        dev = tree.pci(
            f"pci0000:{n + 0x20:02x}", [f"0000:{n + 0x20:02x}:01.0", f"0000:{n + 0x21:02x}:00.0"], cls="0x020700"
        )
        tree.hca(f"mlx5_{n}", dev, ports=[Port()])
    return tree


def with_hca(tmp_path: Path, value: str) -> Snapshot:
    many_nics(tmp_path)
    base = h100_nvswitch_8x()
    return replace(
        base, host=replace(base.host, network=read_network(tmp_path)), env={**base.env, "NCCL_IB_HCA": value}
    )


def test_a_prefix_that_is_a_device_name_also_selects_its_namesakes(tmp_path: Path) -> None:
    fs = [f for f in findings(with_hca(tmp_path, "mlx5_1")) if f.code == "GD241"]
    assert [f.status for f in fs] == [Status.WARN]
    assert "also selects mlx5_10, mlx5_11" in fs[0].message and "=mlx5_1" in fs[0].hint


def test_exact_names_give_no_prefix_warning(tmp_path: Path) -> None:
    assert [f for f in findings(with_hca(tmp_path, "=mlx5_1")) if f.code == "GD241"] == []


def test_an_entry_naming_an_absent_device_warns_and_names_it(tmp_path: Path) -> None:
    [f] = [f for f in findings(with_hca(tmp_path, "=mlx5_0,mlx5_9")) if f.code == "GD240"]
    assert f.status is Status.WARN and "mlx5_9" in f.message and f.evidence["selected"] == ["mlx5_0:1"]


def test_a_list_that_names_only_a_down_port_fails_and_says_so(tmp_path: Path) -> None:
    snap = machine(tmp_path, ports={3: Port(state="1: DOWN", phys_state="2: Polling")}, env={"NCCL_IB_HCA": "=mlx5_3"})
    [f] = [f for f in findings(snap) if f.code == "GD240"]
    assert f.status is Status.FAIL and "only ports that are down: mlx5_3 port 1" in f.message


def test_ib_hca_on_a_host_without_rdma_warns(tmp_path: Path) -> None:
    tree = SysfsTree(tmp_path)
    tree.netdev("eth0", tree.pci("pci0000:00", ["0000:00:1c.0", "0000:01:00.0"], cls="0x020000"))
    base = h100_nvswitch_8x()
    snap = replace(base, host=replace(base.host, network=read_network(tmp_path)), env={"NCCL_IB_HCA": "mlx5"})
    assert [(c, s) for c, s, _ in bad(snap)] == [("GD240", "warn")]


def test_a_snapshot_recorded_before_network_facts_says_nothing() -> None:
    """As the other checks do with a fact an older recording lacks (xid's not_collected)."""
    assert findings(h100_nvswitch_8x()) == []
