"""What a rank's Python stack says it is doing: joining its process group, waiting in a collective, in
backward, spawning ranks of its own, waiting for data, or something of its own (pure: frames in, words out).

A frame is (function, file, line) with the file as py-spy's `short_filename` gives it for installed
packages (`torch/distributed/distributed_c10d.py`), innermost first. The table names the torch functions
and files by where they are defined in torch 2.x:
- joining: `init_process_group` and `torch/distributed/rendezvous.py` (the store it connects to);
  `torch/distributed/elastic/rendezvous/` is torchrun's agent waiting for its nodes;
- a collective: any other function of `torch/distributed/distributed_c10d.py` (all_reduce, barrier,
  broadcast, ...), `c10d_logger.py`'s wrapper around them, and DDP's own collectives in
  `torch/nn/parallel/distributed.py` (the parameter broadcast in its constructor, buffer syncs);
- backward: `torch/autograd/` (under DDP, a backward that does not return waits for the gradient
  all-reduce, which the reducer runs from autograd hooks);
- spawn: `torch/multiprocessing/spawn.py` (mp.spawn waiting for its processes);
- loader: `torch/utils/data/` (waiting for a batch from DataLoader workers);
- importing: any frame of Python's import machinery (`<frozen importlib._bootstrap>`): still starting up
  (importing torch takes seconds, and longer on a loaded machine), whatever module it is in.
"""

from __future__ import annotations

from collections.abc import Sequence

Frame = tuple[str, str, int]  # function, file (short form for packages), line

JOIN, COLLECTIVE, BACKWARD, SPAWN, LOADER, RENDEZVOUS, IMPORTING, OTHER = (
    "join",
    "collective",
    "backward",
    "spawn",
    "loader",
    "rendezvous",
    "importing",
    "other",
)
KINDS = (JOIN, COLLECTIVE, BACKWARD, SPAWN, LOADER, RENDEZVOUS, IMPORTING, OTHER)
C10D = "torch/distributed/distributed_c10d.py"
# Where each kind leaves the job, in words for a verdict.
WORDS = {
    JOIN: "waits to join its process group",
    COLLECTIVE: "waits in a collective",
    BACKWARD: "waits in backward (DDP's gradient all-reduce runs there)",
    SPAWN: "waits for processes it started with torch.multiprocessing.spawn",
    LOADER: "waits for a batch from its DataLoader",
    RENDEZVOUS: "waits in torchrun's rendezvous for the other nodes",
    IMPORTING: "is still importing modules",
    OTHER: "is busy in its own code",
}
WAITING = {JOIN, COLLECTIVE, BACKWARD, RENDEZVOUS}  # kept waiting by other ranks (or nodes)


def _kind(frame: Frame) -> str | None:
    name, file, _ = frame
    short = name.rsplit(".", 1)[-1]
    if file.startswith("<frozen importlib"):
        return IMPORTING
    if file.startswith("torch/distributed/elastic/rendezvous/"):
        return RENDEZVOUS
    if file == "torch/distributed/rendezvous.py" or (file == C10D and short == "init_process_group"):
        return JOIN
    if file.startswith("torch/multiprocessing/spawn.py"):
        return SPAWN
    if file in (C10D, "torch/distributed/c10d_logger.py", "torch/nn/parallel/distributed.py"):
        return COLLECTIVE
    if file.startswith("torch/autograd/"):
        return BACKWARD
    if file.startswith("torch/utils/data/"):
        return LOADER
    return None


def classify(frames: Sequence[Frame]) -> str:
    """What the stack shows, innermost first: importing, torchrun's rendezvous, joining and spawning
    anywhere in it decide (in that order); otherwise the innermost frame of a known kind; otherwise OTHER."""
    kinds = [_kind(f) for f in frames]
    for decisive in (IMPORTING, RENDEZVOUS, JOIN, SPAWN):
        if decisive in kinds:
            return decisive
    return next((k for k in kinds if k is not None), OTHER)


def own_frame(frames: Sequence[Frame], full_names: Sequence[str]) -> int | None:
    """The index of the innermost frame of the user's own code: not torch, not Python's or another
    package's (a file under site-packages/dist-packages or lib/pythonX.Y), not `<frozen ...>`. A heuristic
    on paths."""
    for i, (frame, full) in enumerate(zip(frames, full_names, strict=False)):
        file = frame[1]
        if file.startswith(("torch/", "<")) or "-packages/" in full or "/lib/python3" in full:
            continue
        return i
    return None
