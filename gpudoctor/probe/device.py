"""Per-device NVML calls that stop asking once the device is lost.

A GPU that falls off the bus answers GPU_IS_LOST to every later call, and each call can
take a while; after the first such answer the remaining fields are marked lost at once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from gpudoctor.probe.nvml import Nvml
from gpudoctor.snapshot import Missing

T = TypeVar("T")

LOST = Missing("gpu_lost", "the GPU was lost earlier in this probe")


class DeviceReader:
    def __init__(self, nvml: Nvml, handle: Any) -> None:
        self.nvml = nvml
        self.handle = handle
        self.lost = False

    def call(self, name: str, *args: Any) -> Any:
        """nvml.call(name, handle, *args); a Missing once the device is lost."""
        if self.lost:
            return LOST
        return self.noting_loss(self.nvml.call(name, self.handle, *args))

    def read(self, name: str, convert: Callable[[Any], T], *args: Any) -> T | Missing:
        """Call and convert the answer; a conversion that fails is an `error` Missing."""
        return convert_value(self.call(name, *args), convert, name)

    def noting_loss(self, value: Any) -> Any:
        """Remember a GPU_IS_LOST answer, so the remaining calls are not made."""
        if isinstance(value, Missing) and value.reason == "gpu_lost":
            self.lost = True
        return value

    def field(self, field_id: int) -> int | float | Missing:
        """One NVML field value (Nvml.field_value) of this device."""
        return LOST if self.lost else self.noting_loss(self.nvml.field_value(self.handle, field_id))

    def memory(self) -> tuple[Any, bool] | Missing:
        """The memory struct and whether it is v2 (Nvml.memory_info)."""
        return LOST if self.lost else self.noting_loss(self.nvml.memory_info(self.handle))

    def struct(self, fn_name: str, struct_name: str) -> dict[str, int] | Missing:
        """A versioned struct this device fills by reference (Nvml.struct_fields)."""
        return LOST if self.lost else self.noting_loss(self.nvml.struct_fields(fn_name, struct_name, self.handle))


def convert_value(value: Any, convert: Callable[[Any], T], what: str) -> T | Missing:
    if isinstance(value, Missing):
        return value
    try:
        return convert(value)
    except Exception as exc:  # noqa: BLE001  (an odd answer from a driver is data, not a crash)
        return Missing("error", f"{what}: unexpected answer {value!r} ({type(exc).__name__})")


def text(value: Any) -> str:
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    if not isinstance(value, str):
        raise TypeError("not a string")
    return value


def bus_id(pci_info: Any) -> str:
    """The bus id of an nvmlPciInfo_t: '00000000:18:00.0'."""
    return text(pci_info.busId)
