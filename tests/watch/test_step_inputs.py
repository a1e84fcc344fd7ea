"""Whatever a training loop hands `gpudoctor.step(loss=, samples=, epoch=)` while watched, the step never
raises into the loop and holds a bounded number of indices (a hostile review: a user's object whose
`tolist()`, `__getitem__` or `__index__` raised went through; `range(10**12)` was copied whole)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

CHILD = r"""
import json, sys
import gpudoctor, gpudoctor.training_step as ts
from gpudoctor.training_data import PENDING_MAX

class Boom:
    def __index__(self): raise RuntimeError("index")
    def __float__(self): raise RuntimeError("float")
class BadList:
    def __len__(self): return 3
    def __getitem__(self, k): raise RuntimeError("getitem")
class BadToList:
    def __len__(self): return 3
    def __getitem__(self, k): return self
    def tolist(self): raise RuntimeError("tolist")
def gen(): yield from range(5)

odd = [[1, 2, 3], [Boom(), Boom()], BadList(), BadToList(), gen(), {1: 2}, {1, 2}, "abc", 5, 1.5, None,
       [None, 1], [[1], [2]], range(10), (1, 2), object()]
epochs = [None, 0, 1, -1, 10**100, 1.5, "1", Boom()]
raised = []
for s in odd:
    for e in epochs:
        for loss in (None, Boom(), "x"):
            try:
                gpudoctor.step(loss=loss, samples=s, epoch=e)
            except BaseException as exc:
                raised.append(f"{type(exc).__name__}: {exc}")
for _ in range(3):
    gpudoctor.step(samples=range(10**12), epoch=7)
epoch = ts._publisher.data.streams["train"].epoch
held = len(epoch.pending)
print(json.dumps({"raised": raised, "held": held, "max": PENDING_MAX, "counted": epoch.n}))
"""


def test_odd_inputs_never_raise_into_the_loop_and_a_huge_batch_is_counted_not_copied(tmp_path: Path) -> None:
    folder = tmp_path / "steps"
    folder.mkdir(mode=0o700)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    server.bind(str(folder / "steps.sock"))  # a watcher's channel: step() is watched
    try:
        env = {**os.environ, "GPUDOCTOR_STEPS": str(folder), "PYTHONPATH": str(Path(__file__).parents[2])}
        out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, env=env, timeout=120)
    finally:
        server.close()
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["raised"] == []
    assert got["held"] <= got["max"]  # the epoch holds a bounded list, though 3 x 10**12 indices were given
    assert got["counted"] == 3 * 10**12  # every index is still counted
    assert "could not be read" in out.stderr  # said once on stderr, not raised
