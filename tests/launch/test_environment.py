"""Under torchrun/srun gpudoctor reads RANK, WORLD_SIZE, LOCAL_RANK... the way torch does; a value
torch could not use is one usage line (exit 2) before any rank starts, not a crash in every
active check (review3 X2: `RANK=x ...` gave three GD001 "check crashed: ValueError")."""

from __future__ import annotations

import pytest

from gpudoctor.launch.environment import LauncherEnv, LauncherEnvError, launcher_env
from gpudoctor.launch.results import Task
from gpudoctor.launch.supervise import launch
from tests.helpers.cli import run_cli

TORCHRUN = {"RANK": "1", "WORLD_SIZE": "4", "MASTER_ADDR": "node0", "MASTER_PORT": "29500"}
LAUNCHER_VARS = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK")


def test_a_torchrun_environment_is_read() -> None:
    env = dict(TORCHRUN, LOCAL_RANK="1", LOCAL_WORLD_SIZE="2", GROUP_RANK="0")
    assert launcher_env(env) == LauncherEnv(rank=1, world_size=4, local_rank=1, node_rank=0)
    assert launcher_env({"RANK": "0", "WORLD_SIZE": "2"}) is None  # no MASTER_ADDR: not a launcher


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"RANK": "x"}, "RANK='x' is not a rank number"),
        ({"RANK": ""}, "RANK='' is not a rank number"),
        ({"RANK": "-1"}, "RANK='-1' is not a rank number"),
        ({"WORLD_SIZE": "0"}, "WORLD_SIZE='0' is not a process count"),
        ({"WORLD_SIZE": "two"}, "WORLD_SIZE='two' is not a process count"),
        ({"RANK": "4"}, "RANK=4 is not below WORLD_SIZE=4"),
        ({"LOCAL_RANK": "x"}, "LOCAL_RANK='x' is not a rank number"),
        ({"LOCAL_RANK": "2", "LOCAL_WORLD_SIZE": "2"}, "LOCAL_RANK=2 is not below LOCAL_WORLD_SIZE=2"),
        ({"LOCAL_WORLD_SIZE": "0"}, "LOCAL_WORLD_SIZE='0' is not a process count"),
        ({"GROUP_RANK": "node1"}, "GROUP_RANK='node1' is not a rank number"),
        ({"MASTER_PORT": "abc"}, "MASTER_PORT='abc' is not a port number"),
        ({"MASTER_PORT": "70000"}, "MASTER_PORT='70000' is not a port number"),
        ({"MASTER_PORT": None}, "MASTER_PORT is not set and is not a port number"),
    ],
)
def test_a_value_torch_could_not_use_is_named(change: dict[str, str | None], says: str) -> None:
    env = {k: v for k, v in {**TORCHRUN, **change}.items() if v is not None}
    with pytest.raises(LauncherEnvError) as caught:
        launcher_env(env)
    message = str(caught.value)
    assert message.startswith(says) and "\n" not in message and caught.value.exit_code == 2


def test_a_secret_typed_into_a_variable_is_not_repeated() -> None:
    with pytest.raises(LauncherEnvError) as caught:
        launcher_env(dict(TORCHRUN, MASTER_PORT="https://bob:hunter2@x"))
    assert "hunter2" not in str(caught.value)


@pytest.mark.parametrize("rank", ["x", "", "1.0", "0x1", " 1 ", "+1", "1_0", "٣"])
def test_a_rank_is_a_number_exactly_when_torch_reads_it_as_one(monkeypatch: pytest.MonkeyPatch, rank: str) -> None:
    """Oracle: torch's env:// rendezvous (torch/distributed/rendezvous.py) reads RANK with int()
    before MASTER_PORT; a MASTER_PORT it cannot read stops it right after, so the error names
    whichever it met first, and no store is ever opened."""
    rendezvous = pytest.importorskip("torch.distributed.rendezvous")
    monkeypatch.setenv("RANK", rank)
    monkeypatch.setenv("WORLD_SIZE", "64")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "sentinel")
    with pytest.raises(ValueError) as torch_error:  # RANK unreadable, or (read) MASTER_PORT
        next(rendezvous.rendezvous("env://"))
    torch_reads_it = "'sentinel'" in str(torch_error.value)
    try:
        ours = launcher_env(dict(TORCHRUN, RANK=rank, WORLD_SIZE="64")) is not None
    except LauncherEnvError:
        ours = False
    assert ours == torch_reads_it


def clean(monkeypatch: pytest.MonkeyPatch, **env: str) -> None:
    for name in (*LAUNCHER_VARS, "GPUDOCTOR_FAULT"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)


def test_check_says_it_in_one_line_and_starts_nothing(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    clean(monkeypatch, RANK="x", WORLD_SIZE="2", MASTER_ADDR="127.0.0.1")
    r = run_cli(capsys, "check", "--device", "cpu", "--ranks", "2")
    assert r.exit_code == 2
    assert r.err.strip().splitlines() == [
        "gpudoctor: RANK='x' is not a rank number: under torchrun/srun (RANK, WORLD_SIZE and MASTER_ADDR set) "
        "gpudoctor joins the launcher's process group; fix the variable or unset RANK to run on this node alone"
    ]
    assert "GD001" not in r.out and "crashed" not in r.out + r.err
    j = run_cli(capsys, "check", "--device", "cpu", "--ranks", "2", "--json")
    assert j.exit_code == 2 and j.doc["error"]["kind"] == "usage" and "RANK='x'" in j.doc["error"]["message"]


def test_bench_refuses_it_the_same_way(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    clean(monkeypatch, RANK="3", WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT="29500")
    r = run_cli(capsys, "bench", "allreduce", "--device", "cpu")
    assert r.exit_code == 2 and "RANK=3 is not below WORLD_SIZE=2" in r.err


def test_quick_checks_need_no_launcher_variables(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    clean(monkeypatch, RANK="x", WORLD_SIZE="2", MASTER_ADDR="127.0.0.1")
    r = run_cli(capsys, "check", "--quick", "--snapshot", "tests/fixtures/h100_sxm_8x.json")
    assert r.exit_code in (0, 1) and "RANK='x'" not in r.err


def test_launch_called_directly_reports_a_setup_error(monkeypatch: pytest.MonkeyPatch) -> None:
    clean(monkeypatch)
    result = launch(
        [Task("ddp", {})], device="cpu", ranks=2, environ={"RANK": "x", "WORLD_SIZE": "2", "MASTER_ADDR": "h"}
    )
    assert result.ranks == [] and not result.ok
    assert result.setup_error is not None and result.setup_error["kind"] == "bad_launcher_env"
    assert result.setup_error["message"].startswith("RANK='x' is not a rank number")
