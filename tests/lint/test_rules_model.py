"""GD759-GD763 on small scripts: DDP's device, accumulation without no_sync, clipping scaled
gradients, DataParallel and BatchNorm at small per-GPU batches, with the traps of
tests/reference/lint/rules.md (rules 10-14)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.lint.snippets import codes, lint_source

HEAD = """import os
import torch
import torch.nn as nn
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
dist.init_process_group("nccl")
"""


def ddp(body: str) -> str:
    return HEAD + body.strip("\n") + "\n"


@pytest.mark.parametrize(
    "body, line",
    [
        ("model = Net()\nmodel.cuda()\nmodel = DDP(model)", 9),
        ("model = Net().to('cuda')\nmodel = DDP(model)", 8),
        ("dev = torch.device('cuda')\nmodel = Net()\nmodel.to(dev)\nddp_model = DDP(model)", 10),
        ("model = DDP(Net().cuda())", 7),
        # set_device on one path only does not count, nor in a loop that may not run
        ("if args.gpu is not None:\n    torch.cuda.set_device(args.gpu)\nmodel = Net().cuda()\nmodel = DDP(model)", 10),
        ("for gpu in gpus:\n    torch.cuda.set_device(gpu)\nmodel = Net().cuda()\nmodel = DDP(model)", 10),
    ],
)
def test_ddp_on_the_default_gpu_without_set_device_is_a_warning(tmp_path: Path, body: str, line: int) -> None:
    (f,) = lint_source(tmp_path, ddp(body))
    assert (f.code, f.evidence["line"], f.status.value) == ("GD759", line, "warn")
    assert "GPU 0" in f.message and "set_device" in f.hint


@pytest.mark.parametrize(
    "body",
    [
        "model = Net().cuda()\nmodel = DDP(model, device_ids=[local_rank])",
        "torch.cuda.set_device(local_rank)\nmodel = Net().cuda()\nmodel = DDP(model)",
        "def setup():\n    torch.cuda.set_device(int(os.environ['LOCAL_RANK']))\nsetup()\nmodel = DDP(Net().cuda())",
        "def build():\n    return DDP(Net().cuda())\ntorch.accelerator.set_device_index(local_rank)\nbuild()",
        "model = Net().to(local_rank)\nmodel = DDP(model)",
        "model = Net().cuda(local_rank)\nmodel = DDP(model)",
        "model = DDP(Net())",  # CPU / gloo, or placed where lint cannot see
        "model = DDP(Net().cuda(), device_mesh=mesh)",
        # a multi-device module (the tutorial's ToyMpModel)
        "mp_model = ToyMpModel(dev0, dev1)\nddp_mp_model = DDP(mp_model)",
    ],
)
def test_device_ids_set_device_or_an_unknown_placement_are_not_flagged(tmp_path: Path, body: str) -> None:
    assert codes(tmp_path, ddp(body)) == []


LOOP = """
model = DDP(Net().to(local_rank), device_ids=[local_rank])
for i, (x, y) in enumerate(loader):
    loss = loss_fn(model(x), y) / accum_steps
{body}
"""


def test_accumulation_without_no_sync_is_info_at_the_backward(tmp_path: Path) -> None:
    body = "    loss.backward()\n    if (i + 1) % accum_steps == 0:\n        optimizer.step()"
    (f,) = lint_source(tmp_path, ddp(LOOP.format(body=body)))
    assert (f.code, f.evidence["line"], f.status.value, f.evidence["severity"]) == ("GD760", 10, "pass", "info")
    assert "no_sync" in f.hint


@pytest.mark.parametrize(
    "body",
    [
        "    ctx = model.no_sync() if (i + 1) % accum_steps else contextlib.nullcontext()\n    with ctx:\n"
        "        loss.backward()\n    if (i + 1) % accum_steps == 0:\n        optimizer.step()",
        "    model.require_backward_grad_sync = (i + 1) % accum_steps == 0\n    loss.backward()\n"
        "    if (i + 1) % accum_steps == 0:\n        optimizer.step()",
        "    loss.backward()\n    if (i + 1) % 1 == 0:\n        optimizer.step()",
        "    loss.backward()\n    optimizer.step()\n    if i % log_interval == 0:\n        print(loss.item())",
        "    if (i + 1) % accum_steps == 0:\n        loss.backward()\n        optimizer.step()",
        "    with accelerator.accumulate(model):\n        accelerator.backward(loss)\n"
        "    if i % accum_steps == 0:\n        optimizer.step()",
        "    model_engine.backward(loss)\n    if i % accum_steps == 0:\n        model_engine.step()",
    ],
)
def test_no_sync_no_accumulation_or_a_deepspeed_engine_are_not_flagged(tmp_path: Path, body: str) -> None:
    assert codes(tmp_path, ddp(LOOP.format(body=body))) == []


def test_accumulation_without_ddp_in_sight_is_not_flagged(tmp_path: Path) -> None:
    """The seed fragments 002_3 and 004_2: the model's wrapping is elided."""
    script = "for i, b in enumerate(loader):\n    loss.backward()\n    if (i + 1) % 4 == 0:\n        optimizer.step()\n"
    assert codes(tmp_path, script) == []


def test_clipping_scaled_gradients_is_an_error_at_the_clip(tmp_path: Path) -> None:
    body = """
scaler = torch.amp.GradScaler("cuda")
def step(loss):
    scaler.scale(loss).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    scaler.step(optimizer)
    scaler.update()
"""
    (f,) = lint_source(tmp_path, ddp(body))
    assert (f.code, f.evidence["line"], f.status.value) == ("GD761", 10, "fail")
    assert f.evidence["backward_line"] == 9 and "unscale_" in f.hint


def test_a_clip_after_the_amp_branch_still_sees_scaled_gradients(tmp_path: Path) -> None:
    body = """
def step(loss, amp):
    if amp:
        scaler.scale(loss).backward()
    else:
        loss.backward()
    nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    scaler.step(optimizer)
"""
    assert codes(tmp_path, ddp(body)) == [("GD761", 12)]


@pytest.mark.parametrize(
    "body",
    [
        "scaler.scale(loss).backward()\nscaler.unscale_(optimizer)\n"
        "torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)\nscaler.step(optimizer)",
        # timm's NativeScaler: the unscale_ in the clip's own block
        "scaler.scale(loss).backward()\nif clip is not None:\n    scaler.unscale_(optimizer)\n"
        "    torch.nn.utils.clip_grad_norm_(params, clip)\nscaler.step(optimizer)",
        # minGPT's no-scaler branch
        "if amp:\n    scaler.scale(loss).backward()\n    scaler.step(optimizer)\nelse:\n    loss.backward()\n"
        "    torch.nn.utils.clip_grad_norm_(params, 1.0)\n    optimizer.step()",
        "accelerator.backward(loss)\naccelerator.clip_grad_norm_(model.parameters(), 1.0)\noptimizer.step()",
        "scaler = torch.amp.GradScaler('cuda', enabled=False)\nscaler.scale(loss).backward()\n"
        "torch.nn.utils.clip_grad_norm_(params, 1.0)\nscaler.step(optimizer)",
    ],
)
def test_unscaled_clips_and_scalers_that_do_not_scale_are_not_flagged(tmp_path: Path, body: str) -> None:
    assert codes(tmp_path, ddp(body)) == []


def test_data_parallel_is_info_unless_the_file_builds_ddp(tmp_path: Path) -> None:
    script = "import torch.nn as nn\nmodel = nn.DataParallel(model)\nok = isinstance(model, nn.DataParallel)\n"
    (f,) = lint_source(tmp_path, script)
    assert (f.code, f.evidence["line"], f.status.value) == ("GD762", 2, "pass")
    assert codes(tmp_path, ddp("model = nn.DataParallel(model) if single else DDP(model)")) == []
    assert codes(tmp_path, "import torch\nm = torch.nn.DataParallel(m, device_ids=[0])\n") == []


BN = """
from torch.utils.data import DataLoader, DistributedSampler
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3)
        self.bn = nn.BatchNorm2d(8)
        self.bn2 = nn.BatchNorm2d(8)
model = DDP(Net().to(local_rank), device_ids=[local_rank])
loader = DataLoader(ds, batch_size={batch}, sampler=DistributedSampler(ds))
"""


def test_batchnorm_at_a_small_per_gpu_batch_is_info_at_the_first_layer(tmp_path: Path) -> None:
    findings = [f for f in lint_source(tmp_path, ddp(BN.format(batch=8))) if f.code == "GD763"]
    (f,) = findings
    assert (f.evidence["line"], f.evidence["related_lines"], f.evidence["per_gpu_batch"]) == (12, [13], 8)
    assert "convert_sync_batchnorm" in f.hint


@pytest.mark.parametrize(
    "batch, extra",
    [
        ("64", ""),
        ("args.batch_size", ""),  # unknown: info rules stay quiet
        ("8", "model = nn.SyncBatchNorm.convert_sync_batchnorm(model)"),
    ],
)
def test_a_large_unknown_batch_or_syncbn_are_not_flagged(tmp_path: Path, batch: str, extra: str) -> None:
    found = [c for c in codes(tmp_path, ddp(BN.format(batch=batch) + extra)) if c[0] == "GD763"]
    assert found == []


def test_the_batch_size_of_an_argparse_default_is_read(tmp_path: Path) -> None:
    parser = "import argparse\np = argparse.ArgumentParser()\np.add_argument('-b', '--batch-size', default=4)\n"
    parser += "args = p.parse_args()\n"
    found = [c for c in codes(tmp_path, ddp(parser + BN.format(batch="args.batch_size"))) if c[0] == "GD763"]
    assert len(found) == 1
