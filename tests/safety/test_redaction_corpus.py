"""The allow-list redactor against the corpus of tests/reference/redaction/ (issue 24).

Secret lines: command lines written in the credential syntax each tool documents (mysql, psql,
curl, aws, wandb, huggingface-cli, kubectl, openssl, sshpass, PEM blocks, signed URLs, ...; the
source of each is in the line). Not one secret, and not one piece of one (a value cut at `/`,
`%2B`, `.` or `&` and one half kept), may survive, in argv form or as the one-line command
gpudoctor writes into snapshots and recordings.

Benign lines: real training command lines copied from public READMEs (torchrun, deepspeed,
accelerate, Hydra overrides, horovodrun, fairseq, NeMo, ...): every option name, key, script,
`-m` module and launcher verb (`keep`) must survive, compared token-wise.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from gpudoctor.probe.environment import shown_value
from gpudoctor.probe.processes import command_line
from gpudoctor.safety import redact
from tests.helpers.redaction_corpus import SECRETS_FILE, benign_lines, secret_lines

SECRET = secret_lines()
BENIGN = benign_lines()


def _id(row: dict[str, Any]) -> str:
    return " ".join(row["argv"])[:60]


def test_the_corpus_is_as_large_as_the_issue_asks_and_every_line_names_its_source() -> None:
    assert len(SECRET) >= 400 and len(BENIGN) >= 300
    assert len({r["tool"] for r in SECRET}) >= 100
    for row in SECRET:
        assert row["source"].startswith(("http", "heuristic: ")) and row["secrets"]
        joined = " ".join(row["argv"])
        assert all(s in joined for s in row["secrets"]), row
    for row in BENIGN:
        assert row["source"] and row["keep"] and row["keep"][0] == row["argv"][0]


def test_the_stored_secret_lines_are_not_readable_by_a_scanner() -> None:
    """A push scanner reads text and opens archives; the stored bytes hold no secret."""
    stored = SECRETS_FILE.read_bytes()
    assert not any(s.encode() in stored for row in SECRET for s in row["secrets"])
    assert not stored.startswith(b"\x1f\x8b")  # not a plain gzip stream either


@pytest.mark.parametrize("row", SECRET, ids=_id)
def test_no_secret_or_piece_of_one_survives(row: dict[str, Any]) -> None:
    shown = redact.argv(row["argv"], shown_value)
    outputs = "\n".join([*shown, command_line(row["argv"], limit=100_000)])
    assert [s for s in row["secrets"] if s in outputs] == [], shown
    assert redact.redacted(outputs)  # and the output says something was left out


def _survives(entry: str, tokens: list[str]) -> bool:
    """Token-wise: a token (or a word of one) equals the entry, starts with `entry=`, or for a
    script ends with `/entry` (`[redacted]/train.py`)."""
    for token in tokens:
        words = [token, *(w.strip("'\"`();") for w in token.split())]
        for word in words:
            if word == entry or word.startswith(entry + "="):
                return True
            if entry.endswith((".py", ".sh")) and word.endswith("/" + entry):
                return True
    return False


@pytest.mark.parametrize("row", BENIGN, ids=_id)
def test_every_option_name_key_script_and_verb_of_a_training_line_survives(row: dict[str, Any]) -> None:
    shown = redact.argv(row["argv"], shown_value)
    assert [k for k in row["keep"] if not _survives(k, shown)] == [], shown


def _decided_away(argv: list[str], value: str) -> bool:
    """A value the allow-list replaces by decision (module docstring of gpudoctor.safety.redact): a
    number standing alone (no option before it: it may be a PIN), or any value of an option whose
    name ends in a credential word (`--use_auth false`)."""
    at = argv.index(value) if value in argv else -1
    before = argv[at - 1] if at > 0 else ""
    named = re.split(r"[^a-z]+", before.lower().strip("-"))[-1:] if before.startswith("-") else []
    return (redact.NUMBER.fullmatch(value) is not None and not before.startswith("-")) or (
        named and named[0] in ("auth", "token", "key", "password", "secret")
    )


def test_numbers_booleans_host_ports_and_file_names_of_training_lines_survive() -> None:
    """The values the allow-list keeps (issue 24: numbers, booleans, host:port, known file names)
    survive, but for the ones it replaces by decision."""
    lost = []
    for row in BENIGN:
        shown = redact.argv(row["argv"], shown_value)
        for value in row.get("keep_values", []):
            if not _survives(value, shown) and not any(value in t for t in shown):
                lost.append((value, row["argv"]))
    assert [(v, a) for v, a in lost if not _decided_away(a, v)] == []
    assert len(lost) < len(BENIGN) // 100  # the decision costs a few values, not a class of them
