"""The codes of `gpudoctor lint` (area 7, DDP; 750-799 the training script), each with what the
rule looks for, why it breaks a multi-GPU job (citing the PyTorch documentation or the issue
that establishes it) and how to fix it. `gpudoctor explain GD75x` and docs/checks/ read them.

A rule's severity says how wrong the code is, and sets its finding's status:
error -> `fail` (the job crashes, hangs, or trains on the wrong data or gradients), warning ->
`warn` (wrong under common conditions: a second node, a second job, a resume), info -> `pass`
with `evidence.severity = "info"` (correct but slow, or a best practice): an info finding never
changes the exit code, as a `pass` of `check` does not. The research behind each rule, with the
traps a detector must not fall into: tests/reference/lint/rules.md.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpudoctor.engine.codes import Code

ERROR, WARNING, INFO = "error", "warning", "info"


@dataclass(frozen=True)
class Rule:
    code: Code
    severity: str  # the usual severity; a rule may raise or lower it per finding (GD750)
    hint: str  # one line: the fix, as the text output prints it under the finding

    @property
    def name(self) -> str:
        return self.code.name


_TORCHRUN_DOC = "https://docs.pytorch.org/docs/stable/elastic/run.html"
_DDP_DOC = "https://docs.pytorch.org/docs/stable/generated/torch.nn.parallel.DistributedDataParallel.html"
_SAMPLER_DOC = "https://docs.pytorch.org/docs/stable/data.html#torch.utils.data.distributed.DistributedSampler"
_DDP_TUTORIAL = "https://docs.pytorch.org/tutorials/intermediate/ddp_tutorial.html"

MASTER_PORT = Code(
    "GD750",
    "master-port-hardcoded",
    "The script does not hard-code MASTER_PORT",
    what="Looks for a literal port written into the rendezvous address: `os.environ['MASTER_PORT'] = '12355'` "
    "(also `os.environ.update(...)`, `os.putenv`), `init_process_group(init_method='tcp://host:PORT')` and "
    "`TCPStore(host, PORT)` with a literal port. `os.environ.setdefault(...)`, an assignment under "
    "`if 'MASTER_PORT' not in os.environ:` and a port from a variable or argument are not flagged. An error "
    "when the script is run by torchrun (`--launcher torchrun`, or torchrun's variables read by the script), "
    "a warning otherwise.",
    why="A second job on the host, or a leftover process of the last one, already listens on that port: "
    "`DistNetworkError ... EADDRINUSE` (pytorch/pytorch#126510: 'Typically it's another torch run on the same "
    "machine already occupying the port'). Under torchrun it is worse: torchrun already exported MASTER_PORT "
    "and hosts the store itself; the overwrite sends every rank to a port nobody listens on and the job hangs "
    f"in init_process_group until the timeout. torchrun's documentation ({_TORCHRUN_DOC}): 'The environment "
    "variables necessary to initialize a Torch process group are provided to you by this module'.",
    fix="Under torchrun: delete the line (choose the port with `torchrun --master-port` or `--standalone`). Under "
    "mp.spawn: `os.environ.setdefault('MASTER_PORT', '12355')`, or bind a socket to port 0 in the parent "
    "before mp.spawn and pass the free port it got to the workers.",
)

WORLD_SIZE = Code(
    "GD751",
    "world-size-from-device-count",
    "The world size is not the local GPU count",
    what="Follows `torch.cuda.device_count()` (or `torch.accelerator.device_count()`): its value itself reaching "
    "`init_process_group(world_size=...)` or `DistributedSampler(num_replicas=...)` in a torchrun script or "
    "outside an mp.spawn worker, and `mp.spawn(..., nprocs=device_count() * nodes)`. The single-node spawn "
    "pattern (`nprocs = world_size = device_count()`) and a product that goes to world_size while nprocs "
    "stays per node are not flagged.",
    why="device_count() counts the GPUs of this node; the world spans every node. A wrong world size makes "
    "the store wait for ranks that never come ('Timed out ... waiting for clients. 1/2 clients joined'), and "
    "spawning the whole world's processes on each machine numbers them 0..N-1 on every node. torchrun's "
    f"documentation ({_TORCHRUN_DOC}): 'WORLD_SIZE - The world size (total number of workers in the job)'.",
    fix="Under torchrun: `init_process_group(backend)` with no rank or world_size (env://). Under mp.spawn on "
    "several nodes: `nprocs = torch.cuda.device_count()`, `world_size = nprocs * nnodes`, "
    "`rank = node_rank * nprocs + local_index` (as pytorch/examples imagenet/main.py does).",
)

SPAWN_UNDER_TORCHRUN = Code(
    "GD752",
    "spawn-under-torchrun",
    "A script that starts its workers with mp.spawn is not run by torchrun",
    what="With `--launcher torchrun` (how the script is run): any `mp.spawn`/`start_processes` call. Without "
    "it: an unconditional `mp.spawn` in a script that also reads torchrun's variables (LOCAL_RANK, RANK, "
    "WORLD_SIZE) unconditionally, in the parent or in the spawned function. Two modes chosen by flags "
    "(imagenet's `--multiprocessing-distributed`) are not flagged.",
    why="torchrun already starts N processes and each then spawns N more: N x N processes share N GPUs, each "
    "group numbers its ranks 0..N-1 against one store, and the job hangs or dies before step 1. torchrun's "
    f"documentation ({_TORCHRUN_DOC}): it 'spawns up multiple distributed training processes on each of the "
    "training nodes'; the DDP tutorial: 'create a single DDP instance per process'.",
    fix="Pick one launcher: `python script.py` with mp.spawn, or remove mp.spawn and read LOCAL_RANK, RANK and "
    "WORLD_SIZE under torchrun (pytorch/examples' ddp-tutorial-series shows both: multigpu.py and "
    "multigpu_torchrun.py).",
)

GLOBAL_RANK_DEVICE = Code(
    "GD753",
    "global-rank-as-device",
    "The CUDA device index is the local rank, not the global rank",
    what="Follows the global rank (`os.environ['RANK']`, `dist.get_rank()`, SLURM_PROCID, through variables, "
    "`int()` and in-file calls) into a device choice: `set_device(rank)`, `set_device_index(rank)`, "
    "`.to(rank)`, `.cuda(rank)`, `f'cuda:{rank}'`, `torch.device('cuda', rank)`, `DDP(device_ids=[rank])`, "
    "`FSDP(device_id=rank)`. One finding per source, at the first device choice it reaches, the others "
    "listed. LOCAL_RANK, the mp.spawn process index and `rank % device_count()` are not flagged.",
    why="On the second node the global rank exceeds the local GPU count: 'CUDA error: invalid device ordinal'. "
    "On one node it happens to work, so the bug ships. torchrun's documentation "
    f"({_TORCHRUN_DOC}): 'the device_ids needs to be [int(os.environ(\"LOCAL_RANK\"))]' and 'RANK is NOT "
    "stable ... NEVER hard code any assumptions about ... some correlation between RANK and LOCAL_RANK'; "
    "meta-llama/llama-cookbook#90 reports this exact mistake.",
    fix="Use LOCAL_RANK (`int(os.environ['LOCAL_RANK'])`) for every device choice; keep the global rank for "
    "init_process_group, logging and rank-0 guards.",
)

NO_DIST_SAMPLER = Code(
    "GD754",
    "no-distributed-sampler",
    "Every training DataLoader of a DDP script shards the data across ranks",
    what="In a DDP script (a process group, DDP or FSDP, or a DistributedSampler in the file), each DataLoader "
    "run on every rank must get a DistributedSampler (or a sampler or dataset that shards by rank). Flags a "
    "DataLoader with no sampler or a non-distributed one (RandomSampler, WeightedRandomSampler, ...), and "
    "says so when a DistributedSampler was built but never passed. Not flagged: loaders under a rank-0 "
    "guard, evaluation loaders (named val/test/eval), datasets built from the rank or world size, and "
    "scripts that leave the loaders to accelerate.",
    why="DDP does not split the data: every rank iterates the whole dataset, so an epoch is N copies of the "
    "data and the effective batch N times the one intended, silently. The DDP documentation "
    f"({_DDP_DOC}): 'DistributedDataParallel does not chunk or otherwise shard the input across "
    "participating GPUs; the user is responsible for defining how to do so, for example through the use of "
    "a DistributedSampler'.",
    fix="`DataLoader(ds, sampler=DistributedSampler(ds), shuffle=False, ...)` (and call "
    "`sampler.set_epoch(epoch)` each epoch), or let `accelerator.prepare` shard the loader.",
)

SET_EPOCH = Code(
    "GD755",
    "sampler-set-epoch-missing",
    "A shuffling DistributedSampler gets set_epoch each epoch",
    what="A DistributedSampler that shuffles (shuffle not literally False) and reaches a DataLoader, in a "
    "script (or the files linted with it that import each other) where nothing calls `set_epoch`.",
    why="The sampler seeds its permutation with seed + epoch; without set_epoch every epoch repeats epoch 0's "
    f"order on every rank. The DistributedSampler documentation ({_SAMPLER_DOC}): 'calling the set_epoch() "
    "method at the beginning of each epoch before creating the DataLoader iterator is necessary to make "
    "shuffling work properly across multiple epochs. Otherwise, the same ordering will be always used.'",
    fix="`sampler.set_epoch(epoch)` at the top of each epoch, before iterating the loader "
    "(`loader.sampler.set_epoch(epoch)` when only the loader is at hand).",
)

RANDOM_SPLIT = Code(
    "GD756",
    "random-split-no-generator",
    "random_split draws the same split on every rank",
    what="A `torch.utils.data.random_split` without a `generator=`, run on every rank of a distributed script "
    "(a Lightning Trainer not pinned to one device counts: it calls a DataModule's setup() on every rank), "
    "with no seeding call (`torch.manual_seed`, `set_seed`, `seed_everything`) before it on every path, or "
    "one whose seed depends on the rank.",
    why="Each process's default generator starts from its own seed, so each rank draws a different split: "
    "rank A's validation samples are in rank B's training set, the model trains on validation data and the "
    "reported metric is inflated. Lightning-AI/pytorch-lightning#7728: 'When random_split() is called in "
    "setup() on MultiGPU, it assigns a different random split to each GPU, leading to overlap between the "
    "validation and train sets.' The random_split documentation shows the fix: "
    "'generator=torch.Generator().manual_seed(42)'.",
    fix="`random_split(ds, lengths, generator=torch.Generator().manual_seed(SEED))` with the same SEED on every "
    "rank, or split once before starting the workers and pass the subsets (or save the indices).",
)

RANK_WRITE = Code(
    "GD757",
    "unguarded-rank-write",
    "Checkpoints and metrics are written by one rank",
    what="In a distributed script, a write to a file that runs on every rank: `torch.save`, `open(path, 'w')`, "
    "`np.save`, `Path.write_text`, `shutil.copyfile`, `to_csv`, a TensorBoard `SummaryWriter`, "
    "`wandb.init`, `mlflow.start_run`. Not flagged: writes under a rank-0 guard (`if rank == 0`, "
    "`if dist.get_rank() == 0`, `is_main_process`, an early `if rank != 0: return`, a function whose every "
    "in-file caller is guarded), destinations that embed the rank, in-memory buffers, accelerate's and "
    "torch.distributed.checkpoint's savers, and functions with no caller in the file.",
    why="N processes write the same file at once: a truncated or corrupt checkpoint, a reader racing the "
    "writer, N wandb runs and N TensorBoard files with the same curves. The DDP tutorial "
    f"({_DDP_TUTORIAL}, 'Save and Load Checkpoints'): 'save the model in only one process and then load it "
    "to all processes ... make sure no process starts loading before the saving is finished.'",
    fix="Guard the write with `if dist.get_rank() == 0:` (or your global-rank-0 test) and call "
    "`dist.barrier()` before any rank reads it back; or use torch.distributed.checkpoint.",
)

LOAD_MAP_LOCATION = Code(
    "GD758",
    "torch-load-no-map-location",
    "torch.load says where the tensors go",
    what="In a distributed script, a `torch.load` (or `torch.jit.load`, `torch.hub.load_state_dict_from_url`) "
    "with no `map_location`, run on every rank. `weights_only=True` does not change where tensors go and "
    "does not silence it. Not flagged: loads under a rank-0 guard, a load whose other branch of the same "
    "`if` gives map_location, calls with `**kwargs`. Lint cannot tell a file saved from a GPU from one saved "
    "from the CPU (a cached dataset): `map_location='cpu'` costs nothing and says it.",
    why="Tensors are restored to the device they were saved from, usually cuda:0, so every rank puts the "
    "checkpoint on GPU 0: memory piles up there, OOM, or ranks computing on the wrong GPU. The DDP tutorial "
    f"({_DDP_TUTORIAL}): 'If map_location is missing, torch.load will first load the module to CPU and then "
    "copy each parameter to where it was saved, which would result in all processes on the same machine "
    "using the same set of devices'; pytorch/examples#969.",
    fix="`torch.load(path, map_location='cpu')` then `load_state_dict`, or `map_location=f'cuda:{local_rank}'`.",
)

DDP_DEVICE_IDS = Code(
    "GD759",
    "ddp-no-device-ids",
    "A DDP model on the default GPU is placed on this rank's GPU",
    what="A `DistributedDataParallel(model)` without `device_ids` whose model was last moved with `.cuda()` "
    "(no index) or `.to('cuda')`, with no `torch.cuda.set_device` (or `set_device_index`) before it on every "
    "path, in the function or in every caller. Not flagged: `device_ids` given, `device_mesh=`, models never "
    "moved in the file, multi-device modules, CPU/gloo models.",
    why="`.cuda()` without an index means the current device, GPU 0 in every process until set_device runs: "
    "all ranks of a node put their replica on GPU 0 (OOM, or NCCL's 'Duplicate GPU detected : rank 1 and "
    "rank 0 both on CUDA device'). pytorch/examples#1142: 'The recommended best practice to avoid hangs and "
    "high memory utilization on GPU:0 is to set_device(i)'; the DDP documentation "
    f"({_DDP_DOC}): with device_ids None 'the actual module must be placed on the correct device'.",
    fix="`torch.cuda.set_device(local_rank)` before creating the model, then `model.to(local_rank)` and "
    "`DDP(model, device_ids=[local_rank])`.",
)

ACCUMULATION_NO_SYNC = Code(
    "GD760",
    "grad-accum-no-sync",
    "Gradient accumulation under DDP skips the all-reduce of the micro-batches",
    what="In a DDP (or accelerate) training loop: a backward every iteration and an optimizer step only every "
    "k-th (`if step % k == 0`), with no `model.no_sync()`, `require_backward_grad_sync` or "
    "`accelerator.accumulate(model)` in the function. Info: the result is correct.",
    why="DDP all-reduces the gradients on every backward, k times per optimizer step instead of once. The "
    "no_sync documentation: 'Context manager to disable gradient synchronizations across DDP processes'; "
    "accelerate's gradient accumulation guide: 'standard gradient accumulation code would work fine in a "
    "distributed setup, it is not the most efficient method ... you may experience considerable slowdowns!'",
    fix="`ctx = model.no_sync() if (i + 1) % k else contextlib.nullcontext()` around forward and backward; with "
    "accelerate, `Accelerator(gradient_accumulation_steps=k)` and `with accelerator.accumulate(model):`.",
)

CLIP_BEFORE_UNSCALE = Code(
    "GD761",
    "clip-before-unscale",
    "Gradients are unscaled before they are clipped",
    what="With a GradScaler: `scaler.scale(loss).backward()`, then `clip_grad_norm_`/`clip_grad_value_`, then "
    "`scaler.step(...)`, with no `scaler.unscale_(optimizer)` between the backward and the clip.",
    why="The gradients are still multiplied by the loss scale (65536 at the start), so their norm is about "
    "that many times too large: the clip fires on every step and shrinks the update by the scale factor. "
    "The GradScaler.unscale_ documentation shows the order: 'scaler.scale(loss).backward(); "
    "scaler.unscale_(optimizer); torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm); "
    "scaler.step(optimizer)'; pytorch/examples#1196 reports it in minGPT-ddp.",
    fix="`scaler.unscale_(optimizer)` right before the clip, then `scaler.step(optimizer)` and `scaler.update()`.",
)

DATA_PARALLEL = Code(
    "GD762",
    "data-parallel",
    "Multi-GPU training uses DistributedDataParallel, not nn.DataParallel",
    what="A `torch.nn.DataParallel(...)` construction in a script that builds no DistributedDataParallel "
    "(where it does, DataParallel is a fallback chosen by flags). Info.",
    why="DataParallel is one process with a thread per GPU: it replicates the model every iteration, gathers "
    "outputs on GPU 0 and is bound by the GIL. Its documentation: 'It is recommended to use "
    "DistributedDataParallel, instead of this class, to do multi-GPU training, even if there is only a "
    "single node.'",
    fix="DistributedDataParallel with one process per GPU, launched by torchrun.",
)

BATCHNORM_SYNC = Code(
    "GD763",
    "batchnorm-no-syncbn",
    "BatchNorm under DDP at a small per-GPU batch is synchronised",
    what="A DDP script whose model classes build `nn.BatchNorm1d/2d/3d`, with no SyncBatchNorm anywhere, and a "
    "training DataLoader whose batch size (a literal or an argparse default) is 16 or less per GPU. An "
    "unknown batch size, or BatchNorm inside library models, gives no finding. Info; the threshold of 16 "
    "is a heuristic.",
    why="Each rank normalises with the statistics of its own per-GPU batch; DDP only broadcasts rank 0's "
    "running buffers. Small batches give noisy estimates: 'BN's error increases rapidly when the batch size "
    "becomes smaller' (Wu and He, Group Normalization, arXiv:1803.08494). The SyncBatchNorm documentation: "
    "'Use torch.nn.SyncBatchNorm.convert_sync_batchnorm() to convert BatchNorm*D layer to SyncBatchNorm "
    "before wrapping Network with DDP.'",
    fix="`model = nn.SyncBatchNorm.convert_sync_batchnorm(model)` before wrapping it in DDP, or GroupNorm.",
)

UNREADABLE = Code(
    "GD799",
    "script-unreadable",
    "The script can be read and parsed",
    what="Every file lint is given is read (a regular file, at most 2 MiB, its encoding as Python reads it) "
    "and parsed with Python's `ast`; a file that cannot be is this finding, with Python's message and line. "
    "The other files are still linted. Like a check that crashed, it is never hidden by --select or "
    "--ignore.",
    why="A file that does not parse proved nothing: none of the other rules looked at it, so lint cannot call "
    "it clean. Code copied from a web page often loses its indentation or carries non-breaking spaces.",
    fix="Fix the syntax error at the line shown (`python -m py_compile FILE` says the same), or leave the "
    "file out of the paths you lint.",
)

RULES: tuple[Rule, ...] = (
    Rule(
        MASTER_PORT, WARNING, "under torchrun delete the line; under mp.spawn use os.environ.setdefault or a free port"
    ),
    Rule(WORLD_SIZE, ERROR, "world size = GPUs per node x nodes; nprocs = GPUs per node"),
    Rule(SPAWN_UNDER_TORCHRUN, ERROR, "pick one launcher: python + mp.spawn, or torchrun without mp.spawn"),
    Rule(GLOBAL_RANK_DEVICE, WARNING, "choose the device with LOCAL_RANK: int(os.environ['LOCAL_RANK'])"),
    Rule(NO_DIST_SAMPLER, ERROR, "DataLoader(ds, sampler=DistributedSampler(ds), shuffle=False, ...)"),
    Rule(SET_EPOCH, WARNING, "call sampler.set_epoch(epoch) at the start of every epoch"),
    Rule(RANDOM_SPLIT, WARNING, "random_split(ds, lengths, generator=torch.Generator().manual_seed(SEED))"),
    Rule(RANK_WRITE, WARNING, "write under `if dist.get_rank() == 0:` and dist.barrier() before reading it back"),
    Rule(LOAD_MAP_LOCATION, WARNING, "torch.load(path, map_location='cpu') or map_location=f'cuda:{local_rank}'"),
    Rule(DDP_DEVICE_IDS, WARNING, "torch.cuda.set_device(local_rank) first; DDP(model, device_ids=[local_rank])"),
    Rule(ACCUMULATION_NO_SYNC, INFO, "wrap the micro-batches that do not step in model.no_sync()"),
    Rule(CLIP_BEFORE_UNSCALE, ERROR, "scaler.unscale_(optimizer) right before clipping"),
    Rule(DATA_PARALLEL, INFO, "use DistributedDataParallel, one process per GPU (torchrun)"),
    Rule(BATCHNORM_SYNC, INFO, "nn.SyncBatchNorm.convert_sync_batchnorm(model) before DDP(model)"),
)
UNREADABLE_RULE = Rule(UNREADABLE, ERROR, "fix the file or leave it out of the paths you lint")

BY_NAME = {r.name: r for r in (*RULES, UNREADABLE_RULE)}
BY_CODE = {r.code.code: r for r in (*RULES, UNREADABLE_RULE)}
CODES: tuple[Code, ...] = tuple(r.code for r in (*RULES, UNREADABLE_RULE))
