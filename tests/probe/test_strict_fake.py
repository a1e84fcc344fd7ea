"""The fake NVML is no more lenient than pynvml and nvml.h: a call the real library would reject
fails the test, and pynvml's own traps (research/nvml/calls.md §1.7) are there to fall into."""

from __future__ import annotations

import ctypes
import re
import threading
from pathlib import Path
from typing import Any

import pynvml
import pytest

from gpudoctor.probe.nvml import Nvml
from tests.fakes import nvml_c as c
from tests.fakes.fake_nvml import FakeNvml, SnapshotLibrary
from tests.fakes.live_nvml import LiveNvml
from tests.fakes.machines import h100_nvswitch_8x, h200_vm
from tests.fakes.nvml_c import FakeViolation


def opened(fake: FakeNvml) -> tuple[Nvml, Any]:
    nvml = Nvml(fake)
    assert nvml.init().ok
    return nvml, nvml.call("nvmlDeviceGetHandleByIndex", 0)


def test_the_fake_answers_only_c_symbols_pynvml_resolves() -> None:
    source = Path(pynvml.__file__).read_text(encoding="utf-8")
    resolved = set(re.findall(r'_nvmlGetFunctionPointer\("(\w+)"\)', source))
    answered = {name for name in dir(SnapshotLibrary) if name.startswith("nvml")}
    assert answered and answered - resolved == set()


def test_a_call_that_does_not_bind_to_pynvmls_signature_fails_the_test() -> None:
    fake = FakeNvml(h100_nvswitch_8x())
    nvml, handle = opened(fake)
    with pytest.raises(FakeViolation, match="nvmlDeviceGetTemperature"):
        nvml.call("nvmlDeviceGetTemperature", handle)  # the sensor is not optional
    with pytest.raises(FakeViolation):
        fake.nvmlDeviceGetMemoryInfo(handle, version=fake.nvmlMemory_v2, extra=1)
    # A name the installed pynvml lacks is what an older nvidia-ml-py does: not a value, and noted.
    assert (
        nvml.call("nvmlDeviceGetSomethingNew", handle).detail == "nvmlDeviceGetSomethingNew is not in this nvidia-ml-py"
    )
    assert fake.absent == ["nvmlDeviceGetSomethingNew"]


def test_a_struct_passed_by_value_fails_the_test() -> None:
    fake = FakeNvml(h100_nvswitch_8x())
    _, handle = opened(fake)
    status = fake.c_nvmlEccSramErrorStatus_v1_t()
    with pytest.raises(FakeViolation, match="pointer"):
        fake.nvmlDeviceGetSramEccErrorStatus(handle, status)  # C would read the struct's bytes as a pointer
    assert fake.nvmlDeviceGetSramEccErrorStatus(handle, ctypes.byref(status)) == 0


def test_versioned_structs_must_carry_the_version_nvml_h_defines() -> None:
    fake = FakeNvml(h200_vm())
    _, handle = opened(fake)
    # pynvml writes `version` into c_nvmlMemory_v2_t as given: True is version 1, which NVML refuses.
    with pytest.raises(fake.NVMLError_ArgumentVersionMismatch):
        fake.nvmlDeviceGetMemoryInfo(handle, version=True)
    assert fake.nvmlDeviceGetMemoryInfo(handle, version=fake.nvmlMemory_v2).reserved == 615 << 20
    # pynvml's c_nvmlGpuFabricInfoV_t is the v2 struct (nvml.h typedefs nvmlGpuFabricInfoV_t to v3).
    info = fake.c_nvmlGpuFabricInfoV_t()
    fake.nvmlDeviceGetGpuFabricInfoV(handle, ctypes.byref(info))
    assert "healthSummary" not in {name for name, *_ in info._fields_}
    bare = fake.c_nvmlGpuFabricInfo_v3_t.__new__(fake.c_nvmlGpuFabricInfo_v3_t)  # no __init__: no version
    with pytest.raises(fake.NVMLError_ArgumentVersionMismatch):
        fake.nvmlDeviceGetGpuFabricInfoV(handle, ctypes.byref(bare))


def test_pynvml_traps_are_there_to_fall_into() -> None:
    fake = LiveNvml(missing={"nvmlDeviceGetComputeRunningProcesses_v3"})
    _, handle = opened(fake)
    assert isinstance(fake.nvmlDeviceGetGspFirmwareVersion(handle), bytes)  # not decoded by pynvml
    assert isinstance(fake.nvmlDeviceGetName(handle), str)
    # A driver without the _v3 symbol: a plain Exception without an NVML code, not FUNCTION_NOT_FOUND.
    with pytest.raises(fake.NVMLLibraryMismatchError):
        fake.nvmlDeviceGetComputeRunningProcesses(handle)
    # Nothing newer than the timestamp: pynvml raises NOT_FOUND from its NULL-buffer first call.
    with pytest.raises(fake.NVMLError_NotFound):
        fake.nvmlDeviceGetProcessUtilization(handle, 0)
    # A code pynvml has a class for but no words: it asks the library (nvml.h 1328).
    assert str(fake.NVMLError(c.RESET_TYPE_NOT_SUPPORTED)) == "Reset not supported for given device/parameters"


def test_a_call_before_init_answers_uninitialized() -> None:
    fake = FakeNvml(h100_nvswitch_8x())
    with pytest.raises(fake.NVMLError_Uninitialized):
        fake.nvmlDeviceGetCount()


def test_latency_is_modelled_per_calling_thread() -> None:
    fake = LiveNvml()
    _, handle = opened(fake)
    before = fake.library.modelled_s()
    fake.nvmlDeviceGetPcieThroughput(handle, 0)
    fake.nvmlDeviceGetPcieThroughput(handle, 1)
    assert fake.library.modelled_s() - before == pytest.approx(2 * 0.021058)  # nvml.h 5571: a 20 ms window
    other: list[float] = []
    thread = threading.Thread(
        target=lambda: (fake.nvmlDeviceGetPowerUsage(handle), other.append(fake.library.modelled_s()))
    )
    thread.start()
    thread.join()
    assert other == [pytest.approx(0.007e-3)]  # the other thread's own cost: 0.007 ms
