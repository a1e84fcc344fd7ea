"""Options that cannot be read two ways (review3 C1, C2): a repeated single-value option is refused
instead of silently keeping the last, an empty --collectives is refused like --select '', and
`snapshot -o -` writes to standard output instead of a file named '-'."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.helpers.cli import run_cli
from tests.paths import H100


@pytest.mark.parametrize(
    ("args", "option"),
    [
        (["--expect-model", "H100", "--expect-model", "A100"], "--expect-model"),
        (["--fail-on", "warn", "--fail-on", "fail"], "--fail-on"),
        (["--level", "1", "--quick", "--level", "2"], "--level"),
    ],
)
def test_a_repeated_single_value_option_is_a_usage_error(capsys, args: list[str], option: str) -> None:  # type: ignore[no-untyped-def]
    r = run_cli(capsys, "check", "--snapshot", H100, "-q", *args)
    assert r.exit_code == 2 and r.out == ""
    (line,) = r.err.strip().splitlines()
    assert f"{option} given more than once" in line


def test_repeatable_options_and_flags_still_repeat(capsys) -> None:  # type: ignore[no-untyped-def]
    r = run_cli(capsys, "check", "--snapshot", H100, "--json", "--select", "GD301", "--select", "GD105", "--quick")
    assert r.exit_code == 0 and {f["code"] for f in r.findings()} == {"GD301", "GD105"}
    assert run_cli(capsys, "check", "--snapshot", H100, "-v", "-v", "--quick").exit_code == 0
    # --help answers whatever else is on the line.
    assert run_cli(capsys, "check", "--fail-on", "warn", "--fail-on", "fail", "--help").exit_code == 0


@pytest.mark.parametrize("value", ["", " ", ","])
def test_an_empty_collectives_list_is_refused_like_select(capsys, value: str) -> None:  # type: ignore[no-untyped-def]
    r = run_cli(capsys, "check", "--snapshot", H100, "-q", "--collectives", value)
    assert r.exit_code == 2 and "--collectives" in r.err and "needs collective names" in r.err


def test_snapshot_dash_o_dash_writes_standard_output(capsys, tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.chdir(tmp_path)
    r = run_cli(capsys, "snapshot", "-o", "-")
    assert r.exit_code == 0
    assert "schema_version" in json.loads(r.out) and "wrote" not in r.err
    assert not os.path.exists(tmp_path / "-")
    # A file really named '-' is still reachable: ./-
    r = run_cli(capsys, "snapshot", "-o", "./-")
    assert r.exit_code == 0 and (tmp_path / "-").is_file() and r.out == ""


@pytest.mark.parametrize(
    ("args", "option"),
    [
        (["watch", "--demo", "straggler", "--demo", "hung", "--no-tui", "--duration", "1"], "--demo"),
        (["report", "sample:xid", "--warmup", "5", "--warmup", "6"], "--warmup"),
        (["bench", "scaling", "--device", "cpu", "--steps", "3", "--steps", "4"], "--steps"),
    ],
)
def test_the_lazily_loaded_commands_refuse_a_repeat_too(capsys, args: list[str], option: str) -> None:  # type: ignore[no-untyped-def]
    r = run_cli(capsys, *args)
    assert r.exit_code == 2 and f"{option} given more than once" in r.err
