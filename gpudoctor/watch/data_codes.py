"""Finding codes of the job's data, numerics and resources (GD940-GD949), judged by `gpudoctor watch`
from what the ranks send (gpudoctor.watch_loader, gpudoctor.step(loss=, samples=)) and NVML's process
list. Sources quoted in tests/reference/job_data.md. Must not import textual."""

from __future__ import annotations

from gpudoctor.engine.codes import Code

DATA_NOT_SHARDED = Code(
    "GD940",
    "data-not-sharded",
    "Several ranks train on the same samples: the data is not split across ranks",
    what="From the sample indices each rank reads (gpudoctor.watch_loader, or step(samples=, epoch=)): within one "
    "epoch, ranks whose first indices are identical, or that share with other ranks more sampled indices than "
    "DistributedSampler's padding can repeat (world size - 1) and at least 5% of their sample (a heuristic floor). "
    "DistributedSampler's shards never overlap apart from that padding, and the sample of indices kept per epoch "
    "(a coordinated hash sample, see docs/watch.md) finds an overlap only where there is one. Judged within the "
    "first epoch, on partial epochs too.",
    why="DistributedDataParallel 'does not chunk or otherwise shard the input across participating GPUs; the user "
    "is responsible for defining how to do so, for example through the use of a DistributedSampler' (torch "
    "docs, DistributedDataParallel). Without it (or with a DistributedSampler built but not passed to the "
    "DataLoader, or a WeightedRandomSampler in its place) every rank iterates the whole data set: an epoch "
    "costs world-size times the compute for the data of one rank, and identical batches on all ranks make the "
    "all-reduced gradient the gradient of one batch.",
    fix="Pass a `DistributedSampler(dataset)` as the DataLoader's `sampler=` (and drop `shuffle=True` there, "
    "the sampler shuffles), or shard the data yourself (a Subset per rank, or per-rank files). Ranks meant to "
    "read the same batches (tensor or pipeline parallel groups) are not a mistake: watch only the "
    "data-parallel ranks' loaders. Its static twin: `gpudoctor lint train.py` finds a DataLoader without a "
    "DistributedSampler in the script before it runs (GD754 no-distributed-sampler).",
)

SAME_ORDER_EVERY_EPOCH = Code(
    "GD941",
    "same-order-every-epoch",
    "A rank reads its samples in the same order every epoch: set_epoch() is not called",
    what="Compares the first 32 indices a rank reads in each epoch with those of its first epoch; identical and not "
    "in ascending order (shuffling was wanted) is the same shuffled order again. The DistributedSampler's own "
    "`epoch` attribute, unchanged since the first epoch, is quoted when the sampler has one. Called at the start "
    "of the second epoch.",
    why="DistributedSampler seeds its shuffle with `seed + epoch`. Its documentation warns: 'calling the "
    ":meth:`set_epoch` method at the beginning of each epoch before creating the DataLoader iterator is "
    "necessary to make shuffling work properly across multiple epochs. Otherwise, the same ordering will be "
    "always used.' Every epoch then shows the model the same batches in the same order, which hurts "
    "generalization as if the data were never shuffled after the first epoch.",
    fix="Call `sampler.set_epoch(epoch)` at the start of every epoch, before iterating the DataLoader "
    "(`train_loader.sampler.set_epoch(epoch)`). Its static twin: `gpudoctor lint train.py` finds a shuffling "
    "DistributedSampler with no set_epoch in the script before it runs (GD755 sampler-set-epoch-missing).",
)

SPLIT_DIFFERS = Code(
    "GD942",
    "split-differs-across-ranks",
    "Ranks split the data set differently: evaluation samples are trained on",
    what="Fingerprints each rank's `torch.utils.data.Subset` (random_split's result) once: a hash of its index list "
    "and a coordinated sample of the indices. Ranks whose splits of the same data set differ but overlap (not "
    "disjoint shards) are named, with how many of one rank's evaluation samples another rank trains on.",
    why="random_split draws its permutation from `generator=default_generator` unless told otherwise, and an "
    "unseeded process's default generator starts from a different seed on every rank (reproduced with torch "
    "2.14.1: rank 0 initial_seed=4736189208585970805, rank 1 12069729718461999394, different test splits). "
    "Each rank then evaluates on samples another rank trains on: the validation score is optimistic, silently.",
    fix="Split with a generator every rank seeds the same: `random_split(ds, [0.9, 0.1], "
    "generator=torch.Generator().manual_seed(42))` (as the random_split documentation shows), or split once "
    "and save the indices, or split on rank 0 and broadcast. Its static twin: `gpudoctor lint train.py` finds "
    "a random_split without a shared generator before the script runs (GD756 random-split-no-generator).",
)

EVAL_PADDING = Code(
    "GD943",
    "eval-padding-counted",
    "Evaluation with DistributedSampler counts some samples twice",
    what="For an evaluation loader (role 'eval', 'val' or 'test'): when an epoch ends on every rank and the ranks "
    "together read more samples than the data set holds, but fewer than one extra per rank, the surplus is "
    "DistributedSampler's padding.",
    why="DistributedSampler with `drop_last=False` (the default) 'will add extra indices to make the data evenly "
    "divisible across the replicas' (torch docs): a metric summed or averaged over all ranks counts those "
    "samples twice (forum: discuss.pytorch.org/t/distributedsampler/90205). The error is small but it is not "
    "zero and it changes with the world size, so scores do not compare across runs.",
    fix="Evaluate the remainder separately, as pytorch/examples' imagenet main.py does: a DistributedSampler with "
    "`drop_last=True` for the evenly divisible part plus a loader over the remaining samples on every rank; or "
    "evaluate on one rank; or count the padded samples out before reducing.",
)

UNEVEN_SHARDS = Code(
    "GD944",
    "uneven-shards",
    "Ranks run different numbers of batches per epoch",
    what="Counts the batches each rank's training loader gives per epoch (or steps per epoch with "
    "step(samples=, epoch=)). A rank that ended an epoch with fewer batches than another rank has already run in "
    "it is named.",
    why="Each DDP step all-reduces gradients, and such collective communications 'require participation from "
    "all ranks in the process group, so if a rank has fewer inputs, then the other ranks will hang or error "
    "(depending on the backend)' (PyTorch tutorial 'Distributed Training with Uneven Inputs Using the Join "
    "Context Manager'). With gloo the job ends with 'Connection closed by peer' at the end; with NCCL it hangs "
    "until the watchdog's timeout.",
    fix="Give every rank the same number of batches: DistributedSampler (it pads or drops to an even split), "
    "`drop_last=True`, or equal per-rank files; where uneven inputs are intended, wrap the loop in "
    "`with model.join():` (torch.distributed.algorithms.Join).",
)

LOSS_NOT_FINITE = Code(
    "GD945",
    "loss-not-finite",
    "A rank's loss became NaN or infinite",
    what="From the loss each rank gives `gpudoctor.step(loss=...)` (or `step.loss(...)` inside the `with` block): "
    "the first step at which a rank's loss is NaN or +/-inf, and the ranks that followed.",
    why="torch prints nothing: training goes on. Under DDP the next backward all-reduces the rank's NaN "
    "gradients into every rank, so one rank's bad batch or overflow ruins the weights of all; with a GradScaler "
    "the step is skipped silently instead ('optimizer.step() is skipped to avoid corrupting the params', torch "
    "docs). The first rank and step point at the cause.",
    fix="Look at that rank's batch at that step (a corrupt sample, a division by zero, log of 0), the learning "
    "rate, and mixed precision (bf16 instead of fp16, or a GradScaler). `torch.autograd.detect_anomaly()` names "
    "the operation that produced the first NaN; TORCH_NCCL_NAN_CHECK=1 stops NCCL collectives that carry NaN.",
)

LOSS_DIVERGES = Code(
    "GD946",
    "loss-diverges",
    "One rank's loss differs from the others' beyond noise: the replicas are not the same model",
    what="Over the window (30 s), compares each rank's mean loss per sample interval with the median of the other "
    "ranks' in the same interval (so the trend all ranks share cancels out). A rank is named when it stays on one "
    "side of that median in 90% of at least 10 intervals (a sign test: 2% by chance) and its mean is 25% of "
    "the larger away, with 20 losses at least. Heuristic thresholds; waits for the warm-up.",
    why="Data-parallel ranks run one model on different batches of one data set, so their mean losses agree within "
    "noise. A persistent gap means the replicas differ: DDP's documentation warns 'You should never try to "
    "change your model's parameters after wrapping up your model with DistributedDataParallel' (a checkpoint "
    "loaded on one rank after wrapping), buffers that are not broadcast (`broadcast_buffers=False` with "
    "BatchNorm), `no_sync()` left on, or per-rank data that differs (GD940-GD942).",
    fix="Load checkpoints and change parameters before wrapping the model in DDP (or load on every rank), keep "
    "`broadcast_buffers=True` or use SyncBatchNorm, and check the data verdicts. Ranks fed different kinds of "
    "data on purpose (one language per rank) differ by design: then this verdict does not apply.",
)

MEMORY_ON_OTHER_GPU = Code(
    "GD947",
    "memory-on-other-gpu",
    "A rank's process holds memory on a GPU that is not its own",
    what="From NVML's process list (every --process-interval): each rank's process (the PID the kernel gives for its "
    "step records) with memory on a GPU other than its own, the one its LOCAL_RANK picks among "
    "CUDA_VISIBLE_DEVICES (NVML order under CUDA_DEVICE_ORDER=PCI_BUS_ID or on identical GPUs). Memory of 64 MiB "
    "or more counts (a heuristic floor; a CUDA context alone is about 500 MiB: 518 MiB on an H200 with torch 2.11).",
    why="A process that touches CUDA before `torch.cuda.set_device(local_rank)` makes a context on GPU 0; "
    "`torch.load` without `map_location` puts tensors back on the GPU they were saved from; `.cuda()` without "
    "set_device and DDP without `device_ids` put the replica there. The DDP tutorial: without map_location "
    "torch.load would result in 'all processes on the same machine using the same set of devices'; "
    "pytorch/examples#1142: 'The recommended best practice to avoid hangs and high memory utilization on GPU:0 "
    "is to set_device(i)'. GPU 0 runs out of memory first and caps every rank's batch.",
    fix="Call `torch.cuda.set_device(local_rank)` first, before any CUDA work; load with "
    "`torch.load(path, map_location=f'cuda:{local_rank}')` (or 'cpu'); give DDP `device_ids=[local_rank]`. "
    "Its static twins: `gpudoctor lint train.py` finds these causes in the script before it runs (GD758 "
    "torch-load-no-map-location, GD759 ddp-no-device-ids, GD753 global-rank-as-device).",
)

TIME_OUTSIDE_STEP = Code(
    "GD948",
    "time-outside-step",
    "Time between steps goes to work other than the data loader",
    what="With `gpudoctor.watch_loader`, the time between two steps is split into time inside next(loader) and "
    "the rest. A rank that spends at least 20% of its time in the rest, twice the others' median (or the median "
    "rank, when all do), is named. Heuristic thresholds; waits for the warm-up.",
    why="Evaluation, logging, checkpointing or metrics done between steps on one rank (usually rank 0) make every "
    "other rank wait for it in the next step's collective: the job runs at that rank's pace, and more DataLoader "
    "workers, the usual advice for input wait, change nothing.",
    fix="Move the work off the step path: checkpoint asynchronously (torch.distributed.checkpoint.async_save) or "
    "less often, log every N steps, evaluate on every rank (sharded) instead of on rank 0 alone, and keep "
    "`.item()`/`print` of tensors out of the loop.",
)

LOADER_WORKERS = Code(
    "GD949",
    "loader-workers-oversubscribed",
    "The DataLoader workers of all ranks together ask for more CPUs than there are",
    what="Adds up, over the ranks of this host, each rank's DataLoader workers plus the rank's own process, and "
    "compares the sum with the CPUs the ranks may run on (their affinity). torch checks each process alone; "
    "this checks the host.",
    why="torch warns per process when 'This DataLoader will create N worker processes in total. Our suggested "
    "max number of worker in current system is M' (DataLoader._check_worker_number_rationality), but with k "
    "ranks on a host the real total is k times N, which torch does not check. Oversubscribed workers slow "
    "each other and the ranks' main processes, and input wait then does not improve with more workers.",
    fix="Keep `ranks x (num_workers + 1)` at or below the CPUs: `num_workers = cpus // ranks_per_host - 1`; make "
    "each sample cheaper instead (decode on the GPU, preprocess once), or give the job more CPUs.",
)

CODES: list[Code] = [
    DATA_NOT_SHARDED,
    SAME_ORDER_EVERY_EPOCH,
    SPLIT_DIFFERS,
    EVAL_PADDING,
    UNEVEN_SHARDS,
    LOSS_NOT_FINITE,
    LOSS_DIVERGES,
    MEMORY_ON_OTHER_GPU,
    TIME_OUTSIDE_STEP,
    LOADER_WORKERS,
]
