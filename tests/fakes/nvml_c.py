"""A fake libnvidia-ml.so.1 under the real pynvml: the strict half of the fake NVML.

The probe talks to pynvml; pynvml talks to the C library through ctypes. The fake replaces only
the C library. A private copy of the installed pynvml module (`pynvml_copy()`) is loaded with its
`nvmlLib` pointing at a dispatcher, so every wrapper the probe calls is pynvml's own code: its
signatures, its versioned structs (`c_nvmlMemory_v2_t`, `c_nvmlEccSramErrorStatus_v1_t`...), its
return types (bytes from `nvmlDeviceGetGspFirmwareVersion`, str where it decodes), its traps
(`NVMLLibraryMismatchError` from `@throwOnVersionMismatch`, NOT_FOUND raised by the NULL-buffer
first call of `nvmlDeviceGetProcessUtilization`, `c_nvmlGpuFabricInfoV_t` being the v2 struct).
A fake cannot be more lenient than that code, because it is that code.

What the fake adds, and would otherwise be lenient about, fails the test instead of turning into
data (`FakeViolation` is a BaseException: `Nvml.call`'s `except Exception` cannot swallow it):

- a call whose arguments do not bind to the real pynvml function's signature (inspect);
- a pynvml name the installed module does not have (recorded in `PynvmlView.absent`; a test
  asserts the probe asks for none);
- a C function called with the wrong number of arguments for its nvml.h prototype, a struct passed
  by value where the C function takes a pointer, or a struct whose `version` is not the one nvml.h
  defines (answered ARGUMENT_VERSION_MISMATCH, as NVML does);
- any exception other than pynvml's own out of a pynvml wrapper.

Latency: each C symbol costs what it cost on the H200 (driver 580.159.04; medians of
/work/gpurun1/nvml_calls.json, see LATENCY_MS). The cost is counted per calling thread
(`FakeLibrary.modelled_s`), so a test can assert what one sampling thread spends without timing
anything; `sleep=True` really spends it (benchmarks/sampler_cost.py).

nvml.h line numbers are those of go-nvml gen/nvml/nvml.h at 2f9e261 (CUDA 13.3), as in
/work/research/nvml/calls.md.
"""

from __future__ import annotations

import ctypes
import importlib.util
import inspect
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

# nvmlReturn_t (nvml.h 1295-1330).
SUCCESS = 0
UNINITIALIZED = 1
INVALID_ARGUMENT = 2
NOT_SUPPORTED = 3
NO_PERMISSION = 4
NOT_FOUND = 6
INSUFFICIENT_SIZE = 7
DRIVER_NOT_LOADED = 9
TIMEOUT = 10
LIBRARY_NOT_FOUND = 12
FUNCTION_NOT_FOUND = 13
GPU_IS_LOST = 15
OPERATING_SYSTEM = 17
LIB_RM_VERSION_MISMATCH = 18
ARGUMENT_VERSION_MISMATCH = 25
RESET_TYPE_NOT_SUPPORTED = 30
UNKNOWN = 999

# Milliseconds per C call, measured on the H200 (driver 580.159.04, persistence mode on):
# medians of /work/gpurun1/nvml_calls.json (the watch sampler's steady state where it called the
# function repeatedly, the probe's single call otherwise). Not measured there: field values 197/198
# (modelled as the measured field-values call), TemperatureV, MemoryInfo_v2, GpuMaxPcieLinkGeneration
# and MemoryAffinity (modelled as their older siblings).
LATENCY_MS = {
    "nvmlInitWithFlags": 9.895,
    "nvmlShutdown": 3.338,
    "nvmlDeviceGetHandleByIndex_v2": 6.629,  # nvml.h 4610: "this API causes NVML to initialize the target GPU"
    "nvmlDeviceGetCpuAffinity": 9.645,
    "nvmlDeviceGetMemoryAffinity": 9.645,
    "nvmlDeviceGetEnforcedPowerLimit": 3.279,
    "nvmlDeviceGetEccMode": 1.939,
    "nvmlDeviceGetTotalEccErrors": 0.915,
    "nvmlDeviceGetCurrPcieLinkGeneration": 0.609,
    "nvmlDeviceGetRetiredPagesPendingStatus": 0.471,
    "nvmlDeviceGetPcieReplayCounter": 0.417,
    "nvmlDeviceGetMigMode": 0.415,
    "nvmlDeviceRegisterEvents": 1.524,
    "nvmlEventSetFree": 0.917,
    # nvml.h 5571: "querying a byte counter over a 20ms interval"; measured 21.058 ms median of 20.
    "nvmlDeviceGetPcieThroughput": 21.058,
    "nvmlDeviceGetProcessUtilization": 2.799,
    "nvmlDeviceGetFieldValues": 0.121,
    "nvmlDeviceGetComputeRunningProcesses_v3": 0.049,
    "nvmlDeviceGetMemoryInfo": 0.055,
    "nvmlDeviceGetMemoryInfo_v2": 0.055,
    "nvmlDeviceGetUtilizationRates": 0.012,
    "nvmlDeviceGetPowerUsage": 0.007,
    "nvmlDeviceGetTemperature": 0.007,
    "nvmlDeviceGetTemperatureV": 0.007,
    "nvmlDeviceGetClockInfo": 0.006,
    "nvmlDeviceGetCurrentClocksEventReasons": 0.030,
    "nvmlEventSetWait_v2": 0.064,
}
DEFAULT_LATENCY_MS = 0.02  # the many cheap calls: 0.006-0.06 ms on the H200


class FakeViolation(BaseException):  # noqa: N818  (named for what it is, not an Error: it must not be caught)
    """A call the real pynvml or libnvidia-ml would reject, or a fake bug: fails the test."""


class NvmlError(Exception):
    """Raised inside a fake C function: the nvmlReturn_t it answers."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


# -- the private pynvml ----------------------------------------------------------------------------

_local = threading.local()  # .library: the FakeLibrary the current thread's pynvml call goes to
_module: Any = None
_module_lock = threading.Lock()


class _Dispatcher:
    """pynvml's `nvmlLib`: C symbols of the library the calling thread is using."""

    def __getattr__(self, symbol: str) -> Any:
        library = getattr(_local, "library", None)
        if symbol == "nvmlErrorString":  # str(NVMLError) asks for it after the call has returned
            return _error_string
        if library is None or not library.has(symbol):
            raise AttributeError(symbol)  # pynvml: FUNCTION_NOT_FOUND (or UNINITIALIZED without a library)
        return _trampoline(symbol)


def _trampoline(symbol: str) -> Callable[..., Any]:
    def call(*args: Any) -> Any:
        library = getattr(_local, "library", None)
        if library is None:
            raise FakeViolation(f"{symbol} called outside a fake library")
        return library.c_call(symbol, args)

    call.__name__ = symbol
    return call


def _error_string(result: Any) -> bytes:
    # pynvml asks the library only for codes it has no words of its own for (30 is one: pynvml
    # 13.615.71 knows its class, not its text); nvml.h 1328 gives its meaning.
    return {RESET_TYPE_NOT_SUPPORTED: b"Reset not supported for given device/parameters"}.get(
        value(result), b"Unknown Error"
    )


def _installed_pynvml() -> str:
    """The file of nvidia-ml-py's pynvml, found through the installed distribution rather than
    `import pynvml`: an end-to-end test puts a fake `pynvml` module first on the path
    (tests/fakes/nvml_site), and that fake is built on this one."""
    from importlib.metadata import distribution

    for file in distribution("nvidia-ml-py").files or ():
        if file.name == "pynvml.py":
            return str(file.locate())
    raise RuntimeError("nvidia-ml-py's pynvml.py is not installed")


def pynvml_copy() -> Any:
    """The installed pynvml, loaded a second time under a private name, its C library the fake's.
    pynvml caches function pointers by name; the trampolines it caches look the library up at
    each call, so one copy serves every fake."""
    global _module
    with _module_lock:
        if _module is None:
            name = "_gpudoctor_fake_pynvml"
            spec = importlib.util.spec_from_file_location(name, _installed_pynvml())
            assert spec is not None and spec.loader is not None
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module  # pynvml builds its error classes from sys.modules[__name__]
            try:
                spec.loader.exec_module(module)
            finally:
                del sys.modules[name]
            module.nvmlLib = _Dispatcher()
            _module = module
    return _module


class PynvmlView:
    """What `Nvml(lib)` sees: the pynvml module over a FakeLibrary. Records the pynvml names asked
    for (`calls`) and those the installed pynvml lacks (`absent`)."""

    def __init__(self, library: FakeLibrary) -> None:
        self.library = library
        self.calls: list[str] = []
        self.absent: list[str] = []
        self._module = pynvml_copy()
        self._bound_cache: dict[str, Callable[..., Any]] = {}

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        try:
            value = getattr(self._module, name)
        except AttributeError:
            if name.startswith("nvml"):
                self.absent.append(name)
            raise
        if name.startswith("nvml") and callable(value):
            if name not in self._bound_cache:
                self._bound_cache[name] = self._bound(name, value)
            return self._bound_cache[name]
        return value

    def _bound(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        signature = inspect.signature(fn)
        module = self._module

        def call(*args: Any, **kwargs: Any) -> Any:
            self.calls.append(name)
            try:
                signature.bind(*args, **kwargs)
            except TypeError as exc:
                raise FakeViolation(f"pynvml.{name}{signature} rejects {args!r} {kwargs!r}: {exc}") from exc
            previous = getattr(_local, "library", None)
            _local.library = self.library
            try:
                return fn(*args, **kwargs)
            except (module.NVMLError, module.NVMLLibraryMismatchError):
                raise
            except FakeViolation:
                raise
            except Exception as exc:
                raise FakeViolation(f"pynvml.{name} raised {type(exc).__name__}: {exc}") from exc
            finally:
                _local.library = previous

        call.__name__ = name
        return call


# -- reading and writing C arguments ------------------------------------------------------------------


def value(arg: Any) -> Any:
    """A C scalar argument: pynvml passes c_uint(...) or a plain int."""
    return arg.value if isinstance(arg, ctypes._SimpleCData) else arg


def target(ref: Any, what: str) -> Any:
    """The object an out-pointer (ctypes.byref) points at; a struct passed by value is a violation:
    C would read the bytes of the struct as a pointer."""
    if ref is None:
        raise NvmlError(INVALID_ARGUMENT)  # nvml.h: "INVALID_ARGUMENT if ... is NULL"
    obj = getattr(ref, "_obj", None)
    if obj is None:
        if isinstance(ref, ctypes._Pointer):
            return ref.contents
        raise FakeViolation(f"{what}: expected a pointer (ctypes.byref), got {type(ref).__name__}")
    return obj


def put(ref: Any, what: str, v: Any) -> None:
    target(ref, what).value = v


def put_text(buffer: Any, length: Any, text: str) -> None:
    """A char buffer of `length` bytes: NVML answers INSUFFICIENT_SIZE when the text does not fit."""
    raw = text.encode()
    if len(raw) + 1 > value(length):
        raise NvmlError(INSUFFICIENT_SIZE)
    buffer.value = raw


def check_version(struct: Any, want: int, what: str) -> None:
    """Versioned structs (NVML_STRUCT_VERSION, nvml.h 141): a version NVML does not know answers
    ARGUMENT_VERSION_MISMATCH (e.g. nvml.h 8124 for the SRAM status)."""
    if int(getattr(struct, "version", -1)) != want:
        raise NvmlError(ARGUMENT_VERSION_MISMATCH)


def pointer_value(ptr: Any) -> int:
    return int(ctypes.cast(ptr, ctypes.c_void_p).value or 0)


def set_pointer(ref: Any, address: int) -> None:
    """Point an opaque handle (c_nvmlDevice_t, c_nvmlEventSet_t) at a made-up address."""
    ptr = target(ref, "handle")
    ctypes.cast(ctypes.addressof(ptr), ctypes.POINTER(ctypes.c_void_p)).contents.value = address


_SIGNATURES: dict[Any, inspect.Signature] = {}


def _signature(method: Any) -> inspect.Signature:
    """A bound method's signature, computed once per function and class."""
    key = (type(method.__self__), method.__func__)
    if key not in _SIGNATURES:
        _SIGNATURES[key] = inspect.signature(method)
    return _SIGNATURES[key]


def _wait(seconds: float) -> None:
    """Spend `seconds` as the real call would: a sub-2 ms call spins (time.sleep's own floor on a busy
    machine is ~1 ms, more than the call), a longer one sleeps (NVML's 20 ms window waits, it does
    not compute)."""
    if seconds >= 0.002:
        time.sleep(seconds)
        return
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


# -- the library ---------------------------------------------------------------------------------------


class FakeLibrary:
    """libnvidia-ml's C symbols as methods: each takes the C arguments pynvml passes and returns None
    (SUCCESS) or raises NvmlError(code). Subclasses answer from a machine (fake_nvml.SnapshotLibrary).

    Knobs (all per library):
    - `missing`: C symbols this driver's library lacks (pynvml: FUNCTION_NOT_FOUND, or
      NVMLLibraryMismatchError for the `@throwOnVersionMismatch` wrappers);
    - `answers`: C symbol -> code answered for every call (a sandbox or vGPU profile, see
      SANDBOX_ANSWERS in fake_nvml.py);
    - `sleep`: really sleep the modelled latency, besides counting it.
    """

    def __init__(
        self,
        *,
        missing: set[str] | frozenset[str] = frozenset(),
        answers: dict[str, int] | None = None,
        sleep: bool = False,
        latency_ms: dict[str, float] | None = None,
    ) -> None:
        self.missing = set(missing)
        self.answers = dict(answers or {})
        self.sleep = sleep
        self.latency_ms = {**LATENCY_MS, **(latency_ms or {})}
        self.initialized = 0
        self.c_calls: Counter[str] = Counter()
        self._spent: dict[int, float] = {}  # thread ident -> modelled seconds
        self._spent_lock = threading.Lock()

    # -- bookkeeping ------------------------------------------------------------------------------
    def has(self, symbol: str) -> bool:
        return symbol not in self.missing and callable(getattr(type(self), symbol, None))

    def modelled_s(self, thread: int | None = None) -> float:
        """Modelled NVML time spent by `thread` (default: the calling thread)."""
        return self._spent.get(threading.get_ident() if thread is None else thread, 0.0)

    def reset_clock(self) -> None:
        with self._spent_lock:
            self._spent.clear()

    def _spend(self, symbol: str) -> None:
        seconds = self.latency_ms.get(symbol, DEFAULT_LATENCY_MS) / 1000.0
        ident = threading.get_ident()
        with self._spent_lock:
            self._spent[ident] = self._spent.get(ident, 0.0) + seconds
        if self.sleep:
            _wait(seconds)

    def c_call(self, symbol: str, args: tuple[Any, ...]) -> Any:
        self.c_calls[symbol] += 1
        self._spend(symbol)
        if not self.has(symbol):
            return FUNCTION_NOT_FOUND  # a pointer cached while another library had the symbol
        fn = getattr(self, symbol)
        try:
            _signature(fn).bind(*args)
        except TypeError as exc:
            raise FakeViolation(f"{symbol} called with {len(args)} argument(s), not as nvml.h declares it") from exc
        try:
            if symbol != "nvmlInitWithFlags" and not self.initialized:
                raise NvmlError(UNINITIALIZED)
            if symbol in self.answers:
                raise NvmlError(self.answers[symbol])
            result = fn(*args)
        except NvmlError as err:
            return err.code
        except FakeViolation:
            raise
        except Exception as exc:
            raise FakeViolation(f"fake {symbol}{args!r} failed: {type(exc).__name__}: {exc}") from exc
        return SUCCESS if result is None else result

    # -- the library itself ---------------------------------------------------------------------------
    def nvmlInitWithFlags(self, flags: Any) -> None:
        self.initialized += 1

    def nvmlShutdown(self) -> None:
        self.initialized -= 1
