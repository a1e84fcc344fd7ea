"""The codes of a comparison (`check --baseline FILE`, `gpudoctor diff A B`): GD011-GD019, with
what each compares, why it matters and how to fix it, and how a finding under one is built.

The codes are gpudoctor's own (area 0), whatever they compare, so `--select GD01` is the whole
comparison. `gpudoctor explain` lists them from CODES (catalogue.py).
"""

from __future__ import annotations

from typing import Any

from gpudoctor.engine.codes import Code
from gpudoctor.findings import Finding, Status

GPUS = Code(
    "GD011",
    "baseline-gpus-changed",
    "The GPUs are those of the baseline: count, models, UUIDs",
    what="Pairs the GPUs of the baseline (a saved `check --json` report or a snapshot) with this run's by "
    "PCI bus id (by index when the bus ids differ, as between two kinds of board) and compares their "
    "count, product name, memory size and UUID. The UUIDs are compared only on the same machine (same "
    "hostname, or UUIDs in common): between two nodes every UUID differs. A GPU NVML could not talk to "
    "(lost: fallen off the bus, or no handle; GD827) has no name or UUID to compare: it is reported as "
    "lost, not as a replaced board, and its links count as down (GD013).",
    why="A GPU that fell off the bus, a board swapped for another model or a node that is not the one the "
    "baseline describes changes what every later measurement means; a fleet gate should say so first.",
    fix="A missing or lost GPU: `nvidia-smi -q`, the kernel log (XID 79 'fallen off the bus', GD827), "
    "power-cycle the node, reseat or RMA it; do not refresh the baseline for it. A replaced board (same "
    "model, new UUID): expected after maintenance; refresh the baseline "
    "(`gpudoctor check --json > base.json`) once the node is verified.",
)
SOFTWARE = Code(
    "GD012",
    "baseline-firmware-changed",
    "Driver, CUDA driver version and GPU firmware are those of the baseline",
    what="Compares the NVIDIA driver version, the CUDA version the driver supports and each GPU's VBIOS, "
    "InfoROM image and GSP firmware version with the baseline's (GSP firmware only when the driver is "
    "unchanged: it ships with the driver). A report that predates a field compares what both sides have.",
    why="A driver or firmware update changes NCCL's behaviour, clocks and fixes: a change in measured "
    "bandwidth after maintenance is often explained here, and nodes of one cluster should match.",
    fix="If the change was intended, refresh the baseline. Otherwise align the node with the fleet "
    "(driver packages pinned, VBIOS from the vendor's firmware bundle).",
)
LINKS = Code(
    "GD013",
    "baseline-links-changed",
    "NVLink and PCIe links are those of the baseline",
    what="Compares each GPU's number of active NVLinks, its PCIe maximum generation and width (of GPU and "
    "slot together) and its current PCIe width (read at idle) with the baseline's. Fewer links or a "
    "narrower link fails; more warns (the baseline was recorded degraded).",
    why="A link that went down or trained narrower cuts all-reduce and P2P bandwidth on that GPU, and the "
    "whole job waits for it, without any error.",
    fix="NVLink: `nvidia-smi nvlink -s`, the fabric manager (GD106), a GPU reset or reboot, then the "
    "vendor. PCIe: reseat the GPU and riser, check the BIOS link settings, compare `lspci -vv` LnkSta.",
)
BUSBW = Code(
    "GD014",
    "baseline-busbw-regressed",
    "All-reduce busbw holds the baseline at every message size",
    what="Compares the all-reduce sweep's busbw with the baseline's, when both ran the same number of ranks "
    "with the same backend, where it is bandwidth-bound: the largest sizes measured on both sides (the "
    "last four doublings, the plateau GD601 judges). When the best busbw there fell by more than the "
    "tolerance (`--tolerance`, default 10%), it fails. Every size's change is in the evidence; slower "
    "small, latency-bound sizes are named but not judged.",
    why="A regression against the machine's own earlier figure is the most sensitive sign of a link, "
    "driver or configuration problem: it catches a 20% loss the absolute model still passes.",
    fix="Read the facts comparison (GD011-GD013) and the topology and NCCL environment findings first; "
    "then `gpudoctor bench allreduce` for the whole curve. Re-run once on an idle machine to rule out "
    "another job sharing the links.",
)
DDP_STEP = Code(
    "GD015",
    "baseline-ddp-step-slower",
    "The DDP sanity step is no slower than the baseline's",
    what="Compares the DDP sanity run's step time (the slowest rank's mean) with the baseline's, for the "
    "same number of ranks and backend; slower by more than the tolerance warns. The sanity run trains "
    "a small model for a few steps, so this is a coarse signal.",
    why="A slower step with the same ranks points at host contention, a throttled GPU or a slower collective path.",
    fix="Look at the busbw comparison (GD014), GPU clocks (GD8) and host resources (GD5); re-run on an "
    "idle machine before concluding.",
)
P2P = Code(
    "GD016",
    "baseline-p2p-regressed",
    "P2P copy bandwidth holds the baseline on every GPU pair",
    what="Compares the timed peer-to-peer copy bandwidth of each GPU pair measured on both sides; a pair "
    "that fell by more than the tolerance fails.",
    why="One slow pair slows every collective that crosses it; a change against the same pair's earlier "
    "figure points at that link or at an ACS/IOMMU change.",
    fix="See GD421/GD422 for the pair, `nvidia-smi topo -m` and `nvidia-smi nvlink -s`; check whether "
    "the kernel's IOMMU settings changed (the finding's evidence holds them).",
)
SETTINGS = Code(
    "GD017",
    "baseline-gpu-settings-changed",
    "GPU power limits and ECC, MIG, compute and persistence modes are those of the baseline",
    what="Compares each GPU's enforced power limit (for the same model only) and its ECC (now and pending), MIG, "
    "compute and persistence modes with the baseline's. A change is judged as the static check judges the new"
    " value: MIG turned on (GD820) and compute mode 'prohibited' (GD821) fail, a power limit lowered by more "
    "than the tolerance (`--tolerance`, default 10%) fails, ECC turned off (GD833), persistence turned off "
    "(GD105), exclusive compute mode and any smaller or upward change warn. A report that predates these "
    "facts is passed over.",
    why="Between two nodes of a cluster, or one node before and after maintenance, a power cap, a MIG or ECC "
    "mode left by a previous tenant or a firmware tool is the usual answer to 'why is this node slower' or "
    "'why does the job no longer start', and none of them shows as an error.",
    fix="Restore the setting (`sudo nvidia-smi -i <gpu> -pl <watts>`, `-e 1` then reboot, `-mig 0` then a "
    "GPU reset, `-c DEFAULT`, `sudo systemctl enable --now nvidia-persistenced`), or refresh the baseline "
    "if the change is intended.",
)
MEMORY_HELD = Code(
    "GD018",
    "baseline-gpu-memory-held",
    "No more GPU memory is in use than in the baseline",
    what="Compares the GPU memory in use when each side was recorded (nvmlDeviceGetMemoryInfo 'used'); more "
    "than max(1 GiB, 5% of the GPU) above the baseline's warns, the margin GD826 allows for memory no "
    "process owns.",
    why="Memory held by a leftover rank, a process in another container or a context that was never torn "
    "down is unavailable to the run: the first step runs out of memory, or the GPU is shared and slower.",
    fix="Find the owner (`nvidia-smi`, `sudo fuser -v /dev/nvidia*`; GD825/GD826) and stop it, or reset the "
    "GPU when no process owns the memory.",
)
NCCL_ENV = Code(
    "GD019",
    "baseline-nccl-env-changed",
    "The NCCL_* and TORCH_NCCL_* environment is that of the baseline",
    what="Compares the NCCL_* and TORCH_NCCL_* environment variables recorded on both sides (the snapshot's "
    "allow-list): a variable newly set, changed or no longer set warns, naming both values. A report that "
    "predates this fact is passed over.",
    why="One variable changes what NCCL does: NCCL_NVLS_ENABLE=0 drops NVLink SHARP (about 480 -> 370 GB/s "
    "on 8x H100), NCCL_P2P_DISABLE=1 or NCCL_IB_DISABLE=1 moves traffic off NVLink or InfiniBand. A module "
    "file or a job script that sets it on one node explains a busbw gap no hardware check finds.",
    fix="Unset or align the variable (the job script, module files, ~/.nccl.conf or /etc/nccl.conf, "
    "whose settings NCCL reads as defaults), or refresh the baseline if the change is intended; the NCCL "
    "environment checks (GD62x, GD63x) say what each one costs on this machine.",
)
CODES = [GPUS, SOFTWARE, LINKS, BUSBW, DDP_STEP, P2P, SETTINGS, MEMORY_HELD, NCCL_ENV]

FACT_CODES = {GPUS.code, SOFTWARE.code, LINKS.code, SETTINGS.code, MEMORY_HELD.code, NCCL_ENV.code}


def finding(
    code: Code, status: Status, subject: str, message: str, evidence: dict[str, Any], hint: str = ""
) -> Finding:
    """A finding under one of these codes; a problem without its own hint gets the code's fix."""
    quiet = status in (Status.PASS, Status.SKIP)
    return Finding(code.code, status, subject, message, "" if quiet else (hint or code.fix), evidence)
