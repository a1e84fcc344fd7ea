"""What level 3's deep workloads share inside a rank: bitwise digests, a row per rank, flipped bits.

A digest stands for a whole tensor in comparisons across ranks ("digests gathered, not whole
tensors"): the tensor's bytes as 32-bit words, in rows of `ROW_WORDS`, reduced on its own device
to two exact int64 sums per row (plain, and weighted by the word's place in the row), and the
row sums hashed on the host. Integer sums are exact in any order, so the same bits give the same
digest on every device and every run; one flipped bit changes its row's plain sum by a power of
two, so it always changes the digest. Only the row sums (16 bytes a row) leave the device.
"""

from __future__ import annotations

import hashlib
import socket
from typing import Any

from gpudoctor.workloads.rank import RankContext, all_gather_json, host_bytes

ROW_WORDS = 1024  # words per row: plain sum < 2^41, weighted sum < 2^51, both exact in int64
BLOCK_ROWS = 4096  # rows reduced at a time (16 MiB of words), to bound the temporary memory


def digest(tensor: Any) -> str:
    """A bitwise digest of `tensor` (any dtype and shape; the dtype and shape are part of it)."""
    import torch

    raw = tensor.detach().contiguous().view(-1).view(torch.uint8)
    if raw.numel() % 4:  # whole 32-bit words: pad the last one with zero bytes
        raw = torch.cat([raw, torch.zeros(4 - raw.numel() % 4, dtype=torch.uint8, device=raw.device)])
    words = raw.view(torch.int32)
    full = words.numel() - words.numel() % ROW_WORDS
    weights = torch.arange(1, ROW_WORDS + 1, dtype=torch.int64, device=words.device)
    h = hashlib.sha256(f"{tensor.dtype}:{tuple(tensor.shape)}".encode())
    rows = words[:full].view(-1, ROW_WORDS)
    for start in range(0, rows.shape[0], BLOCK_ROWS):
        block = rows[start : start + BLOCK_ROWS].to(torch.int64)
        sums = torch.stack([block.sum(dim=1), (block * weights).sum(dim=1)], dim=1)
        h.update(host_bytes(sums))  # not .numpy(): the ranks run without numpy
    tail = words[full:].to(torch.int64)
    h.update(host_bytes(tail))
    return h.hexdigest()[:32]


def flip_bit(tensor: Any, word: int, bit: int) -> None:
    """Flip one bit of 32-bit word `word` of `tensor` in place (the `sdc` fault: what silent data
    corruption does); the tensor's size in bytes must be a multiple of 4."""
    import torch

    words = tensor.view(-1).view(torch.uint8).view(torch.int32)
    word %= words.numel()
    words[word : word + 1].bitwise_xor_(1 << bit if bit < 31 else -(1 << 31))  # int32: bit 31 is the sign


def device_info(ctx: RankContext) -> dict[str, Any]:
    """Who this rank is and what it runs on: the model name and SM count decide bitwise peers."""
    import torch

    info: dict[str, Any] = {
        "rank": ctx.rank,
        "local_rank": ctx.local_rank,
        "host": socket.gethostname(),
        "device": "cpu",
        "sm_count": None,
        # cuBLAS promises the same bits only within one toolkit version: part of the peer key.
        "toolkit": f"torch {torch.__version__}" + (f", CUDA {torch.version.cuda}" if torch.version.cuda else ""),
    }
    if ctx.device.type == "cuda":
        props = torch.cuda.get_device_properties(ctx.device)
        info["device"] = props.name
        info["sm_count"] = int(props.multi_processor_count)
        info["capability"] = f"{props.major}.{props.minor}"
    return info


def gather_rows(mine: dict[str, Any], world: int) -> list[dict[str, Any]]:
    """Every rank's row, in rank order, on every rank (so rank 0's result holds them all,
    across nodes too)."""
    rows = all_gather_json(mine, world)  # not all_gather_object: it needs numpy and unpickles
    return sorted(rows, key=lambda r: r["rank"])
