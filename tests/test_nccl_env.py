"""NCCL and CUDA environment checks (GD230-231, GD620-626): each variable priced on the topology."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from gpudoctor.checks import nccl_env
from gpudoctor.findings import Finding, Status
from gpudoctor.registry import CheckContext
from gpudoctor.snapshot import Snapshot, load

FIXTURES = Path(__file__).parent / "fixtures"


def snap(name: str, **env: str) -> Snapshot:
    s = load(FIXTURES / f"{name}.json")
    return replace(s, env={**s.env, **env})


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


def test_socket_ifname_that_matches_passes() -> None:
    assert one(snap("a100_sxm_8x", NCCL_SOCKET_IFNAME="ens"), "GD626").status is Status.PASS


def test_p2p_disable_costs_nothing_where_no_pair_has_p2p() -> None:
    f = one(snap("rtx4090_pcie_4x", NCCL_P2P_DISABLE="1"), "GD620")  # GeForce: chipset_not_supported
    assert f.status is Status.PASS and "no GPU pair" in f.message


def test_p2p_disable_is_the_right_workaround_for_rtx40_on_old_drivers() -> None:
    s = snap("rtx4090_pcie_4x", NCCL_P2P_DISABLE="1")
    s = replace(
        s,
        driver=replace(s.driver, driver_version="535.129.03"),
        pairs=[replace(p, p2p_read="ok", p2p_write="ok") for p in s.pairs],
    )
    f = one(s, "GD620")
    assert f.status is Status.PASS and "GD104" in f.message


def test_p2p_disable_zero_is_not_set() -> None:
    assert [f for f in nccl(snap("h100_sxm_8x", NCCL_P2P_DISABLE="0")) if f.code == "GD620"] == []


def test_shm_disable_costs_nothing_when_every_pair_uses_nvlink() -> None:
    assert one(snap("h100_sxm_8x", NCCL_SHM_DISABLE="1"), "GD621").status is Status.PASS


def test_nvls_off_costs_nothing_on_a100() -> None:
    f = one(snap("a100_sxm_8x", NCCL_NVLS_ENABLE="0"), "GD622")
    assert f.status is Status.PASS


def test_nvls_off_costs_nothing_with_four_gpus() -> None:
    s = snap("h100_sxm_8x", NCCL_NVLS_ENABLE="0", CUDA_VISIBLE_DEVICES="0,1,2,3")
    assert one(s, "GD622").status is Status.PASS


def test_p2p_level_pix_keeps_nvlink_pairs() -> None:
    assert one(snap("a100_sxm_8x", NCCL_P2P_LEVEL="PIX"), "GD623").status is Status.PASS


def test_p2p_level_numeric_zero_cuts_everything() -> None:
    f = one(snap("a100_sxm_8x", NCCL_P2P_LEVEL="0"), "GD623")
    assert f.status is Status.WARN and "28 GPU pair" in f.message and "NV12" in f.message


def test_p2p_level_unknown_value_warns() -> None:
    f = one(snap("a100_sxm_8x", NCCL_P2P_LEVEL="FAST"), "GD623")
    assert f.status is Status.WARN and "not a level" in f.message


def test_algo_excluding_nvls_on_hopper_names_the_cost() -> None:
    f = one(snap("h100_sxm_8x", NCCL_ALGO="^NVLS"), "GD624")
    assert f.status is Status.WARN and "NVLink SHARP" in f.message


def test_ib_disable_without_ib_costs_nothing() -> None:
    assert one(snap("rtx4090_pcie_4x", NCCL_IB_DISABLE="1"), "GD625").status is Status.PASS


def test_no_nccl_variables_no_nccl_findings() -> None:
    assert nccl(snap("h100_sxm_8x")) == []


def test_debug_and_profiler_variables_are_listed() -> None:
    s = snap("h100_sxm_8x", CUDA_DEVICE_WAITS_ON_EXCEPTION="1", CUDA_COREDUMP_FILE="/tmp/core.%p")
    findings = nccl_env.launch_env(CheckContext(s))
    (f,) = findings
    assert f.code == "GD231" and set(f.evidence["variables"]) == {
        "CUDA_DEVICE_WAITS_ON_EXCEPTION",
        "CUDA_COREDUMP_FILE",
    }


def test_launch_blocking_zero_is_fine() -> None:
    assert nccl_env.launch_env(CheckContext(snap("h100_sxm_8x", CUDA_LAUNCH_BLOCKING="0"))) == []
