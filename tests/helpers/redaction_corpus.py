"""The redaction corpus of tests/reference/redaction/ (README.md there): secret-bearing and benign
command lines.

The secret lines are FAKE credentials shaped like real ones (`ghp_`, `AKIA`, `xoxb-`, PEM blocks),
so a repository scanner would flag them in plain text. They are stored gzip-compressed with every
byte then XORed with 0x5A (`secret_lines.jsonl.gz.xor`): no scanner that reads text or opens
archives sees a token, and this module reads them back.

    python -m tests.helpers.redaction_corpus show > /tmp/secret_lines.jsonl   # read them
    python -m tests.helpers.redaction_corpus store /tmp/secret_lines.jsonl      # store an edited file
"""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path
from typing import Any

from tests.paths import REFERENCE

CORPUS = REFERENCE / "redaction"
SECRETS_FILE = CORPUS / "secret_lines.jsonl.gz.xor"
KEY = 0x5A


def _flip(data: bytes) -> bytes:
    return bytes(b ^ KEY for b in data)


def secret_text() -> str:
    return gzip.decompress(_flip(SECRETS_FILE.read_bytes())).decode("utf-8")


def store(jsonl: str) -> None:
    SECRETS_FILE.write_bytes(_flip(gzip.compress(jsonl.encode("utf-8"), mtime=0)))


def _rows(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def secret_lines() -> list[dict[str, Any]]:
    """{"argv", "secrets" (values and their 8+ character pieces), "tool", "source", "note"?}."""
    return _rows(secret_text())


def benign_lines() -> list[dict[str, Any]]:
    """{"argv", "keep" (what must survive, token-wise), "keep_values", "source", "origin"}."""
    return _rows((CORPUS / "benign_lines.jsonl").read_text(encoding="utf-8"))


if __name__ == "__main__":
    if sys.argv[1:2] == ["show"]:
        sys.stdout.write(secret_text())
    elif sys.argv[1:2] == ["store"] and len(sys.argv) == 3:
        store(Path(sys.argv[2]).read_text(encoding="utf-8"))
    else:
        sys.exit("usage: python -m tests.helpers.redaction_corpus show | store FILE")
