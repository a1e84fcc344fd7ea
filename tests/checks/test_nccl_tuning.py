"""GD627-635: NCCL and torch settings priced on the machine (gpudoctor/checks/nccl_tuning.py)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gpudoctor.checks import nccl_tuning
from gpudoctor.engine import CheckContext
from gpudoctor.findings import Finding, Status
from gpudoctor.snapshot import Snapshot
from tests.helpers.snapshots import SnapshotOf


def found(s: Snapshot, code: str) -> list[Finding]:
    return [f for f in nccl_tuning.nccl_tuning(CheckContext(s)) if f.code == code]


def one(s: Snapshot, code: str) -> Finding:
    (f,) = found(s, code)
    return f


def test_nothing_set_nothing_said(snapshot_of: SnapshotOf) -> None:
    assert nccl_tuning.nccl_tuning(CheckContext(snapshot_of("h100_sxm_8x"))) == []


def test_gdr_off_matters_only_with_rdma_nics(snapshot_of: SnapshotOf) -> None:
    assert one(snapshot_of("h100_sxm_8x", NCCL_NET_GDR_LEVEL="LOC"), "GD627").status is Status.WARN  # 8 IB NICs
    assert one(snapshot_of("h100_sxm_8x", NCCL_NET_GDR_LEVEL="0"), "GD627").status is Status.WARN  # legacy 0 = LOC
    assert one(snapshot_of("rtx4090_pcie_4x", NCCL_NET_GDR_LEVEL="LOC"), "GD627").status is Status.PASS
    assert one(snapshot_of("h100_sxm_8x", NCCL_NET_GDR_LEVEL="PHB"), "GD627").status is Status.PASS


def test_gdr_read_off_on_an_nvlink_machine_and_the_old_level_name(snapshot_of: SnapshotOf) -> None:
    assert one(snapshot_of("h100_sxm_8x", NCCL_NET_GDR_READ="0"), "GD627").status is Status.WARN
    f = one(snapshot_of("h100_sxm_8x", NCCL_IB_GDR_LEVEL="PHB"), "GD627")
    assert f.status is Status.WARN and "ignored" in f.message and "NCCL_NET_GDR_LEVEL" in f.hint


def test_cross_nic_one_crosses_rails_where_there_are_rails(snapshot_of: SnapshotOf) -> None:
    assert one(snapshot_of("h100_sxm_8x", NCCL_CROSS_NIC="1"), "GD628").status is Status.WARN
    assert one(snapshot_of("h100_sxm_8x", NCCL_CROSS_NIC="0"), "GD628").status is Status.PASS
    assert one(snapshot_of("rtx4090_pcie_4x", NCCL_CROSS_NIC="1"), "GD628").status is Status.PASS  # no RDMA NIC
    f = one(snapshot_of("h100_sxm_8x", NCCL_CROSS_NIC="yes"), "GD628")
    assert f.status is Status.WARN and "reads it as 0" in f.message  # strtoll("yes") is 0


@pytest.mark.parametrize(
    ("name", "value", "status"),
    [
        ("NCCL_MAX_NCHANNELS", "4", Status.WARN),
        ("NCCL_MAX_NRINGS", "8", Status.WARN),
        ("NCCL_MAX_CTAS", "16", Status.WARN),
        ("NCCL_MAX_NCHANNELS", "32", Status.PASS),
        ("NCCL_MIN_NCHANNELS", "16", Status.WARN),
    ],
)
def test_channel_counts(name: str, value: str, status: Status, snapshot_of: SnapshotOf) -> None:
    assert one(snapshot_of("h100_sxm_8x", **{name: value}), "GD629").status is status


@pytest.mark.parametrize(
    ("value", "status", "words"),
    [
        ("4M", Status.FAIL, "reads as 4 byte(s)"),  # strtoll stops at 'M'
        ("4MB", Status.FAIL, "reads as 4 byte(s)"),
        ("4194304", Status.PASS, "default"),
        ("1048576", Status.WARN, "below the 4 MiB default"),
        ("16777216", Status.WARN, "4x the 4 MiB default"),
        ("5000000", Status.WARN, "not a power of two"),
        ("0x800000", Status.WARN, "2x"),
    ],
)
def test_buffsize_as_nccl_reads_it(value: str, status: Status, words: str, snapshot_of: SnapshotOf) -> None:
    f = one(snapshot_of("h100_sxm_8x", NCCL_BUFFSIZE=value), "GD630")
    assert f.status is status and words in f.message


def test_cumem_off_names_what_it_costs(snapshot_of: SnapshotOf) -> None:
    f = one(snapshot_of("h100_sxm_8x", NCCL_CUMEM_ENABLE="0"), "GD631")
    assert f.status is Status.WARN and "multi-node NVLink" in f.message and "/dev/shm" in f.message
    assert found(snapshot_of("h100_sxm_8x", NCCL_CUMEM_ENABLE="1"), "GD631") == []


@pytest.mark.parametrize(
    ("env", "status"),
    [
        ({"NCCL_DEBUG": "TRACE"}, Status.WARN),
        ({"NCCL_DEBUG": "trace"}, Status.WARN),
        ({"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "ALL"}, Status.WARN),
        ({"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,COLL"}, Status.WARN),
        ({"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "^INIT"}, Status.WARN),  # everything but INIT: COLL too
        ({"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "^COLL"}, Status.PASS),
        ({"NCCL_DEBUG": "INFO"}, Status.PASS),  # INIT,BOOTSTRAP,ENV: start-up only
        ({"NCCL_DEBUG": "WARN"}, Status.PASS),
    ],
)
def test_debug_output_that_logs_per_call(env: dict[str, str], status: Status, snapshot_of: SnapshotOf) -> None:
    assert one(snapshot_of("h100_sxm_8x", **env), "GD632").status is status


def test_ignore_cpu_affinity_matters_when_the_job_is_bound(snapshot_of: SnapshotOf) -> None:
    s = snapshot_of("h100_sxm_8x", NCCL_IGNORE_CPU_AFFINITY="1")
    assert one(s, "GD633").status is Status.PASS  # the fixture's process may use all 224 CPUs
    bound = replace(s, host=replace(s.host, cpu_affinity=list(range(28))))
    f = one(bound, "GD633")
    assert f.status is Status.WARN and "28 of 224 CPUs" in f.message


@pytest.mark.parametrize(
    ("env", "status", "words"),
    [
        ({"TORCH_NCCL_BLOCKING_WAIT": "1"}, Status.WARN, "blocks"),
        ({"TORCH_NCCL_BLOCKING_WAIT": "True"}, Status.WARN, "blocks"),  # getCvarBool lower-cases
        ({"TORCH_NCCL_BLOCKING_WAIT": "0"}, None, ""),
        ({"TORCH_NCCL_BLOCKING_WAIT": "on"}, Status.FAIL, "not a boolean"),
        ({"TORCH_NCCL_ASYNC_ERROR_HANDLING": "0"}, Status.WARN, "hangs"),
        ({"TORCH_NCCL_ASYNC_ERROR_HANDLING": "3"}, None, ""),
        ({"TORCH_NCCL_ASYNC_ERROR_HANDLING": "yes"}, Status.FAIL, "not an integer"),
        # the TORCH_ name wins over the deprecated one
        ({"TORCH_NCCL_BLOCKING_WAIT": "0", "NCCL_BLOCKING_WAIT": "1"}, None, ""),
        ({"NCCL_ASYNC_ERROR_HANDLING": "0"}, Status.WARN, "NCCL_ASYNC_ERROR_HANDLING=0"),
    ],
)
def test_torch_error_handling_as_processgroupnccl_reads_it(
    env: dict[str, str], status: Status | None, words: str, snapshot_of: SnapshotOf
) -> None:
    got = found(snapshot_of("h100_sxm_8x", **env), "GD634")
    if status is None:
        assert got == []
    else:
        (f,) = got
        assert f.status is status and words in f.message


def test_deprecated_torch_names_warn_and_say_which_wins(snapshot_of: SnapshotOf) -> None:
    f = one(snapshot_of("h100_sxm_8x", NCCL_BLOCKING_WAIT="1", TORCH_NCCL_BLOCKING_WAIT="0"), "GD635")
    assert f.status is Status.WARN and "TORCH_NCCL_BLOCKING_WAIT=0 overrides it" in f.message
    f = one(snapshot_of("h100_sxm_8x", NCCL_DESYNC_DEBUG="1"), "GD635")
    assert "TORCH_NCCL_DESYNC_DEBUG" in f.hint
