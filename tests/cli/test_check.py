"""`gpudoctor check` as users and CI run it: selection, error paths, real subprocesses."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

from gpudoctor.schemas import report_schema
from tests.helpers.cli import run_cli
from tests.helpers.files import write
from tests.helpers.processes import GpudoctorCli, clean_env
from tests.paths import H100, MIXED


def check_names(doc: dict) -> list[str]:  # type: ignore[type-arg]
    return [c["name"] for c in doc["checks"]]


def test_select_by_check_name_runs_only_that_check(capsys: pytest.CaptureFixture[str]) -> None:
    r = run_cli(capsys, "check", "--snapshot", H100, "--json", "--select", "topology")
    assert check_names(r.doc) == ["topology"]


def test_select_by_prefix_keeps_only_matching_codes(capsys: pytest.CaptureFixture[str]) -> None:
    r = run_cli(capsys, "check", "--snapshot", MIXED, "--json", "--select", "GD3")
    assert {f["code"][:3] for f in r.findings()} == {"GD3"}
    assert r.exit_code == 1  # the 4080 among 4090s


def test_select_by_code_and_ignore_by_code(capsys: pytest.CaptureFixture[str]) -> None:
    only = run_cli(capsys, "check", "--snapshot", MIXED, "--json", "--select", "GD302")
    assert {f["code"] for f in only.findings()} == {"GD302"}
    ignored = run_cli(capsys, "check", "--snapshot", MIXED, "--json", "--select", "identity", "--ignore", "GD301,GD302")
    assert ignored.exit_code == 0
    assert not {"GD301", "GD302"} & {f["code"] for f in ignored.findings()}


def test_ignore_by_check_name_drops_the_check(capsys: pytest.CaptureFixture[str]) -> None:
    r = run_cli(capsys, "check", "--snapshot", MIXED, "--json", "--ignore", "identity")
    assert "identity" not in check_names(r.doc)
    assert "topology" in check_names(r.doc)


def test_text_output_shows_the_topology_matrix(capsys: pytest.CaptureFixture[str]) -> None:
    # -v: the compact default shows tables only for a check that is not a pass (tests/render/test_text.py).
    r = run_cli(capsys, "check", "--snapshot", H100, "--select", "topology", "-v")
    assert r.exit_code == 0
    assert "GPU topology (as nvidia-smi topo -m)" in r.out
    row = next(line for line in r.out.splitlines() if line.startswith("GPU3 "))
    assert row.split()[:5] == ["GPU3", "NV18", "NV18", "NV18", "X"]


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda d: d / "missing.json", "no such file"),
        (lambda d: d, "is a directory"),
        (lambda d: write(d / "corrupt.json", '{"schema_version": 1, "gpus": ['), "not valid JSON"),
        (lambda d: write(d / "future.json", '{"schema_version": 99, "gpus": []}'), "schema_version 99"),
        (lambda d: write(d / "list.json", "[1, 2]"), "not a gpudoctor snapshot"),
    ],
)
def test_unusable_snapshot_is_a_usage_error_with_a_json_document(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    make,
    message: str,  # type: ignore[no-untyped-def]
) -> None:
    r = run_cli(capsys, "check", "--snapshot", str(make(tmp_path)), "--json")
    assert r.exit_code == 2
    doc = r.doc  # validated against the schema
    assert doc["error"]["kind"] == "input" and message in doc["error"]["message"]
    assert doc["exit_code"] == 2
    assert r.err.startswith("gpudoctor: cannot use snapshot") and "Traceback" not in r.err


def test_unknown_select_code_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    r = run_cli(capsys, "check", "--snapshot", H100, "--json", "--select", "GD999")
    assert r.exit_code == 2
    assert r.doc["error"] == {"kind": "usage", "message": "unknown check or code 'GD999' (see `gpudoctor list-checks`)"}
    text = run_cli(capsys, "check", "--snapshot", H100, "--ignore", "nosuchcheck")
    assert text.exit_code == 2 and text.out == ""
    assert text.err.strip() == "gpudoctor: unknown check or code 'nosuchcheck' (see `gpudoctor list-checks`)"


# ------------------------------------------------------------------------------ real processes

ENV = clean_env(NO_COLOR="1", COLUMNS="200")


def test_subprocess_healthy_machine_exits_0_with_valid_json(gpudoctor_cli: GpudoctorCli) -> None:
    p = gpudoctor_cli("check", "--quick", "--snapshot", H100, "--json", env=ENV)
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    jsonschema.validate(doc, report_schema())
    assert doc["exit_code"] == 0 and doc["source"] == H100


def test_subprocess_mixed_machine_exits_1_and_names_the_card(gpudoctor_cli: GpudoctorCli) -> None:
    p = gpudoctor_cli("check", "--snapshot", MIXED, env=ENV)
    assert p.returncode == 1
    assert "GPU 1 is an NVIDIA GeForce RTX 4080, the others NVIDIA GeForce RTX 4090" in p.stdout
    assert "NOT READY (exit 1" in p.stdout


def test_subprocess_bad_snapshot_exits_2_without_traceback(tmp_path: Path, gpudoctor_cli: GpudoctorCli) -> None:
    p = gpudoctor_cli("check", "--snapshot", str(write(tmp_path / "bad.json", "{")), "--json", env=ENV)
    assert p.returncode == 2
    jsonschema.validate(json.loads(p.stdout), report_schema())
    assert "Traceback" not in p.stderr and len(p.stderr.strip().splitlines()) == 1


def test_static_check_imports_neither_torch_nor_textual() -> None:
    code = (
        "import atexit, sys\n"
        "atexit.register(lambda: sys.stderr.write('IMPORTED=%s\\n' % sorted("
        "m for m in ('torch', 'textual') if m in sys.modules)))\n"
        "from gpudoctor.cli.main import run\n"
        f"run(['check', '--quick', '--snapshot', {H100!r}, '--json'])\n"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=ENV)
    assert p.returncode == 0, p.stderr
    assert "IMPORTED=[]" in p.stderr
