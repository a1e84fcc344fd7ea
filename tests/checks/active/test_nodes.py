"""The cross-node logic without launching anything: who is the odd node, the round structure, the
slow node or pair from pair results, the NIC expectation, counter growth, the fault switch."""

from __future__ import annotations

import itertools
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from gpudoctor.checks import context
from gpudoctor.checks.active.common import Plan
from gpudoctor.checks.active.node_bandwidth import bandwidth_findings
from gpudoctor.checks.active.node_comparison import comparison_findings, forwarded, labels_for
from gpudoctor.checks.active.node_counters import growth_findings
from gpudoctor.checks.active.node_task import node_facts
from gpudoctor.engine import CheckContext, CheckOptions
from gpudoctor.findings import Finding, Status
from gpudoctor.knowledge.network_expectation import NET_EFFICIENCY, node_capacity
from gpudoctor.knowledge.odd_one_out import odd_one_out
from gpudoctor.knowledge.pair_isolation import analyse, disjoint_batches, merged, retested
from gpudoctor.launch.faults import Fault, Faults, parse
from gpudoctor.probe.network import read_network
from gpudoctor.snapshot import Snapshot
from gpudoctor.workloads.nodes import circle_rounds
from tests.fakes.machines import h100_nvswitch_8x
from tests.fakes.sysfs import DOWN, POLLING, Port, h100_gpu_bus_ids, hgx_h100_node
from tests.helpers.findings import verdicts
from tests.helpers.snapshots import SnapshotOf


def test_the_odd_node_is_named_against_the_majority() -> None:
    split = odd_one_out({"n0": "2.21.5", "n1": "2.21.5", "n2": "2.18.3", "n3": "2.21.5"})
    assert (split.majority, split.odd) == ("2.21.5", {"n2": "2.18.3"})
    assert split.groups == {"2.21.5": ["n0", "n1", "n3"], "2.18.3": ["n2"]}


def test_a_tie_has_no_odd_one_and_alike_nodes_do_not_differ() -> None:
    tie = odd_one_out({"a": 1, "b": 2})
    assert tie.majority is None and tie.odd == {"a": 1, "b": 2} and tie.differs
    same = odd_one_out({"a": 1, "b": 1})
    assert not same.differs and same.odd == {}


@pytest.mark.parametrize("n", [2, 3, 4, 5, 8, 9, 64, 1000])
def test_rounds_are_disjoint_pairs_and_every_partner_is_new(n: int) -> None:
    rounds = circle_rounds(n, 3)
    assert len(rounds) == min(3, n - 1 if n % 2 == 0 else n)
    met: dict[int, set[int]] = {}
    for pairs in rounds:
        nodes = [x for pair in pairs for x in pair]
        assert len(nodes) == len(set(nodes))  # disjoint: every pair of a round runs at once
        assert len(pairs) == n // 2  # at most one node sits out a round
        for a, b in pairs:
            assert b not in met.get(a, set())
            met.setdefault(a, set()).add(b)
            met.setdefault(b, set()).add(a)
    if n >= 4:
        assert all(len(partners) >= 2 for partners in met.values())  # enough to tell a node from a pair


def pair_results(
    n: int, slow: set[int] = frozenset(), slow_pairs: set[tuple[int, int]] = frozenset()
) -> list[list[dict[str, Any]]]:
    return [
        [
            {
                "nodes": [f"h#{a}", f"h#{b}"],
                "busbw_gbps": 2.0 if a in slow or b in slow or (a, b) in slow_pairs else 40.0,
            }
            for a, b in pairs
        ]
        for pairs in circle_rounds(n, 3)
    ]


@pytest.mark.parametrize(("n", "slow"), [(3, 0), (3, 2), (4, 2), (8, 5), (101, 77)])
def test_the_node_slow_with_every_partner_is_named_alone(n: int, slow: int) -> None:
    analysis = analyse(merged(pair_results(n, {slow}), []))
    assert analysis.slow_nodes == [f"h#{slow}"]
    assert analysis.slow_pairs == []


def test_a_pair_slow_only_together_is_the_fabric() -> None:
    first = circle_rounds(8, 3)[0][0]
    analysis = analyse(merged(pair_results(8, slow_pairs={first}), []))
    assert analysis.slow_nodes == []
    assert [pair for pair, _ in analysis.slow_pairs] == [(f"h#{first[0]}", f"h#{first[1]}")]


def test_a_healthy_fabric_names_nothing() -> None:
    analysis = analyse(merged(pair_results(6), []))
    assert analysis.slow_nodes == [] and analysis.slow_pairs == [] and analysis.typical == 40.0


def test_a_pair_fast_when_measured_again_was_a_hiccup() -> None:
    first = circle_rounds(8, 3)[0][0]
    pair = [f"h#{first[0]}", f"h#{first[1]}"]
    analysis = analyse(merged(pair_results(8, slow_pairs={first}), [{"nodes": pair, "busbw_gbps": 39.0}]))
    assert analysis.slow_pairs == []


def test_only_a_pair_slow_twice_is_named() -> None:
    """The rounds of a loaded 4-node CPU run (this suite's once): node 2 slowed, pair 0-3 slow by a
    hiccup and fast when measured again; with the re-test the typical pair rose, so pair 0-1 (1.22)
    looked slow too, but it was measured once: only node 2 is named."""
    rounds = [
        [{"nodes": ["n0", "n3"], "busbw_gbps": 0.758}, {"nodes": ["n1", "n2"], "busbw_gbps": 0.252}],
        [{"nodes": ["n0", "n2"], "busbw_gbps": 0.181}, {"nodes": ["n1", "n3"], "busbw_gbps": 2.803}],
        [{"nodes": ["n0", "n1"], "busbw_gbps": 1.222}, {"nodes": ["n2", "n3"], "busbw_gbps": 0.122}],
    ]
    retests = [{"nodes": ["n0", "n3"], "busbw_gbps": 2.834}]
    analysis = analyse(merged(rounds, retests), confirmed=retested(retests))
    assert analysis.slow_nodes == ["n2"] and analysis.slow_pairs == []
    assert [p for p, _ in analyse(merged(rounds, retests)).slow_pairs] == [("n0", "n1")]  # the next suspect


def test_a_pair_slow_when_measured_again_is_named() -> None:
    first = circle_rounds(8, 3)[0][0]
    pair = [f"h#{first[0]}", f"h#{first[1]}"]
    retests = [{"nodes": pair, "busbw_gbps": 2.5}]
    analysis = analyse(merged(pair_results(8, slow_pairs={first}), retests), confirmed=retested(retests))
    assert [p for p, _ in analysis.slow_pairs] == [tuple(pair)]


def test_retests_run_in_few_batches_of_disjoint_pairs() -> None:
    pairs = [("a", "b"), ("b", "c"), ("d", "e"), ("a", "c"), ("f", "g")]
    assert disjoint_batches(pairs, 3) == [[("a", "b"), ("d", "e"), ("f", "g")], [("b", "c")], [("a", "c")]]
    assert disjoint_batches(pairs, 1) == [[("a", "b"), ("d", "e"), ("f", "g")]]


def facts(**overrides: Any) -> dict[str, Any]:
    base = {
        "driver": "550.54.15",
        "cuda": "12.4",
        "nccl": "2.21.5",
        "torch": "2.4.1+cu124",
        "gpus": ["NVIDIA H100 80GB HBM3"] * 8,
        "vbios": ["96.00.74.00.01"],
        "nvlinks": [18] * 8,
        "nics": [
            {
                "name": f"mlx5_{i}",
                "hca_type": "MT4129",
                "fw_ver": "28.41.1000",
                "ports": [{"port": 1, "state": "ACTIVE", "rate_gbps": 400.0, "link_layer": "InfiniBand"}],
            }
            for i in range(8)
        ],
        "mtu": {f"ibp{i}s0": 4092 for i in range(8)},
        "gpudirect": "nvidia_peermem",
        "ethernet": ["100000 Mb/s MTU 9000"],
    }
    return {**base, **overrides}


def test_alike_nodes_give_one_pass() -> None:
    assert verdicts(comparison_findings({f"n{i}": facts() for i in range(4)})) == [("GD460", "pass", "host")]


def test_an_nccl_version_apart_fails_naming_the_node() -> None:
    fs = comparison_findings({"n0": facts(), "n1": facts(), "n2": facts(nccl="2.18.3")})
    assert verdicts(fs) == [("GD460", "fail", "node:n2")]
    assert "node n2 has NCCL 2.18.3, the other 2 node(s) 2.21.5" in fs[0].message


def test_a_node_without_gpus_is_not_called_the_slowest() -> None:
    """Hostile review L7: "node fresh-install has GPU models none, ...: the slowest node paces every step"."""
    fs = comparison_findings({"n0": facts(), "n1": facts(), "n2": facts(gpus=[])})
    (f,) = [f for f in fs if f.code == "GD461"]
    assert f.message.startswith("node n2 has GPU models none, the other 2 node(s) ") and f.message.endswith(
        ": it sees no GPU"
    )


def test_two_odd_nodes_are_each_told_how_many_of_the_others_have_the_majoritys_value() -> None:
    fs = comparison_findings(
        {"n0": facts(), "n1": facts(), "n2": facts(), "n3": facts(nccl="2.18.3"), "n4": facts(nccl="2.19.3")}
    )
    assert [f.message.split(":")[0] for f in fs] == [
        "node n3 has NCCL 2.18.3, 3 of the other 4 nodes 2.21.5",
        "node n4 has NCCL 2.19.3, 3 of the other 4 nodes 2.21.5",
    ]


@pytest.mark.parametrize(
    ("odd", "expected"),
    [
        (facts(driver="535.129.03"), ("GD460", "warn", "node:n3")),
        (facts(gpus=["NVIDIA A100-SXM4-80GB"] * 8), ("GD461", "fail", "node:n3")),
        (facts(gpus=["NVIDIA H100 80GB HBM3"] * 4), ("GD461", "warn", "node:n3")),
        (facts(vbios=["96.00.61.00.01"]), ("GD462", "warn", "node:n3")),
        (facts(nvlinks=[18] * 7 + [12]), ("GD461", "warn", "node:n3")),
        (facts(mtu={"ibp0s0": 2044}), ("GD463", "warn", "node:n3")),
        (facts(gpudirect="none"), ("GD463", "warn", "node:n3")),
        (facts(ethernet=["25000 Mb/s MTU 9000"]), ("GD463", "warn", "node:n3")),
    ],
)
def test_each_fact_that_differs_names_the_odd_node(odd: dict[str, Any], expected: tuple[str, str, str]) -> None:
    assert verdicts(comparison_findings({"n0": facts(), "n1": facts(), "n2": facts(), "n3": odd})) == [expected]


def test_fewer_rails_fail_and_firmware_is_compared_per_hca_type() -> None:
    nics = facts()["nics"]
    fewer = [*nics[:7], {**nics[7], "ports": [{**nics[7]["ports"][0], "state": "DOWN"}]}]
    older = [{**nic, "fw_ver": "28.39.1002"} if i == 2 else nic for i, nic in enumerate(nics)]
    fs = comparison_findings({"a": facts(), "b": facts(nics=fewer), "c": facts(nics=older)})
    assert sorted(verdicts(fs)) == [("GD462", "warn", "node:c"), ("GD463", "fail", "node:b")]
    assert "7x InfiniBand 400 Gb/s" in next(f.message for f in fs if f.code == "GD463")


def test_a_tie_names_both_groups() -> None:
    fs = comparison_findings({"a": facts(), "b": facts(torch="2.5.0")})
    assert verdicts(fs) == [("GD460", "warn", "node:a")]
    assert "no majority" in fs[0].message and "2.5.0 on b" in fs[0].message


@pytest.mark.parametrize(
    ("after", "status"),
    [
        ({"link_downed": 3, "symbol_error": 0}, Status.FAIL),
        ({"link_downed": 1, "symbol_error": 9}, Status.WARN),
        ({"link_downed": 1, "symbol_error": 0}, Status.PASS),
    ],
)
def test_counter_growth(after: dict[str, int], status: Status) -> None:
    before = {"mlx5_0:1": {"link_downed": 1, "symbol_error": 0}}
    [f] = growth_findings(before, {"mlx5_0:1": after}, "host", "")
    assert f.status is status
    if status is not Status.PASS:
        assert f.message.startswith("mlx5_0 port 1: ")


def test_counters_cleared_in_between_are_no_growth() -> None:
    before = {"mlx5_0:1": {"link_downed": 5, "symbol_error": 7}}
    assert growth_findings(before, {"mlx5_0:1": {"link_downed": 0, "symbol_error": 0}}, "host", "") == []


def test_other_nodes_findings_are_forwarded_once_per_code() -> None:
    per_node = {
        "h#0": {"findings": [{"code": "GD510", "status": "warn", "subject": "host", "message": "/dev/shm 64 MiB"}]},
        "h#1": {
            "findings": [{"code": "GD440", "status": "fail", "subject": "host", "message": "mlx5_3 port 1 is DOWN"}]
        },
        "h#2": {"findings": [{"code": "GD510", "status": "warn", "subject": "host", "message": "/dev/shm 64 MiB"}]},
        "h#3": {"findings": [{"code": "GD510", "status": "warn", "subject": "host", "message": "/dev/shm 64 MiB"}]},
    }
    labels = {k: k for k in per_node}
    fs = forwarded(per_node, labels, skip="h#0")
    assert verdicts(fs) == [("GD440", "fail", "node:h#1"), ("GD510", "warn", "node:h#2")]
    assert fs[0].message == "on node h#1: mlx5_3 port 1 is DOWN"
    assert fs[1].message.startswith("on 2 nodes (h#2, h#3): ")


def test_labels_are_hostnames_unless_a_host_repeats() -> None:
    nodes = [{"key": "a#0", "host": "a"}, {"key": "b#1", "host": "b"}]
    assert labels_for(nodes) == {"a#0": "a", "b#1": "b"}
    same = [{"key": "vm#0", "host": "vm"}, {"key": "vm#1", "host": "vm"}]
    assert labels_for(same) == {"vm#0": "vm#0", "vm#1": "vm#1"}


def h100(tmp_path: Path, **tree: Any) -> Snapshot:
    hgx_h100_node(tmp_path, **tree)
    base = h100_nvswitch_8x()
    return replace(base, host=replace(base.host, network=read_network(tmp_path, h100_gpu_bus_ids())))


def test_nic_capacity_of_an_hgx_h100_node(tmp_path: Path) -> None:
    snap = h100(tmp_path)
    cap = node_capacity(snap, snap.gpus, 8)
    assert cap is not None
    assert (cap.ports, cap.port_rate_gbps, cap.line_gbps) == (8, 400.0, 400.0)
    assert cap.expected_gbps == pytest.approx(400.0 * NET_EFFICIENCY)
    assert node_capacity(snap, snap.gpus, 2).ports == 2  # two ranks use two NICs


def test_a_rail_down_does_not_lower_the_expectation(tmp_path: Path) -> None:
    snap = h100(tmp_path, ports={3: Port(state=DOWN, phys_state=POLLING, rate="10 Gb/sec (4X)")})
    cap = node_capacity(snap, snap.gpus, 8)
    assert cap is not None and (cap.ports, cap.port_rate_gbps) == (8, 400.0)


def test_nccl_ib_hca_limits_the_rails_counted(tmp_path: Path) -> None:
    snap = h100(tmp_path)
    snap = replace(snap, env={**snap.env, "NCCL_IB_HCA": "=mlx5_0,mlx5_1"})
    assert node_capacity(snap, snap.gpus, 8).ports == 2


def test_no_rdma_no_model() -> None:
    snap = h100_nvswitch_8x()
    assert node_capacity(snap, snap.gpus, 8) is None


def test_node_facts_carry_what_rank_0_compares(tmp_path: Path) -> None:
    ctx = context(h100(tmp_path, ports={3: Port(state=DOWN, phys_state=POLLING, rate="10 Gb/sec (4X)")}))
    f = node_facts(ctx, Plan("cuda", 8, list(range(8))))
    assert (f["driver"], f["nccl"], f["gpudirect"]) == ("550.54.15", "2.20.5", "nvidia_peermem")
    assert f["ethernet"] == ["100000 Mb/s MTU 1500"]  # eno1; the IPoIB interfaces are not Ethernet
    assert f["capacity"]["ports"] == 8 and len(f["nics"]) == 8 and f["counters"]["mlx5_3:1"]["link_downed"] == 0
    assert {"code": "GD440", "status": "fail"}.items() <= next(x for x in f["findings"] if x["code"] == "GD440").items()


def run_data(
    intra: dict[str, float], full: float, caps: float | None, rounds: list[list[dict[str, Any]]] | None = None
) -> dict[str, Any]:
    keys = list(intra)
    capacity = None if caps is None else {"expected_gbps": caps, "basis": f"{caps:g} GB/s"}
    return {
        "bytes": 256 << 20,
        "nodes": [{"key": k, "host": k, "node_rank": i, "ranks": [i]} for i, k in enumerate(keys)],
        "facts": {k: {"capacity": capacity} for k in keys},
        "full": {"ranks": len(keys) * 8, "busbw_gbps": full},
        "intra": {k: {"kind": "allreduce_busbw", "gbps": v, "ranks": 8} for k, v in intra.items()},
        "isolation": {"ran": rounds is not None, "why": "", "rounds": rounds or []},
    }


def judge(data: dict[str, Any], cpu: bool = False) -> list[Finding]:
    ctx = context(h100_nvswitch_8x(), CheckOptions())
    return bandwidth_findings(ctx, data, {k: k for k in data["intra"]}, cpu)


@pytest.mark.parametrize(("measured", "status"), [(370.0, Status.PASS), (250.0, Status.WARN), (150.0, Status.FAIL)])
def test_internode_busbw_against_the_nics(measured: float, status: Status) -> None:
    fs = judge(run_data({"a": 370.0, "b": 370.0}, measured, 384.0))
    [f] = [f for f in fs if f.code == "GD680"]
    assert f.status is status and f.evidence["expected_busbw_gbps"] == 384.0


def test_two_nodes_low_with_one_node_slow_on_its_own_names_that_node() -> None:
    fs = judge(run_data({"a": 370.0, "b": 90.0}, 100.0, 384.0))
    assert ("GD681", "fail", "node:b") in verdicts(fs) and ("GD683", "warn", "node:b") in verdicts(fs)
    assert "the node itself" in next(f.message for f in fs if f.code == "GD681")


def test_two_nodes_low_with_both_fine_on_their_own_names_the_link() -> None:
    fs = judge(run_data({"a": 370.0, "b": 365.0}, 100.0, 384.0))
    assert ("GD682", "fail", "node:a,b") in verdicts(fs)


def test_a_slow_node_found_by_the_rounds_with_a_normal_own_figure_is_its_network() -> None:
    keys = [f"h#{i}" for i in range(4)]
    fs = judge(run_data({k: 370.0 for k in keys}, 60.0, 384.0, pair_results(4, {2})))
    [f] = [f for f in fs if f.code == "GD681"]
    assert f.subject == "node:h#2" and "its network (NIC, cable, switch port)" in f.message


def test_cpu_runs_report_without_a_verdict_but_still_isolate() -> None:
    keys = [f"h#{i}" for i in range(4)]
    fs = judge(run_data({k: 10.0 for k in keys}, 0.03, None, pair_results(4, {1})), cpu=True)
    assert ("GD680", "pass", "host") in verdicts(fs) and ("GD681", "fail", "node:h#1") in verdicts(fs)


def test_pair_tests_the_ranks_could_not_run_are_a_skip_not_a_pass() -> None:
    keys = [f"h#{i}" for i in range(4)]
    data = run_data({k: 10.0 for k in keys}, 3.0, 384.0)
    data["intra"] = {}
    data["isolation"] = {"ran": False, "skipped": True, "why": "the ranks make process groups differently"}
    [slow] = [f for f in judge_keys(data, keys) if f.code == "GD681"]
    assert slow.status is Status.SKIP and "pairwise tests not run: the ranks make" in slow.message


def judge_keys(data: dict[str, Any], keys: list[str]) -> list[Finding]:
    ctx = context(h100_nvswitch_8x(), CheckOptions())
    return bandwidth_findings(ctx, data, {k: k for k in keys}, False)


def test_node_faults_parse_and_apply_to_every_rank_of_that_node() -> None:
    assert parse("node2:slownet,1:hang") == [Fault(None, "slownet", "joined", 2), Fault(1, "hang", "joined")]
    assert Faults(5, "node2:slownet", node=2).has("slownet")
    assert not Faults(5, "node2:slownet", node=1).has("slownet")
    assert not Faults(2, "node2:slownet").has("slownet")  # rank 2 is not node 2


def test_every_pair_of_a_healthy_cluster_is_tested_once_with_four_nodes() -> None:
    pairs = [p for r in circle_rounds(4, 3) for p in r]
    assert sorted(pairs) == list(itertools.combinations(range(4), 2))


def test_one_node_reads_its_counters_again_after_the_active_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The snapshot holds the counters at start; link_downed rises while the ranks run."""
    from gpudoctor.checks.active import nodes as nodes_check
    from gpudoctor.launch.results import LaunchResult
    from gpudoctor.probe.network import ROOT_ENV
    from tests.fakes.sysfs import cpu_node

    tree = cpu_node(tmp_path)
    base = h100_nvswitch_8x()
    snap = replace(base, host=replace(base.host, network=read_network(tmp_path)))
    launched: list[bool] = []

    def fake_launch(name: str) -> LaunchResult:  # the run the check runner hands the check
        launched.append(True)
        tree.set_port("mlx5_1", 1, counters__link_downed="2", counters__symbol_error="40")
        return LaunchResult("cpu", "gloo", 2, [], 1.0, "tcpstore:port0")

    ctx = CheckContext(snap, CheckOptions(device="cpu", ranks=2), shared=fake_launch)
    monkeypatch.setenv(ROOT_ENV, str(tmp_path))
    for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR"):
        monkeypatch.delenv(name, raising=False)
    fs = nodes_check.nodes(ctx)[0]
    assert launched == [True]
    [grew] = [f for f in fs if f.code == "GD443"]
    assert (
        grew.status is Status.FAIL and grew.message == "mlx5_1 port 1: symbol_error +40, link_downed +2 during the run"
    )
    assert ("GD460", "skip", "host") in verdicts(fs)


def test_a_rank_that_died_in_the_cross_node_tests_is_named() -> None:
    from gpudoctor.checks.active.nodes import _not_completed
    from gpudoctor.launch.results import LaunchResult, RankOutcome

    dead = RankOutcome(3, 0, None, state="exited", error="exited with status 17 in phase nodes", host="n3")
    ok = RankOutcome(0, 0, None, state="aborted")
    f = _not_completed(LaunchResult("cpu", "gloo", 4, [ok, dead], 9.0, "env", under_launcher=True))
    assert (f.code, f.status) == ("GD684", Status.FAIL)
    assert "rank 3 failed (exited with status 17 in phase nodes)" in f.message


def test_a_pcie_node_is_capped_by_its_own_links(tmp_path: Path, snapshot_of: SnapshotOf) -> None:
    """Four NDR NICs carry 192 GB/s, but a ring across nodes also crosses each node's PCIe tree."""
    from gpudoctor.knowledge.expectations import expected_busbw
    from tests.fakes.sysfs import cpu_node

    cpu_node(tmp_path)
    base = snapshot_of("rtx4090_pcie_4x")
    snap = replace(base, host=replace(base.host, network=read_network(tmp_path)))
    cap = node_capacity(snap, snap.gpus, 4)
    own = expected_busbw(snap, [g.index for g in snap.gpus])
    assert cap is not None and own is not None and own.busbw_gbps < 192
    assert cap.expected_gbps == pytest.approx(own.busbw_gbps)
    assert "capped at the node's own" in cap.basis


def test_the_typical_figure_is_the_standard_librarys_upper_quartile() -> None:
    # Written out to keep `statistics` off check --quick's start-up; the library is the oracle.
    import random
    import statistics

    from gpudoctor.knowledge.pair_isolation import typical

    rng = random.Random(5)
    for n in range(1, 30):
        values = [rng.uniform(1, 400) for _ in range(n)]
        want = statistics.quantiles(values, n=4, method="inclusive")[2] if n > 1 else values[0]
        assert typical(values) == pytest.approx(want)


def test_a_suspect_pair_is_measured_again_until_it_has_its_retests() -> None:
    from gpudoctor.knowledge.pair_isolation import RETESTS, retested

    once = [{"nodes": ["n0", "n3"], "busbw_gbps": 1.9}]
    assert retested(once) == {("n0", "n3")} and retested(once, RETESTS) == set()  # tested again next batch
    twice = once + [{"nodes": ["n0", "n3"], "busbw_gbps": 4.9}]
    assert retested(twice, RETESTS) == {("n0", "n3")}
