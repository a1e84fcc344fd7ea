"""The one module that imports pynvml.

Everything that reads NVML (the snapshot probe, the watch sampler) goes through `Nvml`,
which turns NVML errors into `Missing` values with a reason instead of exceptions.
Tests hand `Nvml` a fake library object with the same function names (tests/fakes).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

from gpudoctor.snapshot import Missing

# NVML return codes (nvml.h 1295-1330); kept here so a fake library need not define them.
NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_OPERATING_SYSTEM = 17
NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18
NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25
NVML_ERROR_UNKNOWN = 999

# nvmlReturn_t names, lower case without the NVML_ERROR_ prefix: how a snapshot spells an
# NVML status it recorded (e.g. the fabric registration status).
NVML_RETURN_NAMES = {
    0: "success",
    1: "uninitialized",
    2: "invalid_argument",
    3: "not_supported",
    4: "no_permission",
    5: "already_initialized",
    6: "not_found",
    7: "insufficient_size",
    8: "insufficient_power",
    9: "driver_not_loaded",
    10: "timeout",
    11: "irq_issue",
    12: "library_not_found",
    13: "function_not_found",
    14: "corrupted_inforom",
    15: "gpu_is_lost",
    16: "reset_required",
    17: "operating_system",
    18: "lib_rm_version_mismatch",
    19: "in_use",
    20: "memory",
    21: "no_data",
    22: "vgpu_ecc_not_supported",
    23: "insufficient_resources",
    24: "freq_not_supported",
    25: "argument_version_mismatch",
    26: "deprecated",
    27: "not_ready",
    28: "gpu_not_found",
    29: "invalid_state",
    30: "reset_type_not_supported",
    999: "unknown",
}


def return_name(code: int) -> str:
    return NVML_RETURN_NAMES.get(code, f"error_{code}")


# What each code means for a reading (tests/reference/gpu_first_contact.md, research/nvml/errors.md).
# "unsupported": the reading is not there, on this GPU, driver, VM or sandbox; not asked again.
# NOT_SUPPORTED and FUNCTION_NOT_FOUND say so. OPERATING_SYSTEM is "The GPU control device has been
# blocked by the operating system/cgroups" (nvml.h 1315): gVisor's nvproxy answers it for a query it
# does not pass on (google/gvisor PR #10676), WSL at init. INVALID_ARGUMENT for a query the probe makes
# with fixed, valid arguments is a device or sandbox without that query (NVLink indices past the last
# link on GB200: TensorRT-LLM PR #17060). ARGUMENT_VERSION_MISMATCH: a driver older than the struct
# version asked, after the older versions were tried. UNKNOWN ("An internal driver error occurred")
# and the rest stay "error": a failed reading, which the watch sampler asks again less and less often.
_REASONS = {
    NVML_ERROR_NOT_SUPPORTED: "unsupported",
    NVML_ERROR_FUNCTION_NOT_FOUND: "unsupported",  # an older driver lacks the call
    NVML_ERROR_OPERATING_SYSTEM: "unsupported",
    NVML_ERROR_INVALID_ARGUMENT: "unsupported",
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH: "unsupported",
    NVML_ERROR_NO_PERMISSION: "no_permission",
    NVML_ERROR_GPU_IS_LOST: "gpu_lost",
}
# The codes above whose pynvml text does not say by itself why nothing came back.
_SAID_WHY = {
    NVML_ERROR_OPERATING_SYSTEM: "blocked by the operating system or a sandbox",
    NVML_ERROR_INVALID_ARGUMENT: "not available on this device or platform",
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH: "this driver does not know the struct version",
}
# pynvml's @throwOnVersionMismatch wrappers (nvmlDeviceGetComputeRunningProcesses and its siblings)
# turn FUNCTION_NOT_FOUND into this plain Exception, with no NVML code (pynvml 13.615.71 line 3131).
LIBRARY_MISMATCH = "NVMLLibraryMismatchError"

# What a failed nvmlInit means for the user: (status for Driver.nvml_status, message).
_INIT_STATUS = {
    NVML_ERROR_LIBRARY_NOT_FOUND: "no_library",
    NVML_ERROR_DRIVER_NOT_LOADED: "no_driver",
    NVML_ERROR_LIB_RM_VERSION_MISMATCH: "version_mismatch",
    NVML_ERROR_NO_PERMISSION: "no_permission",
}


def error_code(exc: BaseException) -> int | None:
    """The NVML return code carried by an NVMLError (real or fake), else None."""
    value = getattr(exc, "value", None)
    return value if isinstance(value, int) else None


def missing_from(exc: BaseException) -> Missing:
    code = error_code(exc)
    text = str(exc) or type(exc).__name__
    if code is None:
        if type(exc).__name__ == LIBRARY_MISMATCH:
            return Missing("unsupported", f"Function Not Found: this driver's NVML is older than nvidia-ml-py ({text})")
        return Missing("error", text)
    why = _SAID_WHY.get(code)
    return Missing(_REASONS.get(code, "error"), f"{text} ({why})" if why else text)


def missing_from_code(code: int, what: str) -> Missing:
    """A per-item NVML return code (field values answer one per field) as a Missing."""
    return Missing(_REASONS.get(code, "error"), f"{what}: {return_name(code)}")


# nvmlValueType_t -> the member of the nvmlValue_t union that holds the value.
_VALUE_MEMBERS = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}


class Answer(NamedTuple):
    value: Any  # the value, or a Missing
    code: int | None  # the NVML return code of a failure (None: a value, or no NVML code)


@dataclass(frozen=True)
class InitResult:
    status: str  # "ok" or a Driver.nvml_status value
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def load_library() -> Any:
    """Import pynvml lazily: a missing package is an init failure, not an ImportError."""
    import pynvml  # lazy: only callers that want NVML pay for it

    return pynvml


class Nvml:
    """A handle on the NVML library: real pynvml by default, a fake in tests."""

    def __init__(self, lib: Any | None = None) -> None:
        self._lib = lib
        self.initialized = False

    @property
    def lib(self) -> Any:
        if self._lib is None:
            self._lib = load_library()
        return self._lib

    def init(self) -> InitResult:
        try:
            lib = self.lib
        except ImportError as exc:
            return InitResult("no_library", f"nvidia-ml-py is not installed ({exc})")
        try:
            lib.nvmlInit()
        except Exception as exc:  # noqa: BLE001  (NVMLError or an OSError from a broken library)
            code = error_code(exc)
            status = _INIT_STATUS.get(code, "error") if code is not None else "error"
            return InitResult(status, str(exc) or type(exc).__name__)
        self.initialized = True
        return InitResult("ok")

    def shutdown(self) -> None:
        if self.initialized:
            try:
                self.lib.nvmlShutdown()
            except Exception:  # noqa: BLE001  (shutting down: nothing useful to do with it)
                pass
            self.initialized = False

    def call(self, name: str, *args: Any) -> Any:
        """Call NVML function `name`; an error becomes a Missing with its reason."""
        return self.attempt(name, *args).value

    def attempt(self, name: str, *args: Any) -> Answer:
        """Call NVML function `name`: its value, or a Missing and the NVML code (None: not an NVML
        code), for the callers to whom one code means something of its own (NOT_FOUND from
        nvmlDeviceGetProcessUtilization is "no new sample", TIMEOUT from an event wait "nothing")."""
        fn: Callable[..., Any] | None = getattr(self.lib, name, None)
        if fn is None:
            return Answer(Missing("unsupported", f"{name} is not in this nvidia-ml-py"), NVML_ERROR_FUNCTION_NOT_FOUND)
        try:
            value = fn(*args)
        except Exception as exc:  # noqa: BLE001  (every NVML failure is data, by design)
            return Answer(missing_from(exc), error_code(exc))
        return Answer(decode_text(value), None)

    def memory_info(self, handle: Any, try_v2: bool = True) -> tuple[Any, bool] | Missing:
        """nvmlDeviceGetMemoryInfo as nvidia-smi reads it, and whether it is the v2 struct: v2's
        `used` is "Allocated device memory" with `reserved` apart (nvml.h 274), v1's is the "Sum of
        Reserved and Allocated device memory" (nvml.h 259). v2 is asked with pynvml's version
        constant (the wrapper writes whatever it is given into the struct); a pynvml or driver
        without it answers v1."""
        version = getattr(self.lib, "nvmlMemory_v2", None) if try_v2 else None
        if version is not None:
            v2 = self.call("nvmlDeviceGetMemoryInfo", handle, version)
            if not isinstance(v2, Missing):
                return v2, True
            if v2.reason in ("gpu_lost", "no_permission"):
                return v2  # the older struct will not fare better
        v1 = self.call("nvmlDeviceGetMemoryInfo", handle)
        return v1 if isinstance(v1, Missing) else (v1, False)

    def field_value(self, handle: Any, field_id: int) -> int | float | Missing:
        """One NVML field value (nvmlDeviceGetFieldValues): the call can succeed while the
        field itself answers an error of its own, e.g. NOT_SUPPORTED on an older driver."""
        values = self.field_values(handle, [field_id])
        return values if isinstance(values, Missing) else values[0].value

    def field_values(self, handle: Any, field_ids: list[int]) -> list[FieldValue] | Missing:
        """Several field values in one call (nvml.h 10215-10217: fields "populated by the same driver
        call" are read once), each with its own answer and NVML's timestamp of it."""
        values = self.call("nvmlDeviceGetFieldValues", handle, field_ids)
        if isinstance(values, Missing):
            return values
        return [_field(values[i], field_id) for i, field_id in enumerate(field_ids)]

    def struct_fields(self, fn_name: str, struct_name: str, handle: Any) -> dict[str, int] | Missing:
        """Call an NVML function that fills a caller-allocated, versioned struct by reference
        (as pynvml requires for these) and return the struct's integer fields."""
        import ctypes  # lazy: only the calls that need it pay for it

        fn = getattr(self.lib, fn_name, None)
        struct_cls = getattr(self.lib, struct_name, None)
        if fn is None or struct_cls is None:
            return Missing("unsupported", f"{fn_name} is not in this nvidia-ml-py")
        try:
            info = struct_cls()
            fn(handle, ctypes.byref(info))
        except Exception as exc:  # noqa: BLE001  (NVML failures are data)
            return missing_from(exc)
        values = {name: getattr(info, name) for name, *_ in struct_cls._fields_ if name != "version"}
        return {k: int(v) for k, v in values.items() if isinstance(v, int)}  # arrays (UUIDs) left out

    def fabric_info(self, handle: Any) -> dict[str, int] | Missing:
        """nvmlDeviceGetGpuFabricInfo(V): pynvml wants a caller-allocated struct by reference.

        Tries the newest struct version first (v3 has the health summary), then v2, then
        the legacy call, because older drivers reject versions they do not know.
        Returns the struct's fields as a dict: state, status, and healthMask/healthSummary
        where the struct has them.
        """
        attempts = [
            ("nvmlDeviceGetGpuFabricInfoV", "c_nvmlGpuFabricInfo_v3_t"),
            ("nvmlDeviceGetGpuFabricInfoV", "c_nvmlGpuFabricInfo_v2_t"),
            ("nvmlDeviceGetGpuFabricInfo", "c_nvmlGpuFabricInfo_t"),
        ]
        last: Missing = Missing("unsupported", "no fabric info call in this nvidia-ml-py")
        for fn_name, struct_name in attempts:
            raw = self.struct_fields(fn_name, struct_name, handle)
            if not isinstance(raw, Missing):
                return {k: v for k, v in raw.items() if k in ("state", "status", "healthMask", "healthSummary")}
            if raw.reason in ("gpu_lost", "no_permission"):
                return raw  # an older struct version will not fare better
            if raw.detail.endswith("is not in this nvidia-ml-py"):
                continue
            last = raw
        return last


class FieldValue(NamedTuple):
    value: int | float | Missing
    timestamp_us: int  # nvml.h 3014: "CPU Timestamp of this value in microseconds since 1970" (0: none)
    wraps_at: int  # the counter's modulus: 2**32 for an unsigned int, 2**64 for the 64-bit types


_WRAPS = {1: 1 << 32, 2: 1 << 64, 3: 1 << 64}


def _field(value: Any, field_id: int) -> FieldValue:
    try:
        code = int(value.nvmlReturn)
        stamp = int(value.timestamp)
        if code != NVML_SUCCESS:
            return FieldValue(missing_from_code(code, f"field {field_id}"), stamp, 0)
        kind = int(value.valueType)
        member = _VALUE_MEMBERS.get(kind)
        if member is None:
            return FieldValue(Missing("error", f"field {field_id}: unknown value type {kind}"), stamp, 0)
        return FieldValue(getattr(value.value, member), stamp, _WRAPS.get(kind, 0))
    except Exception as exc:  # noqa: BLE001  (an odd answer from a driver is data)
        why = f"field {field_id}: unexpected answer ({type(exc).__name__}: {exc})"
        return FieldValue(Missing("error", why), 0, 0)


def decode_text(value: Any) -> Any:
    """Older pynvml versions return bytes for strings."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return value
