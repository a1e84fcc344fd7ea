"""GD1 (driver and software stack): versions that disagree, drivers too old, persistence, fabric;
GD107 (torch and NCCL against the GPUs' architecture) lives in checks/arch_support.py.

GD101 (checks/driver_reachable.py) covers NVML failing to start, including "Driver/library version
mismatch"; the checks here only run when NVML answered, so nothing is reported twice.
"""

from __future__ import annotations

from gpudoctor.checks.arch_support import NCCL_TOO_OLD_FOR_GPU, nccl_for_arch
from gpudoctor.checks.targets import target_gpus
from gpudoctor.engine import CheckContext, Code, check
from gpudoctor.findings import Finding, Status, gpu_subject
from gpudoctor.knowledge.gpu_products import RTX40_FIXED_DRIVER, RTX40_RE
from gpudoctor.knowledge.units import gpu_list
from gpudoctor.knowledge.versions import driver_version, version_text, version_tuple
from gpudoctor.snapshot import Gpu, Snapshot, known

KERNEL_MISMATCH = Code(
    "GD102",
    "driver-kernel-mismatch",
    "The loaded kernel module matches the user-space driver",
    what="Compares the driver version NVML reports with the version of the loaded kernel module "
    "(/proc/driver/nvidia/version) and with the NVML library's own version.",
    why="After an unattended upgrade the new user-space libraries sit beside the old kernel module "
    "until a reboot. NVML may still start, but CUDA fails to initialise ('CUDA driver version is "
    "insufficient' / 'system has unsupported display driver / cuda driver combination') or some "
    "ranks of a job fail while others run.",
    fix="Reboot so the new kernel module loads (or stop everything using the GPU and "
    "`rmmod nvidia_uvm nvidia_drm nvidia_modeset nvidia && modprobe nvidia`). Then pin the driver "
    "packages (`apt-mark hold 'nvidia-*' 'libnvidia-*'`) or exclude them from unattended-upgrades.",
)
DRIVER_TOO_OLD = Code(
    "GD103",
    "driver-too-old-for-torch",
    "The driver supports the CUDA version torch was built with",
    what="Compares the CUDA version torch was built with (torch.version.cuda) with the newest CUDA "
    "version the driver supports (nvmlSystemGetCudaDriverVersion, or NVIDIA's table of minimum "
    "Linux drivers per CUDA release). A newer CUDA major than the driver's always fails. A newer "
    "minor of the same major (12.4 torch on a 12.2 driver) runs through CUDA minor-version "
    "compatibility as long as the driver is at least that major's first driver (R525 for 12.x, "
    "R580 for 13.x, 450.80.02 for 11.x); gpudoctor warns then, since kernels that need PTX JIT or "
    "newer driver features fail.",
    why="torch wheels bundle their CUDA runtime but not the driver. With a driver older than the "
    "runtime's major, torch.cuda.is_available() is False (or raises 'The NVIDIA driver on your "
    "system is too old') and every rank fails at start-up; within minor-version compatibility, "
    "JIT-compiled kernels (Triton, torch.compile, custom extensions) can fail with "
    "'unsupported toolchain' / CUDA_ERROR_UNSUPPORTED_PTX_VERSION.",
    fix="Upgrade the NVIDIA driver to at least the version named in the finding, or install the "
    "torch build for an older CUDA (e.g. `pip install torch --index-url "
    "https://download.pytorch.org/whl/cu121`).",
)
RTX40_P2P = Code(
    "GD104",
    "rtx40-p2p-driver",
    "GeForce RTX 40 GPUs have a driver with working peer-to-peer",
    what="Looks for more than one GeForce RTX 40-series GPU among the GPUs the run uses with a "
    "driver older than 550.40.07 (the threshold Hugging Face accelerate enforces in "
    "`check_cuda_p2p_ib_support`; the hangs it guards against: NVIDIA/nccl-tests#117, all_reduce_perf "
    "stuck on several RTX 4090s), unless NCCL_P2P_DISABLE=1 is set.",
    why="Drivers before 550.40.07 report peer-to-peer as supported between RTX 40 cards although it "
    "does not work: NCCL uses it, and collectives hang or return corrupted results.",
    fix="Upgrade the driver to 550.40.07 or newer. Until then, set NCCL_P2P_DISABLE=1 (NCCL then "
    "copies through host memory; slower but correct).",
)
PERSISTENCE_OFF = Code(
    "GD105",
    "persistence-mode-off",
    "Persistence mode is on for multi-GPU runs",
    what="Reads each GPU's persistence mode when the run uses more than one GPU, and names every GPU "
    "without it (GD305, which compares the GPUs' modes, leaves persistence to this check).",
    why="Without persistence (or nvidia-persistenced) the driver tears the GPUs down whenever no "
    "process holds them and re-initialises them at the next start: each rank's first CUDA call "
    "takes seconds per GPU, ranks start unevenly, and short health checks measure start-up.",
    fix="Enable the persistence daemon: `sudo systemctl enable --now nvidia-persistenced` (or "
    "`sudo nvidia-smi -pm 1`, which does not survive a reboot).",
)
FABRIC_NOT_READY = Code(
    "GD106",
    "fabric-manager-not-ready",
    "The NVSwitch fabric is up (fabric manager running, GPUs registered)",
    what="On NVSwitch systems (HGX/DGX), reads each GPU's fabric state, status and health "
    "(nvmlDeviceGetGpuFabricInfo, Hopper and later) and, before Hopper, whether the "
    "nvidia-fabricmanager service is active. Workloads that fail with CUDA error 802 point here too.",
    why="Until the fabric manager has programmed the NVSwitches, CUDA initialisation fails with "
    "'cuda runtime error (802): system not yet initialized' and torch sees zero GPUs; a degraded "
    "fabric runs with less NVLink bandwidth.",
    fix="Start the fabric manager and make it start at boot: `sudo systemctl enable --now "
    "nvidia-fabricmanager`. Its version must equal the driver's exactly (install "
    "nvidia-fabricmanager-<branch> matching the driver). Check /var/log/fabricmanager.log; if the "
    "fabric stays degraded, reset the GPUs or reboot, then contact the vendor.",
)
CODES = [KERNEL_MISMATCH, DRIVER_TOO_OLD, RTX40_P2P, PERSISTENCE_OFF, FABRIC_NOT_READY, NCCL_TOO_OLD_FOR_GPU]

# Minimum Linux driver per CUDA toolkit GA (NVIDIA CUDA release notes, table 3).
MIN_DRIVER_FOR_CUDA: dict[tuple[int, int], tuple[int, ...]] = {
    (11, 0): (450, 51, 5),
    (11, 1): (455, 23),
    (11, 2): (460, 27, 3),
    (11, 3): (465, 19, 1),
    (11, 4): (470, 42, 1),
    (11, 5): (495, 29, 5),
    (11, 6): (510, 39, 1),
    (11, 7): (515, 43, 4),
    (11, 8): (520, 61, 5),
    (12, 0): (525, 60, 13),
    (12, 1): (530, 30, 2),
    (12, 2): (535, 54, 3),
    (12, 3): (545, 23, 6),
    (12, 4): (550, 54, 14),
    (12, 5): (555, 42, 2),
    (12, 6): (560, 28, 3),
    (12, 8): (570, 26),
    (12, 9): (575, 51, 3),
    (13, 0): (580, 65, 6),
    (13, 1): (590, 44, 1),
    (13, 2): (595, 45, 4),
}
# The oldest driver that runs any minor of a CUDA major (minor-version compatibility).
MINOR_COMPAT_FLOOR: dict[int, tuple[int, ...]] = {11: (450, 80, 2), 12: (525, 60, 13), 13: (580, 65, 6)}


def _nvml_ok(snapshot: Snapshot) -> bool:
    return snapshot.driver.nvml_status == "ok"


def kernel_mismatch(ctx: CheckContext) -> list[Finding]:
    driver = ctx.snapshot.driver
    if not _nvml_ok(ctx.snapshot) or not known(driver.kernel_module_version):
        return []
    kernel = driver_version(str(driver.kernel_module_version))
    readings = {"kernel_module": driver.kernel_module_version}
    if known(driver.driver_version):
        readings["driver (NVML)"] = driver.driver_version
    if known(driver.nvml_version):
        readings["NVML library"] = driver.nvml_version
    # Every form compares by its driver part: NVML's own version carries the CUDA major in front.
    others = {k: driver_version(str(v)) for k, v in readings.items() if k != "kernel_module"}
    differ = {k: readings[k] for k, v in others.items() if v is not None and v != kernel}
    if kernel is None or not others:
        return []
    if differ:
        names = ", ".join(f"{k} {v}" for k, v in differ.items())
        return [
            Finding(
                KERNEL_MISMATCH.code,
                Status.FAIL,
                "host",
                f"the loaded NVIDIA kernel module is {driver.kernel_module_version} but {names}: "
                "the driver was upgraded without a reboot",
                "Reboot (or reload the nvidia kernel modules) so the module matches the libraries, then "
                "pin the driver packages so unattended upgrades cannot do this again.",
                {**readings, "expected": "all equal"},
            )
        ]
    return [
        Finding(
            KERNEL_MISMATCH.code,
            Status.PASS,
            "host",
            f"kernel module and driver libraries are both {driver.kernel_module_version}",
            "",
            readings,
        )
    ]


def _driver_cuda(snapshot: Snapshot) -> tuple[tuple[int, int] | None, str]:
    """The newest CUDA the driver supports: (major, minor) and where that came from."""
    driver = snapshot.driver
    if known(driver.cuda_driver_version):
        v = version_tuple(str(driver.cuda_driver_version))
        if v is not None and len(v) >= 2:
            return (v[0], v[1]), "NVML"
    if known(driver.driver_version):
        dv = version_tuple(str(driver.driver_version))
        if dv is not None:
            supported = [cuda for cuda, need in MIN_DRIVER_FOR_CUDA.items() if dv >= need]
            if supported:
                return max(supported), "NVIDIA's driver table"
    return None, ""


def driver_too_old(ctx: CheckContext) -> list[Finding]:
    snapshot = ctx.snapshot
    torch_cuda = snapshot.software.torch_cuda
    if not _nvml_ok(snapshot) or not known(torch_cuda):
        return []
    if torch_cuda is None:
        return [
            Finding(
                DRIVER_TOO_OLD.code,
                Status.SKIP,
                "host",
                "torch is a CPU-only build: no CUDA to compare",
                "",
                {"torch": snapshot.software.torch},
            )
        ]
    built = version_tuple(str(torch_cuda))
    supports, source = _driver_cuda(snapshot)
    if built is None or len(built) < 2 or supports is None:
        return []
    built2 = (built[0], built[1])
    dv = version_tuple(str(snapshot.driver.driver_version)) if known(snapshot.driver.driver_version) else None
    need = MIN_DRIVER_FOR_CUDA.get(built2)
    evidence = {
        "torch_cuda": torch_cuda,
        "driver": snapshot.driver.driver_version if dv else "unknown",
        "driver_supports_cuda": f"{supports[0]}.{supports[1]}",
        "source": source,
    }
    if need:
        evidence["expected_driver"] = f">= {version_text(need)}"
    need_text = f"driver {version_text(need)} or newer" if need else f"a driver for CUDA {built2[0]}.{built2[1]}"
    if built2 <= supports:
        return [
            Finding(
                DRIVER_TOO_OLD.code,
                Status.PASS,
                "host",
                f"driver supports CUDA {supports[0]}.{supports[1]}; torch needs {torch_cuda}",
                "",
                evidence,
            )
        ]
    floor = MINOR_COMPAT_FLOOR.get(built2[0])
    compat = built2[0] == supports[0] and floor is not None and (dv is None or dv >= floor)
    if compat:
        return [
            Finding(
                DRIVER_TOO_OLD.code,
                Status.WARN,
                "host",
                f"torch is built with CUDA {torch_cuda} but the driver supports CUDA {supports[0]}.{supports[1]}: "
                "it runs through minor-version compatibility, but JIT-compiled kernels may fail",
                f"Upgrade to {need_text}, or use a torch build for CUDA {supports[0]}.{supports[1]}.",
                evidence,
            )
        ]
    return [
        Finding(
            DRIVER_TOO_OLD.code,
            Status.FAIL,
            "host",
            f"the driver is too old for torch: torch needs CUDA {torch_cuda}, the driver supports "
            f"CUDA {supports[0]}.{supports[1]}",
            f"Upgrade to {need_text}, or install a torch build for CUDA {supports[0]}.{supports[1]} or older.",
            evidence,
        )
    ]


def rtx40_p2p(ctx: CheckContext) -> list[Finding]:
    snapshot = ctx.snapshot
    cards = [g for g in target_gpus(ctx) if RTX40_RE.search(g.name)]
    if len(cards) < 2 or not known(snapshot.driver.driver_version):
        return []
    dv = version_tuple(str(snapshot.driver.driver_version))
    if dv is None:
        return []
    evidence = {
        "gpus": [g.index for g in cards],
        "names": sorted({g.name for g in cards}),
        "driver": snapshot.driver.driver_version,
        "expected_driver": f">= {version_text(RTX40_FIXED_DRIVER)}",
    }
    if dv >= RTX40_FIXED_DRIVER:
        return [
            Finding(
                RTX40_P2P.code,
                Status.PASS,
                "host",
                f"driver {snapshot.driver.driver_version} has the RTX 40 P2P fix",
                "",
                evidence,
            )
        ]
    if snapshot.env.get("NCCL_P2P_DISABLE", "").strip() == "1":
        evidence["NCCL_P2P_DISABLE"] = "1"
        return [
            Finding(
                RTX40_P2P.code,
                Status.WARN,
                "host",
                f"driver {snapshot.driver.driver_version} has broken RTX 40 P2P; NCCL_P2P_DISABLE=1 "
                "works around it at a bandwidth cost",
                "Upgrade the driver to 550.40.07 or newer and drop NCCL_P2P_DISABLE.",
                evidence,
            )
        ]
    return [
        Finding(
            RTX40_P2P.code,
            Status.FAIL,
            "host",
            f"{len(cards)} GeForce RTX 40 GPUs on driver {snapshot.driver.driver_version}: peer-to-peer is "
            "broken before 550.40.07 (NCCL hangs or corrupts data)",
            "Upgrade the driver to 550.40.07 or newer, or set NCCL_P2P_DISABLE=1 until you can.",
            evidence,
        )
    ]


def persistence(ctx: CheckContext) -> list[Finding]:
    gpus = target_gpus(ctx)
    if len(gpus) < 2:
        return []
    readable = [g for g in gpus if known(g.persistence_mode)]
    if not readable:
        return []
    off = [g.index for g in readable if g.persistence_mode is False]
    evidence = {"persistence_off": off, "gpus": [g.index for g in readable], "expected": "on"}
    if off:
        where, them = (f"GPU {off[0]}", "it") if len(off) == 1 else (f"GPUs {gpu_list(off)}", "them")
        return [
            Finding(
                PERSISTENCE_OFF.code,
                Status.WARN,
                "host",
                f"persistence mode is off on {where}: each start re-initialises {them}",
                "sudo systemctl enable --now nvidia-persistenced (or sudo nvidia-smi -pm 1).",
                evidence,
            )
        ]
    return [Finding(PERSISTENCE_OFF.code, Status.PASS, "host", "persistence mode is on", "", evidence)]


def _on_nvswitch(gpu: Gpu) -> bool:
    links = gpu.nvlinks if known(gpu.nvlinks) else []
    return any(link.active and link.remote_type == "switch" for link in links)


def _fabric_finding(gpu: Gpu) -> Finding | None:
    """Hopper and later: the GPU's own fabric registration, as NVML reports it."""
    fabric = gpu.fabric
    if not known(fabric) or fabric.state == "not_supported":
        return None
    status = fabric.status if known(fabric.status) else f"unknown ({fabric.status.reason})"
    evidence = {"state": fabric.state, "status": status, "expected": "completed/success"}
    if known(fabric.health):
        evidence["health"] = fabric.health
    subject = gpu_subject(gpu.index)
    if fabric.state != "completed":
        return Finding(
            FABRIC_NOT_READY.code,
            Status.FAIL,
            subject,
            f"NVSwitch fabric registration is '{fabric.state}': CUDA fails with error 802 "
            "(system not yet initialized) until it completes",
            "Start the fabric manager (`sudo systemctl enable --now nvidia-fabricmanager`) and "
            "wait for it; its version must match the driver's.",
            evidence,
        )
    if known(fabric.status) and fabric.status != "success":
        return Finding(
            FABRIC_NOT_READY.code,
            Status.FAIL,
            subject,
            f"NVSwitch fabric registration failed: {fabric.status}",
            "Read /var/log/fabricmanager.log; make the fabric manager version equal the driver's "
            "and restart it, or reboot.",
            evidence,
        )
    if fabric.health == "unhealthy":
        return Finding(
            FABRIC_NOT_READY.code,
            Status.FAIL,
            subject,
            "the NVSwitch fabric reports this GPU unhealthy",
            "Reset the GPUs or reboot; if it persists, contact the vendor (NVSwitch or NVLink fault).",
            evidence,
        )
    if fabric.health == "limited_capacity":
        return Finding(
            FABRIC_NOT_READY.code,
            Status.WARN,
            subject,
            "the NVSwitch fabric runs with limited capacity: less NVLink bandwidth",
            "Check /var/log/fabricmanager.log and `nvidia-smi nvlink -s`; reset the GPUs or reboot.",
            evidence,
        )
    return Finding(FABRIC_NOT_READY.code, Status.PASS, subject, "NVSwitch fabric registration completed", "", evidence)


def fabric(ctx: CheckContext) -> list[Finding]:
    gpus = target_gpus(ctx)
    per_gpu = [f for f in (_fabric_finding(g) for g in gpus) if f is not None]
    bad = [f for f in per_gpu if f.status is not Status.PASS]
    if bad:
        return bad
    if per_gpu:
        ok = per_gpu[0]
        return [
            Finding(
                FABRIC_NOT_READY.code,
                Status.PASS,
                "host",
                f"NVSwitch fabric registration completed on {len(per_gpu)} GPU(s)",
                "",
                ok.evidence,
            )
        ]
    # Before Hopper NVML has no fabric state: the fabric manager service is the evidence.
    switched = [g.index for g in gpus if _on_nvswitch(g)]
    service = ctx.snapshot.driver.fabric_manager
    if not switched or not known(service):
        return []
    evidence = {"nvswitch_gpus": switched, "nvidia-fabricmanager": service, "expected": "active"}
    if service != "active":
        return [
            Finding(
                FABRIC_NOT_READY.code,
                Status.FAIL,
                "host",
                f"NVSwitch system but nvidia-fabricmanager is {service}: CUDA fails with error 802",
                "sudo systemctl enable --now nvidia-fabricmanager (its version must match the driver's).",
                evidence,
            )
        ]
    return [Finding(FABRIC_NOT_READY.code, Status.PASS, "host", "nvidia-fabricmanager is active", "", evidence)]


@check("driver_stack", "Driver and CUDA stack", codes=CODES, needs="gpus")
def driver_stack(ctx: CheckContext) -> list[Finding]:
    return [
        *kernel_mismatch(ctx),
        *driver_too_old(ctx),
        *rtx40_p2p(ctx),
        *persistence(ctx),
        *fabric(ctx),
        *nccl_for_arch(ctx),
    ]
