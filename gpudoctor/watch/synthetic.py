"""Synthetic 8x H100 readings for `watch --demo`, tests, fixtures and the fake source (no GPU needed).

Each scenario is a pure function of (sample number, seed), so a fixture regenerates byte
for byte. The numbers follow a real 8x H100 80GB HBM3 box under DDP training (700 W
limit, ~61 GiB used, ~95-100% utilization). With `ranks=True` each GPU also has a training
rank publishing steps (as `gpudoctor.step()` would): 0.5 s steps, the straggler's rank ending
them late, the starved job waiting for input, the hung job's ranks stopping (one a step behind).
"""

from __future__ import annotations

import random

from gpudoctor.knowledge.clock_reasons import HW_THERMAL_SLOWDOWN, SW_POWER_CAP
from gpudoctor.watch.model import GpuReading, ProcReading, RankReading, Sample

SCENARIOS = ("healthy", "straggler", "hung", "starved", "throttle", "memory", "idle", "xid", "lost")
DEMOS = ("straggler", "hung", "starved", "throttle", "xid", "lost", "balanced")  # `watch --demo`; balanced = healthy
NAME = "NVIDIA H100 80GB HBM3"
MEM_TOTAL = 81559
POWER_LIMIT = 700.0
STRAGGLER_GPU = 3
HUNG_SUSPECT = 5
HUNG_AFTER = 30  # samples of healthy training before the hang
THROTTLED_GPU = 2
XID_GPU = 6
XID_AT = 40  # the sample where GPU 6 reports XID 48 (double-bit ECC error)
LOST_GPU = 7
LOST_AT = 40  # GPU 7 reports XID 79 (fallen off the bus), then NVML says it is lost
PROCESS_EVERY = 5  # samples between process readings
STEP_S = 0.5  # the synthetic ranks' step time
LATE_S = 0.15  # the straggler's rank ends each step this much after the others
STARVED_WAIT = 0.45  # share of each step the starved job's ranks wait for input


def _busy(rng: random.Random, index: int, util_lo: int = 95, util_hi: int = 100) -> dict[str, object]:
    return {
        "util": rng.randint(util_lo, util_hi),
        "mem_util": rng.randint(35, 55),
        "mem_used": 61000 + rng.randint(-200, 200),
        "power": round(rng.uniform(560, 690), 1),
        "temp": rng.randint(58, 70),
        "sm_clock": 1980,
        "pcie_rx": rng.randint(1500, 2500),
        "pcie_tx": rng.randint(800, 1200),
        "throttle": 0,
    }


def gpu_values(scenario: str, i: int, index: int, rng: random.Random, n_gpus: int) -> dict[str, object]:
    v = _busy(rng, index)
    if scenario == "idle":
        v.update(
            util=0,
            mem_util=0,
            mem_used=4,
            power=round(rng.uniform(68, 75), 1),
            temp=33,
            sm_clock=345,
            pcie_rx=0,
            pcie_tx=0,
            throttle=0x1,
        )
    elif scenario == "straggler" and index == STRAGGLER_GPU:
        v.update(util=rng.randint(52, 64), power=round(rng.uniform(330, 380), 1), sm_clock=1980)
    elif (scenario == "hung" and i >= HUNG_AFTER) or (scenario == "lost" and i >= LOST_AT):
        if index == HUNG_SUSPECT % n_gpus and scenario == "hung":
            v.update(util=0, mem_util=0, power=round(rng.uniform(70, 74), 1), pcie_rx=0, pcie_tx=0, temp=41)
        else:  # an NCCL kernel spinning on a flag: busy by NVML's count, drawing idle power
            v.update(util=100, mem_util=0, power=round(rng.uniform(76, 84), 1), pcie_rx=0, pcie_tx=0, temp=44)
    elif scenario == "starved" and i % 5 in (1, 2, 3):
        v.update(util=rng.randint(8, 30), power=round(rng.uniform(150, 220), 1), mem_util=rng.randint(2, 8))
    elif scenario == "throttle" and index == THROTTLED_GPU:
        v.update(temp=rng.randint(87, 90), sm_clock=1410, throttle=HW_THERMAL_SLOWDOWN | SW_POWER_CAP)
    elif scenario == "memory" and index == 0:
        v.update(mem_used=78200 + rng.randint(-100, 100))
    elif scenario == "xid" and index == XID_GPU and i == XID_AT:
        v.update(xids=(48,))
    elif scenario == "lost" and index == LOST_GPU and i == LOST_AT - 1:
        v.update(xids=(79,))
    return v


def rank_readings(scenario: str, i: int, t: float, n_ranks: int, pids: tuple[int, ...] = ()) -> tuple[RankReading, ...]:
    """What `gpudoctor.step()` in one rank per GPU would have sent over the interval ending at `t`."""
    per_interval = 2  # 0.5 s steps in a 1 s interval
    out = []
    for rank in range(n_ranks):
        pid = pids[rank] if rank < len(pids) else 4100 + rank
        wait = STARVED_WAIT * STEP_S if scenario == "starved" else 0.01
        end = t - 0.2 + (LATE_S if scenario == "straggler" and rank == STRAGGLER_GPU else 0.0)
        last = per_interval * (i + 1)
        steps = per_interval
        stopped = (scenario == "hung" and i >= HUNG_AFTER) or (scenario == "lost" and i >= LOST_AT)
        if stopped:  # the job hangs: every rank waits for the one that stopped a step earlier
            stop_at = HUNG_AFTER if scenario == "hung" else LOST_AT
            culprit = HUNG_SUSPECT % n_ranks if scenario == "hung" else LOST_GPU % n_ranks
            behind = 1 if rank == culprit else 0
            last = per_interval * stop_at - behind
            end = t - (i - stop_at + 1) - 0.2 - behind * STEP_S
            steps = 0
        out.append(
            RankReading(
                pid=pid,
                rank=rank,
                steps=steps,
                step_s=STEP_S if steps else None,
                step_max=round(STEP_S * 1.05, 6) if steps else None,
                wait_s=round(wait, 6) if steps else None,
                last_step=last,
                last_end=round(end, 6),
            )
        )
    return tuple(out)


def host_cpu(scenario: str, i: int, rng: random.Random) -> float:
    if scenario == "starved":
        return round(rng.uniform(93, 99), 1)
    return round(rng.uniform(20, 40), 1)


def synthetic_sample(
    scenario: str,
    i: int,
    t: float,
    n_gpus: int = 8,
    seed: int = 0,
    pids: tuple[int, ...] = (),
    ranks: bool = False,
) -> Sample:
    """Sample number `i` of `scenario` at time `t`; processes every PROCESS_EVERY samples; with `ranks`,
    one training rank per GPU publishing its steps."""
    scenario = "healthy" if scenario == "balanced" else scenario
    if scenario not in SCENARIOS:
        raise ValueError(f"unknown scenario {scenario!r} (one of {', '.join(SCENARIOS)})")
    rng = random.Random(seed * 1_000_003 + i)
    gpus = []
    for index in range(n_gpus):
        v = gpu_values(scenario, i, index, rng, n_gpus)
        if scenario == "lost" and index == LOST_GPU and i >= LOST_AT:
            gpus.append(GpuReading(index=index, name=NAME, uuid=_uuid(index), state="lost"))
            continue
        gpus.append(
            GpuReading(
                index=index,
                name=NAME,
                uuid=_uuid(index),
                mem_total=MEM_TOTAL,
                power_limit=POWER_LIMIT,
                **v,
            )
        )  # type: ignore[arg-type]
    procs = None
    if i % PROCESS_EVERY == 0:
        procs = tuple(
            ProcReading(
                pid=pids[index] if index < len(pids) else 4100 + index,
                gpu=index,
                gpu_mem=max(0, (gpus[index].mem_used or 0) - 520),
                user="train",
                cpu=round(rng.uniform(95, 105), 1),
                rss=rng.randint(9000, 9400),
                command=f"python train.py --local_rank={index}",
            )
            for index in range(n_gpus)
            if scenario != "idle" and gpus[index].alive
        )
    return Sample(
        t=round(t, 3),
        gpus=tuple(gpus),
        cpu=host_cpu(scenario, i, rng),
        procs=procs,
        ranks=rank_readings(scenario, i, round(t, 3), n_gpus, pids) if ranks else None,
    )


def _uuid(index: int) -> str:
    return f"GPU-{index:08x}-0000-4000-8000-00000000cafe"


def synthetic_run(
    scenario: str,
    n: int,
    n_gpus: int = 8,
    t0: float = 1_700_000_000.0,
    interval: float = 1.0,
    seed: int = 0,
    ranks: bool = False,
) -> list[Sample]:
    return [synthetic_sample(scenario, i, t0 + i * interval, n_gpus, seed, ranks=ranks) for i in range(n)]
