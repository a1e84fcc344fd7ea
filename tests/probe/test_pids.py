"""NVML's PIDs across PID namespaces (gpudoctor/probe/pids.py): a driver that converts them into our
namespace (open kernel modules 535.113.01+), one that reports the host's, a host procfs mounted in the
container, and the probe run end to end under a container PID view."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from gpudoctor.probe.machine import collect_machine
from gpudoctor.probe.nvml import Nvml
from gpudoctor.probe.pids import pid_view
from gpudoctor.probe.processes import resolve
from gpudoctor.snapshot import GpuProcess
from tests.fakes.fake_nvml import FakeNvml
from tests.fakes.machines import h200_vm

OPEN_580 = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build  (nixbld@)\n"
CLOSED_525 = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  525.147.05  Wed Oct 25 20:27:35 UTC 2023\n"
OPEN_530 = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  530.41.03  Release Build\n"
CHILD_NS = 4026532481  # any inode but the initial namespace's 0xEFFFFFFC


def container_root(tmp_path: Path, driver: str, *, ns_inode: int = CHILD_NS) -> Path:
    """/proc of a container: its own PID namespace, the driver's banner, and one process of ours."""
    ns = tmp_path / "proc/self/ns"
    ns.mkdir(parents=True)
    (ns / "pid").symlink_to(f"pid:[{ns_inode}]")
    version = tmp_path / "proc/driver/nvidia/version"
    version.parent.mkdir(parents=True)
    version.write_text(driver)
    return tmp_path


def local_process(root: Path, pid: int, *, gpu: bool = False, start: int = 1234, base: str = "proc") -> Path:
    proc = root / base / str(pid)
    (proc / "fd").mkdir(parents=True)
    (proc / "status").write_text(f"Name:\tpython\nUid:\t{os.getuid()}\t0\t0\t0\nNSpid:\t{pid}\n")
    (proc / "cmdline").write_bytes(b"python\0train.py\0")
    comm = "(py thon) S"  # a command name with a space, as proc(5) allows
    (proc / "stat").write_text(f"{pid} {comm} " + " ".join(["0"] * 18) + f" {start} 0 0\n")  # field 22: start
    (proc / "fd" / "0").symlink_to("/dev/null")
    if gpu:
        (proc / "fd" / "7").symlink_to("/dev/nvidia0")
    return proc


def view_of(root: Path):  # noqa: ANN201  (a PidView)
    from gpudoctor.probe.host import pid_namespace_isolated

    return pid_view(root, pid_namespace_isolated(root))


def test_a_converting_driver_gives_our_pids_in_a_container(tmp_path: Path) -> None:
    root = container_root(tmp_path, OPEN_580)
    local_process(root, 42)
    local, user, command = resolve(42, root, view_of(root))
    assert (local, command) == (42, "python train.py") and user


@pytest.mark.parametrize("driver", [CLOSED_525, OPEN_530], ids=["closed-525", "open-530"])
def test_a_host_pid_is_not_pinned_on_the_local_process_of_that_number(tmp_path: Path, driver: str) -> None:
    root = container_root(tmp_path, driver)
    local_process(root, 42)  # NVML's 42 is a host PID; ours is some other process that holds no GPU
    assert resolve(42, root, view_of(root)) == (None, None, None)


def test_a_local_process_holding_a_gpu_device_is_ours_on_any_driver(tmp_path: Path) -> None:
    root = container_root(tmp_path, CLOSED_525)
    local_process(root, 42, gpu=True)
    assert resolve(42, root, view_of(root))[0] == 42


def test_a_host_procfs_maps_host_pids_through_nspid(tmp_path: Path) -> None:
    root = container_root(tmp_path, CLOSED_525)
    local_process(root, 7, start=5555)  # the job, PID 7 here
    host = local_process(root, 90210, start=5555, base="host/proc")  # and PID 90210 on the host
    (host / "status").write_text("Name:\tpython\nUid:\t0\t0\t0\t0\nNSpid:\t90210\t7\n")
    local_process(root, 1, base="host/proc")  # the host's init: a procfs is mounted there
    assert resolve(90210, root, view_of(root))[0] == 7
    # The same inner number in another container: its start time differs, so it is not ours.
    (host / "stat").write_text("90210 (python) S " + " ".join(["0"] * 18) + " 9999 0 0\n")
    assert resolve(90210, root, view_of(root))[0] is None


def test_in_the_hosts_namespace_nvml_pids_are_ours(tmp_path: Path) -> None:
    root = container_root(tmp_path, CLOSED_525, ns_inode=0xEFFFFFFC)
    local_process(root, 42)
    assert resolve(42, root, view_of(root))[0] == 42


@pytest.mark.parametrize("view, driver", [("namespace", OPEN_580), ("host", CLOSED_525)])
def test_the_probe_under_a_container_pid_view(tmp_path: Path, view: str, driver: str) -> None:
    """The whole probe in a container, as a user without privileges: NVML's PIDs either converted
    (and another container's process dropped), or the host's (left unresolved, never mislabelled)."""
    root = container_root(tmp_path, driver)
    local_process(root, 42)
    local_process(root, 3_000_042)  # some local process that happens to have the job's host PID
    gpu = dataclasses.replace(
        h200_vm().gpu(0), processes=[GpuProcess(pid=42, used_memory_mib=4096), GpuProcess(pid=77, used_memory_mib=512)]
    )
    fake = FakeNvml(
        dataclasses.replace(h200_vm(), gpus=[gpu]), pid_view=view, foreign={77}, root=False, documented_root=True
    )
    snapshot = collect_machine(Nvml(fake), {}, root=root, systemctl=lambda unit: "inactive")
    got = snapshot.gpu(0)
    assert snapshot.host.pid_namespace_isolated is True
    if view == "namespace":
        assert [(p.pid, p.local_pid, p.command) for p in got.processes] == [(42, 42, "python train.py")]
    else:
        assert [(p.pid, p.local_pid, p.command) for p in got.processes] == [
            (3_000_042, None, None),
            (3_000_077, None, None),
        ]
    assert got.sram_ecc.reason == "no_permission"  # nvml.h 8111, where a driver enforces it
    assert got.memory_used_mib == 0 and got.temperature_c == 44  # the rest of the GPU is read as root reads it
    assert fake.absent == []
