"""GD757 (writes every rank makes) and GD758 (torch.load without map_location) on small scripts,
with the rank-0 guards of tests/reference/lint/rules.md 0.5 and the traps of rules 8-9."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.lint.snippets import codes, lint_source

HEAD = """import os
import torch
import torch.distributed as dist
dist.init_process_group("nccl")
rank = dist.get_rank()
"""


def ddp(body: str) -> str:
    return HEAD + body.strip("\n") + "\n"


@pytest.mark.parametrize(
    "body, what",
    [
        ("torch.save(model.state_dict(), 'ckpt.pt')", "torch.save"),
        ("with open('metrics.json', 'w') as f:\n    f.write('{}')", "open(..., 'w')"),
        ("import wandb\nwandb.init(project='x')", "wandb.init"),
        ("from torch.utils.tensorboard import SummaryWriter\nw = SummaryWriter('runs')", "SummaryWriter"),
        ("import numpy as np\nnp.save('emb.npy', emb)", "numpy's save"),
        ("import shutil\nshutil.copyfile('ckpt.pt', 'best.pt')", "a file copy"),
        ("df.to_csv('results.csv')", ".to_csv()"),
        ("from pathlib import Path\nPath('out.txt').write_text('done')", ".write_text()"),
    ],
)
def test_a_write_every_rank_makes_is_a_warning(tmp_path: Path, body: str, what: str) -> None:
    (f,) = lint_source(tmp_path, ddp(body))
    assert f.code == "GD757" and f.status.value == "warn" and what in f.message
    tracker = what in ("wandb.init", "SummaryWriter")
    assert ("one run, one writer" if tracker else "dist.barrier()") in f.hint


def test_a_function_called_unguarded_names_the_call_site(tmp_path: Path) -> None:
    body = "def save(m):\n    torch.save(m.state_dict(), 'ckpt.pt')\nfor epoch in range(3):\n    save(model)"
    (f,) = lint_source(tmp_path, ddp(body))
    assert (f.code, f.evidence["line"], f.evidence["reached_from"]) == ("GD757", 7, 9)


@pytest.mark.parametrize(
    "body",
    [
        "if rank == 0:\n    torch.save(m, 'ckpt.pt')",
        "if dist.get_rank() == 0:\n    torch.save(m, 'ckpt.pt')",
        "if 0 == rank and epoch % 5 == 0:\n    torch.save(m, 'ckpt.pt')",
        "if args.local_rank in [-1, 0]:\n    torch.save(m, 'ckpt.pt')",
        "if not rank:\n    torch.save(m, 'ckpt.pt')",
        "if accelerator.is_main_process:\n    torch.save(m, 'ckpt.pt')",
        "if rank != 0:\n    pass\nelse:\n    torch.save(m, 'ckpt.pt')",
        "if int(os.environ['RANK']) > 0:\n    print('worker')\nelse:\n    torch.save(m, 'ckpt.pt')",
        # imagenet's form: a mode flag or-ed with a rank-0 test
        "if not args.mp or (args.mp and args.rank % ngpus == 0):\n    torch.save(m, 'ckpt.pt')",
        # an early exit on the other ranks
        "def save(m):\n    if rank != 0:\n        return\n    torch.save(m, 'ckpt.pt')\nsave(model)",
        # the function's only caller is guarded (multigpu.py)
        "def save(m):\n    torch.save(m, 'ckpt.pt')\nif rank == 0:\n    save(model)",
        "from lightning.pytorch.utilities import rank_zero_only\n@rank_zero_only\ndef save(m):\n"
        "    torch.save(m, 'ckpt.pt')\nsave(model)",
        # per-rank files, memory, reads
        "torch.save(m, f'ckpt_rank{rank}.pt')",
        "path = f'shard_{dist.get_rank()}.pt'\ntorch.save(m, path)",
        "import io\nbuf = io.BytesIO()\ntorch.save(m, buf)",
        "with open('config.json') as f:\n    cfg = f.read()",
        # a helper no one in this file calls: its caller elsewhere may guard it
        "def save_checkpoint(m, path):\n    torch.save(m, path)",
        "print(f'rank {rank} loss {loss}')",
    ],
)
def test_guarded_per_rank_in_memory_and_unreached_writes_are_not_flagged(tmp_path: Path, body: str) -> None:
    assert codes(tmp_path, ddp(body)) == []


def test_a_flag_that_holds_a_rank_0_test_guards_and_the_write_outside_it_is_flagged(tmp_path: Path) -> None:
    """nanoGPT's form: `master_process = ddp_rank == 0` (True when not distributed)."""
    script = """
    import os, torch
    from torch.distributed import init_process_group
    ddp = int(os.environ.get("RANK", -1)) != -1
    if ddp:
        init_process_group("nccl")
        ddp_rank = int(os.environ["RANK"])
        master_process = ddp_rank == 0
    else:
        master_process = True
    for it in range(100):
        if it % 10 == 0 and master_process:
            torch.save(model.state_dict(), "ckpt.pt")
    if not master_process:
        pass
    else:
        torch.save(model.state_dict(), "final.pt")
    torch.save(model.state_dict(), "last.pt")
    """
    assert codes(tmp_path, script) == [("GD757", 17)]


def test_the_else_of_a_rank_0_test_runs_on_the_other_ranks(tmp_path: Path) -> None:
    body = "if rank == 0:\n    print('main')\nelse:\n    torch.save(m, 'ckpt.pt')"
    assert codes(tmp_path, ddp(body)) == [("GD757", 9)]


def test_writes_of_a_single_process_script_are_not_flagged(tmp_path: Path) -> None:
    assert codes(tmp_path, "import torch\ntorch.save(model.state_dict(), 'ckpt.pt')\n") == []


def test_torch_load_on_every_rank_without_map_location_is_a_warning(tmp_path: Path) -> None:
    (f,) = lint_source(tmp_path, ddp("state = torch.load('ckpt.pt', weights_only=True)"))
    assert (f.code, f.evidence["line"]) == ("GD758", 6)
    assert "weights_only=True does not choose the device" in f.message and "map_location" in f.hint


@pytest.mark.parametrize(
    "body",
    [
        "state = torch.load('ckpt.pt', map_location='cpu')",
        "state = torch.load('ckpt.pt', 'cpu')",
        "state = torch.load('ckpt.pt', map_location={'cuda:0': f'cuda:{rank}'})",
        "state = torch.load('ckpt.pt', **load_kwargs)",
        "if rank == 0:\n    state = torch.load('ckpt.pt')",
        # imagenet: the author chose per case
        "if gpu is None:\n    state = torch.load(path)\nelse:\n    state = torch.load(path, map_location=loc)",
        "state = torch.hub.load_state_dict_from_url(url, None, 'cpu')",
    ],
)
def test_loads_that_say_where_or_run_on_rank_0_only_are_not_flagged(tmp_path: Path, body: str) -> None:
    assert codes(tmp_path, ddp(body)) == []


def test_accelerate_and_single_process_loads_are_not_flagged(tmp_path: Path) -> None:
    assert codes(tmp_path, "import torch\nstate = torch.load('ckpt.pt')\n") == []
    script = "from accelerate import Accelerator\nimport torch\naccelerator = Accelerator()\nw = torch.load('w.pt')\n"
    assert codes(tmp_path, script) == []
