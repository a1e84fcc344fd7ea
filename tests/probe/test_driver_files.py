"""What the probe records of the driver when NVML cannot start: the two halves of a version mismatch
(the loaded kernel module, the user-space library on disk) and when the machine last booted, so GD101
can say which half is behind and whether a reboot can help (issue 21)."""

from __future__ import annotations

import os
from pathlib import Path

from gpudoctor.checks.driver_reachable import nvml_available
from gpudoctor.engine import CheckContext
from gpudoctor.findings import Status
from gpudoctor.probe import driver, host
from gpudoctor.probe.machine import collect_machine
from gpudoctor.probe.nvml import Nvml
from gpudoctor.snapshot import Missing
from tests.fakes.fake_nvml import FakeNvml
from tests.fakes.machines import h100_nvswitch_8x

BOOT = 1_725_000_000  # 2024-08-30T06:40:00Z


def _tree(root: Path, *, module: str, library: str, lib_changed: int, sysfs_only: bool = False) -> Path:
    """A root with a loaded module of version `module` and libnvidia-ml.so.1 -> libnvidia-ml.so.<library>."""
    if sysfs_only:
        (root / "sys/module/nvidia").mkdir(parents=True)
        (root / "sys/module/nvidia/version").write_text(module + "\n")
    else:
        (root / "proc/driver/nvidia").mkdir(parents=True)
        (root / "proc/driver/nvidia/version").write_text(
            f"NVRM version: NVIDIA UNIX x86_64 Kernel Module  {module}  Fri May 31 09:35:42 UTC 2024\n"
        )
    (root / "proc").mkdir(exist_ok=True)
    (root / "proc/stat").write_text(f"cpu  1 2 3 4\nbtime {BOOT}\nprocesses 9\n")
    libdir = root / "usr/lib/x86_64-linux-gnu"
    libdir.mkdir(parents=True)
    real = libdir / f"libnvidia-ml.so.{library}"
    real.write_bytes(b"\x7fELF")
    os.utime(real, (lib_changed, lib_changed))
    (libdir / "libnvidia-ml.so.1").symlink_to(real.name)  # relative, as the packages install it
    return root


def _probe(root: Path):  # type: ignore[no-untyped-def]
    fake = FakeNvml(h100_nvswitch_8x(), init_failure="version_mismatch")
    return collect_machine(Nvml(fake), {}, root=root, systemctl=lambda unit: Missing("unsupported"))


def test_a_mismatch_records_the_library_on_disk_and_the_boot_time(tmp_path: Path) -> None:
    root = _tree(tmp_path, module="550.90.07", library="550.107.02", lib_changed=BOOT + 3600)
    snap = _probe(root)
    assert snap.driver.kernel_module_version == "550.90.07"
    assert snap.driver.nvml_library == "libnvidia-ml.so.550.107.02"
    assert snap.driver.nvml_library_changed == "2024-08-30T07:40:00+00:00"
    assert snap.host.booted == "2024-08-30T06:40:00+00:00"


def test_the_module_version_falls_back_to_sysfs(tmp_path: Path) -> None:
    root = _tree(tmp_path, module="520.56.06", library="525.85.12", lib_changed=BOOT - 86400, sysfs_only=True)
    assert driver.kernel_module_version(root) == "520.56.06"
    (root / "sys/module/nvidia/version").write_text("not a version\n")
    assert isinstance(driver.kernel_module_version(root), Missing)


def test_a_library_name_of_another_form_is_not_kept(tmp_path: Path) -> None:
    libdir = tmp_path / "usr/lib64"
    libdir.mkdir(parents=True)
    (libdir / "evil name; rm -rf").write_bytes(b"")
    (libdir / "libnvidia-ml.so.1").symlink_to("evil name; rm -rf")
    got = driver.nvml_library(tmp_path, {})
    assert isinstance(got, Missing) and "evil" not in got.detail
    assert driver.nvml_library(tmp_path / "nowhere", {}) == Missing(
        "unsupported", "libnvidia-ml.so.1 is in none of the usual library directories"
    )


def test_ld_library_path_comes_first(tmp_path: Path) -> None:
    _tree(tmp_path, module="550.90.07", library="550.90.07", lib_changed=BOOT)
    own = tmp_path / "opt/app/lib"
    own.mkdir(parents=True)
    (own / "libnvidia-ml.so.535.54.03").write_bytes(b"")
    (own / "libnvidia-ml.so.1").symlink_to("libnvidia-ml.so.535.54.03")
    name, _ = driver.nvml_library(tmp_path, {"LD_LIBRARY_PATH": "relative/ignored:/opt/app/lib"})  # type: ignore[misc]
    assert name == "libnvidia-ml.so.535.54.03"


def test_boot_time_needs_a_btime_line(tmp_path: Path) -> None:
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc/stat").write_text("cpu 1 2 3\n")
    assert isinstance(host.booted(tmp_path), Missing)


def _gd101(root: Path):  # type: ignore[no-untyped-def]
    (finding,) = nvml_available(CheckContext(_probe(root)))
    assert finding.status is Status.FAIL
    return finding


def test_libraries_upgraded_after_boot_say_reboot_to_load_the_new_module(tmp_path: Path) -> None:
    # oddmario/NVIDIA-Ubuntu-Driver-Guide#4: 550.107.02 installed, 550.90.07 still loaded: "usually rebooting will fix".
    f = _gd101(_tree(tmp_path, module="550.90.07", library="550.107.02", lib_changed=BOOT + 3600))
    assert "550.90.07" in f.message and "550.107.02" in f.message
    assert f.hint.startswith("The 550.107.02 libraries were installed while the 550.90.07 module stayed loaded: reboot")
    assert f.evidence["nvml_library"] == "libnvidia-ml.so.550.107.02"


def test_a_mismatch_that_survived_a_reboot_is_named_a_package_mismatch(tmp_path: Path) -> None:
    # illinois-scicomp/machine-shop-maintenance#70: module 520.56.06, packages 525.85.12, "Tried rebooting the
    # system, but still doesn't work"; fixed by `apt install --fix-broken`.
    f = _gd101(_tree(tmp_path, module="520.56.06", library="525.85.12", lib_changed=BOOT - 86400))
    assert "half-upgraded package set" in f.message and "will not fix" in f.message
    assert "apt install --fix-broken" in f.hint and "does not fix" in f.hint
    assert "nvidia-driver-525" in f.hint


def test_a_library_older_than_the_module_points_at_the_library(tmp_path: Path) -> None:
    f = _gd101(_tree(tmp_path, module="550.90.07", library="535.54.03", lib_changed=BOOT + 60))
    assert "older than the loaded module" in f.message and "container" in f.hint


def test_without_the_library_gd101_keeps_the_general_sentence(tmp_path: Path) -> None:
    (tmp_path / "proc/driver/nvidia").mkdir(parents=True)
    (tmp_path / "proc/driver/nvidia/version").write_text("NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.90.07\n")
    (finding,) = nvml_available(CheckContext(_probe(tmp_path)))
    assert finding.message.startswith("NVIDIA driver/library version mismatch: the kernel module and libnvidia-ml")
