"""GD754-GD756 on small scripts: the data every rank reads, and the traps of
tests/reference/lint/rules.md (rules 5-7)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpudoctor.lint import lint_paths
from tests.lint.snippets import codes, lint_source

HEAD = """import os
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler, random_split
from torch.nn.parallel import DistributedDataParallel as DDP
dist.init_process_group("nccl")
"""


def ddp(body: str) -> str:
    return HEAD + body.strip("\n") + "\n"


@pytest.mark.parametrize(
    "body, why",
    [
        ("loader = DataLoader(ds, batch_size=32, shuffle=True)", "no DistributedSampler"),
        (
            "from torch.utils.data import WeightedRandomSampler\n"
            "loader = DataLoader(ds, sampler=WeightedRandomSampler(w, len(ds)))",
            "WeightedRandomSampler",
        ),
        ("s = DistributedSampler(ds)\nloader = DataLoader(ds, batch_size=8)", "built on line 7 (s) but never passed"),
    ],
)
def test_a_loader_every_rank_reads_whole_is_an_error(tmp_path: Path, body: str, why: str) -> None:
    found = [f for f in lint_source(tmp_path, ddp(body)) if f.code == "GD754"]
    assert len(found) == 1 and found[0].status.value == "fail" and why in found[0].message
    assert "N copies" in found[0].message


@pytest.mark.parametrize(
    "body",
    [
        "loader = DataLoader(ds, sampler=DistributedSampler(ds))",
        "sampler = DistributedSampler(ds) if distributed else None\nloader = DataLoader(ds, sampler=sampler)",
        "if distributed:\n    s = DistributedSampler(ds)\nelse:\n    s = None\nloader = DataLoader(ds, 8, False, s)",
        "class Balanced(DistributedSampler): ...\nloader = DataLoader(ds, sampler=Balanced(ds))",
        "loader = DataLoader(ds, batch_sampler=MyShardedBatchSampler(ds, 8))",
        "part = torch.utils.data.Subset(ds, range(dist.get_rank(), len(ds), world_size))\nloader = DataLoader(part)",
        "loader = DataLoader(ds.shard(num_shards=n, index=i), batch_size=8)",
        "if dist.get_rank() == 0:\n    eval_loader = DataLoader(ds, batch_size=8)",
        "val_loader = DataLoader(val_set, batch_size=8)",
        "loader = DataLoader(ds, **loader_kwargs)",
        "class Stream(torch.utils.data.IterableDataset): ...\nloader = DataLoader(Stream(), batch_size=4)",
    ],
)
def test_sharded_guarded_eval_and_invisible_loaders_are_not_flagged(tmp_path: Path, body: str) -> None:
    assert [c for c in codes(tmp_path, ddp(body)) if c[0] == "GD754"] == []


def test_without_a_process_group_or_a_sampler_a_loader_is_none_of_lint_s_business(tmp_path: Path) -> None:
    """Hogwild (mnist_hogwild): processes sample independently by design."""
    script = "import torch.multiprocessing as mp\nfrom torch.utils.data import DataLoader\n"
    script += "loader = DataLoader(ds, shuffle=True)\nmp.Process(target=train).start()\n"
    assert codes(tmp_path, script) == []


def test_loaders_accelerate_prepares_are_not_flagged(tmp_path: Path) -> None:
    script = """
    from accelerate import Accelerator
    from torch.utils.data import DataLoader
    accelerator = Accelerator()
    loader = DataLoader(ds, shuffle=True, batch_size=16)
    model, loader = accelerator.prepare(model, loader)
    """
    assert codes(tmp_path, script) == []


def test_a_shuffling_sampler_without_set_epoch_is_a_warning_at_the_sampler(tmp_path: Path) -> None:
    body = "sampler = DistributedSampler(ds)\nloader = DataLoader(ds, sampler=sampler)\nfor e in range(3):\n"
    body += "    for x in loader:\n        step(x)\n"
    (f,) = lint_source(tmp_path, ddp(body))
    assert (f.code, f.evidence["line"], f.status.value) == ("GD755", 7, "warn")


@pytest.mark.parametrize(
    "body",
    [
        "loader = DataLoader(ds, sampler=DistributedSampler(ds))\nfor e in range(3):\n    loader.sampler.set_epoch(e)",
        "samplers = {'train': DistributedSampler(ds)}\nfor e in range(2):\n    samplers['train'].set_epoch(e)",
        "loader = DataLoader(ds, sampler=DistributedSampler(ds))\nif hasattr(loader.sampler, 'set_epoch'): pass",
        "loader = DataLoader(ds, sampler=DistributedSampler(ds, shuffle=False))",
        "sampler = DistributedSampler(ds)",  # reaches no loader here
    ],
)
def test_set_epoch_anywhere_shuffle_false_or_no_loader_are_not_flagged(tmp_path: Path, body: str) -> None:
    assert [c for c in codes(tmp_path, ddp(body)) if c[0] == "GD755"] == []


def test_set_epoch_in_another_file_of_the_program_counts_a_sibling_script_s_does_not(tmp_path: Path) -> None:
    (tmp_path / "data.py").write_text(
        "from torch.utils.data import DataLoader, DistributedSampler\n"
        "def loader(ds):\n    return DataLoader(ds, sampler=DistributedSampler(ds))\n"
    )
    (tmp_path / "train.py").write_text(
        "from data import loader\nfor e in range(2):\n    loader(ds).sampler.set_epoch(e)\n"
    )
    (tmp_path / "other.py").write_text(
        "from torch.utils.data import DataLoader, DistributedSampler\n"
        "l = DataLoader(ds, sampler=DistributedSampler(ds))\n"
    )
    found = {(Path(f.evidence["file"]).name, f.code) for f in lint_paths([tmp_path])}
    assert found == {("other.py", "GD755")}
    assert [f.code for f in lint_paths([tmp_path / "data.py"])] == ["GD755"]  # alone, it cannot know


def test_random_split_on_every_rank_is_a_warning(tmp_path: Path) -> None:
    (f,) = lint_source(tmp_path, ddp("train, val = random_split(ds, [0.9, 0.1])"))
    assert (f.code, f.evidence["line"], f.evidence["seed_depends_on_rank"]) == ("GD756", 7, False)
    assert "generator=" in f.hint


def test_a_seed_that_depends_on_the_rank_does_not_help_and_says_so(tmp_path: Path) -> None:
    body = "torch.manual_seed(42 + dist.get_rank())\ntrain, val = random_split(ds, [0.9, 0.1])"
    (f,) = lint_source(tmp_path, ddp(body))
    assert f.code == "GD756" and f.evidence["seed_depends_on_rank"] is True and "depends on the rank" in f.message


def test_a_seed_on_only_one_path_does_not_count(tmp_path: Path) -> None:
    body = "if args.seed is not None:\n    torch.manual_seed(args.seed)\ntrain, val = random_split(ds, [0.9, 0.1])"
    assert codes(tmp_path, ddp(body)) == [("GD756", 9)]


@pytest.mark.parametrize(
    "body",
    [
        "g = torch.Generator().manual_seed(0)\ntrain, val = random_split(ds, [0.9, 0.1], generator=g)",
        "train, val = random_split(ds, [0.9, 0.1], torch.Generator().manual_seed(0))",
        "torch.manual_seed(1234)\ntrain, val = random_split(ds, [0.9, 0.1])",
        "from transformers import set_seed\nset_seed(7)\ntrain, val = random_split(ds, [0.9, 0.1])",
        # seeded by the caller, before every call of the function that splits
        "def data():\n    return random_split(ds, [0.9, 0.1])\ntorch.manual_seed(0)\ndata()",
        "if dist.get_rank() == 0:\n    train, val = random_split(ds, [0.9, 0.1])",
    ],
)
def test_a_shared_generator_a_rank_free_seed_or_rank_0_only_is_not_flagged(tmp_path: Path, body: str) -> None:
    assert codes(tmp_path, ddp(body)) == []


def test_a_split_in_the_parent_before_mp_spawn_is_one_draw(tmp_path: Path) -> None:
    script = """
    import torch.multiprocessing as mp
    import torch.distributed as dist
    from torch.utils.data import random_split
    def worker(rank, train):
        dist.init_process_group("gloo", rank=rank, world_size=2)
    if __name__ == "__main__":
        train, val = random_split(ds, [0.9, 0.1])
        mp.spawn(worker, args=(train,), nprocs=2)
    """
    assert codes(tmp_path, script) == []


def test_a_seed_in_the_parent_does_not_reach_a_spawned_worker(tmp_path: Path) -> None:
    script = """
    import torch
    import torch.multiprocessing as mp
    import torch.distributed as dist
    from torch.utils.data import random_split
    def worker(rank):
        dist.init_process_group("gloo", rank=rank, world_size=2)
        train, val = random_split(ds, [0.9, 0.1])
    if __name__ == "__main__":
        torch.manual_seed(0)
        mp.spawn(worker, nprocs=2)
    """
    assert codes(tmp_path, script) == [("GD756", 7)]


def test_random_split_in_a_single_process_script_is_fine(tmp_path: Path) -> None:
    assert codes(tmp_path, "from torch.utils.data import random_split\na, b = random_split(ds, [8, 2])\n") == []


def test_a_lightning_datamodule_splitting_in_setup_is_flagged_unless_seeded_first(tmp_path: Path) -> None:
    """Lightning-AI/pytorch-lightning#7728: setup() runs on every rank, each draws its own split."""
    script = """
    import lightning as L
    from torch.utils.data import random_split

    class Data(L.LightningDataModule):
        def setup(self, stage):
            self.train, self.val = random_split(self.full, [0.9, 0.1])

    trainer = L.Trainer(max_epochs=3)
    trainer.fit(model, Data())
    """
    assert codes(tmp_path, script) == [("GD756", 6)]
    seeded = script.replace("import lightning as L\n", "import lightning as L\n    L.seed_everything(42)\n")
    assert codes(tmp_path, seeded) == []
    one_gpu = script.replace("L.Trainer(max_epochs=3)", "L.Trainer(max_epochs=3, devices=1)")
    assert codes(tmp_path, one_gpu) == []
