"""The ranks' private directory: made by mkdtemp (0700, an unpredictable name), locked for the
run, swept when a SIGKILLed gpudoctor left it behind; and the rendezvous store's file inside it.

The ranks' spec, event files (gpudoctor/launch/protocol.py), logs and the single-node
rendezvous store live here, so they are written with plain opens; gpudoctor/launch/supervise.py
removes the directory on every way out. Only a SIGKILL leaves it behind; the next run removes
such leftovers of its own user whose run lock is free (`sweep_leftovers`).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

RANK_DIR_PREFIX = "gpudoctor-ranks-"
RUN_LOCK = "run.lock"  # flock'd by the launching gpudoctor for the whole run; the kernel drops it on SIGKILL
LEFTOVER_AGE_S = 60.0  # heuristic: a younger directory may belong to a run still starting (not yet locked)


def hold_run_lock(outdir: Path) -> int:
    """Lock the rank directory as in use (an fd to keep open for the run). A lock, not a PID: the
    run may be in another PID namespace (a container sharing /tmp) or on another host (TMPDIR on
    shared scratch), where a PID says nothing."""
    import fcntl

    fd = os.open(outdir / RUN_LOCK, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


def sweep_leftovers(tmp: Path) -> None:
    """Remove rank directories a SIGKILLed gpudoctor left behind: only this user's private ones
    (0700, not links, a minute old) whose run lock nobody holds any more."""
    import fcntl
    import shutil
    import stat

    now = time.time()
    try:
        entries = [e for e in os.scandir(tmp) if e.name.startswith(RANK_DIR_PREFIX)]
    except OSError:
        return
    for entry in entries:
        try:
            st = entry.stat(follow_symlinks=False)
            if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or stat.S_IMODE(st.st_mode) != 0o700:
                continue
            if now - st.st_mtime < LEFTOVER_AGE_S:
                continue
            fd = os.open(Path(entry.path) / RUN_LOCK, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            continue  # no lock file (an older gpudoctor's, or not ours): left alone
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            continue  # a live run holds it
        finally:
            os.close(fd)
        shutil.rmtree(entry.path, ignore_errors=True)


STORE_NAME = "rendezvous.store"


def private_store(outdir: Path) -> Path:
    """Create the single-node rendezvous store's file, empty and 0600, in the ranks' 0700 directory.

    The ranks open it as a `torch.distributed.FileStore` (which would create it 0644 itself):
    only this user can reach it, unlike a TCP port on 127.0.0.1, which every local user can
    connect to and read or poison the keys of (review3 S3). O_EXCL | O_NOFOLLOW: a fresh file,
    never one planted in its place.
    """
    path = outdir / STORE_NAME
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    os.close(fd)
    return path


def log_path(outdir: Path, rank: int) -> Path:
    """Where rank `rank`'s stdout and stderr go (the tail is kept for its findings)."""
    return outdir / f"rank{rank}.log"
