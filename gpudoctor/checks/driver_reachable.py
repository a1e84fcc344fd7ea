"""GD1 (driver/NVML): can gpudoctor talk to the NVIDIA driver at all?"""

from __future__ import annotations

from gpudoctor.engine import CheckContext, Code, check
from gpudoctor.findings import Finding, Status
from gpudoctor.knowledge.nvml_status import INSTALL_DRIVER, explain_init_failure, explain_mismatch

NVML_UNAVAILABLE = Code(
    "GD101",
    "nvml-unavailable",
    "The NVIDIA driver answers through NVML",
    what="Initialises NVML (libnvidia-ml, part of the NVIDIA driver) and lists the GPUs it sees.",
    why="Without a working driver no GPU can be used: PyTorch sees zero CUDA devices and a "
    "multi-GPU launch fails or silently falls back to CPU.",
    fix=INSTALL_DRIVER,
)


def _no_gpu(ctx: CheckContext, message: str, hint: str, evidence: dict[str, object]) -> Finding:
    """No usable GPU: a failure, unless the user asked for CPU ranks (then reported, not failing)."""
    if ctx.options.device == "cpu":
        return Finding("GD101", Status.SKIP, "host", f"{message} (not needed for --device cpu)", hint, evidence)
    return Finding("GD101", Status.FAIL, "host", message, hint, evidence)


def _mismatch(ctx: CheckContext) -> tuple[tuple[str, str], dict[str, str]] | None:
    """Both halves of a version mismatch, when the snapshot recorded them: the loaded kernel module
    and the NVML library on disk (and whether a reboot has already happened since it was installed)."""
    driver, host = ctx.snapshot.driver, ctx.snapshot.host
    readings = {
        "kernel_module": driver.kernel_module_version,
        "nvml_library": driver.nvml_library,
        "nvml_library_changed": driver.nvml_library_changed,
        "booted": host.booted,
    }
    values = {k: v for k, v in readings.items() if isinstance(v, str)}
    get = values.get
    told = explain_mismatch(get("kernel_module"), get("nvml_library"), get("nvml_library_changed"), get("booted"))
    return None if told is None else (told, values)


@check("nvml", "NVIDIA driver and NVML", codes=[NVML_UNAVAILABLE])
def nvml_available(ctx: CheckContext) -> list[Finding]:
    driver = ctx.snapshot.driver
    evidence = {"nvml_status": driver.nvml_status}
    if driver.nvml_detail:
        evidence["detail"] = driver.nvml_detail
    if driver.nvml_status != "ok":
        message, hint = explain_init_failure(driver.nvml_status, driver.nvml_detail)
        sides = _mismatch(ctx) if driver.nvml_status == "version_mismatch" else None
        if sides is not None:
            (message, hint), readings = sides
            evidence.update(readings)
        return [_no_gpu(ctx, message, hint, evidence)]
    count = len(ctx.snapshot.gpus)
    evidence["gpus"] = count
    if count == 0:
        return [
            _no_gpu(
                ctx,
                "the NVIDIA driver is loaded but reports no GPUs",
                "Check `nvidia-smi`; in a container pass the GPUs through (`--gpus all`); on "
                "NVSwitch systems make sure nvidia-fabricmanager is running.",
                evidence,
            )
        ]
    version = driver.driver_version if isinstance(driver.driver_version, str) else "unknown"
    return [Finding("GD101", Status.PASS, "host", f"driver {version}, {count} GPU(s) seen by NVML", "", evidence)]
