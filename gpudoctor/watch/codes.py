"""Finding codes of the watch verdicts (area GD9). Must not import textual."""

from __future__ import annotations

from gpudoctor.engine.codes import Code
from gpudoctor.watch import data_codes
from gpudoctor.watch.job_codes import JOB_CODES

STRAGGLER = Code(
    "GD901",
    "straggler",
    "One GPU runs steadily below (or above) the others",
    what="Over a sliding window (30 s by default), compares each GPU's utilization with the median of the "
    "other GPUs. A GPU that stays at least 15 points away from that median in 80% of the samples is named.",
    why="In data-parallel training every step waits for the slowest rank, so one slow GPU sets the pace of "
    "the whole job. A GPU that is steadily lower is usually starved or slowed (throttling, a PCIe link "
    "trained down, a busy neighbour process); one that is steadily higher does more work than the rest "
    "(uneven shards, extra logging or evaluation on that rank) while the others wait for it in collectives.",
    fix="Look at the named GPU's row: throttle reasons, power and clocks, PCIe rx/tx, and other processes on "
    "it in the process table. Check that every rank gets the same batch size and data shard, and that "
    "rank-0-only work (logging, checkpointing, evaluation) is short or moved off the step path.",
)

MEMORY_IMBALANCE = Code(
    "GD902",
    "memory-imbalance",
    "One GPU holds much more memory than the others",
    what="Over the window, compares each GPU's mean memory use with the median of the others: a GPU holding "
    "at least 15% of its total memory more, and 1.25 times the median, is named.",
    why="The extra memory on one GPU (usually GPU 0) is the torch.nn.DataParallel pattern, a model or an "
    "evaluation copy kept on cuda:0, or every rank creating a CUDA context on GPU 0. That GPU runs out of "
    "memory first and caps the batch size of every rank.",
    fix="Use DistributedDataParallel with one process per GPU and call `torch.cuda.set_device(local_rank)` "
    "before any CUDA work; load checkpoints with `map_location=f'cuda:{local_rank}'` (or 'cpu'); keep "
    "evaluation models off GPU 0 or shard the evaluation too.",
)

INPUT_STARVATION = Code(
    "GD903",
    "input-starvation",
    "All GPUs wait together while the CPUs are saturated",
    what="Counts the samples in the window where utilization drops below 50% on every GPU at the same time; "
    "when that happens in 30% of the window and the host CPUs are at least 85% busy during those dips, the "
    "input pipeline is the bottleneck.",
    why="The GPUs finish their step and wait for the next batch: the job runs at the speed of data loading "
    "and augmentation on the CPU, and more GPUs will not make it faster.",
    fix="Give the DataLoader more workers (`num_workers`, up to the cores per GPU), use `pin_memory=True` and "
    "`persistent_workers=True`, move decoding/augmentation to the GPU (e.g. DALI, torchvision v2 on "
    "tensors), pre-process the data set once, or use a faster storage path.",
)

HUNG_COLLECTIVE = Code(
    "GD904",
    "hung-collective",
    "GPUs spin at 100% utilization at near-idle power: a collective is waiting",
    what="Looks for GPUs whose utilization stays at 95% or more while their power stays below 25% of the "
    "power limit for 20 s or longer. That is an NCCL kernel spinning while it waits for a peer. A GPU that "
    "is not spinning at the same time is named as the suspect.",
    why="A rank that never reaches the collective (crashed, deadlocked, stuck in I/O, or on a failing GPU) "
    "makes every other rank spin until the NCCL watchdog kills the job, often after 30 minutes "
    "(TORCH_NCCL timeout 1800000 ms) with nothing learned in between.",
    fix="Look at the suspect GPU's process (py-spy dump --pid PID shows its Python stack), check the logs of "
    "that rank, and look for XID errors. Set a shorter timeout in `init_process_group(timeout=...)` and "
    "`TORCH_NCCL_ASYNC_ERROR_HANDLING=1` so a hang ends with an error; NCCL_DEBUG=INFO and the NCCL RAS "
    "port (2.24+) show which rank is missing.",
)

THERMAL_THROTTLE = Code(
    "GD905",
    "thermal-throttle",
    "A GPU lowers its clocks because it is too hot",
    what="Reads NVML's clock event (throttle) reasons each sample: software or hardware thermal slowdown, "
    "or a hardware slowdown, active in at least half of the window.",
    why="A throttled GPU computes slower than its peers, so it becomes the straggler that the whole "
    "data-parallel job waits for.",
    fix="Check the GPU's temperature and fan/airflow (blocked intake, failed fan, hot aisle), the data "
    "centre cooling, and whether neighbouring cards in a tight chassis heat each other. Persistent hardware "
    "slowdown on one GPU is a case for the hardware vendor.",
)

POWER_THROTTLE = Code(
    "GD906",
    "power-throttle",
    "A GPU lowers its clocks to stay within its power limit",
    what="Reads NVML's clock event reasons: software power cap or hardware power brake active in at least "
    "half of the window.",
    why="A GPU capped below its peers' power limit runs slower than they do and sets the pace of the job; a "
    "power brake is a signal from the board or the PSU that power delivery is failing.",
    fix="Compare the GPU's power limit with the others (`nvidia-smi -q -d POWER`); restore it with "
    "`nvidia-smi -i N -pl WATTS` (root). A hardware power brake points at the PSU or the board: report "
    "it to the hardware vendor.",
)

XID_EVENT = Code(
    "GD907",
    "xid-event",
    "NVML reported an XID error on a GPU",
    what="Registers for NVML's XID critical-error events while watching and reports every XID with the GPU "
    "that raised it.",
    why="XIDs are the driver's error reports: 13/43 are application faults (an illegal memory access), "
    "while 48, 63/64, 74, 79, 94/95 and others are hardware or link faults (double-bit ECC error, row "
    "remapping, NVLink error, GPU fallen off the bus) that hang or crash a multi-GPU job.",
    fix="Look the number up in NVIDIA's XID catalogue. For application XIDs fix the code (run with "
    "CUDA_LAUNCH_BLOCKING=1 to find the kernel). For hardware XIDs drain the node, reset the GPU "
    "(`nvidia-smi -r`) or reboot, and run `gpudoctor check`; repeated ones mean an RMA.",
)

GPU_LOST = Code(
    "GD908",
    "gpu-lost",
    "A GPU stopped answering NVML while being watched",
    what="A GPU whose NVML calls return GPU_IS_LOST is marked lost; the other GPUs go on being watched.",
    why="A lost GPU (often XID 79, 'fallen off the bus') takes its rank down, and with it the whole "
    "collective: the other ranks hang until the watchdog fires.",
    fix="Stop the job, check `dmesg` for XID 79 or PCIe errors, reset the GPU or reboot the node, then run "
    "`gpudoctor check` before restarting. A GPU that keeps falling off the bus needs service.",
)

SLOW_RANK = Code(
    "GD909",
    "slow-rank",
    "One training rank is slower than the others, by its step times",
    what="Reads the step records that `gpudoctor.step()` publishes from each rank (step time, time spent "
    "waiting for input, when each step ended). A rank is named when, over the window, its steps take at least "
    "1.2 times the median of the others' (ranks that do not synchronize every step); or it finishes each step "
    "later than the others by at least 10% of the step time (ranks that synchronize: the others then wait for "
    "it in the next collective); or it alone spends at least 20% of its steps waiting for input, twice the "
    "others' median. These thresholds are gpudoctor's heuristics.",
    why="In synchronous data parallel every step waits for the slowest rank: the others' step times equal its "
    "own, and what they lose is hidden inside their collectives. GPU utilization alone cannot tell which rank "
    "it is (a GPU spinning in an NCCL kernel also reads 100%); when a rank ends its steps late, or waits for its "
    "data while the others do not, it is the one the job waits for.",
    fix="Look at what that rank does that the others do not: rank-0-only logging, evaluation or checkpointing "
    "on the step path (move it off, or make it asynchronous), a bigger shard or longer sequences on that rank, "
    "a slower data source or fewer DataLoader workers for it, or its GPU (throttling, PCIe link: see its row "
    "and `gpudoctor check`).",
)

INPUT_WAIT = Code(
    "GD910",
    "input-wait",
    "The ranks spend a large share of each step waiting for input",
    what="From the step records of `gpudoctor.step()` (context-manager or iterator form, or step(input_wait=)): "
    "the median rank spends at least 25% of its step time waiting for the next batch over the window (a "
    "heuristic threshold).",
    why="Time spent waiting for input is time every GPU of the job sits idle; adding GPUs will not make it "
    "faster. Unlike the utilization-based GD903 this is measured in the training loop itself, so it holds on "
    "any device and whatever else shares the CPUs.",
    fix="Give the DataLoader more workers (`num_workers`), `pin_memory=True`, `persistent_workers=True` and a "
    "`prefetch_factor`; move decoding and augmentation to the GPU; pre-process the data set once; read from "
    "faster storage. The host line (CPU, load, RAM, swap) shows whether the host itself is saturated.",
)

STEPS_STALLED = Code(
    "GD911",
    "steps-stalled",
    "No rank has finished a training step for a long time: the job is hung",
    what="From the step records of `gpudoctor.step()`: no rank has finished a step for the deadline (`--hang-after`, "
    "by default 60 s or 10 times the recent median step time, whichever is longer). The ranks whose last step is "
    "behind the others' are named; when all stopped after the same step, all are.",
    why="A rank that never reaches a collective (crashed, deadlocked, stuck in I/O) makes every other rank wait "
    "until the NCCL watchdog kills the job, often after 30 minutes, with nothing learned in between. Step records "
    "see the hang on any device, also where GPU power readings cannot (CPU ranks, gloo).",
    fix="Dump the stacks of the named ranks (`py-spy dump --pid PID`) and read their logs; a rank behind the "
    "others is usually the one that stopped first. Set a shorter `init_process_group(timeout=...)` and "
    "`TORCH_NCCL_ASYNC_ERROR_HANDLING=1` so a hang ends with an error. A checkpoint or evaluation that "
    "legitimately takes longer than the deadline: raise `--hang-after`.",
)

CODES: list[Code] = [
    STRAGGLER,
    MEMORY_IMBALANCE,
    INPUT_STARVATION,
    HUNG_COLLECTIVE,
    THERMAL_THROTTLE,
    POWER_THROTTLE,
    XID_EVENT,
    GPU_LOST,
    SLOW_RANK,
    INPUT_WAIT,
    STEPS_STALLED,
]
CODES += JOB_CODES  # the job's life: arrival, stalls, crashes (GD920-GD939, watch/job_codes.py)

# The job's data, numerics and resources (GD940-GD949) are written in their own module.
CODES += data_codes.CODES
