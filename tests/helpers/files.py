"""Files a test writes for gpudoctor to read (policy files, snapshots made by hand)."""

from __future__ import annotations

import os
from pathlib import Path


def write(path: Path, text: str, mode: int = 0o644, owner: int | None = None) -> Path:
    """`text` at `path` (its folders made), with `mode` whatever the umask of the machine running the
    tests (a group-writable policy file is not trusted: tests/test_policy_trust.py), given to the user
    `owner` if named."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    path.chmod(mode)
    if owner is not None:
        os.chown(path, owner, -1)
    return path
