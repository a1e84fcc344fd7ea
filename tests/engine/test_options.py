"""Options that reach the ranks are checked before any rank starts: `--timeout` has a maximum
(the OS timers and torch's C++ timeouts the ranks arm overflow far below 1e308), and a
GPUDOCTOR_FAULT the ranks cannot read is a usage error, in `check` and in `bench`."""

from __future__ import annotations

from pathlib import Path

import pytest

import gpudoctor
from gpudoctor.engine.options import MAX_TIMEOUT_S
from gpudoctor.errors import UserError
from gpudoctor.launch.faults import ENV, FaultSpecError, check_env
from tests.helpers.cli import run_cli
from tests.paths import H100


@pytest.mark.parametrize("value", ["1e308", "86401", "1e10"])
def test_a_timeout_past_a_day_is_a_usage_error(capsys: pytest.CaptureFixture[str], value: str) -> None:
    r = run_cli(capsys, "check", "--device", "cpu", "--timeout", value)
    assert r.exit_code == 2 and "--timeout" in r.err and "86400" in r.err
    assert "starting" not in r.err, "no rank was started"
    bench = run_cli(capsys, "bench", "allreduce", "--device", "cpu", "--timeout", value)
    assert bench.exit_code == 2 and "86400" in bench.err


def test_the_cli_bound_is_the_options_bound(capsys: pytest.CaptureFixture[str]) -> None:
    assert MAX_TIMEOUT_S == 86400
    assert run_cli(capsys, "check", "--snapshot", H100, "--timeout", "86400").exit_code == 0
    assert "at most 86400" in run_cli(capsys, "check", "--help").out


def test_the_api_and_the_policy_are_held_to_the_same_bound(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(UserError, match="timeout must be between 1 and 86400 seconds"):
        gpudoctor.run_checks(snapshot=H100, timeout_s=1e308, use_config=False)
    with pytest.raises(UserError, match="got nan"):
        gpudoctor.run_checks(snapshot=H100, timeout_s=float("nan"), use_config=False)
    (tmp_path / "gpudoctor.toml").write_text("timeout = 1e9\n")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserError, match="timeout must be between"):
        gpudoctor.run_checks(snapshot=H100)


@pytest.mark.parametrize("spec", ["garbage", "0:explode", "1:hang@never", "-1:exit", "x:hang"])
def test_a_fault_spec_the_ranks_cannot_read_is_a_usage_error_before_any_rank_starts(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, spec: str
) -> None:
    monkeypatch.setenv(ENV, spec)
    for args in (["check", "--device", "cpu", "--ranks", "2"], ["bench", "allreduce", "--device", "cpu"]):
        r = run_cli(capsys, *args)
        assert r.exit_code == 2, (args, r.err)
        assert r.err.startswith(f"gpudoctor: {ENV}: ") and r.err.count("\n") == 1, r.err
        assert "starting" not in r.err and "Traceback" not in r.err


def test_a_bad_fault_spec_does_not_stop_the_static_checks(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV, "garbage")
    assert run_cli(capsys, "check", "--snapshot", H100).exit_code == 0  # no rank would start


def test_the_fault_switch_reads_what_the_ranks_read() -> None:
    assert [(f.rank, f.action, f.when) for f in check_env({ENV: "1:hang@start, 0:sdc"})] == [
        (1, "hang", "start"),
        (0, "sdc", "joined"),
    ]
    assert check_env({}) == []
    with pytest.raises(FaultSpecError) as err:
        check_env({ENV: "1-hang"})
    assert isinstance(err.value, UserError) and err.value.exit_code == 2


def test_every_door_is_made_from_the_option_table(capsys: pytest.CaptureFixture[str]) -> None:
    """The command line, the Python API and the policy file take the same options (engine/options.py)."""
    import inspect

    from gpudoctor import policy
    from gpudoctor.engine.options import OPTIONS

    help_text = run_cli(capsys, "check", "--help").out
    keywords = inspect.signature(gpudoctor.run_checks).parameters
    for opt in OPTIONS:
        if opt.flag:
            assert opt.flag in help_text, opt.flag
            assert opt.name in keywords, f"run_checks has no keyword {opt.name} for {opt.flag}"
        if opt.policy:
            assert opt.policy in policy.KEYS, opt.policy
    assert set(policy.KEYS) == {o.policy for o in OPTIONS if o.policy} | {"severity", "watch"}


@pytest.mark.parametrize(
    ("flag", "value", "key", "toml"), [("--collectives", "alltoall", "collectives", '["alltoall"]')]
)
def test_a_value_the_command_line_takes_the_policy_takes_too(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    flag: str,
    value: str,
    key: str,
    toml: str,
) -> None:
    assert run_cli(capsys, "check", "--snapshot", H100, flag, value, "--no-config").exit_code == 0
    (tmp_path / "gpudoctor.toml").write_text(f"{key} = {toml}\n")
    monkeypatch.chdir(tmp_path)
    assert run_cli(capsys, "check", "--snapshot", H100).exit_code == 0
