"""Host readers on fake procfs/sysfs trees: cgroups, memory, NUMA, containers, kernel log, env."""

from __future__ import annotations

import dataclasses
import os
import platform
from pathlib import Path

import pytest

from gpudoctor.probe import cgroup, driver, host, kernel_log, software
from gpudoctor.probe.environment import allowed_env
from gpudoctor.probe.files import parse_cpulist
from gpudoctor.probe.machine import collect_machine
from gpudoctor.probe.nvml import Nvml
from gpudoctor.snapshot import Missing, NvLink, XidEvent
from tests.fakes.fake_nvml import FakeNvml
from tests.fakes.machines import h100_nvswitch_8x
from tests.paths import REPO


def write(root: Path, relative: str, content: str) -> None:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(content)


# -- cgroups ---------------------------------------------------------------------------


def test_cgroup_v2_quota_and_memory_limit(tmp_path: Path) -> None:
    write(tmp_path, "proc/self/cgroup", "0::/kubepods/burstable/pod1/ctr\n")
    base = "sys/fs/cgroup/kubepods/burstable/pod1/ctr"
    write(tmp_path, f"{base}/cpu.max", "400000 100000\n")
    write(tmp_path, f"{base}/memory.max", "34359738368\n")
    # The pod's parent is tighter on CPU and looser on memory: the tightest of each applies.
    write(tmp_path, "sys/fs/cgroup/kubepods/burstable/pod1/cpu.max", "250000 100000\n")
    write(tmp_path, "sys/fs/cgroup/kubepods/burstable/pod1/memory.max", "max\n")
    assert cgroup.cpu_quota(tmp_path) == 2.5
    assert cgroup.memory_limit(tmp_path) == 32 * 1024**3


def test_cgroup_v2_max_means_unlimited(tmp_path: Path) -> None:
    write(tmp_path, "proc/self/cgroup", "0::/\n")
    write(tmp_path, "sys/fs/cgroup/cpu.max", "max 100000\n")
    write(tmp_path, "sys/fs/cgroup/memory.max", "max\n")
    assert cgroup.memory_limit(tmp_path) is None
    assert cgroup.cpu_quota(tmp_path) == cgroup.NO_CPU_QUOTA


def test_cgroup_v2_host_path_absent_in_container_reads_mount_root(tmp_path: Path) -> None:
    # No cgroup namespace: /proc/self/cgroup names the host path, the mount is the container's.
    write(tmp_path, "proc/self/cgroup", "0::/system.slice/docker-abc.scope\n")
    write(tmp_path, "sys/fs/cgroup/cpu.max", "800000 100000\n")
    write(tmp_path, "sys/fs/cgroup/memory.max", "17179869184\n")
    assert cgroup.cpu_quota(tmp_path) == 8.0
    assert cgroup.memory_limit(tmp_path) == 16 * 1024**3


def test_cgroup_v1_quota_and_limit(tmp_path: Path) -> None:
    write(
        tmp_path,
        "proc/self/cgroup",
        "12:memory:/docker/abc\n4:cpu,cpuacct:/docker/abc\n1:name=systemd:/docker/abc\n",
    )
    write(tmp_path, "sys/fs/cgroup/cpu,cpuacct/docker/abc/cpu.cfs_quota_us", "600000\n")
    write(tmp_path, "sys/fs/cgroup/cpu,cpuacct/docker/abc/cpu.cfs_period_us", "100000\n")
    write(tmp_path, "sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us", "-1\n")
    write(tmp_path, "sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us", "100000\n")
    write(tmp_path, "sys/fs/cgroup/memory/docker/abc/memory.limit_in_bytes", "8589934592\n")
    write(tmp_path, "sys/fs/cgroup/memory/memory.limit_in_bytes", "9223372036854771712\n")
    assert cgroup.cpu_quota(tmp_path) == 6.0
    assert cgroup.memory_limit(tmp_path) == 8 * 1024**3


def test_cgroup_v1_unlimited_sentinel_is_none(tmp_path: Path) -> None:
    write(tmp_path, "proc/self/cgroup", "4:memory:/\n3:cpu:/\n")
    write(tmp_path, "sys/fs/cgroup/memory/memory.limit_in_bytes", "9223372036854771712\n")
    write(tmp_path, "sys/fs/cgroup/cpu/cpu.cfs_quota_us", "-1\n")
    write(tmp_path, "sys/fs/cgroup/cpu/cpu.cfs_period_us", "100000\n")
    assert cgroup.memory_limit(tmp_path) is None
    assert cgroup.cpu_quota(tmp_path).reason == "unsupported"


def test_cgroup_unreadable_is_missing_not_a_crash(tmp_path: Path) -> None:
    assert cgroup.memory_limit(tmp_path).reason == "unsupported"  # no /proc/self/cgroup at all
    write(tmp_path, "proc/self/cgroup", "0::/\n")
    write(tmp_path, "sys/fs/cgroup/memory.max", "lots\n")
    limit = host.guarded(cgroup.memory_limit, tmp_path)
    assert isinstance(limit, Missing) and limit.reason == "error"


# -- host facts --------------------------------------------------------------------------


def fake_host_tree(root: Path) -> None:
    write(root, "proc/meminfo", "MemTotal:       2113357184 kB\nMemFree:  100 kB\nMemAvailable:   2011111111 kB\n")
    write(root, "sys/devices/system/node/node0/cpulist", "0-55,112-167\n")
    write(root, "sys/devices/system/node/node1/cpulist", "56-111,168-223\n")
    write(root, "sys/devices/system/node/online", "0-1\n")
    write(
        root,
        "proc/cmdline",
        "BOOT_IMAGE=/vmlinuz root=UUID=1 ro intel_iommu=on iommu=pt pci=noacs quiet -- iommu=ignored\n",
    )
    for group in range(3):
        (root / f"sys/kernel/iommu_groups/{group}").mkdir(parents=True)
    for name in ("eth0", "ib0", "lo"):
        (root / f"sys/class/net/{name}").mkdir(parents=True)
    (root / "dev/shm").mkdir(parents=True)
    write(root, "proc/self/cgroup", "0::/\n")
    write(root, "sys/fs/cgroup/memory.max", "max\n")


def test_host_facts_from_a_fake_tree(tmp_path: Path) -> None:
    fake_host_tree(tmp_path)
    facts = host.read_host(tmp_path, {"KUBERNETES_SERVICE_HOST": "10.0.0.1"}, isolated=True)
    assert facts.ram_total_bytes == 2113357184 * 1024
    assert facts.ram_available_bytes == 2011111111 * 1024
    assert facts.numa_cpus == {"0": parse_cpulist("0-55,112-167"), "1": parse_cpulist("56-111,168-223")}
    assert facts.iommu_cmdline == ["intel_iommu=on", "iommu=pt", "pci=noacs"]
    assert facts.iommu_groups == 3
    assert facts.network_interfaces == ["eth0", "ib0", "lo"]
    assert facts.container == "kubernetes"
    assert facts.cgroup_memory_limit_bytes is None
    assert facts.xid_events.reason == "unsupported"  # no /dev/kmsg in the fake tree
    assert isinstance(facts.shm_total_bytes, int) and facts.shm_total_bytes > 0
    assert facts.cpu_count == os.cpu_count()


def test_host_facts_missing_tree_gives_reasons(tmp_path: Path) -> None:
    facts = host.read_host(tmp_path, {}, isolated=Missing("unsupported"))
    assert facts.ram_total_bytes.reason == "unsupported"
    assert facts.numa_cpus.reason == "unsupported"
    assert facts.iommu_groups.reason == "unsupported"
    assert facts.container is None


@pytest.mark.parametrize(
    "marker, cgroup_text, expected",
    [
        (".dockerenv", "", "docker"),
        ("run/.containerenv", "", "podman"),
        (None, "0::/kubepods.slice/kubepods-burstable.slice/cri-containerd-1.scope\n", "kubernetes"),
        (None, "12:memory:/docker/0123abcd\n", "docker"),
        (None, "0::/init.scope\n", None),
    ],
)
def test_container_detection(tmp_path: Path, marker: str | None, cgroup_text: str, expected: str | None) -> None:
    if marker:
        write(tmp_path, marker, "")
    write(tmp_path, "proc/1/cgroup", cgroup_text)
    assert host.container(tmp_path, {}) == expected


def test_pid_namespace_from_ns_link_and_nspid(tmp_path: Path) -> None:
    ns = tmp_path / "proc/self/ns"
    ns.mkdir(parents=True)
    (ns / "pid").symlink_to("pid:[4026531836]")  # the initial namespace's inode
    assert host.pid_namespace_isolated(tmp_path) is False
    (ns / "pid").unlink()
    (ns / "pid").symlink_to("pid:[4026532601]")
    assert host.pid_namespace_isolated(tmp_path) is True
    (ns / "pid").unlink()
    write(tmp_path, "proc/self/status", "Name:\tpython\nNSpid:\t81234\t17\n")
    assert host.pid_namespace_isolated(tmp_path) is True


def test_master_port_reads_env_and_rejects_garbage() -> None:
    status = host.master_port({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "0"})
    assert isinstance(status, Missing) and "out of range" in status.detail
    assert host.master_port({"MASTER_PORT": "twenty"}).reason == "error"
    free = host.master_port({})
    assert free.port == 29500 and free.host == "127.0.0.1"


def test_rlimit_unlimited_is_none() -> None:
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert host.rlimit(resource.RLIMIT_NOFILE) == (None if soft == resource.RLIM_INFINITY else soft)


# -- kernel log --------------------------------------------------------------------------


KMSG = (
    "6,1041,5123456789,-;NVRM: loading NVIDIA UNIX x86_64 Kernel Module  550.54.15\n"
    "3,2210,86400123456,-;NVRM: Xid (PCI:0000:18:00): 79, pid=2231, name=python, GPU has fallen off the bus.\n"
    " SUBSYSTEM=pci\n"
    " DEVICE=+pci:0000:18:00.0\n"
    "4,2211,86400200000,-;NVRM: Xid (PCI:0000:ab:00): 48, pid='<unknown>', name=<unknown>, An uncorrectable "
    "double bit error (DBE) has been detected on GPU in the framebuffer at partition 6, subpartition 0.\n"
    "4,2212,86400300000,-;NVRM: GPU at PCI:0000:18:00: GPU-abc\n"
)


def test_kmsg_xid_records_are_parsed(tmp_path: Path) -> None:
    write(tmp_path, "dev/kmsg", KMSG)
    events = kernel_log.xid_events(tmp_path)
    assert [(e.pci_bus_id, e.xid) for e in events] == [("00000000:18:00.0", 79), ("00000000:AB:00.0", 48)]
    assert events[0].timestamp == "[86400.123456]"
    assert events[0].text.startswith("NVRM: Xid (PCI:0000:18:00): 79, pid=2231")


def test_dmesg_lines_old_format_and_function() -> None:
    text = (
        "[ 1234.567890] NVRM: Xid (0000:03:00): 13, Graphics SM Warp Exception on (GPC 0, TPC 0)\n"
        "[ 1240.000001] NVRM: Xid (PCI:0001:1a:00.1): 94, pid=10, Contained: SM (0x1).\n"
        "[ 1300.000000] usb 1-1: new device\n"
    )
    assert kernel_log.parse_dmesg(text) == [
        XidEvent(
            "00000000:03:00.0",
            13,
            "NVRM: Xid (0000:03:00): 13, Graphics SM Warp Exception on (GPC 0, TPC 0)",
            "[ 1234.567890]",
        ),
        XidEvent(
            "00000001:1A:00.1", 94, "NVRM: Xid (PCI:0001:1a:00.1): 94, pid=10, Contained: SM (0x1).", "[ 1240.000001]"
        ),
    ]


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file")
def test_kmsg_permission_denied_is_no_permission(tmp_path: Path) -> None:
    write(tmp_path, "dev/kmsg", KMSG)
    (tmp_path / "dev/kmsg").chmod(0)
    assert kernel_log.xid_events(tmp_path).reason == "no_permission"


def test_kmsg_permission_denied_is_no_permission_via_open(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def denied(*args: object) -> int:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(kernel_log.os, "open", denied)
    missing = kernel_log.xid_events(tmp_path)
    assert missing.reason == "no_permission" and "CAP_SYSLOG" in missing.detail


# -- environment -------------------------------------------------------------------------


def test_only_allow_listed_variables_enter_the_snapshot(tmp_path: Path) -> None:
    environ = {
        "CUDA_VISIBLE_DEVICES": "0,1",
        "NCCL_P2P_DISABLE": "1",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
        "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
        "MASTER_ADDR": "10.1.2.3",
        "LOCAL_RANK": "0",
        "SLURM_GPUS_ON_NODE": "8",
        "OMP_NUM_THREADS": "4",
        "AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
        "HF_TOKEN": "hf_abcdefghijklmnopqrstuvwxyz",
        "SLURM_JOB_PASSWORD": "hunter2",
        "KUBERNETES_SERVICE_HOST": "10.96.0.1",
        "NCCLX": "no",
        "PATH": "/usr/bin",
    }
    env = allowed_env(environ)
    assert set(env) == {
        "CUDA_VISIBLE_DEVICES",
        "NCCL_P2P_DISABLE",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING",
        "PYTORCH_CUDA_ALLOC_CONF",
        "MASTER_ADDR",
        "LOCAL_RANK",
        "SLURM_GPUS_ON_NODE",
        "OMP_NUM_THREADS",
    }
    snapshot = collect_machine(Nvml(FakeNvml(h100_nvswitch_8x())), environ, root=tmp_path, systemctl=lambda u: "active")
    from gpudoctor.snapshot import dumps

    text = dumps(snapshot)
    for secret in ("wJalrXUtnFEMI", "hf_abcdef", "hunter2", "10.96.0.1"):
        assert secret not in text
    assert snapshot.host.container == "kubernetes"  # the variable's presence is used, not its value
    assert snapshot.env["CUDA_VISIBLE_DEVICES"] == "0,1"


# -- software and driver -------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, expected",
    [
        ("__version__ = '2.4.1+cu121'\ndebug = False\ncuda: Optional[str] = '12.1'\n", "12.1"),
        ("cuda: Optional[str] = None\nhip: Optional[str] = None\n", None),
        ("cuda = '11.8'\n", "11.8"),
    ],
)
def test_torch_cuda_version_from_version_py(text: str, expected: str | None) -> None:
    assert software.torch_cuda_from_text(text) == expected


def test_torch_cuda_version_garbage_is_missing() -> None:
    assert software.torch_cuda_from_text("version = '2.4'\n").reason == "error"
    assert software.torch_cuda_from_text("cuda = get_cuda()\n").reason == "error"


def test_software_versions_of_this_environment() -> None:
    import importlib.metadata

    facts = software.read_software()
    assert facts.torch == importlib.metadata.version("torch")
    assert facts.nvidia_ml_py == importlib.metadata.version("nvidia-ml-py")
    if facts.torch.endswith("+cpu"):
        assert facts.torch_cuda is None
        assert facts.torch_nccl.reason == "unsupported"


@pytest.mark.parametrize(
    "line, version",
    [
        ("NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 22:23:56 UTC 2024", "550.54.15"),
        (
            "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  570.133.20  Release Build  (dvs-builder@U16)",
            "570.133.20",
        ),
    ],
)
def test_kernel_module_version(tmp_path: Path, line: str, version: str) -> None:
    write(tmp_path, "proc/driver/nvidia/version", line + "\nGCC version:  gcc version 12.3.0\n")
    assert driver.kernel_module_version(tmp_path) == version


def test_cuda_driver_version_from_int() -> None:
    assert driver.cuda_version(12040) == "12.4"
    assert driver.cuda_version(13010) == "13.1"
    assert driver.cuda_version(11080) == "11.8"


def test_fabric_manager_asked_only_with_nvswitch() -> None:
    asked: list[str] = []

    def systemctl(unit: str) -> str:
        asked.append(unit)
        return "inactive"

    h100 = h100_nvswitch_8x().gpu(0)
    pcie_gpu = dataclasses.replace(h100, nvlinks=Missing("unsupported"))
    assert driver.fabric_manager([pcie_gpu], systemctl).reason == "unsupported" and asked == []
    gpu_to_gpu = [NvLink(link=0, active=True, version=3, remote_bus_id="00000000:07:00.0", remote_type="gpu")]
    bridged = dataclasses.replace(h100, nvlinks=gpu_to_gpu)
    assert driver.fabric_manager([bridged], systemctl).reason == "unsupported" and asked == []
    assert driver.fabric_manager([h100], systemctl) == "inactive"
    assert asked == ["nvidia-fabricmanager"]


def test_systemctl_absent_is_unsupported(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(driver.shutil, "which", lambda name: None)
    assert driver.systemctl_is_active("nvidia-fabricmanager").reason == "unsupported"


def test_every_variable_a_check_reads_is_allowed_into_the_snapshot() -> None:
    """A check that reads a variable the probe drops could never fire on a live machine."""
    import ast

    from gpudoctor.probe.environment import allowed

    read: set[str] = set()
    for path in (REPO / "gpudoctor" / "checks").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                name = node.value
                # "NCCL_" in `k.startswith("NCCL_")` is a prefix, not a variable the check reads
                prefix = name.endswith("_")
                env_like = name.isupper() and "_" in name and name.replace("_", "").isalnum() and not prefix
                if env_like and name.split("_")[0] in {
                    "CUDA",
                    "NCCL",
                    "SLURM",
                    "LOCAL",
                    "WORLD",
                    "GROUP",
                    "MASTER",
                    "NSIGHT",
                    "COMPUTE",
                    "OPENCL",
                    "NNODES",
                    "TORCH",
                }:
                    read.add(name)
    assert read, "the scan found no variable names: the test itself is broken"
    assert sorted(n for n in read if not allowed(n)) == []


@pytest.mark.parametrize(
    "cpuinfo, vendor",
    [
        # x86: the vendor string CPUID gives, the first line of every processor block
        ("processor\t: 0\nvendor_id\t: GenuineIntel\ncpu family\t: 6\n", "GenuineIntel"),
        ("processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\n", "AuthenticAMD"),
        ("processor\t: 0\nvendor_id\t:   Shanghai  \n", "Shanghai"),  # Zhaoxin pads its 12 characters
        ("processor\t: 0\nvendor_id\t: CentaurHauls\n", "CentaurHauls"),
        # ARM (Grace, Ampere Altra...): no vendor_id, the implementer code instead
        ("processor\t: 0\nBogoMIPS\t: 2000.00\nCPU implementer\t: 0x41\nCPU architecture: 8\n", "0x41"),
    ],
)
def test_cpu_vendor_from_proc_cpuinfo(tmp_path: Path, cpuinfo: str, vendor: str) -> None:
    write(tmp_path, "proc/cpuinfo", cpuinfo)
    assert host.cpu_vendor(tmp_path) == vendor


def test_cpu_vendor_unreadable_or_unnamed_is_missing(tmp_path: Path) -> None:
    assert host.cpu_vendor(tmp_path).reason == "unsupported"  # no /proc/cpuinfo at all
    write(tmp_path, "proc/cpuinfo", "processor\t: 0\nmodel name\t: QEMU Virtual CPU\n")
    assert host.cpu_vendor(tmp_path).reason == "unsupported"


def test_this_machines_cpu_is_recorded() -> None:
    facts = host.read_host(Path("/"), {}, isolated=False)
    assert facts.cpu_arch == platform.machine()
    if Path("/proc/cpuinfo").exists():
        assert isinstance(facts.cpu_vendor, str) and facts.cpu_vendor
