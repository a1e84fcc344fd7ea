"""Level 3: a memory test over a share of the GPU's free memory (a buffer on CPU ranks).

Patterns, each written over the whole tested memory before any of it is read back (so the bits
sit in memory for a while, as memtest86 and DCGM's memtest do; DCGM 2.4 "Memtest Diagnostic"):

- walking ones: 32 patterns, every 32-bit word holding 1 << b (b = 0..31);
- walking zeros: the same with the bit cleared, ~(1 << b);
- address in address: every 64-bit word holds its own device address (finds address-line
  faults: a word written through a wrong address shows another word's address);
- random: a seeded random word sequence per chunk, regenerated from the seed to verify; each
  pass uses new seeds.

One pass runs every pattern; passes repeat until `seconds` is spent (at least one pass). The
first wrong word is reported with its pattern, its byte offset in the tested memory and its
device (virtual) address, the value expected and the value read, and the count of wrong words.
The GPU's ECC counters (volatile corrected and uncorrected, remapped rows) are read through
NVML before and after.

params: "seconds", "share" (of free GPU memory), "cpu_bytes", "chunk_bytes", "gpus" (NVML
index of each local rank's GPU, in local rank order).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

from gpudoctor.workloads.deep_common import device_info, flip_bit, gather_rows
from gpudoctor.workloads.rank import RankContext

MIB = 1 << 20
SEED = 8675309
MAX_WRONG_PATTERNS = 8  # patterns with wrong words listed by name in the result

# nvml.h: nvmlMemoryErrorType_t CORRECTED 0, UNCORRECTED 1; nvmlEccCounterType_t VOLATILE 0.
ECC_CORRECTED, ECC_UNCORRECTED, ECC_VOLATILE = 0, 1, 0


def ecc_counters(nvml_index: int | None) -> dict[str, Any] | None:
    """Volatile ECC error totals and remapped rows of a GPU, read through the probe's NVML
    wrapper; None where NVML cannot be asked, a field None where the GPU does not say."""
    if nvml_index is None:
        return None
    from gpudoctor.probe.device import DeviceReader
    from gpudoctor.probe.nvml import Nvml
    from gpudoctor.snapshot import Missing

    nvml = Nvml()
    if not nvml.init().ok:
        return None
    try:
        handle = nvml.call("nvmlDeviceGetHandleByIndex", nvml_index)
        if isinstance(handle, Missing):
            return None
        reader = DeviceReader(nvml, handle)

        def known(value: Any) -> Any:
            return None if isinstance(value, Missing) else value

        rows = known(reader.read("nvmlDeviceGetRemappedRows", lambda v: [int(x) for x in v]))
        return {
            "corrected_volatile": known(reader.read("nvmlDeviceGetTotalEccErrors", int, ECC_CORRECTED, ECC_VOLATILE)),
            "uncorrected_volatile": known(
                reader.read("nvmlDeviceGetTotalEccErrors", int, ECC_UNCORRECTED, ECC_VOLATILE)
            ),
            "remapped_correctable": rows[0] if rows else None,
            "remapped_uncorrectable": rows[1] if rows else None,
            "remap_pending": bool(rows[2]) if rows else None,
            "remap_failed": bool(rows[3]) if rows else None,
        }
    finally:
        nvml.shutdown()


def _allocate(ctx: RankContext, params: dict[str, Any]) -> tuple[list[Any], int]:
    """The buffers under test (chunks of `chunk_bytes`) and the bytes asked for."""
    import torch

    chunk = int(params.get("chunk_bytes", 256 * MIB))
    if ctx.device.type == "cuda":
        torch.cuda.empty_cache()
        free, _ = torch.cuda.mem_get_info(ctx.device)
        wanted = int(free * float(params.get("share", 0.8)))
        wanted -= min(chunk, wanted // 4)  # room for the random pattern's scratch chunk
    else:
        wanted = int(params.get("cpu_bytes", 16 * MIB))
    wanted -= wanted % (8 * MIB)
    chunks = []
    left = wanted
    while left > 0:
        size = min(chunk, left)
        try:
            chunks.append(torch.empty(size // 4, dtype=torch.int32, device=ctx.device))
        except RuntimeError:  # torch.OutOfMemoryError is one
            break  # test what could be had; the result says how much that was
        left -= size
    return chunks, wanted


def _patterns(pass_no: int) -> Iterator[tuple[str, Any]]:
    """(name, value) for every pattern of a pass: an int32 word, "address" or ("random", seed)."""
    for bit in range(32):
        yield f"walking ones bit {bit}", (1 << bit) if bit < 31 else -(1 << 31)
    for bit in range(32):
        yield f"walking zeros bit {bit}", ~(1 << bit) if bit < 31 else (1 << 31) - 1
    yield "address in address", "address"
    yield f"random (seed {SEED + pass_no})", ("random", SEED + pass_no)


def _writer(value: Any, device: Any) -> tuple[Callable[[Any, int], None], Callable[[Any, int], Any]]:
    """How to write a pattern into chunk i, and what chunk i must read back."""
    import torch

    if value == "address":

        def addresses(chunk: Any, i: int) -> Any:
            base = chunk.data_ptr()
            return torch.arange(base, base + chunk.numel() * 4, 8, dtype=torch.int64, device=device)

        def write(chunk: Any, i: int) -> None:
            chunk.view(torch.int64).copy_(addresses(chunk, i))

        return write, lambda chunk, i: addresses(chunk, i).view(torch.int32)
    if isinstance(value, tuple):
        seed = value[1]

        def expected(chunk: Any, i: int) -> Any:
            gen = torch.Generator(device=device).manual_seed(seed * 100003 + i)
            return torch.randint(-(1 << 31), 1 << 31, (chunk.numel(),), dtype=torch.int32, device=device, generator=gen)

        return lambda chunk, i: chunk.copy_(expected(chunk, i)), expected
    return lambda chunk, i: chunk.fill_(value), lambda chunk, i: value


def _check(chunks: list[Any], expected: Callable[[Any, int], Any]) -> tuple[int, dict[str, Any] | None]:
    """Wrong words in all chunks, and the first one (chunk order is address order of the test)."""
    import torch

    counts = torch.stack([torch.count_nonzero(c != expected(c, i)) for i, c in enumerate(chunks)])
    per_chunk = counts.cpu().tolist()
    total = int(sum(per_chunk))
    if not total:
        return 0, None
    i = next(k for k, n in enumerate(per_chunk) if n)
    chunk = chunks[i]
    want = expected(chunk, i)
    bad = chunk != want
    word = int(torch.nonzero(bad)[0].item())
    want_word = int(want.view(-1)[word].item()) if isinstance(want, torch.Tensor) else int(want)
    offset = sum(c.numel() * 4 for c in chunks[:i]) + word * 4
    return total, {
        "offset": offset,
        "address": f"0x{chunk.data_ptr() + word * 4:x}",
        "expected": f"0x{want_word & 0xFFFFFFFF:08x}",
        "got": f"0x{int(chunk[word].item()) & 0xFFFFFFFF:08x}",
    }


def run(ctx: RankContext, params: dict[str, Any]) -> dict[str, Any]:
    seconds = float(params["seconds"])
    gpus = params.get("gpus") or []
    nvml_index = gpus[ctx.local_rank] if ctx.device.type == "cuda" and ctx.local_rank < len(gpus) else None
    sdc = ctx.faults.has("sdc")
    ecc_before = ecc_counters(nvml_index)
    chunks, wanted = _allocate(ctx, params)
    tested = sum(c.numel() * 4 for c in chunks)
    t0 = time.perf_counter()
    passes, patterns_run, errors = 0, 0, 0
    first: dict[str, Any] | None = None
    wrong_patterns: dict[str, int] = {}
    while chunks and (passes == 0 or time.perf_counter() - t0 < seconds):
        for name, value in _patterns(passes):
            write, expected = _writer(value, ctx.device)
            for i, chunk in enumerate(chunks):
                write(chunk, i)
            if sdc and patterns_run == 0:
                flip_bit(chunks[0], 12345, 7)  # the fault: one bit decays before it is read back
            wrong, where = _check(chunks, expected)
            patterns_run += 1
            if wrong:
                errors += wrong
                if len(wrong_patterns) < MAX_WRONG_PATTERNS:
                    wrong_patterns[name] = wrong
                if first is None and where is not None:
                    first = {"pattern": name, "pass": passes + 1, **where}
        passes += 1
    ctx.sync()
    elapsed = time.perf_counter() - t0
    del chunks
    mine = {
        **device_info(ctx),
        "gpu": nvml_index,
        "bytes_wanted": wanted,
        "bytes_tested": tested,
        "passes": passes,
        "patterns": patterns_run,
        "seconds": round(elapsed, 3),
        "errors": errors,
        "first": first,
        "wrong_patterns": wrong_patterns,
        "ecc_before": ecc_before,
        "ecc_after": ecc_counters(nvml_index),
    }
    rows = gather_rows(mine, ctx.world_size)
    return {"rows": rows, "device": ctx.device.type, "seconds": seconds}
