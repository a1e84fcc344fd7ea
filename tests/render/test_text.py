"""The compact text view (the default), and what -v and -vv add."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from gpudoctor.api import run_checks
from gpudoctor.findings import Status
from gpudoctor.render.text import render_report
from tests.helpers.cli import run_cli
from tests.paths import H100, MIXED

pytestmark = pytest.mark.usefixtures("no_policy")


def test_a_healthy_8_gpu_machine_is_one_line_per_check(capsys: pytest.CaptureFixture[str]) -> None:
    r = run_cli(capsys, "check", "--snapshot", H100)
    lines = r.out.splitlines()
    checks = run_checks(snapshot=H100).checks
    assert len(lines) == len(checks) + 2  # header, one per check, verdict
    assert all(line.startswith("[✓] ") for line in lines[1:-1])
    assert "[✓] NVIDIA driver and NVML: driver 550.54.15, 8 GPU(s) seen by NVML" in lines
    passes = sum(f.status is Status.PASS for c in checks for f in c.findings)  # GD407, issue 8's checks
    assert passes >= 41 and lines[-1].startswith(f"{passes} pass  ->  READY")


def test_only_checks_that_are_not_a_pass_show_findings_hints_and_tables(capsys: pytest.CaptureFixture[str]) -> None:
    out = run_cli(capsys, "check", "--snapshot", MIXED).out
    assert "[✗] GPU models and settings alike\n  FAIL GD301 gpu:1 " in out
    assert "hint: Train on identical GPUs" in out
    assert "[!] NVLink, PCIe and P2P topology\n" in out and "GPU topology (as nvidia-smi topo -m)" in out
    assert "[✓] XID errors in the kernel log: no XID errors in the kernel log" in out
    assert "PASS " not in out  # no passing finding line in the compact view


def test_v_is_the_per_check_view_and_vv_adds_every_pass(capsys: pytest.CaptureFixture[str]) -> None:
    compact = run_cli(capsys, "check", "--snapshot", H100).out
    v = run_cli(capsys, "check", "--snapshot", H100, "-v").out
    vv = run_cli(capsys, "check", "--snapshot", H100, "-vv").out
    assert "GPU topology (as nvidia-smi topo -m)" not in compact and "GPU topology (as nvidia-smi topo -m)" in v
    assert "PASS NVIDIA driver and NVML  (nvml, " in v and "(+3 more passed)" in v
    passes = sum(f.status is Status.PASS for c in run_checks(snapshot=H100).checks for f in c.findings)
    assert vv.count("  PASS GD") == passes and v.count("  PASS GD") == 0
    assert len(compact.splitlines()) < len(v.splitlines()) < len(vv.splitlines())


def test_marks_fall_back_to_ascii_where_the_output_cannot_encode_them() -> None:
    report = run_checks(snapshot=MIXED)
    buf = io.TextIOWrapper(io.BytesIO(), encoding="ascii")
    console = Console(file=buf, color_system=None, width=200)
    render_report(report, console)
    buf.flush()
    text = buf.buffer.getvalue().decode("ascii")  # type: ignore[attr-defined]
    assert "[x] GPU models and settings alike" in text and "[+] XID errors in the kernel log" in text
    assert "[!] Driver and CUDA stack" in text
