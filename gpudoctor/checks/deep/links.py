"""GD43x (links), level 3: host-to-device and device-to-host bandwidth per GPU, alone and all at
once, and device-to-device copies per P2P pair, against what the links should carry.

Expectations (what the hardware should reach when healthy, never the link as it happens to be):
- host link: the GPU's maximum PCIe generation x width from the snapshot, at the per-lane rates
  of gpudoctor.knowledge.expectations (x16 Gen4 31.5 GB/s, Gen5 63 GB/s). Healthy pinned copies reach
  0.76-0.88 of it (8x RTX 4090 Gen4: 23.9-26.4 GB/s H2D, NVIDIA/nvbandwidth#15; A100 Gen4 25.9,
  SuperBench baseline; H200 Gen5 55.4, ml-engineering). Below HOST_WARN_RATIO (0.65) warns
  (a link trained to half its width or one generation down measures about 0.4 of its nominal
  rate), below HOST_FAIL_RATIO (0.3) fails (a quarter: x4 of x16 or two generations down,
  about 0.2; GD420 fails a link at a quarter of its bandwidth the same way).
- all at once: a GPU that keeps less than SHARED_WARN_RATIO (0.5, heuristic: half means it shares
  its path with at least one other GPU) of its alone bandwidth when every GPU copies warns,
  naming the GPUs behind the same PCIe switch (PIX/PXB).
- device to device: NVLink generation x links where the pair has NVLink, else the slower GPU's
  PCIe link. Healthy: 371-377 of 450 GB/s on HGX H100 (NVIDIA/nccl#1264), 21.8-26.4 of 31.5 on
  PCIe Gen4 A6000s (NVIDIA/nvbandwidth#50). Below D2D_WARN_RATIO (0.6) warns; below
  D2D_FAIL_RATIO (0.35) fails (ACS-redirected P2P measured 9.9 of 31.5, NVIDIA/nccl#814).
Pageable copies are reported beside pinned ones, without a verdict: they are bounded by host
memcpy, and what they cost is the reason DataLoader(pin_memory=True) exists.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gpudoctor.checks.active.link_probes import link_gbps
from gpudoctor.checks.deep.common import deep_data, subject, who, with_gpus
from gpudoctor.engine import CheckContext, Code, check
from gpudoctor.findings import Finding, Status, pair_subject
from gpudoctor.knowledge import interconnect as topology
from gpudoctor.knowledge.expectations import nvlink_link_gbps
from gpudoctor.snapshot import Snapshot, known

HOST_BANDWIDTH = Code(
    "GD430",
    "host-link-slow",
    "Each GPU copies to and from host memory at its PCIe link's rate",
    what="Times host-to-device and device-to-host copies of 256 MiB from pinned memory for each GPU "
    "alone, and compares the slower direction with the GPU's maximum PCIe generation x width "
    "(x16 Gen4 31.5 GB/s, Gen5 63 GB/s). Below 0.65 of it warns, below 0.3 fails. Pageable-memory "
    "copies are measured and reported beside them.",
    why="Every batch, every checkpoint load and every CPU offload crosses this link. A GPU whose "
    "link runs at a fraction of its rate (trained down, a riser, a bad slot) starves on input "
    "while its peers wait for it.",
    fix="Compare with GD420 (the link's generation and width under load) and `sudo lspci -vv -s <bus "
    "id>` (LnkSta vs LnkCap); reseat the GPU or riser, check BIOS PCIe settings; check that the "
    "ranks run on the GPU's NUMA node (GD5).",
)
HOST_SHARED = Code(
    "GD431",
    "host-link-shared",
    "GPUs keep their host bandwidth when all copy at once",
    what="Times the same host copies on every GPU at the same moment and compares each GPU's "
    "bandwidth with what it reached alone. A GPU that keeps less than half warns, naming the GPUs "
    "behind the same PCIe switch. A shared switch or a narrow uplink shows only this way.",
    why="Data loading runs on every GPU at once: GPUs that share one uplink get a fraction of their "
    "own link each, so input pipelines that are fine on one GPU stall on eight.",
    fix="Nothing to repair if the machine is built that way (check its block diagram); otherwise a "
    "switch uplink trained down is a hardware fault. Pin memory, overlap copies with compute "
    "(non_blocking=True) and keep batches on the GPU to need less of the link.",
)
D2D_BANDWIDTH = Code(
    "GD432",
    "d2d-slow",
    "Device-to-device copies run at the rate of the link between the GPUs",
    what="For each GPU pair with P2P on (per NVML, or NVLink), times direct copies of 256 MiB both "
    "ways and compares the slower with NVLink generation x links, or the PCIe link rate when the "
    "pair has no NVLink. Below 0.6 of it warns, below 0.35 fails.",
    why="NCCL moves gradients over these paths: a pair that copies at a fraction of its link rate "
    "slows every all-reduce (a missing NVLink, P2P redirected through the CPU by ACS/IOMMU).",
    fix="See GD401-GD406 for the links NVML reports and GD421 for P2P against host-staged copies; "
    "`nvidia-smi nvlink -s` for link speeds; disable ACS or boot with iommu=pt on PCIe P2P pairs.",
)
NOT_DONE = Code(
    "GD433",
    "host-link-test-not-completed",
    "The host-link and device-to-device copies ran to the end",
    what="The copies run in spawned ranks under a deadline; this finding names the rank and GPU "
    "that failed or stopped answering, or the pair whose copy never finished.",
    why="A copy that hangs here hangs data loading or NCCL the same way.",
    fix="Read the named rank's error in the evidence; for a pair that hangs see GD422.",
)
CODES = [HOST_BANDWIDTH, HOST_SHARED, D2D_BANDWIDTH, NOT_DONE]

HOST_WARN_RATIO = 0.65
HOST_FAIL_RATIO = 0.3
SHARED_WARN_RATIO = 0.5
D2D_WARN_RATIO = 0.6
D2D_FAIL_RATIO = 0.35
SAME_SWITCH = ("PIX", "PXB")


def host_rate(snapshot: Snapshot, gpu: int | None) -> tuple[float, str] | None:
    """The GB/s a GPU's PCIe link should carry one way, and how it was derived."""
    if gpu is None:
        return None
    g = next((x for x in snapshot.gpus if x.index == gpu), None)
    if g is None or not known(g.pcie_gen_max) or not known(g.pcie_width_max):
        return None
    rate = link_gbps(g.pcie_gen_max, g.pcie_width_max)
    return (rate, f"PCIe Gen{g.pcie_gen_max} x{g.pcie_width_max} = {rate:.1f} GB/s") if rate else None


def _status(ratio: float, warn: float, fail: float) -> Status:
    return Status.FAIL if ratio < fail else Status.WARN if ratio < warn else Status.PASS


def judge_host(snapshot: Snapshot, rows: Sequence[Mapping[str, Any]]) -> list[Finding]:
    findings, fine = [], []
    for r in rows:
        alone = r["alone"]
        slower = min(alone["h2d_pinned"], alone["d2h_pinned"])
        figures = f"H2D {alone['h2d_pinned']:.1f} / D2H {alone['d2h_pinned']:.1f} GB/s pinned"
        if alone.get("h2d_pageable") is not None and alone.get("d2h_pageable") is not None:
            figures += f", {alone['h2d_pageable']:.1f} / {alone['d2h_pageable']:.1f} pageable"
        evidence: dict[str, Any] = {"alone": alone}
        expect = host_rate(snapshot, r.get("gpu"))
        if expect is None:
            fine.append(f"{who(r)} {figures} (no PCIe expectation)")
            continue
        rate, basis = expect
        ratio = slower / rate
        evidence.update(expected_gbps=round(rate, 2), basis=basis, ratio=round(ratio, 3))
        status = _status(ratio, HOST_WARN_RATIO, HOST_FAIL_RATIO)
        if status is Status.PASS:
            fine.append(f"{who(r)} {figures} ({ratio:.0%} of {basis})")
            continue
        evidence.update(warn_below_ratio=HOST_WARN_RATIO, fail_below_ratio=HOST_FAIL_RATIO)
        findings.append(
            Finding(
                HOST_BANDWIDTH.code,
                status,
                subject(r),
                f"{who(r)} copies to/from host memory at {slower:.1f} GB/s alone, {ratio:.0%} of its {basis} "
                f"({figures})",
                HOST_BANDWIDTH.fix,
                evidence,
            )
        )
    if fine:
        findings.append(Finding(HOST_BANDWIDTH.code, Status.PASS, "host", "; ".join(fine)))
    return findings


def _switch_mates(snapshot: Snapshot, gpu: int | None, gpus: Sequence[int]) -> list[int]:
    if gpu is None:
        return []
    return [g for g in gpus if g != gpu and topology.pcie_level(snapshot, gpu, g) in SAME_SWITCH]


def judge_shared(snapshot: Snapshot, rows: Sequence[Mapping[str, Any]]) -> list[Finding]:
    if len(rows) < 2:
        return [Finding(HOST_SHARED.code, Status.SKIP, "host", "one GPU: nothing copies at the same time")]
    gpus = [r["gpu"] for r in rows if r.get("gpu") is not None]
    findings = []
    for r in rows:
        keep = {d: r["at_once"][f"{d}_pinned"] / r["alone"][f"{d}_pinned"] for d in ("h2d", "d2h")}
        worst = min(keep, key=keep.__getitem__)
        if keep[worst] >= SHARED_WARN_RATIO:
            continue
        mates = _switch_mates(snapshot, r.get("gpu"), gpus)
        shared = (
            f"it shares a PCIe switch with GPU {', '.join(map(str, mates))}"
            if mates
            else "no PCIe switch shared with another GPU per NVML: the host (root complex or memory) caps it"
        )
        findings.append(
            Finding(
                HOST_SHARED.code,
                Status.WARN,
                subject(r),
                f"{who(r)} keeps {keep[worst]:.0%} of its {worst.upper()} bandwidth when all GPUs copy at once "
                f"({r['at_once'][f'{worst}_pinned']:.1f} of {r['alone'][f'{worst}_pinned']:.1f} GB/s): {shared}",
                HOST_SHARED.fix,
                {
                    "alone": r["alone"],
                    "at_once": r["at_once"],
                    "kept": {k: round(v, 3) for k, v in keep.items()},
                    "switch_mates": mates,
                    "warn_below_ratio": SHARED_WARN_RATIO,
                },
            )
        )
    total = sum(r["at_once"]["h2d_pinned"] for r in rows)
    return findings or [
        Finding(
            HOST_SHARED.code,
            Status.PASS,
            "host",
            f"all {len(rows)} GPUs copying at once: {total:.1f} GB/s H2D in all, each keeping at least "
            f"{SHARED_WARN_RATIO:.0%} of its alone bandwidth",
            "",
            {"h2d_at_once_total_gbps": round(total, 2)},
        )
    ]


def d2d_rate(snapshot: Snapshot, a: int, b: int) -> tuple[float, str] | None:
    links = topology.nvlink_count(snapshot, a, b)
    per_link = nvlink_link_gbps(snapshot.gpu(a))
    if links and per_link:
        # NCCL's effective per-link rate (expectations.NCCL_NVLINK_GBPS, from NCCL's topo.h), the
        # same basis as the all-reduce model, so GD432 and GD601 judge a link alike.
        rate = links * per_link
        return rate, f"{links} NVLinks x {per_link:g} GB/s (NCCL's per-link rate) = {rate:g} GB/s"
    rates = [x for x in (host_rate(snapshot, a), host_rate(snapshot, b)) if x is not None]
    return min(rates) if len(rates) == 2 else None


def judge_d2d(snapshot: Snapshot, pairs: Sequence[Mapping[str, Any]]) -> list[Finding]:
    if not pairs:
        return [Finding(D2D_BANDWIDTH.code, Status.SKIP, "host", "no GPU pair with P2P on: no device-to-device copy")]
    findings, fine = [], []
    for p in pairs:
        a, b = int(p["a"]), int(p["b"])
        slower = min(p["a_to_b_gbps"], p["b_to_a_gbps"])
        expect = d2d_rate(snapshot, a, b)
        label = topology.link_label(snapshot, a, b)
        if expect is None:
            fine.append(f"{a}-{b} {slower:.1f} GB/s (no expectation)")
            continue
        rate, basis = expect
        ratio = slower / rate
        status = _status(ratio, D2D_WARN_RATIO, D2D_FAIL_RATIO)
        if status is Status.PASS:
            fine.append(f"{a}-{b} {slower:.0f} GB/s ({ratio:.0%})")
            continue
        findings.append(
            Finding(
                D2D_BANDWIDTH.code,
                status,
                pair_subject(a, b),
                f"GPU {a} <-> {b} ({label}): device-to-device copies at {slower:.1f} GB/s, {ratio:.0%} of {basis}",
                D2D_BANDWIDTH.fix,
                {
                    **dict(p),
                    "expected_gbps": rate,
                    "basis": basis,
                    "ratio": round(ratio, 3),
                    "warn_below_ratio": D2D_WARN_RATIO,
                    "fail_below_ratio": D2D_FAIL_RATIO,
                },
            )
        )
    if fine:
        findings.append(Finding(D2D_BANDWIDTH.code, Status.PASS, "host", "device-to-device: " + "; ".join(fine)))
    return findings


def links_table(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    def cells(figures: Mapping[str, float | None]) -> list[str]:
        keys = ("h2d_pinned", "d2h_pinned", "h2d_pageable", "d2h_pageable")
        return ["-" if figures.get(k) is None else f"{figures[k]:.1f}" for k in keys]

    return {
        "title": "host links, GB/s (alone | all at once)",
        "columns": [
            "rank",
            "gpu",
            "H2D pin",
            "D2H pin",
            "H2D page",
            "D2H page",
            "H2D pin",
            "D2H pin",
            "H2D page",
            "D2H page",
        ],
        "rows": [
            [r["rank"], "-" if r.get("gpu") is None else r["gpu"], *cells(r["alone"]), *cells(r["at_once"])]
            for r in rows
        ],
    }


@check("deep_links", "Host links and device-to-device copies (deep)", codes=CODES, active=True, level=3, shares="deep")
def deep_links(ctx: CheckContext) -> tuple[list[Finding], dict[str, Any]]:
    if ctx.options.device == "cpu":
        return [Finding(HOST_BANDWIDTH.code, Status.SKIP, "host", "host links not measured: --device cpu")], {}
    got = deep_data(ctx, "deep_links", "deep_links", NOT_DONE, "the host-link test", CODES[0])
    if isinstance(got, list):
        return got, {}
    run, data = got
    rows = with_gpus(data["rows"], run)
    snap = ctx.snapshot
    findings = judge_host(snap, rows) + judge_shared(snap, rows) + judge_d2d(snap, data["pairs"])
    return findings, {"tables": [links_table(rows)], "links": {**data, "rows": rows}}
