"""First use after `pip install gpudoctor`: no numpy needed, a missing torch named with its install,
`--device cpu` on a machine without a driver, and one rule for the default device."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

import jsonschema
import psutil
import pytest

from gpudoctor.checks.active import common as active_common
from gpudoctor.checks.driver_reachable import nvml_available
from gpudoctor.checks.torch_install import torch_install
from gpudoctor.engine import CheckContext, CheckOptions
from gpudoctor.findings import Status
from gpudoctor.launch.environment import NO_GPU_AUTO, choose_device, rank_env
from gpudoctor.launch.supervise import launch
from gpudoctor.schemas import report_schema
from gpudoctor.snapshot import Missing
from tests.helpers.cli import run_cli
from tests.helpers.processes import GpudoctorCli, hiding
from tests.helpers.snapshots import fixture, load

# -- numpy ---------------------------------------------------------------------------------


@pytest.mark.slow
def test_the_active_and_deep_checks_pass_without_numpy(gpudoctor_cli: GpudoctorCli) -> None:
    """torch's all_gather_object and tensor.numpy() need numpy ("Numpy is not available"); the ranks
    gather JSON and hash tensor bytes without it, at every level (3 includes 2). The run is also the
    CLI's healthy two-rank run (tests/checks/active/test_ddp.py had one of its own for the same): every
    all-reduce and DDP verdict passes, the JSON validates, and no rank outlives gpudoctor."""
    args = ["check", "--level", "3", "--duration", "2", "--device", "cpu", "--ranks", "2", "--json"]
    out = gpudoctor_cli(*args, env=hiding("numpy"), timeout=200)
    assert "Numpy is not available" not in out.stdout + out.stderr
    doc = json.loads(out.stdout)
    jsonschema.validate(doc, report_schema())
    ran = ("allreduce", "ddp", "deep_load", "deep_sdc", "deep_memory")
    statuses = {c["name"]: c["status"] for c in doc["checks"] if c["name"] in ran}
    assert statuses == dict.fromkeys(ran, "pass"), statuses
    assert out.returncode == 0, out.stderr
    codes = {f["code"]: f["status"] for c in doc["checks"] for f in c["findings"]}
    for code in ("GD601", "GD602", "GD701", "GD702", "GD703", "GD704", "GD705", "GD706"):
        assert codes[code] == "pass", code
    ddp = next(c for c in doc["checks"] if c["name"] == "ddp")
    pids = [r["pid"] for r in ddp["details"]["launch"]["ranks"]]
    assert len(pids) == 2 and not any(psutil.pid_exists(p) and psutil.Process(p).status() != "zombie" for p in pids)


# -- torch ---------------------------------------------------------------------------------


def test_a_missing_torch_is_one_finding_that_names_the_install(gpudoctor_cli: GpudoctorCli) -> None:
    out = gpudoctor_cli("check", "--device", "cpu", "--ranks", "2", env=hiding("torch"), timeout=60)
    assert out.returncode == 1
    assert "FAIL GD002 host       PyTorch is not installed in this Python" in out.stdout
    assert "pip install torch" in out.stdout
    assert "--timeout" not in out.stdout, "a missing torch is not a slow machine"
    assert "skipped: PyTorch is not installed: see GD002" in out.stdout
    assert "... starting" not in out.stderr, "ranks were started without torch"


def test_bench_without_torch_says_so_in_one_line(gpudoctor_cli: GpudoctorCli) -> None:
    out = gpudoctor_cli("bench", "allreduce", "--device", "cpu", env=hiding("torch"), timeout=60)
    assert out.returncode == 3
    assert out.stderr.startswith("gpudoctor: the sweep did not start: PyTorch is not installed in ")
    assert "pip install torch" in out.stderr and out.stderr.count("\n") == 1


def test_launch_without_torch_starts_no_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    from gpudoctor.probe import software

    monkeypatch.setattr(software, "torch_installed", lambda: False)
    result = launch([], device="cpu", ranks=2, timeout_s=5)
    assert result.ranks == [] and result.setup_error is not None
    assert result.setup_error["kind"] == "no_torch" and "pip install torch" in result.setup_error["message"]


@pytest.mark.parametrize(("quick", "status"), [(False, Status.FAIL), (True, Status.WARN)])
def test_gd002_fails_a_run_that_needs_torch_and_warns_otherwise(quick: bool, status: Status) -> None:
    s = load("h100_sxm_8x")
    gone = replace(s, software=replace(s.software, torch=Missing("unsupported", "torch is not installed")))
    (f,) = torch_install(CheckContext(gone, CheckOptions(quick=quick)))
    assert f.code == "GD002" and f.status is status
    (ok,) = torch_install(CheckContext(s, CheckOptions(quick=quick)))
    assert ok.status is Status.PASS and ok.message == "torch 2.4.1+cu124 is installed"


# -- --device cpu without a driver -------------------------------------------------------------


def test_gd101_is_reported_but_does_not_fail_a_cpu_run() -> None:
    s = load("no_driver")
    (cpu,) = nvml_available(CheckContext(s, CheckOptions(device="cpu")))
    assert cpu.status is Status.SKIP and "not needed for --device cpu" in cpu.message
    (auto,) = nvml_available(CheckContext(s, CheckOptions()))
    assert auto.status is Status.FAIL


def test_check_device_cpu_on_a_driverless_snapshot_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    r = run_cli(capsys, "check", "--snapshot", str(fixture("no_driver")), "--device", "cpu", "--json")
    assert r.exit_code == 0 and r.one("GD101")["status"] == "skip"
    assert run_cli(capsys, "check", "--snapshot", str(fixture("no_driver"))).exit_code == 1


# -- one default device -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("requested", "gpus", "device"),
    [("auto", 8, "cuda"), ("auto", 0, ""), ("cuda", 2, "cuda"), ("cuda", 0, ""), ("cpu", 8, "cpu"), ("cpu", 0, "cpu")],
)
def test_choose_device(requested: str, gpus: int, device: str) -> None:
    assert choose_device(requested, gpus)[0] == device


def test_check_and_bench_choose_alike_without_a_gpu(gpudoctor_cli: GpudoctorCli) -> None:
    """On this driverless machine `--device auto` runs nothing in both, and both say how to run on CPU."""
    plan = active_common.plan(CheckContext(load("no_driver"), CheckOptions(device="auto")))
    assert plan.ranks == 0 and plan.skip == NO_GPU_AUTO
    out = gpudoctor_cli("bench", "allreduce", timeout=60)
    assert out.returncode == 3 and out.stderr == f"gpudoctor: {NO_GPU_AUTO}\n"


def test_single_node_cpu_ranks_use_loopback_for_gloo() -> None:
    env = rank_env({"GLOO_SOCKET_IFNAME": "eth0"}, device="cpu", gpu_uuids=None, under_launcher=False)
    assert env["GLOO_SOCKET_IFNAME"] in ("lo", "lo0")
    launched = rank_env({"GLOO_SOCKET_IFNAME": "eth0"}, device="cpu", gpu_uuids=None, under_launcher=True)
    assert launched["GLOO_SOCKET_IFNAME"] == "eth0", "torchrun/srun runs keep the user's interface"


def test_single_node_gpu_ranks_keep_nccl_and_gloo_sockets_on_loopback(tmp_path: Path) -> None:
    """NCCL's bootstrap and gloo's side groups listen on loopback, not on the host's public address;
    an interface the user named for NCCL is their training's setting and stays."""

    def ranks(env: dict[str, str], under_launcher: bool = False) -> dict[str, str]:
        return rank_env(env, device="cuda", gpu_uuids=["GPU-aaaa"], under_launcher=under_launcher)

    none = str(tmp_path / "none.conf")  # no config file names an interface
    env = ranks({"NCCL_CONF_FILE": none})
    assert env["NCCL_SOCKET_IFNAME"] in ("=lo", "=lo0") and env["GLOO_SOCKET_IFNAME"] in ("lo", "lo0")
    assert ranks({"NCCL_SOCKET_IFNAME": "=ib0"})["NCCL_SOCKET_IFNAME"] == "=ib0"
    # NCCL ignores a value of one character and picks an interface itself: loopback instead.
    assert ranks({"NCCL_SOCKET_IFNAME": "^", "NCCL_CONF_FILE": none})["NCCL_SOCKET_IFNAME"].startswith("=lo")
    # An interface named in NCCL's config file is the training's too (review5).
    conf = tmp_path / "nccl.conf"
    conf.write_text("# site settings\nNCCL_DEBUG=WARN\nNCCL_SOCKET_IFNAME = ens5\n")
    assert "NCCL_SOCKET_IFNAME" not in ranks({"NCCL_CONF_FILE": str(conf)})
    os.mkfifo(tmp_path / "fifo.conf")  # planted: reading it would block; it names nothing
    assert ranks({"NCCL_CONF_FILE": str(tmp_path / "fifo.conf")})["NCCL_SOCKET_IFNAME"].startswith("=lo")
    (tmp_path / ".nccl.conf").write_text("NCCL_SOCKET_IFNAME=bond0\n")
    assert "NCCL_SOCKET_IFNAME" not in ranks({"HOME": str(tmp_path)})
    launched = ranks({}, under_launcher=True)
    assert "NCCL_SOCKET_IFNAME" not in launched and "GLOO_SOCKET_IFNAME" not in launched
