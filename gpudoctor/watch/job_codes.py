"""Finding codes of the job's life under `gpudoctor watch -- COMMAND` (GD920-GD939): arrival, joining,
stalls and crashes. The judgements are in gpudoctor/watch/job.py and gpudoctor/watch/crash.py."""

from __future__ import annotations

from gpudoctor.engine.codes import Code

STEP_API = (
    "the step API (`import gpudoctor` in the script, `with gpudoctor.step():` around each step), which under "
    "watch says when a process joins its process group and where it is in its steps"
)
STACKS = (
    "Where py-spy is installed (`pip install py-spy`) and the kernel lets this user read the process "
    "(same user; kernel.yama.ptrace_scope 0, or root), the message adds each named process's Python stack, "
    "read with `py-spy dump --nonblocking` without stopping it, and what it shows: waiting to join, waiting "
    "in a collective or in backward, or busy in its own code (the line). Where not, it says why."
)

NOT_JOINED = Code(
    "GD920",
    "ranks-not-joined",
    "Ranks have not joined their process group long after they started",
    what="From the process tree (the ranks torchrun started, by the RANK in their environment) and "
    + STEP_API
    + ": ranks alive that have not joined (torch.distributed is not initialised in them) 30 s after they "
    "started (`--join-after`, policy `join-after-s`). The ranks are named, with how long they have been "
    "waiting, the ranks of WORLD_SIZE that are not on this machine, and the ranks that did join. " + STACKS,
    why="Before the first step nothing is printed until a timeout: 30 minutes for gloo and the stores, 10 for "
    "NCCL, 600 s for torchrun's rendezvous (torch/distributed/constants.py, elastic/rendezvous). A rank that "
    "prepares data alone before init_process_group, a node that never started, a wrong MASTER_ADDR or "
    "MASTER_PORT, or a world size larger than the ranks started leave the others waiting silently.",
    fix="Look at what the named ranks are doing (their stacks, their logs). A rank busy before "
    "init_process_group keeps the others waiting: call init_process_group first on every rank, and let "
    "every rank prepare its data (or prepare it once before the job). Ranks of WORLD_SIZE missing here "
    "belong to another node: start it. Set a shorter `init_process_group(timeout=...)` so a hang ends with "
    "an error. Before the run, `gpudoctor lint` finds a MASTER_PORT hard-coded in a torchrun script (GD750), "
    "which sends every rank to a store nobody hosts.",
)

NO_RANK_STARTED = Code(
    "GD921",
    "no-rank-started",
    "torchrun has started no rank: its rendezvous waits for nodes that do not come",
    what="From the process tree: torchrun's agent (`torchrun`, `python -m torch.distributed.run`) has no rank "
    "process 30 s after it started (`--join-after`). Its command line says how many nodes it waits for "
    "(`--nnodes`).",
    why="torchrun's agent starts no rank until its rendezvous has `--nnodes` nodes "
    "(torch/distributed/elastic/agent/server/api.py, `_rendezvous`); with the c10d backend it waits up to "
    "600 s (`join_timeout`) before RendezvousTimeoutError, with the static one it waits for the store. A node "
    "that was never started, a wrong `--rdzv-endpoint`/`--master-addr`, a firewall or a different "
    "`--rdzv-id` leave it waiting with nothing printed.",
    fix="Start torchrun on every node with the same `--nnodes`, `--rdzv-id` and `--rdzv-endpoint` (or "
    "`--master-addr/--master-port` and a distinct `--node-rank`); check that the other nodes reach this "
    "host's port (`nc -zv HOST PORT`); `--nnodes MIN:MAX` lets a job start with fewer nodes.",
)

NO_FIRST_STEP = Code(
    "GD922",
    "no-first-step",
    "Ranks joined their process group but none has reached its first step",
    what="From " + STEP_API + ": ranks that joined their process group have not finished or entered a step "
    "30 s after joining (`--join-after`). The ranks busy in their own code while others wait in a "
    "collective are named first. " + STACKS,
    why="Work that only one rank does before the first collective (rank 0 downloading or tokenizing the "
    "data set, building a cache, loading a checkpoint) keeps the others waiting in their first barrier or in "
    "DDP's parameter broadcast until it ends, or until the collective times out. When the job resumes, the "
    "ranks that were kept waiting must not be blamed for their long first step: gpudoctor compares step "
    "cycles, not only step times (GD909).",
    fix="Let every rank do the same preparation, or prepare once before the job starts; wrap rank-0-only work "
    "so that it ends before the others' first collective times out (`init_process_group(timeout=...)`). A "
    "checkpoint load that legitimately takes longer: raise `--join-after`.",
)

WORLD_SIZE_MISMATCH = Code(
    "GD923",
    "world-size-mismatch",
    "The process group expects other ranks than those started",
    what="Either a rank joined a process group whose world size differs from the WORLD_SIZE its launcher "
    "gave it (from " + STEP_API + "); or every rank the launcher started is alive, none is missing, and "
    "each one's stack shows it waiting in init_process_group 30 s after it started (`--join-after`).",
    why="A world size computed in the script (`torch.cuda.device_count()`, a hard-coded number) or an "
    "explicit rank that is not the launcher's makes the store wait for ranks that were never started; a "
    "MASTER_ADDR/MASTER_PORT set in the script points the ranks at a store nobody hosts. Nothing is printed "
    "until the store's timeout (30 minutes by default): `Timed out after N seconds waiting for clients. "
    "1/2 clients joined.` (TCPStore).",
    fix="Under torchrun call `init_process_group(backend)` without `world_size`/`rank` (env:// reads "
    "torchrun's WORLD_SIZE and RANK), and do not set MASTER_ADDR/MASTER_PORT in the script "
    "(`os.environ.setdefault` if it must run alone too). Before the run, `gpudoctor lint` finds these in the "
    "script: the world size taken from the GPU count (GD751) and a hard-coded MASTER_PORT (GD750).",
)

SPAWN_UNDER_TORCHRUN = Code(
    "GD924",
    "spawn-under-torchrun",
    "An mp.spawn script was launched by torchrun: ranks start ranks of their own",
    what="From the process tree, " + STEP_API + " and the stacks: a rank that torchrun started runs "
    "`torch.multiprocessing.spawn` (its stack), or processes under a rank joined process groups of their "
    "own.",
    why="A script written for `mp.spawn` starts its own processes; under torchrun every worker does, so "
    "N x N processes join process groups meant for N: they mix in one store (an all_reduce summed across "
    "groups), fail with `Gloo connectFullMesh failed`, land two on one GPU (`Duplicate GPU detected`), or "
    "wait on a port nobody hosts (runtime mistakes #4 in the issue's research).",
    fix="Launch an mp.spawn script with `python script.py`, or remove mp.spawn and read the rank from the "
    "environment (`int(os.environ['RANK'])`, `LOCAL_RANK`) when launching with torchrun. Before the run, "
    "`gpudoctor lint --launcher torchrun` finds an mp.spawn call in the script (GD752).",
)

STALL_CULPRIT = Code(
    "GD925",
    "stall-culprit",
    "A stalled job: the rank that holds the others up, and where it is",
    what="When no rank has finished a step for the stall deadline (GD911), " + STEP_API + " tells each "
    "rank's place: inside step N+1 (entered, not left: waiting in a collective or computing) or outside "
    "its step after step N. Ranks outside their step (or behind) while others wait inside the next one are "
    "named as the ones holding the job up; when all are in the same place, all are named with where they "
    "are. " + STACKS + " For NCCL jobs the hint says whether torch's flight recorder is on "
    "(TORCH_NCCL_TRACE_BUFFER_SIZE).",
    why="Every rank of a synchronous job 'stopped after step N' says nothing about which one to look at: "
    "the ranks waiting inside their collective are victims, and the NCCL watchdog kills them all after "
    "10 minutes (30 for gloo) with the same timeout message on every rank. The rank outside its step is "
    "doing something the others are not (evaluation, checkpointing, logging on rank 0, a data loader that "
    "hangs, a deadlock).",
    fix="Look at the named rank's stack and logs: move rank-only work off the step path or make the others "
    "wait for it explicitly (a barrier with a long timeout), fix a hanging data loader (num_workers=0 to "
    "test). For NCCL, set TORCH_NCCL_TRACE_BUFFER_SIZE=2000 and TORCH_NCCL_DUMP_ON_TIMEOUT=1: at the "
    "watchdog timeout each rank dumps its recent collectives (flight recorder; `torchfrtrace` reads them; "
    "https://pytorch.org/tutorials/prototype/flight_recorder_tutorial.html).",
)

UNEVEN_STEPS = Code(
    "GD926",
    "uneven-steps",
    "Ranks ran different numbers of steps: uneven inputs",
    what="From " + STEP_API + ": a rank ended its loop and exited normally (outside its step) while "
    "another rank went on to a later step.",
    why="In DDP every step's backward all-reduces gradients across all ranks. A rank with fewer batches "
    "(a data set split unevenly, `drop_last=False` with custom sharding, an IterableDataset without "
    "balancing) finishes first; the others wait for it in their next all-reduce and hang, or fail with "
    "`Connection closed by peer ... This is typically caused by a remote worker crashing` (gloo) although "
    "the rank that left did not crash.",
    fix="Give every rank the same number of batches: DistributedSampler (it pads to an even split), "
    "`drop_last=True`, or the same number of steps on every rank; for inputs that are uneven by nature use "
    "`with model.join():` (DistributedDataParallel.join, 'Context manager for training with uneven "
    "inputs across processes in DDP', https://pytorch.org/docs/stable/generated/"
    "torch.nn.parallel.DistributedDataParallel.html).",
)

RANK_FAILED = Code(
    "GD927",
    "rank-failed",
    "A rank failed: the first one, and why",
    what="When the followed command ends with a non-zero exit, gpudoctor names the first rank that failed: "
    "from torchrun's failure summary (`Root Cause (first observed failure)`, with its rank, exit code and, "
    "where the script uses `@record`, the error file torchrun writes to TORCHELASTIC_ERROR_FILE), from "
    "mp.spawn's `Process N terminated with the following error`, or else the first rank that exited with an "
    "uncaught exception (" + STEP_API + "). It classifies that rank's error from its own output (the "
    "`[rankN]:` lines torch prefixes, or the traceback) with the classifier gpudoctor's own ranks use "
    "(gpudoctor/knowledge/known_errors.py: out of memory, unused parameters, port in use, invalid device "
    "ordinal, duplicate GPU, NCCL errors, timeouts, a rank killed by SIGKILL, sampler misuse, a C++ abort "
    "(std::terminate) such as torch's gloo ranks meet at exit) and gives that error's fix.",
    why="When one rank fails, torchrun stops the others (SIGTERM) and every rank's output ends in errors: "
    "the cause is in one rank's lines, buried among the victims' (`Connection closed by peer`, timeouts, "
    "SIGTERM).",
    fix="The fix depends on the error: the verdict's hint gives it. A rank that failed because another went "
    "away (a victim) points at that other rank: its own output, or uneven inputs (GD926). Two of these "
    "errors are visible in the script before it runs, and `gpudoctor lint` finds them: port in use from a "
    "hard-coded MASTER_PORT (GD750), invalid device ordinal from the global rank used as the device index "
    "(GD753).",
)

JOB_CODES: list[Code] = [
    NOT_JOINED,
    NO_RANK_STARTED,
    NO_FIRST_STEP,
    WORLD_SIZE_MISMATCH,
    SPAWN_UNDER_TORCHRUN,
    STALL_CULPRIT,
    UNEVEN_STEPS,
    RANK_FAILED,
]
