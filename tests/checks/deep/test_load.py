"""Level 3's sustained-load verdicts, judged by the pure function over recorded NVML streams and
published GEMM figures (tests/fixtures/deep/, tests/reference/deep-*.md)."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import pytest

from gpudoctor.checks.deep.common import LoadSampler, describe_readings
from gpudoctor.checks.deep.load import judge_load
from gpudoctor.findings import Finding, Status
from gpudoctor.probe.nvml import InitResult
from gpudoctor.watch.recording import read_recording
from tests.helpers.findings import by_code
from tests.paths import FIXTURES

DEEP = FIXTURES / "deep"


def stream(name: str) -> list[tuple[float, list[dict[str, Any]]]]:
    """A recorded stream, read by watch's own reader (so the fixtures are real recordings)."""
    rec = read_recording(str(DEEP / f"{name}.jsonl"))
    assert rec.damage is None
    return [(s.t, [g.to_json() for g in s.gpus]) for s in rec.samples]


def row(
    rank: int, tflops: float, *, gpu: int | None = None, device: str = "NVIDIA H100 80GB HBM3", **extra: Any
) -> dict:
    return {
        "rank": rank,
        "gpu": rank if gpu is None else gpu,
        "device": device,
        "sm_count": 132,
        "dtype": "bfloat16",
        "tflops_sustained": tflops,
        "tflops_mean": tflops,
        "seconds": 60.0,
        "start": extra.pop("start", 0.0),
        "end": extra.pop("end", 60.0),
        **extra,
    }


def not_passing(findings: list[Finding]) -> list[tuple[str, str, str]]:
    return [(f.code, f.status.value, f.subject) for f in findings if f.status not in (Status.PASS, Status.SKIP)]


def test_a_gpu_held_down_by_software_thermal_slowdown_in_a_recorded_h100_stream_is_named_with_its_reason() -> None:
    samples = stream("sglang_h100_2x_sw_thermal")
    start, end = samples[0][0] - 0.5, samples[-1][0]
    # sglang#39206 published clocks, not GEMM figures: a compute-bound GEMM runs at the SM clock,
    # so GPU 1 is given 480/1980 of GPU 0's throughput (the ratio of their median SM clocks).
    rows = [row(0, 700.0, start=start, end=end), row(1, 700.0 * 480 / 1980, start=start, end=end)]
    findings = judge_load(samples, rows)
    assert not_passing(findings) == [("GD850", "fail", "gpu:1"), ("GD851", "warn", "gpu:1")]
    (slow,) = by_code(findings, "GD850")
    assert "24% of its peers' 700" in slow.message
    assert "explained by software thermal slowdown 100% of the time" in slow.message
    assert "SM clock 480 MHz vs 1980" in slow.message and "up to 87 C" in slow.message
    assert slow.evidence["throttle_share"] == {"software thermal slowdown": 1.0}
    (thermal,) = by_code(findings, "GD851")
    assert thermal.message == (
        "GPU 1 reached software thermal slowdown under load: in 200 of 200 readings from 0 s into the load, up to 87 C"
    )


def test_hardware_thermal_slowdown_in_a_recorded_stream_fails_and_the_power_cap_is_not_a_fault() -> None:
    samples = stream("llm_rig_a4000_2x_hw_thermal")
    start, end = samples[0][0], samples[-1][0]
    # llm-rig#97 published no throughput: both GPUs get the same figure, only NVML is judged here.
    rows = [row(r, 19.2, device="NVIDIA RTX A4000", start=start, end=end) for r in (0, 1)]
    findings = judge_load(samples, rows)
    assert not_passing(findings) == [("GD851", "fail", "gpu:0")]
    (thermal,) = by_code(findings, "GD851")
    assert "hardware thermal slowdown" in thermal.message
    assert "in 2 of 4 readings from 105 s into the load, up to 90 C" in thermal.message
    # HW_SLOWDOWN came with the thermal bit: explained, so no separate hardware-slowdown failure.
    assert [f.status for f in by_code(findings, "GD853")] == [Status.PASS]
    (power,) = by_code(findings, "GD852")
    assert power.status is Status.PASS
    assert "software power cap under load: GPU 0 50% of the time (limit 140 W)" in power.message
    assert "not a fault" in power.message


def test_the_hotter_gtx1080_of_a_recorded_gpu_burn_is_warned_as_slower_than_its_peer() -> None:
    samples = stream("gpu_burn_gtx1080_2x")
    rows = json.loads((DEEP / "gpu_burn_gtx1080_2x.figures.json").read_text())["rows"]
    findings = judge_load(samples, rows)
    assert not_passing(findings) == [("GD850", "warn", "gpu:1")]
    (slow,) = by_code(findings, "GD850")
    # Second half: GPU 1 6550 Gflop/s against GPU 0's 7025 (gpu-burn#48).
    assert slow.evidence["ratio"] == pytest.approx(6549.75 / 7025, abs=1e-4)
    assert "no throttle reasons were readable (up to 83 C vs 63 C)" in slow.message
    # gpu_burn prints no throttle reasons: the reason-based verdicts say they could not judge.
    for code in ("GD851", "GD852", "GD853"):
        assert [f.status for f in by_code(findings, code)] == [Status.SKIP]
    assert [f.status for f in by_code(findings, "GD854")] == [Status.PASS]


def test_eight_healthy_h100s_within_two_percent_all_pass() -> None:
    # NVIDIA/enroot#272, one line of an 8-GPU burn: per-GPU Gflop/s.
    gflops = [760862, 764160, 757563, 753165, 756463, 756463, 765260, 753165]
    findings = judge_load([], [row(i, g / 1000) for i, g in enumerate(gflops)])
    (f,) = by_code(findings, "GD850")
    assert f.status is Status.PASS
    assert f.message.startswith("8 GPU(s) sustained 753-765 TFLOPS bfloat16 for 60 s; each compared GPU within 5%")


def test_the_a100_at_a_third_of_its_peers_fails_as_in_dcgm_issue_122() -> None:
    # NVIDIA/DCGM#122: ubergemm FP32 per adapter on a DGX A100-40G; adapter 0 is the broken GPU.
    gflops = [6698.44, 19148.11, 19239.38, 19256.41, 19190.68, 19096.02, 19272.57, 19186.80]
    rows = [row(i, g / 1000, device="NVIDIA A100-SXM4-40GB") for i, g in enumerate(gflops)]
    findings = judge_load([], rows)
    assert not_passing(findings) == [("GD850", "fail", "gpu:0")]
    (f,) = by_code(findings, "GD850")
    assert f.evidence["ratio"] == pytest.approx(6698.44 / 19190.68, abs=1e-3)
    assert "no NVML readings of it to say why" in f.message
    assert all(x.status is Status.SKIP for x in findings if x.code in ("GD851", "GD852", "GD853", "GD854"))


def test_peers_are_gpus_of_the_same_model_only() -> None:
    rows = [row(0, 700.0), row(1, 690.0), row(2, 160.0, device="NVIDIA L4", sm_count=58)]
    (f,) = by_code(judge_load([], rows), "GD850")
    assert f.status is Status.PASS
    assert "no other GPU of its model beside GPU 2" in f.message


def test_the_reason_only_the_slow_gpu_has_is_the_one_that_explains_it() -> None:
    def sample(t: float) -> tuple[float, list[dict[str, Any]]]:
        return t, [
            {"index": 0, "throttle": 0x4, "sm_clock": 1755, "temp": 70},
            {"index": 1, "throttle": 0x4, "sm_clock": 1740, "temp": 71},
            {"index": 2, "throttle": 0x4 | 0x80, "sm_clock": 900, "temp": 69},
        ]

    samples = [sample(float(t)) for t in range(60)]
    findings = judge_load(samples, [row(0, 700.0), row(1, 695.0), row(2, 420.0)])
    (slow,) = by_code(findings, "GD850")
    assert slow.subject == "gpu:2" and slow.status is Status.FAIL
    assert "explained by hardware power brake slowdown 100% of the time" in slow.message
    assert "software power cap" not in slow.message  # every GPU had it: it explains nothing
    assert [(f.status, f.subject) for f in by_code(findings, "GD852")] == [(Status.FAIL, "gpu:2")]


def test_a_slow_gpu_with_no_throttle_reason_is_suspected_itself() -> None:
    samples = [
        (float(t), [{"index": i, "throttle": 0, "sm_clock": 1980, "temp": 60} for i in range(3)]) for t in range(30)
    ]
    findings = judge_load(samples, [row(0, 700.0), row(1, 702.0), row(2, 600.0)])
    (slow,) = by_code(findings, "GD850")
    assert slow.status is Status.WARN
    assert "no throttle reason reported: suspect the GPU itself" in slow.message


def test_xids_and_a_lost_gpu_during_the_deep_run_are_named() -> None:
    samples = [
        (10.0, [{"index": 0, "throttle": 0}, {"index": 1, "throttle": 0}, {"index": 2, "throttle": 0}]),
        (11.0, [{"index": 0, "throttle": 0, "xids": [13]}, {"index": 1, "xids": [48]}, {"index": 2}]),
        (12.0, [{"index": 0, "throttle": 0}, {"index": 1, "throttle": 0}, {"index": 2, "state": "lost"}]),
    ]
    rows = [row(i, 700.0, start=10.0, end=12.0) for i in range(3)]
    xid = by_code(judge_load(samples, rows), "GD854")
    assert [(f.status, f.subject) for f in xid] == [
        (Status.WARN, "gpu:0"),
        (Status.FAIL, "gpu:1"),
        (Status.FAIL, "gpu:2"),
    ]
    assert "XID 48 (double-bit ECC error)" in xid[1].message and "1 s in" in xid[1].message
    assert "stopped answering NVML" in xid[2].message


def test_cpu_ranks_get_figures_without_a_verdict_and_say_why_nvml_was_not_judged() -> None:
    rows = [row(i, 0.04, device="cpu", sm_count=None, dtype="float32") for i in range(2)]
    findings = judge_load([], rows, sampling="CPU ranks: no NVML readings")
    (f,) = by_code(findings, "GD850")
    assert f.status is Status.PASS and "CPU: no hardware verdict" in f.message
    skips = [x for x in findings if x.code != "GD850"]
    assert {x.code for x in skips} == {"GD851", "GD852", "GD853", "GD854"}
    assert all(x.status is Status.SKIP and x.message == "not judged: CPU ranks: no NVML readings" for x in skips)


def test_the_progress_line_gives_ranges_and_names_slowdowns() -> None:
    line = describe_readings(
        [
            {"index": 0, "temp": 61, "power": 590.0, "sm_clock": 1980, "throttle": 0x4},
            {"index": 3, "temp": 88, "power": 450.5, "sm_clock": 1410, "throttle": 0x20},
        ]
    )
    assert line == (
        "under load: temp 61-88 C, power 450.5-590 W, sm clock 1410-1980 MHz; "
        "slowdown: GPU 0 software power cap; GPU 3 software thermal slowdown"
    )


class FakeSampler:
    """Stands in for watch's NvmlSampler: answers readings, counts calls."""

    def __init__(self, indices: list[int], ok: bool = True) -> None:
        self.indices = indices
        self.ok = ok
        self.reads = 0
        self.closed = False

    def open(self) -> InitResult:
        return InitResult("ok") if self.ok else InitResult("no_driver", "NVIDIA driver not loaded")

    def read(self) -> list[dict[str, Any]]:
        self.reads += 1
        return [{"index": i, "temp": 60 + self.reads, "throttle": 0} for i in self.indices]

    def close(self) -> None:
        self.closed = True


def test_the_load_sampler_reads_every_interval_reports_progress_and_stops_promptly() -> None:
    made: list[FakeSampler] = []
    said: list[str] = []

    def factory(indices: list[int]) -> FakeSampler:
        made.append(FakeSampler(indices))
        return made[-1]

    sampler = LoadSampler([0, 1], interval_s=0.02, progress=said.append, factory=factory)
    sampler.start()
    deadline = time.monotonic() + 60  # on a loaded host the thread gets its slices later: wait for 5
    while (not made or made[0].reads < 5) and time.monotonic() < deadline:
        time.sleep(0.02)
    samples, note = sampler.stop()
    assert note == "" and made[0].closed
    assert len(samples) >= 5 and [g["index"] for g in samples[0][1]] == [0, 1]
    assert all(later[0] >= earlier[0] for earlier, later in zip(samples, samples[1:], strict=False))
    assert not any(t.name == "deep-nvml-sampler" for t in threading.enumerate())
    # Promptly: stop() does not wait out the interval. With a 60 s interval, a stop that waited for it
    # would take a minute; one that is woken takes a scheduler slice, however loaded the host.
    slow = LoadSampler([0], interval_s=60.0, factory=factory)
    slow.start()
    while made[-1].reads < 1 and time.monotonic() < deadline + 60:
        time.sleep(0.02)
    t0 = time.monotonic()
    _, note = slow.stop()
    assert note == "" and time.monotonic() - t0 < 20


def test_the_load_sampler_says_why_when_nvml_cannot_be_opened() -> None:
    sampler = LoadSampler([0], interval_s=0.01, factory=lambda indices: FakeSampler(indices, ok=False))
    sampler.start()
    samples, note = sampler.stop()
    assert samples == []
    assert note == "NVML not readable (no_driver: NVIDIA driver not loaded)"


def test_one_reading_of_software_thermal_slowdown_is_a_blip_two_are_a_warning() -> None:
    def stream_with(marked: int) -> list[tuple[float, list[dict[str, Any]]]]:
        return [(float(t), [{"index": 0, "throttle": 0x20 if t < marked else 0, "temp": 84}]) for t in range(20)]

    rows = [row(0, 700.0, start=0.0, end=20.0)]
    (blip,) = by_code(judge_load(stream_with(1), rows), "GD851")
    assert blip.status is Status.PASS
    assert blip.message.endswith("; GPU 0 touched software thermal slowdown in 1 reading")
    (warn,) = by_code(judge_load(stream_with(2), rows), "GD851")
    assert (warn.status, warn.subject) == (Status.WARN, "gpu:0")
