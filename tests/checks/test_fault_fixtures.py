"""Each fault fixture triggers its finding through `gpudoctor check --snapshot`; healthy ones stay clean."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

import pytest
from click.testing import CliRunner

from gpudoctor.cli.main import main
from gpudoctor.snapshot import dumps
from tests.paths import FIXTURES

FAULT_DIR = FIXTURES / "faults"

# The codes the health/config checks own: a healthy machine must not warn or fail on any of them.
OWN_PREFIXES = ("GD10", "GD23", "GD3", "GD51", "GD52", "GD62", "GD63", "GD8")
OWN_EXCEPT = ("GD101",)


def _load_faults() -> ModuleType:
    spec = importlib.util.spec_from_file_location("make_faults", FAULT_DIR / "make_faults.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


FAULTS = _load_faults().FAULTS


def check_json(path: Path, *args: str) -> tuple[int, dict]:
    result = CliRunner().invoke(main, ["check", "--snapshot", str(path), "--json", *args])
    return result.exit_code, json.loads(result.output)


def own_findings(doc: dict) -> list[dict]:
    return [
        f
        for c in doc["checks"]
        for f in c["findings"]
        if f["code"].startswith(OWN_PREFIXES) and f["code"] not in OWN_EXCEPT
    ]


@pytest.mark.parametrize("name", sorted(FAULTS))
def test_fault_fixture_triggers_its_finding(name: str) -> None:
    _make, code, status, subject = FAULTS[name]
    # A run where every selected check skipped is a usage error (docs/gates.md): GD101 gives a
    # skipping fault's run something judged.
    exit_code, doc = check_json(FAULT_DIR / f"{name}.json", "--select", code if status != "skip" else f"{code},GD101")
    hits = [f for f in own_findings(doc) if f["code"] == code and f["status"] == status]
    assert hits, f"{name}: expected {code} {status}, got {[(f['code'], f['status']) for f in own_findings(doc)]}"
    if subject is not None:
        assert subject in {f["subject"] for f in hits}
    assert all(f["message"] and "\n" not in f["message"] for f in hits)
    if status != "skip":
        assert all(f["hint"] for f in hits), "a warn/fail tells the user how to fix it"
    assert exit_code == (1 if status == "fail" else 0)


@pytest.mark.parametrize("name", sorted(FAULTS))
def test_fault_fixture_on_disk_is_what_the_generator_makes(name: str) -> None:
    make = FAULTS[name][0]
    assert (FAULT_DIR / f"{name}.json").read_text(encoding="utf-8") == dumps(make()), (
        "stale fixture: run .venv/bin/python tests/fixtures/faults/make_faults.py"
    )


@pytest.mark.parametrize(
    "name", ["h100_sxm_8x", "a100_sxm_8x", "rtx4090_pcie_4x", "container_32gb_8gpu", "single_gpu", "no_driver"]
)
def test_healthy_fixtures_raise_no_health_or_config_problem(name: str) -> None:
    _code, doc = check_json(FIXTURES / f"{name}.json")
    bad = [(f["code"], f["status"], f["message"]) for f in own_findings(doc) if f["status"] not in ("pass", "skip")]
    if name == "single_gpu":
        # The workstation keeps Ubuntu's default open-files limit of 1024: DataLoader workers sharing tensors
        # by descriptor run out of it with one GPU too (DonsetPG/graph-physics#22), so GD512 warns (issue 21).
        assert [(code, status) for code, status, _ in bad] == [("GD512", "warn")]
        return
    assert bad == []


def test_a_faulty_fixture_raises_only_the_fault_it_was_built_for() -> None:
    # The H100 box with one GPU throttling: every other health/config finding stays clean.
    _code, doc = check_json(FAULT_DIR / "clocks_hw_slowdown.json")
    bad = {(f["code"], f["subject"]) for f in own_findings(doc) if f["status"] in ("warn", "fail", "error")}
    assert bad == {("GD815", "gpu:4")}
