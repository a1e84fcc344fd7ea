"""GD107 (part of the driver_stack check, checks/driver_stack.py): torch and its NCCL against the
architecture of the GPUs the run uses: a torch built with a CUDA that cannot compile for them has no
kernels at all; an NCCL older than the first that launches on an architecture fails every collective."""

from __future__ import annotations

from gpudoctor.checks.targets import target_gpus
from gpudoctor.engine import CheckContext, Code
from gpudoctor.findings import Finding, Status
from gpudoctor.knowledge.units import gpu_list
from gpudoctor.knowledge.versions import version_tuple
from gpudoctor.snapshot import Gpu, known

NCCL_TOO_OLD_FOR_GPU = Code(
    "GD107",
    "nccl-too-old-for-gpu",
    "torch and its NCCL support the GPUs' architecture",
    what="Compares the CUDA torch was built with against the first CUDA that compiles kernels for the GPUs' "
    "architecture (11.8 for sm_89/sm_90, 12.8 for Blackwell sm_100/sm_120: a cu124 torch on an RTX 5090 "
    "has no kernels, pytorch#167244), and the NCCL torch ships (the nvidia-nccl-cu* wheel) with the oldest "
    "NCCL that runs collectives on the GPUs the run uses: Blackwell GeForce and workstation GPUs (compute capability "
    "12.x: RTX 50 series, RTX PRO Blackwell) need NCCL 2.26.2 (NVIDIA/nccl#1637 and nccl-tests#287: "
    "NCCL 2.25.1 fails to launch its kernels there, 'ncclMaxSharedMem 82240 exceeds device/fn "
    "maxSharedMem 79856'; NVIDIA confirmed 2.26.2 works).",
    why="Without kernels for the architecture every CUDA op fails ('sm_120 is not compatible with the current "
    "PyTorch installation'); with an older NCCL every collective of a multi-GPU run fails (or the run hangs "
    "at its first all-reduce), whatever the drivers and links: NCCL_P2P_DISABLE does not help.",
    fix="Install a torch built for the GPUs' architecture (CUDA 12.8 builds, `--index-url "
    "https://download.pytorch.org/whl/cu128`, for Blackwell) with NCCL 2.26.2 or newer (torch 2.7 and later "
    "for CUDA 12.8 ship it); with the right torch, `pip install -U nvidia-nccl-cu12` upgrades NCCL alone.",
)
# The first CUDA toolkit that compiles native kernels for an architecture (CUDA release notes: 11.0 adds
# sm_80, 11.1 sm_86, 11.8 sm_89 and sm_90, 12.8 sm_100 and sm_120). A torch built with an older CUDA has
# no kernels for the GPU: pytorch#167244, torch 2.7.0+cu124 on RTX 5090: "The current PyTorch install
# supports CUDA capabilities sm_50 sm_60 sm_70 sm_75 sm_80 sm_86 sm_90"; pytorch#152077, cu118 and NCCL
# 2.14.3 on RTX 5090: "sm_120 is not compatible with the current PyTorch installation".
MIN_CUDA_FOR_ARCH: dict[tuple[int, int], tuple[int, int]] = {
    (8, 0): (11, 0),
    (8, 6): (11, 1),
    (8, 9): (11, 8),
    (9, 0): (11, 8),
    (10, 0): (12, 8),
    (12, 0): (12, 8),
}
# The oldest NCCL whose kernels launch on an architecture, by compute-capability major:
# Blackwell GeForce/workstation (12.x) needs 2.26.2 (NVIDIA/nccl#1637, NVIDIA/nccl-tests#287).
MIN_NCCL_FOR_ARCH: dict[int, tuple[tuple[int, ...], str]] = {12: ((2, 26, 2), "Blackwell GeForce/workstation")}


def _cc_major(gpu: Gpu) -> int | None:
    cc = gpu.compute_capability
    if not known(cc):
        return None
    major = version_tuple(str(cc))
    return major[0] if major else None


def _cc(gpu: Gpu) -> tuple[int, int] | None:
    v = version_tuple(str(gpu.compute_capability)) if known(gpu.compute_capability) else None
    return (v[0], v[1] if len(v) > 1 else 0) if v else None


def torch_for_arch(ctx: CheckContext) -> list[Finding]:
    """A torch built with a CUDA older than the first that compiles for the GPUs' architecture has no
    kernels for them: every CUDA op, NCCL's included, fails. The remedy is a torch build, not NCCL."""
    sw = ctx.snapshot.software
    built = version_tuple(str(sw.torch_cuda)) if known(sw.torch_cuda) and sw.torch_cuda else None
    if built is None or len(built) < 2:
        return []
    short = {}
    for g in target_gpus(ctx):
        cc = _cc(g)
        need = MIN_CUDA_FOR_ARCH.get(cc) if cc else None
        if need and (built[0], built[1]) < need:
            short.setdefault((cc, need), []).append(g)
    out = []
    for ((major, minor), need), cards in short.items():
        build = f"cu{need[0]}{need[1]}"
        names = ", ".join(sorted({g.name for g in cards}))
        msg = (
            f"torch {sw.torch} is built with CUDA {sw.torch_cuda}, which cannot compile kernels for sm_{major}{minor} "
            f"({names}; CUDA {need[0]}.{need[1]} is the first that can): every CUDA op and collective fails on "
            f"GPU{'s' if len(cards) > 1 else ''} {gpu_list([g.index for g in cards])}"
        )
        hint = (
            f"Install a torch build for CUDA {need[0]}.{need[1]} or newer: `pip install torch --index-url "
            f"https://download.pytorch.org/whl/{build}` (a newer NCCL wheel alone cannot add the kernels)."
        )
        evidence = {
            "torch": sw.torch,
            "torch_cuda": sw.torch_cuda,
            "compute_capability": f"{major}.{minor}",
            "gpus": [g.index for g in cards],
            "expected_torch_cuda": f">= {need[0]}.{need[1]}",
        }
        out.append(Finding(NCCL_TOO_OLD_FOR_GPU.code, Status.FAIL, "host", msg, hint, evidence))
    return out


def nccl_for_arch(ctx: CheckContext) -> list[Finding]:
    arch = torch_for_arch(ctx)
    if arch:
        return arch  # no kernels at all: the NCCL version is beside the point
    gpus = target_gpus(ctx)
    nccl_text = ctx.snapshot.software.torch_nccl
    if len(gpus) < 2 or not known(nccl_text):
        return []
    nccl = version_tuple(str(nccl_text))
    if nccl is None:
        return []
    out = []
    for major, (need, family) in MIN_NCCL_FOR_ARCH.items():
        cards = [g for g in gpus if _cc_major(g) == major]
        if not cards:
            continue
        evidence = {
            "gpus": [g.index for g in cards],
            "compute_capability": sorted({str(g.compute_capability) for g in cards}),
            "torch_nccl": nccl_text,
            "expected_nccl": f">= {'.'.join(map(str, need))}",
        }
        names = ", ".join(sorted({g.name for g in cards}))
        if nccl >= need:
            msg = f"NCCL {nccl_text} supports {family} GPUs ({names})"
            out.append(Finding(NCCL_TOO_OLD_FOR_GPU.code, Status.PASS, "host", msg, "", evidence))
        else:
            out.append(
                Finding(
                    NCCL_TOO_OLD_FOR_GPU.code,
                    Status.FAIL,
                    "host",
                    f"torch's NCCL {nccl_text} is older than {'.'.join(map(str, need))}, the first that runs "
                    f"collectives on {family} GPUs ({names}): every all-reduce fails or hangs",
                    "pip install -U nvidia-nccl-cu12 (or a torch built with NCCL 2.26.2 or newer).",
                    evidence,
                )
            )
    return out
