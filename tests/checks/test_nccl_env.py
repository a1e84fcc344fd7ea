"""NCCL and CUDA environment checks (GD230-231, GD620-626): each variable priced on the topology."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gpudoctor.checks import nccl_env
from gpudoctor.engine import CheckContext
from gpudoctor.findings import Finding, Status
from gpudoctor.knowledge import nccl_rules
from gpudoctor.knowledge.expectations import expected_busbw
from gpudoctor.knowledge.nccl_rules import nccl_int
from gpudoctor.snapshot import Missing, Snapshot
from tests.helpers.snapshots import SnapshotOf


def nccl(s: Snapshot) -> list[Finding]:
    return nccl_env.nccl_env(CheckContext(s))


def one(s: Snapshot, code: str) -> Finding:
    (f,) = [f for f in nccl(s) if f.code == code]
    return f


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("eth", ["eth0", "eth1"]),
        ("=eth0", ["eth0"]),
        ("=eth", []),
        ("ib,eno", ["eno1", "ib0"]),
        ("^lo,docker", ["eth0", "eth1", "eno1", "ib0"]),
        ("^=eth0", ["lo", "docker0", "eth1", "eno1", "ib0"]),
    ],
)
def test_socket_ifname_matching_follows_nccl_rules(value: str, expected: list[str]) -> None:
    ifaces = ["lo", "docker0", "eth0", "eth1", "eno1", "ib0"]
    assert nccl_env.socket_ifname_matches(value, ifaces) == sorted(expected, key=ifaces.index)


def test_socket_ifname_that_matches_passes(snapshot_of: SnapshotOf) -> None:
    assert one(snapshot_of("a100_sxm_8x", NCCL_SOCKET_IFNAME="ens"), "GD626").status is Status.PASS


def test_socket_ifname_is_matched_as_nccl_parses_it_without_trimming_spaces(snapshot_of: SnapshotOf) -> None:
    # NCCL's parseStringList (src/misc/utils.cc) splits on ',' and never trims: a space from a
    # quoting slip makes the exact name match nothing, and NCCL cannot bootstrap.
    s = snapshot_of("a100_sxm_8x", NCCL_SOCKET_IFNAME="=lo ")
    assert one(s, "GD626").status is Status.FAIL
    assert nccl_env.socket_ifname_matches("^", ["lo", "eth0"]) == []  # '^' alone excludes everything
    assert nccl_env.socket_ifname_matches("=eth0,,ib", ["eth0", "eth01", "ib0"]) == ["eth0"]


def test_p2p_disable_costs_nothing_where_no_pair_has_p2p(snapshot_of: SnapshotOf) -> None:
    f = one(snapshot_of("rtx4090_pcie_4x", NCCL_P2P_DISABLE="1"), "GD620")  # GeForce: chipset_not_supported
    assert f.status is Status.PASS and "no GPU pair" in f.message


def test_p2p_disable_is_the_right_workaround_for_rtx40_on_old_drivers(snapshot_of: SnapshotOf) -> None:
    s = snapshot_of("rtx4090_pcie_4x", NCCL_P2P_DISABLE="1")
    s = replace(
        s,
        driver=replace(s.driver, driver_version="535.129.03"),
        pairs=[replace(p, p2p_read="ok", p2p_write="ok") for p in s.pairs],
    )
    f = one(s, "GD620")
    assert f.status is Status.PASS and "GD104" in f.message


def test_p2p_disable_zero_is_not_set(snapshot_of: SnapshotOf) -> None:
    assert [f for f in nccl(snapshot_of("h100_sxm_8x", NCCL_P2P_DISABLE="0")) if f.code == "GD620"] == []


def test_shm_disable_costs_nothing_when_every_pair_uses_nvlink(snapshot_of: SnapshotOf) -> None:
    assert one(snapshot_of("h100_sxm_8x", NCCL_SHM_DISABLE="1"), "GD621").status is Status.PASS


def test_nvls_off_costs_nothing_on_a100(snapshot_of: SnapshotOf) -> None:
    f = one(snapshot_of("a100_sxm_8x", NCCL_NVLS_ENABLE="0"), "GD622")
    assert f.status is Status.PASS


def test_nvls_off_on_hopper_quotes_what_the_calibrated_model_expects_with_and_without(snapshot_of: SnapshotOf) -> None:
    f = one(snapshot_of("h100_sxm_8x", NCCL_NVLS_ENABLE="0"), "GD622")
    with_nvls = expected_busbw(snapshot_of("h100_sxm_8x"), list(range(8)))
    ring = expected_busbw(snapshot_of("h100_sxm_8x", NCCL_NVLS_ENABLE="0"), list(range(8)))
    assert with_nvls is not None and ring is not None and with_nvls.algorithm == "nvls"
    assert f.status is Status.WARN
    assert f.evidence["expected_busbw_gbps"] == {
        "nvls": round(with_nvls.busbw_gbps, 1),
        "ring": round(ring.busbw_gbps, 1),
    }
    assert f"~{with_nvls.busbw_gbps:.0f} -> ~{ring.busbw_gbps:.0f} GB/s" in f.message


def test_nvls_off_costs_nothing_with_four_gpus(snapshot_of: SnapshotOf) -> None:
    s = snapshot_of("h100_sxm_8x", NCCL_NVLS_ENABLE="0", CUDA_VISIBLE_DEVICES="0,1,2,3")
    assert one(s, "GD622").status is Status.PASS


def test_p2p_level_pix_keeps_nvlink_pairs(snapshot_of: SnapshotOf) -> None:
    assert one(snapshot_of("a100_sxm_8x", NCCL_P2P_LEVEL="PIX"), "GD623").status is Status.PASS


def test_p2p_level_numeric_zero_cuts_everything(snapshot_of: SnapshotOf) -> None:
    f = one(snapshot_of("a100_sxm_8x", NCCL_P2P_LEVEL="0"), "GD623")
    assert f.status is Status.WARN and "28 GPU pair" in f.message and "NV12" in f.message


def test_p2p_level_unknown_value_warns(snapshot_of: SnapshotOf) -> None:
    f = one(snapshot_of("a100_sxm_8x", NCCL_P2P_LEVEL="FAST"), "GD623")
    assert f.status is Status.WARN and "not a level" in f.message


def test_algo_excluding_nvls_on_hopper_names_the_cost(snapshot_of: SnapshotOf) -> None:
    f = one(snapshot_of("h100_sxm_8x", NCCL_ALGO="^NVLS"), "GD624")
    assert f.status is Status.WARN and "NVLink SHARP" in f.message


def test_ib_disable_without_ib_costs_nothing(snapshot_of: SnapshotOf) -> None:
    assert one(snapshot_of("rtx4090_pcie_4x", NCCL_IB_DISABLE="1"), "GD625").status is Status.PASS


def test_no_nccl_variables_no_nccl_findings(snapshot_of: SnapshotOf) -> None:
    assert nccl(snapshot_of("h100_sxm_8x")) == []


def test_debug_and_profiler_variables_are_listed(snapshot_of: SnapshotOf) -> None:
    s = snapshot_of("h100_sxm_8x", CUDA_DEVICE_WAITS_ON_EXCEPTION="1", CUDA_COREDUMP_FILE="/tmp/core.%p")
    findings = nccl_env.launch_env(CheckContext(s))
    (f,) = findings
    assert f.code == "GD231" and set(f.evidence["variables"]) == {
        "CUDA_DEVICE_WAITS_ON_EXCEPTION",
        "CUDA_COREDUMP_FILE",
    }


def test_launch_blocking_zero_is_fine(snapshot_of: SnapshotOf) -> None:
    assert nccl_env.launch_env(CheckContext(snapshot_of("h100_sxm_8x", CUDA_LAUNCH_BLOCKING="0"))) == []


# --- how NCCL reads its variables (gpudoctor/knowledge/nccl_rules.py), against NCCL's docs and source ----


def with_cpu(s: Snapshot, arch: str, vendor: str, nccl_version: str) -> Snapshot:
    s = replace(s, host=replace(s.host, cpu_arch=arch, cpu_vendor=vendor))
    return replace(s, software=replace(s.software, torch_nccl=nccl_version))


@pytest.mark.parametrize(
    ("nccl", "arch", "vendor", "gpus", "level"),
    [
        # ncclTopoCheckP2p, NCCL 2.22.3 and before: SYS, lowered to PXB on Intel, Zhaoxin and ARM
        ((2, 21, 5), "x86", "intel", 8, "PXB"),
        ((2, 21, 5), "x86", "zhaoxin", 8, "PXB"),
        ((2, 21, 5), "arm", "", 8, "PXB"),
        ((2, 21, 5), "x86", "amd", 8, "SYS"),
        ((2, 21, 5), "power", "", 8, "SYS"),
        # NCCL 2.23.4 and later: PXB, raised to SYS on AMD with at most 2 GPUs
        ((2, 23, 4), "x86", "amd", 2, "SYS"),
        ((2, 26, 2), "x86", "amd", 8, "PXB"),
        ((2, 26, 2), "x86", "intel", 2, "PXB"),
        (None, "", "", 8, "PXB"),  # NCCL unknown: assume a current one
    ],
)
def test_nccl_default_p2p_level_follows_ncclTopoCheckP2p(
    nccl: tuple[int, ...] | None, arch: str, vendor: str, gpus: int, level: str
) -> None:
    assert nccl_rules.default_p2p_level(nccl, arch, vendor, gpus).level == level


@pytest.mark.parametrize(
    ("arch", "vendor", "kind"),
    [
        ("x86_64", "GenuineIntel", ("x86", "intel")),
        ("x86_64", "AuthenticAMD", ("x86", "amd")),
        ("x86_64", "CentaurHauls", ("x86", "zhaoxin")),
        ("x86_64", "Shanghai", ("x86", "zhaoxin")),
        ("aarch64", "0x41", ("arm", "")),
        ("ppc64le", None, ("power", "")),
        (None, None, ("", "")),
    ],
)
def test_cpu_kind_is_nccls_reading_of_cpuid(arch: str | None, vendor: str | None, kind: tuple[str, str]) -> None:
    assert nccl_rules.cpu_kind(arch, vendor) == kind


@pytest.mark.parametrize(
    ("value", "level"),
    [
        # env.rst "Integer Values (Legacy)": LOC 0, PIX 1, PXB 2, PHB 3, SYS 4; greater is SYS
        ("0", "LOC"),
        ("1", "PIX"),
        ("2", "PXB"),
        ("3", "PHB"),
        ("4", "SYS"),
        ("5", "SYS"),
        ("9", "SYS"),
        ("0x3", "PHB"),  # strtol(str, NULL, 0)
        ("PXB", "PXB"),
        ("NVL", "NVL"),
        ("pxb", None),  # strcmp: case-sensitive, NCCL ignores it
        ("NODE", None),  # nvidia-smi's word, not NCCL's
        (" 2", None),  # the legacy form needs a digit first
    ],
)
def test_level_values_read_as_ncclGetLevel_reads_them(value: str, level: str | None) -> None:
    assert nccl_rules.level(value) == level


def test_nccl_int_is_c_strtoll_base_0() -> None:
    """Checked against the C library's own strtoll, which NCCL calls (param.cc)."""
    import ctypes
    import ctypes.util

    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    libc.strtoll.restype = ctypes.c_longlong
    libc.strtoll.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.c_int]
    for text in ["1", "0", "4M", "4MB", "yes", "0x10", "0X1f", "010", "09", "  -3", "+7x", "0x", "1e6", "4194304"]:
        assert nccl_int(text) == libc.strtoll(text.encode(), None, 0), text


ALL = set(nccl_rules.ALGORITHMS)


def test_per_collective_algo_lists_follow_the_user_guide_examples() -> None:
    # env.rst: "ring,collnetdirect;allreduce:tree,collnetdirect;broadcast:ring"
    got = nccl_rules.parse_list(
        "ring,collnetdirect;allreduce:tree,collnetdirect;broadcast:ring", nccl_rules.ALGORITHMS, (2, 26, 2)
    )
    assert got["AllGather"] == {"Ring", "CollNetDirect"} and got["Reduce"] == {"Ring", "CollNetDirect"}
    assert got["AllReduce"] == {"Tree", "CollNetDirect"} and got["Broadcast"] == {"Ring"}
    # env.rst: "NCCL_ALGO=allreduce:^tree": every algorithm elsewhere, all but Tree for all-reduce
    got = nccl_rules.parse_list("allreduce:^tree", nccl_rules.ALGORITHMS, (2, 26, 2))
    assert got["AllReduce"] == ALL - {"Tree"} and got["Broadcast"] == ALL
    # tuning.cc comment: NCCL_PROTO="LL,Simple;allreduce:^LL" and "^LL128;allreduce:LL128"
    protos = set(nccl_rules.PROTOCOLS)
    got = nccl_rules.parse_list("LL,Simple;allreduce:^LL", nccl_rules.PROTOCOLS, (2, 26, 2))
    assert got["Broadcast"] == {"LL", "Simple"} and got["AllReduce"] == protos - {"LL"}
    got = nccl_rules.parse_list("^LL128;allreduce:LL128", nccl_rules.PROTOCOLS, (2, 26, 2))
    assert got["AllGather"] == protos - {"LL128"} and got["AllReduce"] == {"LL128"}
    assert nccl_rules.parse_list("^ring", nccl_rules.ALGORITHMS, None)["AllReduce"] == ALL - {"Ring"}


@pytest.mark.parametrize("value", ["ring, tree", "ring;tree", "allreduce:foo", "allredux:ring", "ring,bogus"])
def test_lists_nccl_2_24_rejects(value: str) -> None:
    with pytest.raises(nccl_rules.ListError):
        nccl_rules.parse_list(value, nccl_rules.ALGORITHMS, (2, 24, 3))


def test_before_2_24_one_list_and_unknown_tokens_ignored() -> None:
    old = (2, 21, 5)
    assert nccl_rules.parse_list("Ring,bogus", nccl_rules.ALGORITHMS, old)["AllReduce"] == {"Ring"}
    assert nccl_rules.parse_list("^ring", nccl_rules.ALGORITHMS, old)["Broadcast"] == ALL - {"Ring"}
    assert nccl_rules.unknown_tokens("ring, tree", nccl_rules.ALGORITHMS) == [" tree"]


# --- the findings -------------------------------------------------------------------------------


def test_p2p_level_pxb_on_amd_epyc_with_an_older_nccl_cuts_node_and_sys_pairs(snapshot_of: SnapshotOf) -> None:
    """The issue's case: NCCL before 2.23 keeps P2P up to SYS on AMD; PXB cuts the rest off."""
    s = snapshot_of("h100_sxm_8x", NCCL_P2P_LEVEL="PXB")
    s = replace(s, gpus=[replace(g, nvlinks=Missing("unsupported")) for g in s.gpus])  # a PCIe-only box
    amd = with_cpu(s, "x86_64", "AuthenticAMD", "2.21.5")
    f = one(amd, "GD623")
    assert f.status is Status.WARN and "28 GPU pair(s)" in f.message and "default SYS" in f.message
    assert "AMD x86" in f.evidence["default_basis"]
    intel = with_cpu(s, "x86_64", "GenuineIntel", "2.21.5")
    assert one(intel, "GD623").status is Status.PASS  # Intel's default is PXB already


@pytest.mark.parametrize(
    ("level", "vendor", "nccl_version", "status", "words"),
    [
        # 4+4 GPUs on two sockets: 12 NODE pairs keep P2P (NCCL's PHB is nvidia-smi's NODE), 16 SYS pairs lose it
        ("PHB", "AuthenticAMD", "2.21.5", Status.WARN, "16 GPU pair(s)"),
        ("SYS", "GenuineIntel", "2.26.2", Status.PASS, "turns P2P on for 28"),
    ],
)
def test_p2p_level_on_pcie_pairs_across_two_sockets(
    level: str, vendor: str, nccl_version: str, status: Status, words: str, snapshot_of: SnapshotOf
) -> None:
    s = snapshot_of("h100_sxm_8x", NCCL_P2P_LEVEL=level)
    s = replace(s, gpus=[replace(g, nvlinks=Missing("unsupported")) for g in s.gpus])
    f = one(with_cpu(s, "x86_64", vendor, nccl_version), "GD623")
    assert f.status is status and words in f.message


def test_lower_case_p2p_level_is_ignored_by_nccl(snapshot_of: SnapshotOf) -> None:
    f = one(snapshot_of("a100_sxm_8x", NCCL_P2P_LEVEL="pxb"), "GD623")
    assert f.status is Status.WARN and "NCCL ignores it" in f.message and "PXB" in f.message


def test_nccl_disable_flags_count_only_as_nccl_reads_them(snapshot_of: SnapshotOf) -> None:
    assert [f for f in nccl(snapshot_of("h100_sxm_8x", NCCL_P2P_DISABLE="2")) if f.code == "GD620"] == []
    assert one(snapshot_of("h100_sxm_8x", NCCL_P2P_DISABLE="1abc"), "GD620").status is Status.WARN  # strtol: 1


@pytest.mark.parametrize(
    ("algo", "nccl_version", "status", "words"),
    [
        ("Tree", "2.26.2", Status.FAIL, "Broadcast"),  # broadcast has only Ring kernels: 2.24+ fails it
        ("Tree", "2.21.5", Status.WARN, "fall back to Ring"),
        ("ring, tree", "2.26.2", Status.FAIL, "unrecognized element token ' tree'"),
        ("ring, tree", "2.21.5", Status.WARN, "ignores ' tree'"),
        ("allreduce:tree;allgather:ring", "2.26.2", Status.WARN, "no NVLink SHARP"),
        ("^ring", "2.26.2", Status.FAIL, "Broadcast, Reduce"),
        ("ring", "2.26.2", Status.WARN, "no NVLink SHARP"),
    ],
)
def test_nccl_algo_is_parsed_as_nccl_does(
    algo: str, nccl_version: str, status: Status, words: str, snapshot_of: SnapshotOf
) -> None:
    s = with_cpu(snapshot_of("h100_sxm_8x", NCCL_ALGO=algo), "x86_64", "GenuineIntel", nccl_version)
    f = one(s, "GD624")
    assert f.status is status and words in f.message


def test_nvls_alone_fails_all_reduce_on_a_pcie_box(snapshot_of: SnapshotOf) -> None:
    s = with_cpu(snapshot_of("rtx4090_pcie_4x", NCCL_ALGO="allreduce:nvls"), "x86_64", "AuthenticAMD", "2.26.2")
    f = one(s, "GD624")
    assert f.status is Status.FAIL and f.evidence["collectives_without_algorithm"] == ["AllReduce"]


def test_proto_excluding_ll_forces_ll128_on_a_pcie_box(snapshot_of: SnapshotOf) -> None:
    # parseList with '^' sets every other protocol to 1, LL128 included: forced, not auto
    f = one(snapshot_of("rtx4090_pcie_4x", NCCL_PROTO="^LL"), "GD624")
    assert f.status is Status.WARN and "corrupt data" in f.message
    nvlink = one(snapshot_of("h100_sxm_8x", NCCL_PROTO="^LL"), "GD624")
    assert "corrupt" not in nvlink.message  # NCCL enables LL128 there itself


def test_nvls_off_in_a_vm_that_hides_its_nvswitches_warns_as_the_model_expects_nvls(snapshot_of: SnapshotOf) -> None:
    # Inside a VM NVML often cannot name the NVSwitches; NCCL (xml.cc) and the busbw model assume
    # one, so NCCL_NVLS_ENABLE=0 costs the same there: the lint must not say "costs nothing".
    s = snapshot_of("h100_sxm_8x", NCCL_NVLS_ENABLE="0")
    hidden = [
        replace(
            g, nvlinks=[replace(link, remote_type="unknown", remote_bus_id="FFFFFFFF:FF:FF.0") for link in g.nvlinks]
        )
        for g in s.gpus
    ]
    vm = replace(s, gpus=hidden)
    assert expected_busbw(replace(vm, env={}), list(range(8))).algorithm == "nvls"  # type: ignore[union-attr]
    assert one(vm, "GD622").status is Status.WARN


def test_a_socket_ifname_nccl_ignores_warns_instead_of_failing(snapshot_of: SnapshotOf) -> None:
    # ncclFindInterfaces reads the variable only `if (env && strlen(env) > 1)`: "^" and "e" are ignored,
    # NCCL picks an interface itself, so nothing "matches no interface".
    for value in ("^", "e", ""):
        f = one(snapshot_of("a100_sxm_8x", NCCL_SOCKET_IFNAME=value), "GD626")
        assert f.status is Status.WARN and "ignored" in f.message, value


def test_a_socket_ifname_matching_only_a_down_interface_warns(snapshot_of: SnapshotOf) -> None:
    from gpudoctor.snapshot import NetInterface, Network

    s = snapshot_of("a100_sxm_8x", NCCL_SOCKET_IFNAME="=eth2")
    names = ["lo", "eth0", "eth2"]
    net = Network(interfaces=[NetInterface("eth0", operstate="up"), NetInterface("eth2", operstate="down")])
    s = replace(s, host=replace(s.host, network_interfaces=names, network=net))
    f = one(s, "GD626")
    assert f.status is Status.WARN and "down" in f.message
    up = replace(s, host=replace(s.host, network=replace(net, interfaces=[NetInterface("eth2", operstate="up")])))
    assert one(up, "GD626").status is Status.PASS
    # NVIDIA/nccl#1837: NCCL_SOCKET_IFNAME=eth2 on a host without it: bootstrap cannot start.
    gone = replace(s, host=replace(s.host, network_interfaces=["lo", "eth0"], network=Missing("not_collected")))
    assert one(gone, "GD626").status is Status.FAIL
