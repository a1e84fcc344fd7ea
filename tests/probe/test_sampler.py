"""The live NVML sampler, against a fake NVML library (and the real one where a GPU exists)."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from gpudoctor.probe.host import PROC_PID_INIT_INO
from gpudoctor.probe.nvml import Nvml
from gpudoctor.probe.sampler import NvmlSampler
from gpudoctor.watch.model import GpuReading
from gpudoctor.watch.sources import NOT_VISIBLE, NOT_VISIBLE_ISOLATED, proc_readings
from tests.fakes import nvml_c as c
from tests.fakes.live_nvml import Clock, LiveNvml, ProcsOf
from tests.helpers.processes import GpudoctorCli


def open_sampler(clock: Clock | None = None) -> tuple[NvmlSampler, LiveNvml]:
    fake = LiveNvml(wall=clock or Clock())
    sampler = NvmlSampler(Nvml(fake))
    assert sampler.open().ok
    return sampler, fake


def test_readings_are_converted_to_watch_units() -> None:
    clock = Clock()
    sampler, _ = open_sampler(clock)
    clock.advance(1.0)  # PCIe rates are the byte counters' rise over the interval
    g0, g1 = (GpuReading(**r) for r in sampler.read())
    assert (g0.util, g0.mem_used, g0.mem_total, g0.power, g0.power_limit) == (97, 61000, 81559, 612.3, 700.0)
    assert (g0.pcie_rx, g0.pcie_tx, g0.temp, g0.sm_clock, g0.throttle) == (2000, 1000, 65, 1980, 0)
    assert g0.name == "NVIDIA H100 80GB HBM3" and g1.throttle == 0x40
    assert g1.xids == (79,) and g0.xids == ()
    procs = sampler.processes()
    assert [(gpu, p.pid, p.used_memory_mib) for gpu, ps in procs.items() for p in ps] == [
        (0, 1000, 60000),
        (1, 1001, 60000),
    ]


def test_unsupported_metric_is_asked_once_then_na() -> None:
    sampler, fake = open_sampler()
    deadline = time.monotonic() + 30
    while sampler.pcie.states[1].source is not None and time.monotonic() < deadline:
        time.sleep(0.01)  # GPU 1 has no byte counters: its 20 ms call is tried on the PCIe thread
    for _ in range(5):
        g1 = GpuReading(**sampler.read()[1])
        assert g1.pcie_rx is None and g1.pcie_tx is None and g1.util == 54
    # GPU 0 reads its byte counters; GPU 1 asked the 20 ms call once per direction, then never again.
    assert fake.calls.count("nvmlDeviceGetPcieThroughput") == 2
    assert sampler.pcie.states[0].source == "counters" and sampler.pcie.states[1].source is None
    sampler.close()


def test_a_lost_gpu_is_marked_and_the_others_go_on() -> None:
    sampler, fake = open_sampler()
    sampler.read()
    fake.lose(0)
    readings = [GpuReading(**r) for r in sampler.read()]
    assert readings[0].state == "lost" and readings[1].state == "ok" and readings[1].util == 54
    before = fake.calls.count("nvmlDeviceGetUtilizationRates")
    readings = [GpuReading(**r) for r in sampler.read()]
    assert readings[0].state == "lost"
    assert fake.calls.count("nvmlDeviceGetUtilizationRates") == before + 1  # only GPU 1 is still asked


def test_gpus_option_limits_the_devices() -> None:
    sampler = NvmlSampler(Nvml(LiveNvml()), indices=[1])
    assert sampler.open().ok
    assert [r["index"] for r in sampler.read()] == [1]


def _smi() -> list[tuple[float, float, float]]:
    out = subprocess.run(
        ["nvidia-smi", "--query-gpu=utilization.gpu,memory.used,power.draw", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        timeout=30,
    ).stdout
    return [tuple(float(x) for x in line.split(",")) for line in out.strip().splitlines()]  # type: ignore[misc]


@pytest.mark.gpu
def test_real_nvml_matches_nvidia_smi() -> None:
    sampler = NvmlSampler()
    assert sampler.open().ok
    try:
        readings = [GpuReading(**r) for r in sampler.read()]
        smi = _smi()
    finally:
        sampler.close()
    assert len(readings) == len(smi)
    for g, (util, mem, power) in zip(readings, smi, strict=True):
        assert g.mem_used is not None and abs(g.mem_used - mem) <= 256  # MiB: allocations move between reads
        assert g.power is not None and abs(g.power - power) <= max(30.0, 0.15 * power)
        assert g.util is not None and abs(g.util - util) <= 30  # utilization is a 1/6 s..1 s sample window


def fake_proc_root(tmp_path: Path, ns_inode: int, pid: int) -> Path:
    """A /proc with our PID namespace link and one process: `pid`, a python with a known command line."""
    ns = tmp_path / "proc/self/ns"
    ns.mkdir(parents=True)
    (ns / "pid").symlink_to(f"pid:[{ns_inode}]")
    me = tmp_path / "proc" / str(pid)
    me.mkdir()
    (me / "status").write_text(f"Name:\tpython\nUid:\t{os.getuid()}\t0\t0\t0\n")
    (me / "cmdline").write_bytes(b"python\0train.py\0--rank\x000\0")
    return tmp_path


def test_processes_are_named_through_the_probe_with_cpu_and_rss(tmp_path: Path) -> None:
    ghost = 2**22 + 12345  # a host PID that no process here has
    root = fake_proc_root(tmp_path, PROC_PID_INIT_INO, os.getpid())  # the host's own PID namespace
    sampler = NvmlSampler(Nvml(ProcsOf(os.getpid(), ghost)), root=root)
    assert sampler.open().ok and sampler.isolated is False
    found = sampler.processes()
    me, gone = proc_readings(found, sampler.usage([os.getpid()]), sampler.isolated)
    assert (me.pid, me.gpu, me.gpu_mem, me.command) == (os.getpid(), 0, 512, "python train.py --rank 0")
    assert me.user and me.rss and me.rss > 0 and not me.note
    assert (gone.pid, gone.gpu, gone.command, gone.note) == (ghost, 1, "", NOT_VISIBLE)  # explained, not dropped
    again = proc_readings(sampler.processes(), sampler.usage([os.getpid()]), sampler.isolated)[0]
    assert again.cpu is not None  # measured over the interval since the first reading


def test_host_pids_are_not_pinned_on_local_processes_in_a_pid_namespace(tmp_path: Path) -> None:
    # A container without --pid=host and without /.dockerenv or a `container` variable: NVML's
    # host PID happens to be the number of a local process (this one); it must not be shown as it.
    root = fake_proc_root(tmp_path, 4026532481, os.getpid())
    sampler = NvmlSampler(Nvml(ProcsOf(os.getpid(), 4242)), root=root)
    assert sampler.open().ok and sampler.isolated is True
    found = sampler.processes()
    assert all(p.local_pid is None and p.command is None and p.user is None for ps in found.values() for p in ps)
    rows = proc_readings(found, sampler.usage([]), sampler.isolated)
    assert [(r.pid, r.gpu, r.gpu_mem) for r in rows] == [(os.getpid(), 0, 512), (4242, 1, 512)]
    assert all(r.command == "" and r.user == "" and r.rss is None and r.note == NOT_VISIBLE_ISOLATED for r in rows)


def old_driver(**options: object) -> LiveNvml:
    """A new nvidia-ml-py on a driver before 535: the new name of the call is not in the driver."""
    return LiveNvml(missing={"nvmlDeviceGetCurrentClocksEventReasons"}, **options)  # type: ignore[arg-type]


def test_throttle_reasons_fall_back_to_the_old_call_on_drivers_before_535() -> None:
    fake = old_driver()
    sampler = NvmlSampler(Nvml(fake))
    assert sampler.open().ok
    for _ in range(4):
        g0, g1 = (GpuReading(**r) for r in sampler.read())
        assert (g0.throttle, g1.throttle) == (0, 0x40)  # thermal slowdown on GPU 1 is seen, every time
    assert fake.calls.count("nvmlDeviceGetCurrentClocksEventReasons") == 2  # once per GPU, then only the old name
    assert fake.calls.count("nvmlDeviceGetCurrentClocksThrottleReasons") == 4 * 2


def test_throttle_reasons_unsupported_under_both_names_are_asked_once() -> None:
    fake = old_driver(answers={"nvmlDeviceGetCurrentClocksThrottleReasons": c.NOT_SUPPORTED})
    sampler = NvmlSampler(Nvml(fake))
    assert sampler.open().ok
    for _ in range(3):
        assert [r["throttle"] for r in sampler.read()] == [None, None]
    assert fake.calls.count("nvmlDeviceGetCurrentClocksThrottleReasons") == 2


@pytest.mark.gpu
def test_watch_headless_on_a_real_gpu(gpudoctor_cli: GpudoctorCli) -> None:
    import json

    r = gpudoctor_cli("watch", "--no-tui", "--json", "--duration", "3")
    assert r.returncode == 0, r.stderr
    lines = [json.loads(x) for x in r.stdout.splitlines()]
    samples = [x for x in lines if x["kind"] == "sample"]
    assert len(samples) >= 2 and lines[-1]["kind"] == "summary"
    assert all("util" in g or g.get("state") for g in samples[-1]["gpus"])


def test_per_process_sm_utilization_comes_from_nvml_samples_newer_than_the_last_seen() -> None:
    sampler, fake = open_sampler()
    assert sampler.process_utilization() == {0: {}}  # no busy process since (NOT_FOUND): none, no error
    first = fake.util_asked[0]
    assert abs(first / 1e6 - (time.time() - 5.0)) < 2  # the recent past only, not the driver's whole buffer
    fake.live(0).util_samples = [(1000, first + 1_000_000, 90), (1000, first + 2_000_000, 70), (1000, first - 10, 5)]
    assert sampler.process_utilization() == {0: {1000: 80}}  # the mean of the two new samples
    fake.live(0).util_samples = []
    assert sampler.process_utilization() == {0: {}}
    assert fake.util_asked[-1] == first + 2_000_000  # asks for what is newer than the last sample seen
    assert "proc_util" in sampler.devices[1].unsupported  # GPU 1 asked once, then left alone
    found = sampler.processes()
    fake.live(0).util_samples = [(1001, first + 3_000_000, 40), (1000, first + 3_000_000, 55)]
    rows = proc_readings(found, {}, False, sampler.process_utilization())
    assert [(r.pid, r.gpu, r.sm) for r in rows] == [(1000, 0, 55), (1001, 1, None)]  # GPU 1: n/a
    fake.live(0).util_samples = [(1001, first + 4_000_000, 40)]  # PID 1000 had no non-zero sample: it was idle
    rows = proc_readings(found, {}, False, sampler.process_utilization())
    assert [(r.pid, r.sm) for r in rows] == [(1000, 0), (1001, None)]


def test_host_reading_agrees_with_proc_meminfo_and_loadavg() -> None:
    from gpudoctor.probe.sampler import host_reading

    meminfo = {
        line.split(":")[0]: int(line.split()[1]) // 1024 for line in Path("/proc/meminfo").read_text().splitlines()
    }
    host = host_reading()
    assert host["ram_total"] == meminfo["MemTotal"]
    assert abs(host["ram_used"] - (meminfo["MemTotal"] - meminfo["MemAvailable"])) < 512  # MiB moving between reads
    assert host["swap_total"] == meminfo["SwapTotal"]
    assert abs(host["load1"] - os.getloadavg()[0]) < 2.0
