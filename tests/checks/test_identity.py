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


def test_two_against_two_has_no_majority(capsys, tmp_path) -> None:  # type: ignore[no-untyped-def]
    snap = load("rtx4090_pcie_4x")
    snap = with_gpu(with_gpu(snap, 2, power_limit_w=300.0), 3, power_limit_w=300.0)
    f = check_variant(capsys, tmp_path, snap).one("GD304")
    assert (f["status"], f["subject"]) == ("warn", "host")
    assert "GPUs 0,1: 450 W; GPUs 2,3: 300 W" in f["message"]
