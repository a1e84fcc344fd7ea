"""Redaction: secrets never reach a snapshot, report, JUnit file or recording. One way in.

gpudoctor copies other processes' command lines (the MASTER_PORT holder, processes on the GPUs)
and a few environment values into outputs that users attach to tickets. What it keeps is the
program and the shape of the command; what it replaces with `[redacted]` (MARKER) is:

- the value of an option whose name says it is a secret (`--password=x`, `--token x`,
  `--api-key x`, `--hf_token x`, `--db-password x`): the words of the name decide, see
  `secret_name`; `--sort-key loss` is not a secret, `--key x` and `--access-key x` are;
- the value of a `name=value` pair whose name says so, also inside a longer value
  (`mlx5_0:1,token=x`, `...?access_token=x&n=1`), and of a header (`X-Api-Key: x`,
  `Authorization: Bearer x`);
- the password of a URL or address with user info (`https://user:pw@host`, `user:pw@10.0.0.1`);
  the user name stays;
- the credential after `Bearer ` / `Basic ` (an HTTP authorization scheme);
- a long random string (RANDOM_RULE below).

The long-random-string rule. A candidate is a run of at least 20 letters, digits and `+` (the
alphabet of API keys and base64; `/`, `-`, `_`, `.` and the like end a run, so a path is judged
segment by segment). It is random when it is not hexadecimal and its
characters switch between lower case, upper case and digits often: at least 6 switches and at
least 0.3 per character. Random base62 text switches about 0.6 times per character, base32
about 0.4; English words, CamelCase names and paths switch at word boundaries only
(`TransformerEncoderLayerWithRotaryEmbedding` 0.26, `NVIDIAGeForceRTX4090` 5 switches). Hex
runs (commit and content hashes, UUIDs, container IDs) are kept: they name things rather than
unlock them and they are everywhere in paths (`snapshots/8cca5276...`). Model names
(`Meta-Llama-3.1-70B-Instruct`), options and numbers are short runs and stay whole. Known gaps,
by design: a bare argument that is a secret made only of hex digits or only of lower-case
letters, or base64 whose `/` cut it into runs shorter than 20 (give it an option name and it
goes: `--aws-secret-access-key wJalr/K7MD/...` is redacted by name).

Only the run that looks random is replaced, so `/data/<run>/model.pt` keeps its shape. A text
that was changed contains MARKER, which is how outputs say that redaction happened.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from functools import cache

MARKER = "[redacted]"

# Words that make an option or key name a secret ("hf_token", "api-key", "db_password").
_SECRET_WORDS = frozenset(
    {
        "password",
        "passwd",
        "passphrase",
        "pwd",
        "token",
        "tokens",
        "secret",
        "secrets",
        "credential",
        "credentials",
        "auth",
        "authorization",
        "cookie",
        "apikey",
        "accesskey",
        "secretkey",
        "privatekey",
        "signature",
    }
)
# "key" alone is a secret (`--key x`, `key=x`), and so is "<word> key" for these words; other
# "... key" names (`--sort-key loss`, `--metric-key acc`) name a field, not a credential.
_KEY_QUALIFIERS = frozenset(
    {"api", "access", "secret", "private", "account", "client", "session", "signing", "encryption", "license", "ssh"}
)


def secret_name(name: str) -> bool:
    """Whether an option or key name says its value is a secret (case and separators ignored)."""
    words = [w for w in re.split(r"[^a-z0-9]+", name.lower()) if w]
    if not words:
        return False
    if any(w in _SECRET_WORDS for w in words):
        return True
    if words == ["key"]:
        return True
    return any(w == "key" and i > 0 and words[i - 1] in _KEY_QUALIFIERS for i, w in enumerate(words))


@cache
def _rules() -> dict[str, re.Pattern[str]]:
    """The patterns, compiled on first use (importing this module is on `check --quick`'s path)."""
    return {
        # `name=value` inside a text; the value runs to the next separator of a list or query string.
        "assignment": re.compile(r"(?P<name>[A-Za-z][A-Za-z0-9_.\-]*)=(?P<value>[^\s,;&'\"]+)"),
        # `Name: value` as an HTTP header passed on a command line (`curl -H 'X-Api-Key: ...'`).
        "header": re.compile(r"(?P<name>[A-Za-z][A-Za-z0-9\-]*):\s+(?P<value>[^'\"\n]+)"),
        # user:password@host in a URL or a bare address; not a container image's `name:tag@sha256:...`.
        "userinfo": re.compile(
            r"(?P<pre>(?:[A-Za-z][A-Za-z0-9+.\-]*://)?[^\s:/@,;'\"]+):(?P<pw>[^\s@/'\"]+)@(?=[^\s@])(?!sha\d+:)"
        ),
        # HTTP authorization schemes; a plain English word after "Basic" ("Basic checks") is not one.
        "scheme": re.compile(r"\b(?P<pre>(?:Bearer|bearer|Basic)\s+)(?P<cred>[A-Za-z0-9._~+/\-]{8,}=*)"),
        "run": re.compile(r"[A-Za-z0-9+]{20,}"),
        "hex": re.compile(r"[0-9a-f]+|[0-9A-F]+"),
    }


MIN_RUN = 20
MIN_SWITCHES = 6
MIN_SWITCH_RATE = 0.3


def _kind(c: str) -> int:
    return 0 if c.isdigit() else 1 if c.islower() else 2 if c.isupper() else -1


def looks_random(run: str) -> bool:
    """The long-random-string rule (module docstring) for one run of key/base64 characters."""
    chars = [c for c in run if c.isalnum()]
    if len(run) < MIN_RUN or _rules()["hex"].fullmatch("".join(chars)):
        return False
    kinds = [_kind(c) for c in chars]
    switches = sum(1 for a, b in zip(kinds, kinds[1:], strict=False) if a != b)
    return switches >= MIN_SWITCHES and switches >= MIN_SWITCH_RATE * len(chars)


def _redact_assignment(match: re.Match[str]) -> str:
    if not secret_name(match.group("name")) or match.group("value") == MARKER:
        return match.group()
    return f"{match.group('name')}={MARKER}"


def _redact_header(match: re.Match[str]) -> str:
    if not secret_name(match.group("name")):
        return match.group()
    return f"{match.group('name')}: {MARKER}"


def _redact_scheme(match: re.Match[str]) -> str:
    cred = match.group("cred")
    if cred.isalpha() and cred.islower():
        return match.group()
    return f"{match.group('pre')}{MARKER}"


def text(value: str) -> str:
    """A free text (an environment value, an address, a log line) with its secrets replaced."""
    if not value:
        return value
    rules = _rules()
    out = rules["userinfo"].sub(lambda m: f"{m.group('pre')}:{MARKER}@", value)
    out = rules["header"].sub(_redact_header, out)
    out = rules["scheme"].sub(_redact_scheme, out)
    out = rules["assignment"].sub(_redact_assignment, out)
    return rules["run"].sub(lambda m: MARKER if looks_random(m.group()) else m.group(), out)


def _option_name(arg: str) -> str | None:
    """The name of an option argument (`--api-key`, `-token`), None for anything else."""
    if not arg.startswith("-") or arg in ("-", "--"):
        return None
    name = arg.lstrip("-")
    if not name or not name[0].isalpha():
        return None  # a negative number, not an option
    return name


def argv(args: Iterable[str]) -> list[str]:
    """A command line with its secret values replaced; the program (args[0]) is never changed.

    `--name=value` and `--name value` are redacted when `name` is a secret name; every
    argument also goes through `text` (URLs with passwords, key=value pairs, random runs).
    """
    items = list(args)
    out: list[str] = []
    hide_next = False
    for i, arg in enumerate(items):
        if i == 0:
            out.append(arg)
            continue
        if hide_next and _option_name(arg) is None:
            out.append(MARKER)
            hide_next = False
            continue
        hide_next = False
        name = _option_name(arg)
        if name is not None and "=" in name:
            key, _, value = arg.partition("=")
            out.append(f"{key}={MARKER}" if secret_name(key.lstrip("-")) and value else text(arg))
            continue
        if name is not None and secret_name(name):
            hide_next = True
        out.append(text(arg))
    return out


def redacted(value: str | None) -> bool:
    """Whether a text gpudoctor produced had something redacted from it."""
    return bool(value) and MARKER in str(value)
