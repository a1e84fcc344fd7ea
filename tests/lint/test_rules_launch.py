"""GD750-GD753 on small scripts: each rule's mistake, and the traps of tests/reference/lint/rules.md
(rules 1-4, "Must NOT flag") that a naive detector falls into."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.lint.snippets import codes, lint_source

SPAWN = """
import os
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

def worker(rank, world_size):
    {line}
    dist.init_process_group("nccl", rank=rank, world_size=world_size)

if __name__ == "__main__":
    n = torch.cuda.device_count()
    mp.spawn(worker, args=(n,), nprocs=n)
"""


@pytest.mark.parametrize(
    "line",
    [
        'os.environ["MASTER_PORT"] = "12355"',
        "os.environ['MASTER_PORT'] = str(12355)",
        'os.environ["MASTER_PORT"] = f"29500"',
        'os.environ.update({"MASTER_PORT": "29500"})',
        'os.environ.update(MASTER_PORT="29500")',
        'os.putenv("MASTER_PORT", "29500")',
    ],
)
def test_a_literal_port_in_a_spawn_script_is_a_warning(tmp_path: Path, line: str) -> None:
    (f,) = lint_source(tmp_path, SPAWN.format(line=line))
    assert (f.code, f.evidence["line"], f.status.value) == ("GD750", 7, "warn")
    assert "EADDRINUSE" in f.message and "setdefault" in f.hint


@pytest.mark.parametrize(
    "line",
    [
        'os.environ.setdefault("MASTER_PORT", "12355")',
        'os.environ["MASTER_PORT"] = os.environ.get("MASTER_PORT", "12355")',
        'os.environ["MASTER_PORT"] = master_port',
        'os.environ["MASTER_PORT"] = str(find_free_port())',
        'port = os.environ["MASTER_PORT"]',
        'if "MASTER_PORT" not in os.environ: os.environ["MASTER_PORT"] = "12355"',
        'if not os.environ.get("MASTER_PORT"): os.environ["MASTER_PORT"] = "12355"',
    ],
)
def test_ports_that_leave_the_launcher_s_value_alone_are_not_flagged(tmp_path: Path, line: str) -> None:
    assert codes(tmp_path, SPAWN.format(line=line)) == []


def test_under_torchrun_the_port_is_an_error_and_says_how_lint_knew(tmp_path: Path) -> None:
    script = """
    import os
    import torch.distributed as dist
    os.environ["MASTER_PORT"] = "29500"
    local_rank = int(os.environ["LOCAL_RANK"])
    dist.init_process_group("nccl")
    """
    (f,) = lint_source(tmp_path, script)
    assert (f.code, f.status.value, f.evidence["severity"]) == ("GD750", "fail", "error")
    assert "reads LOCAL_RANK (line 4)" in f.message and "delete the line" in f.hint
    (told,) = lint_source(tmp_path, SPAWN.format(line='os.environ["MASTER_PORT"] = "1"'), launcher="torchrun")[:1]
    assert told.evidence["severity"] == "error" and "--launcher torchrun" in told.message


def test_a_literal_tcp_init_method_and_store_port_are_flagged_an_argparse_default_is_not(tmp_path: Path) -> None:
    script = """
    import argparse
    import torch.distributed as dist
    parser = argparse.ArgumentParser()
    parser.add_argument("--dist-url", default="tcp://224.66.41.62:23456")
    dist.init_process_group("nccl", init_method="tcp://10.0.0.1:23456", rank=0, world_size=2)
    store = dist.TCPStore("10.0.0.1", 29512, 2, True)
    """
    assert codes(tmp_path, script) == [("GD750", 5), ("GD750", 6)]


def test_device_count_times_nodes_as_nprocs_is_an_error(tmp_path: Path) -> None:
    script = """
    import torch
    import torch.multiprocessing as mp
    def run(rank, world_size): ...
    world_size = torch.cuda.device_count() * num_machines
    mp.spawn(run, args=(world_size,), nprocs=world_size)
    """
    assert codes(tmp_path, script) == [("GD751", 5)]


def test_device_count_as_the_world_size_of_a_torchrun_script_is_an_error(tmp_path: Path) -> None:
    script = """
    import os
    import torch
    import torch.distributed as dist
    from torch.utils.data import DistributedSampler
    rank = int(os.environ["RANK"])
    n = torch.cuda.device_count()
    dist.init_process_group("nccl", rank=rank, world_size=n)
    sampler = DistributedSampler(ds, num_replicas=torch.cuda.device_count(), rank=rank, shuffle=False)
    """
    assert codes(tmp_path, script) == [("GD751", 7), ("GD751", 8)]


@pytest.mark.parametrize(
    "main",
    [
        # the single-node spawn pattern (the tutorial, multigpu.py)
        "world_size = torch.cuda.device_count()\nmp.spawn(run, args=(world_size,), nprocs=world_size)",
        # imagenet: the product goes to world_size, nprocs stays per node
        "ngpus = torch.cuda.device_count()\nws = ngpus * nodes\nmp.spawn(run, nprocs=ngpus, args=(ngpus, ws))",
        "if torch.cuda.device_count() > 1:\n    print(torch.cuda.device_count())",
        "mp.spawn(run, args=(torch.cuda.device_count() * 1,), nprocs=torch.cuda.device_count() * 1)",
    ],
)
def test_the_per_node_count_where_it_is_right_is_not_flagged(tmp_path: Path, main: str) -> None:
    script = (
        "import torch\nimport torch.distributed as dist\nimport torch.multiprocessing as mp\n"
        "def run(rank, world_size):\n    dist.init_process_group('nccl', rank=rank, world_size=world_size)\n"
        "    torch.cuda.set_device(rank % torch.cuda.device_count())\n" + main + "\n"
    )
    assert codes(tmp_path, script) == []


def test_mp_spawn_beside_torchrun_s_variables_is_an_error_without_being_told(tmp_path: Path) -> None:
    script = """
    import os
    import torch.multiprocessing as mp
    def train(i): ...
    world = int(os.environ["WORLD_SIZE"])
    mp.spawn(train, nprocs=world)
    """
    assert codes(tmp_path, script) == [("GD752", 5)]
    assert codes(tmp_path, script, launcher="spawn") == []


@pytest.mark.parametrize(
    "script",
    [
        # imported, never called (multigpu_torchrun.py)
        "import os\nimport torch.multiprocessing as mp\nlocal = int(os.environ['LOCAL_RANK'])\n",
        # two modes chosen by a flag (imagenet)
        "import os\nimport torch.multiprocessing as mp\ndef w(i): ...\n"
        "if args.env:\n    ws = int(os.environ['WORLD_SIZE'])\nif args.spawn:\n    mp.spawn(w, nprocs=2)\n",
        # Hogwild: processes, no spawn
        "import torch.multiprocessing as mp\nfor r in range(4):\n    mp.Process(target=print, args=(r,)).start()\n",
    ],
)
def test_no_spawn_under_torchrun_without_both_signals(tmp_path: Path, script: str) -> None:
    assert codes(tmp_path, script) == []


def test_the_global_rank_as_device_is_one_finding_at_the_first_choice_listing_the_others(tmp_path: Path) -> None:
    script = """
    import os
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    def build(rank):
        model = Net().to(rank)
        return DDP(model, device_ids=[rank])

    def main():
        rank = int(os.environ["RANK"])
        dist.init_process_group("nccl")
        torch.cuda.set_device(rank)
        build(rank)

    main()
    """
    (f,) = lint_source(tmp_path, script)
    assert (f.code, f.evidence["line"], f.evidence["related_lines"]) == ("GD753", 13, [7, 8])
    assert f.evidence["source_line"] == 11 and "LOCAL_RANK" in f.hint


@pytest.mark.parametrize(
    "sink",
    [
        "torch.cuda.set_device(dist.get_rank())",
        "x = torch.zeros(1).to(f'cuda:{self_rank}')",
        "d = torch.device('cuda', self_rank)",
        "x = torch.zeros(1).cuda(self_rank)",
        "ckpt = torch.load('c.pt', map_location=f'cuda:{self_rank}')",
        "torch.accelerator.set_device_index(int(os.environ.get('RANK', '0')))",
    ],
)
def test_every_kind_of_device_choice_is_followed(tmp_path: Path, sink: str) -> None:
    script = f"import os\nimport torch\nimport torch.distributed as dist\nself_rank = dist.get_rank()\n{sink}\n"
    assert [c for c, _ in codes(tmp_path, script)] == ["GD753"]


@pytest.mark.parametrize(
    "script",
    [
        # minGPT: a variable named rank that holds LOCAL_RANK
        "import os, torch\nrank = int(os.environ['LOCAL_RANK'])\ntorch.cuda.set_device(rank)\n",
        # the spawn index (the tutorial's demo_basic)
        "import torch, torch.multiprocessing as mp\ndef demo(rank, ws):\n    torch.cuda.set_device(rank)\n"
        "mp.spawn(demo, args=(2,), nprocs=2)\n",
        # elastic_ddp.py: tolerated on homogeneous nodes
        "import torch, torch.distributed as dist\nrank = dist.get_rank()\n"
        "device_id = rank % torch.cuda.device_count()\nmodel = Net().to(device_id)\n",
        # the global rank used as a rank and in messages
        "import os, torch.distributed as dist\nrank = int(os.environ['RANK'])\n"
        "dist.init_process_group('nccl', rank=rank, world_size=2)\nprint(f'[GPU{rank}] ready')\n",
        # literals (model parallel in one process) and an unknown rank
        "import torch\nx = torch.zeros(1).cuda(0).to(torch.device('cuda:1'))\nmodel = FSDP(model, device_id=rank)\n",
        # a helper called once with LOCAL_RANK and once with RANK: not proven global
        "import os, torch\ndef use(r):\n    torch.cuda.set_device(r)\nuse(int(os.environ['LOCAL_RANK']))\n"
        "use(int(os.environ['RANK']))\n",
    ],
)
def test_local_ranks_spawn_indices_and_unknown_ranks_are_not_flagged(tmp_path: Path, script: str) -> None:
    assert codes(tmp_path, script) == []
