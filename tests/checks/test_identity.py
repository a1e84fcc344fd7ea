"""GD307: InfoROM and GSP firmware alike across GPUs of a model (beside GD303's VBIOS)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gpudoctor.checks.identity import identity
from gpudoctor.engine import CheckContext
from gpudoctor.snapshot import Missing
from tests.helpers.cli import check_variant
from tests.helpers.snapshots import load, with_gpu


def test_firmware_alike_across_gpus_of_a_model() -> None:
    s = load("h100_sxm_8x")
    s = replace(s, gpus=[replace(g, inforom_image="G520.0200.00.05", gsp_firmware="550.54.15") for g in s.gpus])
    assert [f.status.value for f in identity(CheckContext(s)) if f.code == "GD307"] == ["pass", "pass"]
    odd = replace(s, gpus=[replace(g, inforom_image="G520.0200.00.03") if g.index == 6 else g for g in s.gpus])
    (f,) = [f for f in identity(CheckContext(odd)) if f.code == "GD307" and f.status.value != "pass"]
    assert (f.status.value, f.subject) == ("warn", "gpu:6")
    assert "InfoROM image G520.0200.00.03, the others G520.0200.00.05" in f.message
    # GSP firmware off on one GPU (NVML: unsupported) is a difference too
    off = replace(s, gpus=[replace(g, gsp_firmware=Missing("unsupported")) if g.index == 1 else g for g in s.gpus])
    (f,) = [f for f in identity(CheckContext(off)) if f.code == "GD307" and f.status.value != "pass"]
    assert f.subject == "gpu:1" and "GSP firmware off" in f.message


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


def test_two_against_two_names_the_pair_that_is_worse_off(capsys, tmp_path) -> None:  # type: ignore[no-untyped-def]
    snap = load("rtx4090_pcie_4x")
    snap = with_gpu(with_gpu(snap, 2, power_limit_w=300.0), 3, power_limit_w=300.0)
    f = check_variant(capsys, tmp_path, snap).one("GD304")
    assert (f["status"], f["subject"]) == ("warn", "host")
    assert "GPUs 2,3: 300 W, below GPUs 0,1's 450 W" in f["message"]
    assert f["evidence"]["below_best"] == [2, 3]


def test_a_faster_odd_card_is_not_told_it_has_less(capsys, tmp_path) -> None:  # type: ignore[no-untyped-def]
    # Issue 21: three cards in Gen3 slots and one in a Gen4 slot; the old message told GPU 3 it had "less
    # host bandwidth". The slower ones are named.
    snap = load("rtx4090_pcie_4x")
    for i in (0, 1, 2):
        snap = with_gpu(snap, i, pcie_gen_max=3)
    f = check_variant(capsys, tmp_path, snap).one("GD306")
    assert f["subject"] == "host" and f["message"].startswith(
        "max PCIe link differs: GPUs 0,1,2: Gen3 x16, below GPU 3's"
    )
    slow = check_variant(capsys, tmp_path, with_gpu(load("rtx4090_pcie_4x"), 1, pcie_gen_max=3)).one("GD306")
    assert slow["subject"] == "gpu:1" and "less host bandwidth" in slow["message"]
    big = check_variant(capsys, tmp_path, with_gpu(load("rtx4090_pcie_4x"), 0, memory_total_mib=49140)).one("GD302")
    assert big["subject"] == "host" and "GPUs 1,2,3" in big["message"]  # the 48 GB card caps nothing
