"""GD4 (links), active: PCIe link under load and a timed peer-to-peer copy per GPU pair.

Both run in ONE spawned rank that drives every visible GPU (gpudoctor/workloads/link_probes.py),
through the launcher's deadlines; `--quick` and `--snapshot` skip them. The judging is pure
functions over measurements (`judge_pcie`, `judge_p2p`, `judge_hang`), tested with synthetic
numbers; the real path is tested with @pytest.mark.gpu.
"""

from __future__ import annotations

import os
from typing import Any

from gpudoctor.engine import CheckContext, Code, check
from gpudoctor.findings import Finding, Status, gpu_subject, pair_subject
from gpudoctor.knowledge import interconnect as topology
from gpudoctor.knowledge.expectations import PCIE_GBPS_PER_LANE
from gpudoctor.snapshot import Gpu, Host, Snapshot, known

PCIE_UNDER_LOAD = Code(
    "GD420",
    "pcie-link-degraded",
    "PCIe links run at their full generation and width under load",
    what="Puts each GPU under a short host-to-device copy load and reads its PCIe link generation and "
    "width from NVML while the copies run, against the maximum the GPU and slot support. Idle GPUs "
    "drop to Gen1 to save power, so only a reading under load counts.",
    why="A link that trained down (a Gen4 x16 GPU at Gen3 or x8, from a riser, a dirty or loose "
    "connector, a BIOS setting) cuts host-to-device and PCIe P2P bandwidth: data loading and "
    "all-reduce on PCIe machines slow down on that GPU, and the whole job waits for it.",
    fix="Reseat the GPU and its riser/cables, check the BIOS PCIe settings (link speed Auto/GenN, "
    "bifurcation), and compare with `sudo lspci -vv -s <bus id> | grep -E 'LnkCap|LnkSta'`. "
    "Persistent downtraining on one slot is a hardware fault for the vendor.",
)
P2P_SLOW = Code(
    "GD421",
    "p2p-slower-than-host",
    "Peer-to-peer copies are faster than copies staged through host memory",
    what="For each pair of GPUs the run uses that NVML reports as P2P-capable (or NVLink-connected), times "
    "a direct device-to-device copy against the same bytes copied through pinned host memory, and "
    "reports the kernel's IOMMU settings (/proc/cmdline, IOMMU groups) with it.",
    why="With PCIe ACS or the IOMMU redirecting peer traffic to the CPU root complex, P2P is slower than "
    "going through host memory, or hangs, while NVML still reports it supported: NCCL picks P2P and "
    "all-reduce crawls or deadlocks (NCCL user guide, 'PCI Access Control Services').",
    fix="On bare metal, disable ACS on the PCIe switches/root ports (`setpci -s <bdf> ECAP_ACS+6.w=0000`, "
    "reapplied at every boot, or the BIOS option) or boot with `iommu=pt` (or the IOMMU off) "
    "if your security model allows. In VMs, where ACS is needed, enable ATS on the NICs/GPUs instead. "
    "As a stop-gap, NCCL_P2P_DISABLE=1 makes NCCL avoid P2P (slower, but it does not hang).",
)
P2P_HANG = Code(
    "GD422",
    "p2p-copy-hung",
    "Peer-to-peer copies finish",
    what="Runs the timed peer-to-peer copies under a deadline; a copy that does not finish is killed at "
    "the deadline and reported for the pair it was copying between.",
    why="A P2P copy that hangs is what NCCL will do at the first all-reduce on those GPUs: the job hangs "
    "until the NCCL watchdog (often 30 minutes) kills it. The usual cause is PCIe ACS/IOMMU "
    "redirection, or RTX 40 cards on drivers older than 550.40.07.",
    fix="Fix ACS/IOMMU as for GD421 (disable ACS on bare metal, `iommu=pt`, ATS in VMs); on RTX 40 "
    "upgrade the driver to 550.40.07 or newer; until then set NCCL_P2P_DISABLE=1.",
)
CODES = [PCIE_UNDER_LOAD, P2P_SLOW, P2P_HANG]

PCIE_FAIL_RATIO = 0.26  # about a quarter of the bandwidth or less: x4 of x16, Gen3 x8 of Gen4 x16, Gen1
P2P_FAIL_RATIO = 0.5  # P2P at half the host-staged rate: traffic is being redirected
P2P_WARN_RATIO = 1.0
NVLINK_MIN_RATIO = 2.0  # NVLink P2P should beat two PCIe hops through host memory by far
PROBE_BYTES = 64 << 20
ENV_DROP = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT")


def link_gbps(gen: int, width: int) -> float:
    """Usable GB/s of a PCIe link (the per-lane table the all-reduce expectation uses)."""
    return PCIE_GBPS_PER_LANE.get(gen, 0.0) * width


def iommu_evidence(host: Host) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if known(host.iommu_cmdline):
        out["kernel_cmdline_iommu"] = " ".join(host.iommu_cmdline) or "(none: kernel defaults)"
    if known(host.iommu_groups):
        out["iommu_groups"] = host.iommu_groups
    return out


def _iommu_text(host: Host) -> str:
    ev = iommu_evidence(host)
    if not ev:
        return "IOMMU settings unknown"
    groups = ev.get("iommu_groups")
    state = "IOMMU on" if isinstance(groups, int) and groups > 0 else "IOMMU off or not exposed"
    return f"{state}; kernel: {ev.get('kernel_cmdline_iommu', '?')}"


def judge_pcie(gpu: Gpu, gen: int | None, width: int | None, h2d_gbps: float | None = None) -> Finding:
    """The link as read under load, against the GPU+slot maximum from the snapshot."""
    subject = gpu_subject(gpu.index)
    max_gen = gpu.pcie_gen_max if known(gpu.pcie_gen_max) else None
    max_width = gpu.pcie_width_max if known(gpu.pcie_width_max) else None
    evidence: dict[str, Any] = {
        "gen_under_load": gen,
        "width_under_load": width,
        "gen_max": max_gen,
        "width_max": max_width,
    }
    if h2d_gbps is not None:
        evidence["h2d_gbps"] = round(h2d_gbps, 2)
    if gen is None or width is None or max_gen is None or max_width is None:
        return Finding(PCIE_UNDER_LOAD.code, Status.SKIP, subject, "PCIe link not readable under load", "", evidence)
    if gen >= max_gen and width >= max_width:
        return Finding(
            PCIE_UNDER_LOAD.code, Status.PASS, subject, f"PCIe Gen{gen} x{width} under load (the maximum)", "", evidence
        )
    ratio = link_gbps(gen, width) / link_gbps(max_gen, max_width)
    evidence["bandwidth_ratio"] = round(ratio, 3)
    status = Status.FAIL if ratio <= PCIE_FAIL_RATIO else Status.WARN
    return Finding(
        PCIE_UNDER_LOAD.code,
        status,
        subject,
        f"PCIe link at Gen{gen} x{width} under load, capable of Gen{max_gen} x{max_width}: "
        f"{ratio:.0%} of its bandwidth",
        "Reseat the GPU/riser, check BIOS PCIe speed and bifurcation, compare with `lspci -vv` LnkSta.",
        evidence,
    )


def judge_p2p(snapshot: Snapshot, a: int, b: int, p2p_gbps: float, staged_gbps: float, data_ok: bool = True) -> Finding:
    """A pair's direct copy against the host-staged copy; NVLink pairs must do far better."""
    subject = pair_subject(a, b)
    nvlinks = topology.nvlink_count(snapshot, a, b)
    label = topology.link_label(snapshot, a, b)
    ratio = p2p_gbps / staged_gbps if staged_gbps > 0 else float("inf")
    evidence: dict[str, Any] = {
        "path": label,
        "p2p_gbps": round(p2p_gbps, 2),
        "staged_gbps": round(staged_gbps, 2),
        "ratio": round(ratio, 2),
        **iommu_evidence(snapshot.host),
    }
    if not data_ok:
        return Finding(
            P2P_SLOW.code,
            Status.FAIL,
            subject,
            f"peer-to-peer copy GPU {a} -> {b} ({label}) returned wrong data",
            "Set NCCL_P2P_DISABLE=1 now; upgrade the driver (RTX 40: 550.40.07+) and fix ACS/IOMMU.",
            evidence,
        )
    if nvlinks and ratio < NVLINK_MIN_RATIO:
        return Finding(
            P2P_SLOW.code,
            Status.WARN,
            subject,
            f"GPU {a} -> {b} over {label}: P2P {p2p_gbps:.1f} GB/s is no faster than through host memory "
            f"({staged_gbps:.1f} GB/s): NVLink is not carrying the copy",
            "Check `nvidia-smi nvlink -s` and the fabric manager (GD106); reset the GPUs or reboot.",
            {**evidence, "expected_ratio": f">= {NVLINK_MIN_RATIO:g}"},
        )
    if ratio < P2P_WARN_RATIO:
        status = Status.FAIL if ratio < P2P_FAIL_RATIO else Status.WARN
        return Finding(
            P2P_SLOW.code,
            status,
            subject,
            f"GPU {a} -> {b} ({label}): P2P {p2p_gbps:.1f} GB/s is slower than through host memory "
            f"({staged_gbps:.1f} GB/s): PCIe ACS/IOMMU is redirecting peer traffic "
            f"({_iommu_text(snapshot.host)})",
            "Disable ACS (setpci ... ECAP_ACS+6.w=0000 or BIOS) or boot with iommu=pt; meanwhile NCCL_P2P_DISABLE=1.",
            {**evidence, "expected_ratio": f">= {P2P_WARN_RATIO:g}"},
        )
    return Finding(
        P2P_SLOW.code,
        Status.PASS,
        subject,
        f"GPU {a} -> {b} ({label}): P2P {p2p_gbps:.1f} GB/s, {ratio:.1f}x the host-staged copy",
        "",
        evidence,
    )


def judge_hang(snapshot: Snapshot, a: int, b: int, deadline_s: float) -> Finding:
    label = topology.link_label(snapshot, a, b)
    return Finding(
        P2P_HANG.code,
        Status.FAIL,
        pair_subject(a, b),
        f"peer-to-peer copy GPU {a} -> {b} ({label}) did not finish within {deadline_s:.0f} s and was "
        f"killed: NCCL will hang the same way ({_iommu_text(snapshot.host)})",
        "Disable ACS / boot with iommu=pt (ATS in VMs); RTX 40: driver 550.40.07+; until fixed NCCL_P2P_DISABLE=1.",
        {"path": label, "deadline_s": deadline_s, **iommu_evidence(snapshot.host)},
    )


def p2p_pairs(snapshot: Snapshot, gpus: list[Gpu]) -> list[tuple[int, int]]:
    """CUDA-index pairs whose GPUs NVML says can do P2P (read and write OK) or that share NVLink."""
    out = []
    for i, ga in enumerate(gpus):
        for j in range(i + 1, len(gpus)):
            gb = gpus[j]
            pair = snapshot.pair(ga.index, gb.index)
            nvml_ok = pair is not None and pair.p2p_read == "ok" and pair.p2p_write == "ok"
            if nvml_ok or topology.nvlink_count(snapshot, ga.index, gb.index):
                out.append((i, j))
    return out


def _skip(message: str) -> list[Finding]:
    return [Finding(PCIE_UNDER_LOAD.code, Status.SKIP, "host", f"link probes not run: {message}", "", {})]


def run_budget(ctx: CheckContext, gpus: int, pairs: int) -> float:
    """The probes' own seconds, counted from when the rank is ready (torch imported; no process group:
    one rank, no collective): a CUDA context and ~1 s of load per GPU, two timed copies per pair,
    and room for a loaded machine (a heuristic). Import and CUDA start get the rest of --timeout,
    so a cold VM's slow start is not taken for a hung copy."""
    return min(ctx.options.timeout_s, 20.0 + 2.0 * gpus + 1.0 * pairs)


def judge_launch(
    snapshot: Snapshot, gpus: list[Gpu], pairs: list[tuple[int, int]], result: Any, run_s: float | None = None
) -> list[Finding]:
    """Turn one LaunchResult (or anything shaped like it) into findings; `run_s`: the probes' budget
    from when the rank was ready (the whole launch's deadline when None)."""
    if result.setup_error:
        return _skip(result.setup_error.get("message", "the probe could not start"))
    findings: list[Finding] = []
    rank = result.ranks[0] if result.ranks else None
    phase = rank.phase if rank is not None else ""
    why = rank.error if rank is not None and rank.error else f"the probe rank ended in phase {phase or 'start'}"
    pcie = result.results("link_pcie")
    by_index = {g.index: g for g in gpus}
    for row in (pcie or {}).get("gpus", []):
        gpu = by_index.get(row.get("gpu"))
        if gpu is not None:
            findings.append(judge_pcie(gpu, row.get("gen"), row.get("width"), row.get("h2d_gbps")))
    if pcie is None:
        findings.append(
            Finding(
                PCIE_UNDER_LOAD.code,
                Status.ERROR,
                "host",
                f"PCIe probe did not finish: {why[:200]}",
                "Re-run with a longer --timeout; check that torch sees the GPUs "
                "(python -c 'import torch; print(torch.cuda.device_count())').",
                {
                    "state": rank.state if rank else None,
                    "phase": phase,
                    "error_kind": rank.error_kind if rank else None,
                },
            )
        )
        return findings
    p2p = result.results("link_p2p")
    if p2p is not None:
        for row in p2p.get("pairs", []):
            findings.append(
                judge_p2p(snapshot, row["a"], row["b"], row["p2p_gbps"], row["staged_gbps"], row.get("data_ok", True))
            )
        return findings
    from gpudoctor.launch.protocol import PAIR_P2P, pair_in_phase  # light; not at import (check --quick)

    hung_pair = pair_in_phase(phase, PAIR_P2P)
    if pairs and hung_pair and (result.timed_out or (rank is not None and rank.state == "hung")):
        a, b = hung_pair
        findings.append(judge_hang(snapshot, a, b, float(run_s if run_s is not None else result.deadline_s or 0)))
        return findings
    if pairs:
        findings.append(
            Finding(
                P2P_SLOW.code,
                Status.ERROR,
                "host",
                f"P2P probe did not finish: {why[:200]}",
                "Re-run with a longer --timeout; if it persists, run the ranks' command by hand.",
                {
                    "state": rank.state if rank else None,
                    "phase": phase,
                    "error_kind": rank.error_kind if rank else None,
                },
            )
        )
    return findings


@check("link_probes", "PCIe under load and P2P copies (active)", codes=CODES, active=True, needs="visible")
def link_probes(ctx: CheckContext) -> list[Finding]:
    # needs="visible": without a driver or a visible GPU the registry gives the uniform skip.
    snapshot = ctx.snapshot
    if ctx.options.device == "cpu":
        return _skip("--device cpu: there are no GPU links to measure")
    visible = ctx.visible
    if any(d.mig is not None for d in visible.devices):
        return _skip("MIG instances have no P2P and share the parent GPU's PCIe link")
    gpus = list(visible.gpus)
    pairs = p2p_pairs(snapshot, gpus)
    from gpudoctor.launch import Task, launch  # lazy: only live, non-quick runs pay for it

    nvml_indices = [g.index for g in gpus]
    tasks = [Task("link_pcie", {"gpus": nvml_indices, "seconds": 0.6, "bytes": PROBE_BYTES})]
    if pairs:
        tasks.append(
            Task(
                "link_p2p", {"gpus": nvml_indices, "pairs": [list(p) for p in pairs], "bytes": PROBE_BYTES, "iters": 5}
            )
        )
    # One rank that drives every GPU, outside any torchrun job this process may sit in.
    environ = {k: v for k, v in os.environ.items() if k not in ENV_DROP}
    result = launch(
        tasks,
        device="cuda",
        ranks=1,
        timeout_s=ctx.options.timeout_s,
        run_s=run_budget(ctx, len(gpus), len(pairs)),
        gpus=nvml_indices[:1],
        gpu_uuids=[d.uuid for d in visible.devices],  # the rank's cuda:i is exactly gpus[i]
        progress=ctx.progress,
        environ=environ,
        python=ctx.options.python,
    )
    findings = judge_launch(snapshot, gpus, pairs, result, run_budget(ctx, len(gpus), len(pairs)))
    if not pairs:
        findings.append(
            Finding(
                P2P_SLOW.code,
                Status.SKIP,
                "host",
                "no GPU pair is P2P-capable per NVML: nothing to copy peer-to-peer",
                "",
                iommu_evidence(snapshot.host),
            )
        )
    return findings
