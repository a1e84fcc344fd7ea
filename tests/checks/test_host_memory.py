"""Host RAM for the GPUs (GD501-502): the bar per GPU and the option that sets it."""

from __future__ import annotations

import pytest

from tests.helpers.cli import run_cli
from tests.helpers.snapshots import fixture


def test_ram_per_gpu_option_sets_the_bar(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["check", "--snapshot", str(fixture("single_gpu")), "--json", "--select", "GD501"]
    assert run_cli(capsys, *args).exit_code == 0
    r = run_cli(capsys, *args, "--ram-per-gpu", "128")
    assert r.exit_code == 1
    assert r.one("GD501")["evidence"]["expected_per_gpu_gb"] == 128.0
