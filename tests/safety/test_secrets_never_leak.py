"""31 planted secrets, every output gpudoctor writes: none of them gets through.

The secrets sit where a shared GPU server has them: in the environment (under names the old
prefix allow-list kept, and inside values the checks read), in the command line of the process
holding MASTER_PORT, in the command lines of processes on the GPUs (the probe sees them through a
fake NVML and reads /proc for real), and in the command line of a job `watch --pid` follows.
The GPU processes run as `mysql` and `curl` (argv[0] set by `exec -a`), so the shapes those
programs take passwords in are planted too (review3 S4). The outputs: check's JSON and text, its
JUnit and Prometheus files and GitHub step summary, snapshot on stdout and in a file, a watch
recording (its header's `command` too) and watch's JSON lines, and the JSON error documents of
failed runs.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

import gpudoctor.probe
import gpudoctor.probe.sampler
from gpudoctor.probe.machine import collect_machine
from gpudoctor.probe.nvml import Nvml
from gpudoctor.safety.redact import MARKER
from gpudoctor.snapshot import GpuProcess
from tests.fakes.fake_nvml import FakeNvml
from tests.fakes.live_nvml import ProcsOf
from tests.fakes.machines import h100_nvswitch_8x
from tests.helpers.cli import run_cli

RANDOM_TOKEN = "R4nd0mAlph4Num3r1cStr1ngOf36Chars"
SECRETS = {
    # environment: names no allow-list may keep
    "env NCCL_PASSWORD": "leak01-nccl-password",
    "env TORCH_SECRET_KEY": "leak02-torch-secret",
    "env PYTORCH_API_TOKEN": "leak03-pytorch-token",
    "env CUDA_CREDENTIALS": "leak04-cuda-creds",
    "env HF_TOKEN": "leak05-hf-token",
    "env AWS_SECRET_ACCESS_KEY": "leak06-aws-secret",
    "env NCCL_SOCKET_MAGIC": "leak07-socket-magic",
    # environment: secrets inside values that are kept
    "env NCCL_IB_HCA token=": "leak08-ib-token",
    "env MASTER_ADDR user:password@": "leak09-master-pw",
    "env NCCL_DEBUG_FILE ?secret=": "leak10-debug-file",
    "env TORCH_NCCL_DEBUG_INFO_TEMP_FILE api_key=": "leak11-temp-file",
    # the MASTER_PORT holder's command line
    "holder --api-key=": "leak12-holder-api-key",
    "holder --token": "leak13-holder-token",
    "holder URL password": "leak14-holder-url-pw",
    # processes on the GPUs
    "gpu --password=": "leak15-gpu-password",
    "gpu key=": "leak16-gpu-key",
    "gpu Authorization: Bearer": "leak17-gpu-bearer",
    "gpu long random string": RANDOM_TOKEN,
    "gpu --secret": "leak19-gpu-secret",
    # the job `watch --pid` follows
    "watched --db-password": "leak20-watched-db-pw",
    # review3 S4: shapes that got through
    "gpu mysql -pSECRET": "leak21-mysql-glued",
    "gpu --pass": "leak22-gpu-pass",
    "gpu AKIA access key id": "AKIALEAK023EXAMPLE00",
    "gpu curl -u user:password": "leak24-curl-user-pw",
    "gpu ?sig= (Azure SAS)": "leak25SasSignature%2Bx%3D",
    "gpu dbpass=": "leak26-dbpass",
    "holder -p WORD": "leak27-holder-p",
    "watched -p WORD": "leak28-watched-p",
    "watched --wandb-key": "0123456789abcdef0123456789abcdef0leak029",
    "watched PGPASSWORD= argument": "leak30-pgpassword",
    "watched mysql_pwd=": "leak31-mysql-pwd",
}
S = SECRETS


def planted_env(master_addr: str, port: int) -> dict[str, str]:
    return {
        "NCCL_PASSWORD": S["env NCCL_PASSWORD"],
        "TORCH_SECRET_KEY": S["env TORCH_SECRET_KEY"],
        "PYTORCH_API_TOKEN": S["env PYTORCH_API_TOKEN"],
        "CUDA_CREDENTIALS": S["env CUDA_CREDENTIALS"],
        "HF_TOKEN": S["env HF_TOKEN"],
        "AWS_SECRET_ACCESS_KEY": S["env AWS_SECRET_ACCESS_KEY"],
        "NCCL_SOCKET_MAGIC": S["env NCCL_SOCKET_MAGIC"],
        "NCCL_IB_HCA": f"mlx5_0:1,mlx5_1:1,token={S['env NCCL_IB_HCA token=']}",
        "MASTER_ADDR": master_addr,
        "MASTER_PORT": str(port),
        "NCCL_DEBUG_FILE": f"/tmp/nccl.%h.%p?secret={S['env NCCL_DEBUG_FILE ?secret=']}",
        "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": f"/tmp/dump?api_key={S['env TORCH_NCCL_DEBUG_INFO_TEMP_FILE api_key=']}",
        "NCCL_DEBUG": "INFO",
        "CUDA_VISIBLE_DEVICES": "0,1",
    }


SLEEP = "import time; time.sleep(120)"
HOLDER = (
    "import socket, sys, time\n"
    "s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen()\n"
    "print(s.getsockname()[1], flush=True); time.sleep(120)\n"
)


@pytest.fixture(scope="module")
def processes() -> Iterator[dict[str, object]]:
    """The holder of MASTER_PORT, two GPU processes and a job to follow, with secrets in argv."""
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            HOLDER,
            f"--api-key={S['holder --api-key=']}",
            "--token",
            S["holder --token"],
            f"https://bob:{S['holder URL password']}@hub.example/r",
            "-p",
            S["holder -p WORD"],
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    gpu_a = as_program(
        "mysql",
        f"--password={S['gpu --password=']}",
        f"key={S['gpu key=']}",
        "--epochs",
        "3",
        f"-p{S['gpu mysql -pSECRET']}",
        "--pass",
        S["gpu --pass"],
        S["gpu AKIA access key id"],
    )
    gpu_b = as_program(
        "curl",
        "-H",
        f"Authorization: Bearer {S['gpu Authorization: Bearer']}",
        f"ghp_{RANDOM_TOKEN}",
        "--secret",
        S["gpu --secret"],
        "-u",
        f"bob:{S['gpu curl -u user:password']}",
        f"https://acct.blob.core.windows.net/c/f?sv=2022-11-02&sp=r&sig={S['gpu ?sig= (Azure SAS)']}",
        f"dbpass={S['gpu dbpass=']}",
    )
    watched = subprocess.Popen(
        [
            sys.executable,
            "-c",
            SLEEP,
            "--db-password",
            S["watched --db-password"],
            "-p",
            S["watched -p WORD"],
            "--wandb-key",
            S["watched --wandb-key"],
            f"PGPASSWORD={S['watched PGPASSWORD= argument']}",
            f"mysql_pwd={S['watched mysql_pwd=']}",
        ]
    )
    try:
        assert holder.stdout is not None
        port = int(holder.stdout.readline())
        yield {"port": port, "gpu_a": gpu_a.pid, "gpu_b": gpu_b.pid, "watched": watched.pid}
    finally:
        for p in (holder, gpu_a, gpu_b, watched):
            p.kill()
            p.wait()


def as_program(program: str, *args: str) -> subprocess.Popen[bytes]:
    """A sleeping python whose command line reads `program -c ... ARGS` (bash's `exec -a`)."""
    return subprocess.Popen(["bash", "-c", f'exec -a {program} "$0" "$@"', sys.executable, "-c", SLEEP, *args])


def machine(procs: dict[str, object]) -> object:
    s = h100_nvswitch_8x()
    gpus = [
        replace(g, processes=[GpuProcess(pid=int(procs["gpu_a"] if g.index == 0 else procs["gpu_b"]))])
        if g.index in (0, 1)
        else g
        for g in s.gpus
    ]
    return replace(s, gpus=gpus)


def leaks(text: str) -> list[str]:
    return [where for where, secret in SECRETS.items() if secret in text]


@pytest.mark.parametrize("master_addr", ["127.0.0.1", f"admin:{S['env MASTER_ADDR user:password@']}@127.0.0.1"])
def test_no_planted_secret_reaches_any_output(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    processes: dict[str, object],
    master_addr: str,
) -> None:
    env = planted_env(master_addr, int(processes["port"]))
    fake = machine(processes)
    monkeypatch.setattr(
        gpudoctor.probe,
        "collect",
        lambda: collect_machine(Nvml(FakeNvml(fake)), env, root="/", systemctl=lambda unit: "active"),
    )
    monkeypatch.setattr(
        gpudoctor.probe.sampler, "Nvml", lambda: Nvml(ProcsOf(int(processes["gpu_a"]), int(processes["gpu_b"])))
    )
    for name, value in env.items():
        monkeypatch.setenv(name, value)  # also what gpudoctor's own process sees
    monkeypatch.delenv("GPUDOCTOR_WATCH_FAKE", raising=False)

    summary = tmp_path / "step_summary.md"
    summary.write_text("")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))  # the runner creates it; gpudoctor appends

    outputs: dict[str, str] = {}
    json_run = run_cli(
        capsys,
        "check",
        "--quick",
        "--json",
        "--junit",
        str(tmp_path / "junit.xml"),
        "--prometheus",
        str(tmp_path / "gpudoctor.prom"),
        "--github",
    )
    outputs["check --json"] = json_run.out + json_run.err
    outputs["JUnit file"] = (tmp_path / "junit.xml").read_text()
    outputs["Prometheus file"] = (tmp_path / "gpudoctor.prom").read_text()
    outputs["GitHub step summary"] = summary.read_text()
    text = run_cli(capsys, "check", "--quick", "-v")
    outputs["check text"] = text.out + text.err
    snap = run_cli(capsys, "snapshot")
    outputs["snapshot stdout"] = snap.out + snap.err
    run_cli(capsys, "snapshot", "-o", str(tmp_path / "snap.json"))
    outputs["snapshot file"] = (tmp_path / "snap.json").read_text()
    watch = run_cli(
        capsys,
        "watch",
        "--no-tui",
        "--json",
        "--duration",
        "1.5",
        "--interval",
        "0.5",
        "--process-interval",
        "0.5",
        "--record",
        str(tmp_path / "rec.jsonl"),
        "--pid",
        str(processes["watched"]),
    )
    outputs["watch --json"] = watch.out + watch.err
    outputs["watch recording"] = (tmp_path / "rec.jsonl").read_text()
    bad = run_cli(capsys, "check", "--quick", "--json", "--select", "GD999")
    outputs["error document (check)"] = bad.out + bad.err
    bad_watch = run_cli(capsys, "watch", "--no-tui", "--json", "--gpus", "99", "--duration", "1")
    outputs["error line (watch)"] = bad_watch.out + bad_watch.err

    assert json_run.exit_code == 1 and bad.exit_code == 2 and bad_watch.exit_code == 2
    found = {name: leaks(out) for name, out in outputs.items() if leaks(out)}
    assert found == {}, f"secrets leaked: {found}"

    # What was redacted says so, and the evidence still names what is there.
    doc = json_run.doc
    if master_addr == "127.0.0.1":
        holder = json_run.one("GD221")["evidence"]
        assert holder["holder_pid"] and holder["holder_command_redacted"] is True
        assert f"--api-key={MARKER} --token {MARKER} https://{MARKER}@hub.example/{MARKER}" in holder["holder_command"]
    else:
        assert json_run.one("GD222")["message"] == f"MASTER_ADDR '{MARKER}' does not resolve"
    snapshot_env = json.loads(outputs["snapshot file"])["env"]
    assert snapshot_env["NCCL_IB_HCA"] == f"mlx5_0:1,mlx5_1:1,{MARKER}"
    assert "NCCL_PASSWORD" not in snapshot_env and "TORCH_SECRET_KEY" not in snapshot_env
    assert MARKER in outputs["watch recording"] and doc["hostname"] == socket.gethostname()
    header = json.loads(outputs["watch recording"].splitlines()[0])
    assert f"-p {MARKER} --wandb-key {MARKER} PGPASSWORD={MARKER} mysql_pwd={MARKER}" in json.dumps(header)
    assert outputs["GitHub step summary"] and "gpudoctor_" in outputs["Prometheus file"]
