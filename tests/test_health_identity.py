"""GD307: InfoROM and GSP firmware alike across GPUs of a model (beside GD303's VBIOS)."""

from __future__ import annotations

from dataclasses import replace

from gpudoctor.checks.identity import identity
from gpudoctor.registry import CheckContext
from gpudoctor.snapshot import Missing
from tests.clirun import load


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
