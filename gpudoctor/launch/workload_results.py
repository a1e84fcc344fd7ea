"""The types of the workload results the parent reads in more than one place, defined once.

A workload (gpudoctor/workloads/) returns one of these and the rank sends it as JSON (protocol
`result` event); the checks, `bench` and the report's measurements read it from
`LaunchResult.results(task)` / `RankOutcome.result(task)`. TypedDicts: the JSON on the wire is the
same plain dict, these only name its keys and their types (torch-free, no code).

The other workloads' results (link probes, nodes, scaling, deep) are read in one place each,
beside the check that judges them.
"""

from __future__ import annotations

from typing import TypedDict

# --- "ddp": gpudoctor/workloads/ddp.py; read by checks/active/ddp.py, checks/active/common.py
# (the rank table's step time) and knowledge/facts.py (the DDP step measurement) ---


class ShardReport(TypedDict):
    dataset: int  # samples in the dataset
    per_rank: list[int]  # samples each rank's DistributedSampler gave it
    overlap: int  # samples given to more than one rank
    missing: int  # samples given to none


class DdpResult(TypedDict):
    shards: ShardReport
    grad_max_abs_diff: float  # DDP's averaged gradient vs one process's on the union of the batches
    grad_tolerance: float
    grad_ok: bool
    bad_gradient_ranks: list[int]  # ranks whose own contribution differed from what they should send
    params_differ_ranks: list[int]  # ranks whose parameters differ from rank 0's after training
    loss_first: float  # the group's mean loss at the first step
    loss_last: float  # ... and at the last
    steps: int
    batch: int
    step_s_mean: float  # this rank's mean step time
    step_s_max: float


# --- "allreduce": gpudoctor/workloads/allreduce.py; read by checks/active/allreduce.py and
# cli/bench.py (`bench allreduce`) ---


class _AllreduceRowBase(TypedDict):
    bytes: int
    count: int  # float32 elements
    iters: int  # timed iterations
    time_us: float  # the slowest rank's time per all-reduce
    algbw_gbps: float
    busbw_gbps: float
    wrong: int  # wrong elements over all ranks (nccl-tests' #wrong)


class AllreduceRow(_AllreduceRowBase, total=False):
    wrong_by_rank: list[int]  # where `wrong`: wrong elements each rank received
    bad_input_ranks: list[int]  # ... and the ranks whose own contribution was wrong


class AllreduceResult(TypedDict):
    rows: list[AllreduceRow]
    skipped_sizes: list[int]  # sizes that do not fit in free GPU memory
    unswept_sizes: list[int]  # sizes left after the sweep stopped early
    stopped: str  # "", "plateau" or "time budget"
    world_size: int
    dtype: str
    op: str
    backend: str
    device: str  # "cuda" or "cpu"
    busbw_factor: float


# --- "collectives": gpudoctor/workloads/collectives.py; read by checks/active/collectives.py and
# cli/bench.py (`bench collectives`) ---


class CollectiveRow(TypedDict):
    bytes: int
    count: int  # elements per rank argument (nccl-tests' count)
    iters: int
    time_us: float  # the slowest rank's
    algbw_gbps: float
    busbw_gbps: float
    wrong: int  # nccl-tests' #wrong over all ranks
    wrong_cells: list[list[int]]  # [receiver, source, count]
    wrong_sums: list[list[int]]  # [receiver, count]: reduce-scatter sums wrong from right inputs


class CollectiveSweep(TypedDict):
    rows: list[CollectiveRow]
    skipped_sizes: list[int]
    busbw_factor: float


class PairRow(TypedDict):
    a: int
    b: int
    time_us: float
    algbw_gbps: float
    busbw_gbps: float
    wrong_cells: list[list[int]]  # [receiver, source, count]


class PairsResult(TypedDict, total=False):
    bytes: int
    count: int
    iters: int
    rows: list[PairRow]
    skipped: str  # set instead of count and iters when the pairs did not fit in free GPU memory


class CollectivesResult(TypedDict):
    world_size: int
    backend: str
    device: str
    dtype: str
    ops: dict[str, CollectiveSweep]  # op name (gpudoctor.knowledge.busbw.OPS) -> its sweep
    pairs: PairsResult | None  # send/recv per pair; None unless asked for
