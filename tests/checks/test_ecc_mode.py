"""ECC off on data-centre GPUs (GD833), and one owner for each mode: persistence off is GD105's, ECC off
on a data-centre GPU GD833's (review3 V2)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gpudoctor.checks import driver_stack, ecc_mode, identity
from gpudoctor.engine import CheckContext
from gpudoctor.findings import Status
from gpudoctor.knowledge import gpu_products
from gpudoctor.snapshot import Missing, Snapshot
from tests.helpers.cli import run_cli
from tests.helpers.findings import judged
from tests.helpers.snapshots import load, with_gpu, write_variant


def every_gpu(s: Snapshot, **changes: object) -> Snapshot:
    return replace(s, gpus=[replace(g, **changes) for g in s.gpus])


def test_ecc_off_on_every_h100_warns_though_the_gpus_are_alike() -> None:
    s = every_gpu(load("h100_sxm_8x"), ecc_mode_current=False, ecc_mode_pending=False)
    (f,) = ecc_mode.ecc_mode(CheckContext(s))
    assert (f.code, f.status, f.subject) == ("GD833", Status.WARN, "host")
    assert "ECC is off on GPUs 0, 1, 2, 3, 4, 5, 6, 7" in f.message and "corrupted" in f.message
    assert "-e 1" in f.hint and f.evidence["gpus"] == list(range(8))
    assert not [x for x in identity.identity(CheckContext(s)) if "ECC" in x.message]


def test_ecc_off_on_one_gpu_is_said_once_by_its_owner() -> None:
    s = with_gpu(load("a100_sxm_8x"), 2, ecc_mode_current=False, ecc_mode_pending=False)
    assert judged(ecc_mode.ecc_mode(CheckContext(s))) == [("GD833", Status.WARN, "gpu:2")]
    assert not [f for f in identity.identity(CheckContext(s)) if f.code == "GD305" and f.status is Status.WARN]


@pytest.mark.parametrize(
    ("current", "pending", "words"),
    [
        (True, False, "set to go off at the next reboot"),
        (False, True, "off until the next reboot"),
    ],
)
def test_a_pending_ecc_change_is_named(current: bool, pending: bool, words: str) -> None:
    s = with_gpu(load("h100_sxm_8x"), 5, ecc_mode_current=current, ecc_mode_pending=pending)
    (f,) = ecc_mode.ecc_mode(CheckContext(s))
    assert (f.status, f.subject) == (Status.WARN, "gpu:5") and words in f.message


def test_ecc_on_passes_and_geforce_cards_are_left_to_gd305() -> None:
    (f,) = ecc_mode.ecc_mode(CheckContext(load("h100_sxm_8x")))
    assert f.status is Status.PASS and "GPU 0, 1, 2, 3, 4, 5, 6, 7" in f.message
    # RTX 4090s ship with ECC off (readable, False): not a data-centre warning...
    assert ecc_mode.ecc_mode(CheckContext(load("rtx4090_pcie_4x"))) == []
    # ...but one 4090 with ECC on among three without is still GD305's mismatch.
    odd = with_gpu(load("rtx4090_pcie_4x"), 1, ecc_mode_current=True)
    assert ("GD305", Status.WARN, "gpu:1") in judged(identity.identity(CheckContext(odd)))
    # A board NVML reports no ECC mode for (NOT_SUPPORTED) has no ECC: nothing to judge.
    no_ecc = Missing("unsupported")
    none = every_gpu(load("h100_sxm_8x"), ecc_mode_current=no_ecc, ecc_mode_pending=no_ecc)
    assert ecc_mode.ecc_mode(CheckContext(none)) == []


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("NVIDIA H200", True),
        ("Tesla V100-SXM2-32GB", True),
        ("NVIDIA L40S", True),
        ("NVIDIA A30", True),
        ("NVIDIA GeForce RTX 4090", False),
        ("NVIDIA RTX A6000", False),
        ("Quadro RTX 8000", False),
        ("NVIDIA RTX PRO 6000 Blackwell Server Edition", True),
    ],
)
def test_which_boards_are_expected_to_run_with_ecc(name: str, expected: bool) -> None:
    gpu = replace(load("h100_sxm_8x").gpus[0], name=name)
    assert gpu_products.ecc_expected_on(gpu) is expected


def test_persistence_off_on_one_gpu_is_gd105s_alone_and_singular(capsys, tmp_path) -> None:  # type: ignore[no-untyped-def]
    s = with_gpu(load("h100_sxm_8x"), 2, persistence_mode=False)
    (f,) = driver_stack.persistence(CheckContext(s))
    assert f.status is Status.WARN and f.message == "persistence mode is off on GPU 2: each start re-initialises it"
    r = run_cli(capsys, "check", "--snapshot", write_variant(tmp_path, s), "--json", "--quick")
    warned = [x for x in r.findings() if x["status"] == "warn"]
    assert [x["code"] for x in warned] == ["GD105"], warned
