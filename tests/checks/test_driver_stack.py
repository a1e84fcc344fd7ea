"""Driver and software stack checks (GD102-106): edge cases beyond the fault fixtures."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from gpudoctor.checks import driver_stack as ds
from gpudoctor.engine import CheckContext
from gpudoctor.findings import Finding, Status
from gpudoctor.knowledge.versions import driver_version
from gpudoctor.snapshot import FabricInfo, Missing, Snapshot
from tests.helpers.findings import by_code
from tests.helpers.snapshots import SnapshotOf, load


def run(s: Snapshot) -> list[Finding]:
    return ds.driver_stack(CheckContext(s))


def with_driver(s: Snapshot, version: str, cuda: str | Missing) -> Snapshot:
    branch = version
    nvml = f"{cuda}.{branch}" if isinstance(cuda, str) else Missing("unsupported")
    drv = replace(
        s.driver, driver_version=version, cuda_driver_version=cuda, nvml_version=nvml, kernel_module_version=version
    )
    return replace(s, driver=drv)


def with_torch_cuda(s: Snapshot, cuda: str | None) -> Snapshot:
    return replace(s, software=replace(s.software, torch_cuda=cuda))


def test_nvml_version_mismatch_is_left_to_gd101_not_reported_twice(snapshot_of: SnapshotOf) -> None:
    s = snapshot_of("h100_sxm_8x")
    drv = replace(
        s.driver,
        nvml_status="version_mismatch",
        kernel_module_version="550.54.15",
        driver_version=Missing("error"),
        nvml_version=Missing("error"),
    )
    assert by_code(run(replace(s, driver=drv, gpus=[])), "GD102") == []


def test_kernel_module_string_from_proc_is_understood(snapshot_of: SnapshotOf) -> None:
    s = snapshot_of("h100_sxm_8x")
    text = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 22:23:56 UTC 2024"
    s = replace(s, driver=replace(s.driver, kernel_module_version=text))
    (f,) = by_code(run(s), "GD102")
    assert f.status is Status.PASS


@pytest.mark.parametrize(
    ("driver", "driver_cuda", "torch_cuda", "status"),
    [
        ("550.54.15", "12.4", "12.4", Status.PASS),
        ("535.129.03", "12.2", "12.1", Status.PASS),
        ("535.129.03", "12.2", "12.4", Status.WARN),  # minor-version compatibility
        ("470.223.02", "11.4", "12.1", Status.FAIL),  # older major
        ("470.223.02", "11.4", "11.8", Status.WARN),  # 11.x minor compatibility from 450.80.02
        ("570.86.15", "12.8", "13.0", Status.FAIL),  # CUDA 13 torch needs R580
        ("580.126.09", "13.0", "12.8", Status.PASS),
    ],
)
def test_driver_against_torch_cuda(
    driver: str, driver_cuda: str, torch_cuda: str, status: Status, snapshot_of: SnapshotOf
) -> None:
    s = with_torch_cuda(with_driver(snapshot_of("a100_sxm_8x"), driver, driver_cuda), torch_cuda)
    (f,) = by_code(run(s), "GD103")
    assert f.status is status
    if status is not Status.PASS:
        assert torch_cuda in f.message and f.hint


def test_driver_cuda_is_derived_from_the_table_when_nvml_cannot_say(snapshot_of: SnapshotOf) -> None:
    s = with_torch_cuda(with_driver(snapshot_of("a100_sxm_8x"), "525.147.05", Missing("unsupported")), "12.4")
    (f,) = by_code(run(s), "GD103")
    assert f.status is Status.WARN  # R525 = CUDA 12.0: 12.4 only through minor-version compatibility
    assert f.evidence["driver_supports_cuda"] == "12.0" and f.evidence["source"] == "NVIDIA's driver table"
    assert f.evidence["expected_driver"] == ">= 550.54.14"


def test_cpu_only_torch_is_a_skip(snapshot_of: SnapshotOf) -> None:
    (f,) = by_code(run(with_torch_cuda(snapshot_of("a100_sxm_8x"), None)), "GD103")
    assert f.status is Status.SKIP


def test_rtx40_with_p2p_disabled_is_a_warn_not_a_fail(snapshot_of: SnapshotOf) -> None:
    s = with_driver(snapshot_of("rtx4090_pcie_4x"), "535.129.03", "12.2")
    s = replace(s, env={"NCCL_P2P_DISABLE": "1"})
    (f,) = by_code(run(s), "GD104")
    assert f.status is Status.WARN


def test_rtx40_rule_needs_two_cards_of_the_run(snapshot_of: SnapshotOf) -> None:
    s = with_driver(snapshot_of("rtx4090_pcie_4x"), "535.129.03", "12.2")
    one = replace(s, env={"CUDA_VISIBLE_DEVICES": "2"})
    assert by_code(run(one), "GD104") == []
    two = replace(s, env={"CUDA_VISIBLE_DEVICES": "0,3"})
    assert by_code(run(two), "GD104")[0].status is Status.FAIL


def test_quadro_rtx_4000_is_not_mistaken_for_a_geforce_rtx_40(snapshot_of: SnapshotOf) -> None:
    s = with_driver(snapshot_of("rtx4090_pcie_4x"), "535.129.03", "12.2")
    s = replace(s, gpus=[replace(g, name="Quadro RTX 4000") for g in s.gpus])
    assert by_code(run(s), "GD104") == []


def test_persistence_is_not_judged_for_a_single_gpu_run(snapshot_of: SnapshotOf) -> None:
    s = snapshot_of("single_gpu")  # persistence off, one GPU
    assert by_code(run(s), "GD105") == []


def test_fabric_limited_capacity_warns_and_failed_registration_fails(snapshot_of: SnapshotOf) -> None:
    s = snapshot_of("h100_sxm_8x")
    limited = FabricInfo("completed", "success", "limited_capacity")
    failed = FabricInfo("completed", "nvml_error_insufficient_resources", Missing("unsupported"))
    s = replace(
        s, gpus=[replace(g, fabric=limited if g.index == 1 else failed if g.index == 2 else g.fabric) for g in s.gpus]
    )
    got = {(f.subject, f.status) for f in by_code(run(s), "GD106")}
    assert got == {("gpu:1", Status.WARN), ("gpu:2", Status.FAIL)}


def test_a_fabric_status_that_was_not_read_is_accepted_and_judged_on_the_state(snapshot_of: SnapshotOf) -> None:
    # docs/snapshot-format.md: an unread value is {"missing": ...}; a GPU still registering (the H200 of
    # huggingface_hub#4134, "fabric manager never reported Completed") has no meaningful status yet.
    from gpudoctor.snapshot import dumps, loads

    s = snapshot_of("h100_sxm_8x")
    text = dumps(s).replace('"status": "success"', '"status": {"missing": "not_collected"}')
    text = text.replace('"state": "completed"', '"state": "in_progress"', 1)
    read = loads(text)
    assert isinstance(read.gpus[0].fabric, FabricInfo) and isinstance(read.gpus[0].fabric.status, Missing)
    got = {(f.subject, f.status) for f in by_code(run(read), "GD106") if f.status is not Status.PASS}
    assert got == {("gpu:0", Status.FAIL)}
    done = replace(read, gpus=[replace(g, fabric=FabricInfo("completed", Missing("error"))) for g in read.gpus])
    assert {f.status for f in by_code(run(done), "GD106")} == {Status.PASS}


def test_no_nvswitch_no_fabric_finding(snapshot_of: SnapshotOf) -> None:
    assert by_code(run(snapshot_of("rtx4090_pcie_4x")), "GD106") == []


def rtx5090_box(nccl: str) -> Snapshot:
    """The 4-GPU PCIe box with RTX 5090s (Blackwell GeForce, compute capability 12.0)."""
    s = load("rtx4090_pcie_4x")
    gpus = [replace(g, name="NVIDIA GeForce RTX 5090", compute_capability="12.0") for g in s.gpus]
    torch = replace(s.software, torch="2.7.0+cu128", torch_cuda="12.8", torch_nccl=nccl)  # a torch with sm_120
    return replace(s, gpus=gpus, software=torch)


@pytest.mark.parametrize(
    ("nccl", "status"),
    # nccl#1637 / nccl-tests#287: 2.25.1 cannot launch its kernels on the 5090; 2.26.2 works
    [("2.25.1", Status.FAIL), ("2.21.5", Status.FAIL), ("2.26.2", Status.PASS), ("2.27.3", Status.PASS)],
)
def test_blackwell_geforce_needs_nccl_2_26_2(nccl: str, status: Status) -> None:
    (f,) = by_code(run(rtx5090_box(nccl)), "GD107")
    assert f.status is status and f.evidence["expected_nccl"] == ">= 2.26.2"
    if status is Status.FAIL:
        assert "RTX 5090" in f.message and "nvidia-nccl-cu12" in f.hint


def test_older_architectures_and_single_gpus_are_not_judged_on_the_nccl_floor(snapshot_of: SnapshotOf) -> None:
    assert (
        by_code(
            run(
                replace(
                    snapshot_of("rtx4090_pcie_4x"),
                    software=replace(snapshot_of("rtx4090_pcie_4x").software, torch_nccl="2.18.1"),
                )
            ),
            "GD107",
        )
        == []
    )
    one = replace(rtx5090_box("2.25.1"), env={"CUDA_VISIBLE_DEVICES": "0"})
    assert by_code(run(one), "GD107") == []


# ------------------------------------------------------------------------------ driver versions in every form

# The forms a healthy driver is written in: NVML's driver string (two parts, 470.86, or three,
# 550.54.15), NVML's own version (the CUDA major in front: "11.470.86", "12.550.54.15"), and the
# kernel's /proc/driver/nvidia/version line for the proprietary and the open module.
_PROC_LINES = (
    "NVRM version: NVIDIA UNIX x86_64 Kernel Module  {v}  Tue Nov  9 13:16:52 UTC 2021",
    "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  {v}  Release Build  (dvs-builder@U16-A24-23-2)",
    "NVRM version: NVIDIA UNIX aarch64 Kernel Module  {v}  Wed Jan 10 22:45:58 UTC 2024",
    "{v}",
)


def _driver_text(parts: tuple[int, ...]) -> str:
    return ".".join([str(parts[0])] + [f"{p:02d}" for p in parts[1:]])


_drivers = st.tuples(st.integers(100, 999), st.integers(0, 300)) | st.tuples(
    st.integers(100, 999), st.integers(0, 300), st.integers(0, 99)
)


@settings(max_examples=300, deadline=None)
@given(parts=_drivers, cuda=st.integers(1, 13), line=st.sampled_from(_PROC_LINES), module_form=st.booleans())
def test_a_healthy_driver_never_fails_gd102_in_any_form(
    parts: tuple[int, ...], cuda: int, line: str, module_form: bool
) -> None:
    s = load("a100_sxm_8x")
    text = _driver_text(parts)
    drv = replace(
        s.driver,
        driver_version=text,
        nvml_version=f"{cuda}.{text}",
        kernel_module_version=line.format(v=text) if module_form else text,
    )
    (f,) = by_code(run(replace(s, driver=drv)), "GD102")
    assert f.status is Status.PASS, (text, f.message)


@settings(max_examples=200, deadline=None)
@given(parts=_drivers, other=_drivers, cuda=st.integers(1, 13))
def test_a_module_that_differs_from_the_libraries_always_fails_gd102(
    parts: tuple[int, ...], other: tuple[int, ...], cuda: int
) -> None:
    s = load("a100_sxm_8x")
    lib, module = _driver_text(parts), _driver_text(other)
    assume(driver_version(lib) != driver_version(module))
    drv = replace(s.driver, driver_version=lib, nvml_version=f"{cuda}.{lib}", kernel_module_version=module)
    (f,) = by_code(run(replace(s, driver=drv)), "GD102")
    assert f.status is Status.FAIL and module in f.message


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("470.86", "11.470.86"),  # the AAU AI Cloud T4 nodes (healthy-08): a two-part driver
        ("550.54.15", "12.550.54.15"),
        ("450.36.06", "11.450.36.06"),  # CUDA.jl's example of NVML's version string
        ("580.159.04", "13.580.159.04"),  # the H200 run of /work/gpurun1
        ("NVRM version: NVIDIA UNIX x86_64 Kernel Module  470.86  Tue Nov  9 13:16:52 UTC 2021", "470.86"),
        ("libnvidia-ml.so.550.54.15", "550.54.15"),
    ],
)
def test_driver_version_reads_every_form_alike(a: str, b: str) -> None:
    assert driver_version(a) == driver_version(b) is not None


@pytest.mark.parametrize(
    ("torch", "cuda", "fails"),
    [
        ("2.7.0.dev20250310+cu124", "12.4", True),  # pytorch#167244: "supports ... sm_80 sm_86 sm_90"
        ("2.0.1+cu118", "11.8", True),  # pytorch#152077: "sm_120 is not compatible"
        ("2.7.0+cu128", "12.8", False),
    ],
)
def test_a_torch_built_without_the_gpus_architecture_fails_with_the_build_to_install(
    torch: str, cuda: str, fails: bool
) -> None:
    s = rtx5090_box("2.26.2")
    s = replace(s, software=replace(s.software, torch=torch, torch_cuda=cuda))
    s = replace(s, driver=replace(s.driver, cuda_driver_version="12.8", driver_version="570.124.06"))
    found = [f for f in by_code(run(s), "GD107") if f.status is Status.FAIL]
    assert bool(found) is fails
    if fails:
        (f,) = found
        assert "sm_120" in f.message and "whl/cu128" in f.hint and f.evidence["expected_torch_cuda"] == ">= 12.8"
    one = replace(s, env={"CUDA_VISIBLE_DEVICES": "0"})  # one GPU has no kernels either
    assert bool([f for f in by_code(run(one), "GD107") if f.status is Status.FAIL]) is fails
