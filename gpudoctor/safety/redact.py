"""Redaction: secrets never reach a snapshot, report, JUnit file or recording. One way in.

gpudoctor copies other processes' command lines (the MASTER_PORT holder, processes on the GPUs)
and a few environment values into outputs that users attach to tickets. What it keeps is the
program and the shape of the command; what it replaces with `[redacted]` (MARKER) is:

- the value of an option whose name says it is a secret (`--password=x`, `--token x`,
  `--api-key x`, `--hf_token x`, `--db-password x`, `--pass x`): the words of the name decide,
  see `secret_name`; a secret word also counts at the end of a word (`PGPASSWORD`, `dbpass`,
  `hftoken`; not `bypass` or `compass`); `--key x` and `--access-key x` are secrets, while
  `--sort-key loss` is not: a name ending in "key" hides only a value that looks like a key
  (`key_like`: `--wandb-key <40 hex digits>`). A name whose last word is file/path/dir/filename
  points at a secret and keeps its value (`--password-file /run/secrets/db`, `--key-file
  ~/.ssh/id`); plurals are counts (`--max-tokens 4096`); a name whose last word describes the
  secret keeps its value (`--auth-mode none`, `token_type`, `--secret-name`, `--token-url`:
  `_DESCRIPTOR_WORDS`), and so do null, boolean and special-token values (`<pad>`, `[PAD]`,
  `<|eot_id|>`) and values that name a file (`-key server.key`, `--token ~/t.txt`); `pw` counts
  as the last word only (`--pw x`, `db_pw`; not `--pw-kernel`); digits around a word do not
  hide it (`PASSWORD2`, `0sig`);
- the value of a `name=value` pair whose name says so, also inside a longer value
  (`mlx5_0:1,token=x`, `...?access_token=x&n=1`, an Azure SAS's `&sig=x`, `env PGPASSWORD=x`),
  quoted or spaced in code (`python -c "login(token='x')"`, `password = "x"`), of a quoted
  JSON or dict pair (`{"api_key": "x"}`) and of a header (`X-Api-Key: x`, `Authorization: Bearer x`);
- OpenSSL's `pass:x` pass phrase argument (`-passin pass:x`);
- `-p WORD`: mysql, sshpass, mongosh and many scripts take a password there, ssh and docker a
  port, mkdir a path after a flag; the word goes unless it is a number, a port mapping
  (`8080:80`) or a path. Glued (`-pSECRET`) only after the mysql family and 7z: `find -print`
  and `gcc -pthread` are options, not secrets;
- the password options of a few programs whose option names do not say so (`_PROGRAM_OPTIONS`:
  `curl -u bob:pw` keeps `bob`, `smbclient -U bob%pw`, `lftp -u bob,pw`, `redis-cli -a`,
  `zip -P`), also after a wrapper (`env X=y mysql -pSECRET`, `sudo curl ...`), and inside a
  text (`bash -c "mysql -pSECRET db"`, a log line). A program met on the way adds its rules to
  those already met, never replaces them (a database or URL called `open`), and `&&`, `|`, `;`
  start the next command afresh;
- the password of a URL or address with user info (`https://user:pw@host`, `user:pw@10.0.0.1`);
  the user name stays;
- the credential after `Bearer ` / `Basic ` (an HTTP authorization scheme);
- AWS access key IDs (`AKIA...`, `ASIA...`: 20 characters), the prefix kept;
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
goes: `--aws-secret-access-key wJalr/K7MD/...` is redacted by name); a glued `-pSECRET` after a
program not in _PROGRAM_OPTIONS (argparse would read it as `-p SECRET`); a secret given to an
option whose name says nothing (`--db-conn x`) unless it is random, a URL password or a key ID.

Only the run that looks random is replaced, so `/data/<run>/model.pt` keeps its shape. A text
that was changed contains MARKER, which is how outputs say that redaction happened.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from functools import cache

MARKER = "[redacted]"

# Words that make an option or key name a secret ("hf_token", "api-key", "db_password", "--pass").
_SECRET_WORDS = frozenset(
    {
        "password",
        "passwd",
        "passphrase",
        "pass",
        "pwd",
        "token",
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
        "sig",  # Azure shared access signatures: `...&sig=<base64>`
    }
)
# These also count at the end of a longer word: `PGPASSWORD`, `dbpass`, `hftoken`, `clientsecret`.
_SECRET_SUFFIXES = ("password", "passwd", "passphrase", "pass", "pwd", "token", "secret", "apikey", "accesskey")
# English words that end in a secret word and name no secret (`--bypass-cache`, `--compass`).
_NOT_SECRET_WORDS = frozenset(
    {
        "bypass",
        "compass",
        "encompass",
        "surpass",
        "overpass",
        "underpass",
        "trespass",
        "multipass",
        "onepass",
        "twopass",
        "firstpass",
        "secondpass",
        "singlepass",
    }
)
# A name whose last word says it holds where a secret is, not the secret (`--password-file
# /run/secrets/db`, `--key-file ~/.ssh/id`, `--token-path x`): the path is kept.
_REFERENCE_WORDS = frozenset({"file", "path", "dir", "filename", "fd"})
# "key" alone is a secret (`--key x`, `key=x`), and so is "<word> key" for these words; other
# "... key" names (`--sort-key loss`, `--wandb-key <hex>`) are a secret when their value looks like
# a key (`key_like`), and name a field otherwise.
_KEY_QUALIFIERS = frozenset(
    {"api", "access", "secret", "private", "account", "client", "session", "signing", "encryption", "license", "ssh"}
)


# The last word of a name that describes a secret rather than holds it (`--auth-mode none`,
# `token_type: bpe`, `--secret-name my-secret`, `--token-url https://...`); a heuristic list.
_DESCRIPTOR_WORDS = frozenset(
    {"type", "types", "mode", "kind", "format", "length", "len", "size", "count", "limit", "policy", "method"}
    | {"style", "strategy", "name", "names", "url", "uri", "endpoint", "host", "port", "version", "timeout", "ttl"}
)


def _words(name: str) -> list[str]:
    """The words of a name, lower case, leading and trailing digits dropped (`0sig`, a prefix glued
    by a log; `PASSWORD2`, `token1`)."""
    return [w for w in (w.strip("0123456789") for w in re.split(r"[^a-z0-9]+", name.lower())) if w]


def _secret_word(word: str) -> bool:
    if word in _SECRET_WORDS:
        return True
    return word not in _NOT_SECRET_WORDS and word.endswith(_SECRET_SUFFIXES)


def secret_name(name: str) -> bool:
    """Whether an option or key name says its value is a secret (case and separators ignored)."""
    words = _words(name)
    if not words or words[-1] in _REFERENCE_WORDS or (len(words) > 1 and words[-1] in _DESCRIPTOR_WORDS):
        return False
    if any(_secret_word(w) for w in words) or words[-1] == "pw":  # `--pw`, `db_pw`; not `--pw-kernel`
        return True
    if words == ["key"]:
        return True
    return any(w == "key" and i > 0 and words[i - 1] in _KEY_QUALIFIERS for i, w in enumerate(words))


def key_name(name: str) -> bool:
    """A name that ends in "key" (`--wandb-key`, `--cache-key`, `--sort-key`): a secret only when
    its value looks like a key (`key_like`)."""
    words = _words(name)
    return bool(words) and words[-1].endswith("key")


def key_like(value: str) -> bool:
    """A value that looks like an API key: 20 or more key characters (letters, digits, `+/=-`),
    letters and digits both, no `_` or `.` (identifiers, metric and file names have them) and
    not a path (`/`, `~` or `.` first). A 40-digit hex wandb key is one; `val_accuracy_top5` is not."""
    return (
        len(value) >= MIN_RUN
        and _rules()["keychars"].fullmatch(value) is not None
        and not value.startswith(("/", "~", "."))
        and any(c.isdigit() for c in value)
        and any(c.isalpha() for c in value)
    )


def secret_pair(name: str, value: str) -> bool:
    """Whether `value`, given as the value of option or key `name`, is to be redacted."""
    rules = _rules()
    if (
        not value
        or value == MARKER
        or rules["no_secret_value"].fullmatch(value)
        or rules["file_value"].fullmatch(value)
    ):
        return False
    return secret_name(name) or (key_name(name) and key_like(value))


# A key or option name in a text. It starts only where a run of name characters starts (the
# lookbehind; `_SECRET`, `0token` and `--api-key` whole), so a long run is tried once, not from
# each of its characters; a subscript's closing quote and bracket may follow (`environ['X']=`).
_NAME = r"(?<![A-Za-z0-9_.\-])(?P<name>[0-9_.\-]*[A-Za-z][A-Za-z0-9_.\-]*)(?P<close>['\"]?\]?)"


@cache
def _rules() -> dict[str, re.Pattern[str]]:
    """The patterns, compiled on first use (importing this module is on `check --quick`'s path)."""
    return {
        # A string literal assigned in code given to `python -c`, to its closing quote, the quotes
        # and spaces kept: `token='x'`, `password = "a b"`, `os.environ['HF_TOKEN']='x'`,
        # `OpenAI(api_key="x")`; `==` is a comparison. Only a secret name's literal is replaced; any
        # other is left for the next rule to look inside (`cmd = "run --env=PGPASSWORD=x"`).
        "literal": re.compile(
            _NAME + r"(?P<sep>[ \t]*=(?!=)[ \t]*[rRbBuUfF]{0,2})(?:'(?P<v1>[^'\n]*)'?|\"(?P<v2>[^\"\n]*)\"?)"
        ),
        # `name=value` inside a text; the value runs to the next separator of a list or query
        # string. With spaces around `=` and no quote it is code (`key = jax.random.PRNGKey(0)`).
        "assignment": re.compile(
            _NAME + r"=(?![rRbBuUfF]{1,2}['\"])(?P<value>[^\s,;&'\"]+)"  # (`r'...'` is the literal rule's)
        ),
        # A quoted pair of JSON or a Python dict (`'{"api_key": "x"}'`), its quotes maybe escaped
        # (`"{\"api_key\": \"x\"}"` inside a shell string).
        "quoted_pair": re.compile(
            r"(?P<pre>\\?(?P<q>['\"])(?P<name>[0-9_.\-]*[A-Za-z][A-Za-z0-9_.\-]*)\\?(?P=q)"
            r"[ \t]*:[ \t]*\\?(?P<q2>['\"]))"
            r"(?P<value>[^'\"\n\\]+)(?:\\?(?P=q2))?"  # (a text cut inside the value has no closing quote)
        ),
        # OpenSSL's pass phrase argument (`-passin pass:x`, `-passout pass:x`; openssl-passphrase-options(1):
        # "pass:password ... the actual password is password"); `env:`, `file:`, `fd:` name where it is.
        "openssl_pass": re.compile(r"(?<![A-Za-z0-9_])(?P<pre>pass:)(?P<pw>[^\s'\"]+)"),
        # `Name: value` as an HTTP header passed on a command line (`curl -H 'X-Api-Key: ...'`), or
        # YAML's `password: "x"` (the opening quote kept). The 80 characters looked at are a
        # heuristic bound on what the decision needs (`_redact_headers`).
        "header": re.compile(
            r"(?<![A-Za-z0-9\-])(?P<name>[0-9\-]*[A-Za-z][A-Za-z0-9\-]*):[ \t]*"
            r"(?=(?P<q>['\"]?)(?P<value>[^'\"\n]{1,80}))"
        ),
        # user:password@host in a URL or a bare address; not a container image's `name:tag@sha256:...`.
        # (The user starts only after a space, `/@,;` or a quote: `x:x:x:...` is tried once; a
        # password of at most 256 characters, a heuristic bound that keeps `,a:,a:...@` linear.)
        "userinfo": re.compile(
            # (`redis://:password@host`: a URL may give a password with no user)
            r"(?P<pre>(?<![A-Za-z0-9+.\-])[A-Za-z][A-Za-z0-9+.\-]*://[^\s:/@,;'\"]*|(?<![^\s/@,;'\"])[^\s:/@,;'\"]+)"
            r":(?P<pw>[^\s@/'\"]{1,256})@(?=[^\s@])(?!sha\d+:)"
        ),
        # HTTP authorization schemes; a plain English word after "Basic" ("Basic checks") is not one.
        "scheme": re.compile(r"\b(?P<pre>(?:Bearer|bearer|Basic)\s+)(?P<cred>[A-Za-z0-9._~+/\-]{8,}=*)"),
        # A value that names a file holds no secret itself (`openssl req -key server.key`, `--token
        # ~/t.txt`); the extensions are a heuristic list of key, certificate and config files.
        "file_value": re.compile(
            r"(?:~|\.{1,2})/.*|[^\s=:]*\.(?:key|pem|crt|cer|der|p12|pfx|jks|json|ya?ml|txt|conf|cfg|ini)"
        ),
        # Values that hold no secret whatever the name (a heuristic): a null or a boolean, a
        # tokenizer's special token (`<pad>`, `</s>`, `<|eot_id|>`, `[PAD]`).
        "no_secret_value": re.compile(
            r"(?i:none|null|nil|true|false|undefined)|</?\|?[A-Za-z_]{1,40}\|?>|\[[A-Z]{2,8}\]"
        ),
        "to_line_end": re.compile(r"[^'\"\n]*"),
        "run": re.compile(r"[A-Za-z0-9+]{20,}"),
        "hex": re.compile(r"[0-9a-f]+|[0-9A-F]+"),
        "space": re.compile(r"(\s+)"),
        "keychars": re.compile(r"[A-Za-z0-9+/=\-]+"),
        # AWS access key IDs: long-term (AKIA) and temporary (ASIA) ones, 20 characters
        # (docs.aws.amazon.com IAM "Unique identifiers"; tests/reference/redaction_shapes.md).
        "aws_key_id": re.compile(r"(?<![A-Za-z0-9])(?P<pre>AKIA|ASIA)[A-Z0-9]{16}(?![A-Za-z0-9])"),
        # Not a secret after `-p`: a number, a port mapping (`8080:80`, `127.0.0.1:80:80/tcp`), a path.
        "plain_p": re.compile(r"[0-9][0-9.:]*(?:/(?:tcp|udp|sctp))?|[./~].*|.*/.*"),
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


def _redact_literal(match: re.Match[str]) -> str:
    group = "v1" if match.group("v1") is not None else "v2"
    if not secret_pair(match.group("name"), match.group(group)):
        return match.group()
    quote = "'" if group == "v1" else '"'
    closed = quote if match.end(group) < match.end() else ""  # (a text cut inside the literal)
    return f"{match.group('name')}{match.group('close')}{match.group('sep')}{quote}{MARKER}{closed}"


def _redact_assignment(match: re.Match[str]) -> str:
    head, value = match.group("name") + match.group("close") + "=", match.group("value")
    if secret_pair(match.group("name"), value):
        return f"{head}{MARKER}"
    if "=" in value:  # `--env=HF_TOKEN=...`, `--set=auth.password=...`: the pair inside is judged too
        return f"{head}{_rules()['assignment'].sub(_redact_inner_assignment, value)}"
    return match.group()


def _redact_inner_assignment(match: re.Match[str]) -> str:
    """The pair inside another's value: judged once, not again inside itself (`a=a=a=...` stays linear)."""
    if secret_pair(match.group("name"), match.group("value")):
        return f"{match.group('name')}{match.group('close')}={MARKER}"
    return match.group()


def _redact_quoted_pair(match: re.Match[str]) -> str:
    if not secret_pair(match.group("name"), match.group("value")):
        return match.group()
    close = match.group()[len(match.group("pre")) + len(match.group("value")) :]
    return f"{match.group('pre')}{MARKER}{close}"


def _redact_headers(value: str) -> str:
    """`Name: value` pairs whose name says secret, the value to the end of the line replaced. The
    pattern only looks ahead at the value, so a pair that is not secret (`ERROR: auth failed,
    password: x`) does not hide the pairs after it."""
    rules = _rules()
    out: list[str] = []
    done = 0
    for match in rules["header"].finditer(value):
        if match.start() < done:
            continue  # inside a value already replaced
        # The decision reads the value's first 80 characters, so that each `Name:` costs a bounded
        # look; only a value that is replaced is read to its end.
        shown = match.group("value").strip()
        if shown.startswith(MARKER) or not secret_pair(match.group("name"), shown):
            continue  # (`pass:[redacted] -in req.pem`: the pass phrase rule took it)
        out += [value[done : match.start()], f"{match.group('name')}: {match.group('q')}{MARKER}"]
        end = rules["to_line_end"].match(value, match.start("value"))
        done = end.end() if end else match.end("value")
    return "".join(out) + value[done:] if out else value


def _redact_scheme(match: re.Match[str]) -> str:
    cred = match.group("cred")
    if cred.isalpha() and cred.islower():
        return match.group()
    return f"{match.group('pre')}{MARKER}"


MAX_TEXT = 4096  # longer texts are cut first: the patterns cost up to quadratic time in a text's length


def text(value: str) -> str:
    """A free text (an environment value, an address, a log line) with its secrets replaced; a text
    over MAX_TEXT characters is cut there (marked "...[cut]") so that no input can stall gpudoctor."""
    if not value:
        return value
    if len(value) > MAX_TEXT:
        return text(value[:MAX_TEXT]) + "...[cut]"
    rules = _rules()
    out = rules["userinfo"].sub(lambda m: f"{m.group('pre')}:{MARKER}@", value) if "@" in value else value
    out = rules["openssl_pass"].sub(lambda m: f"{m.group('pre')}{MARKER}", out)
    out = _redact_headers(out)
    out = rules["scheme"].sub(_redact_scheme, out)
    out = rules["quoted_pair"].sub(_redact_quoted_pair, out)
    out = rules["literal"].sub(_redact_literal, out)
    out = rules["assignment"].sub(_redact_assignment, out)
    out = rules["aws_key_id"].sub(lambda m: f"{m.group('pre')}{MARKER}", out)
    out = rules["run"].sub(lambda m: MARKER if looks_random(m.group()) else m.group(), out)
    if "-" not in out or not rules["space"].search(out):
        return out  # one word, or no option in it
    # A command inside a text (`bash -c "mysql -pSECRET db"`, a log line that echoes one): the
    # words go through the same option-aware pass as a command line's arguments.
    parts = rules["space"].split(out)
    parts[0::2] = _tokens(parts[0::2], {}, lambda word: word)
    return "".join(parts)


def _option_name(arg: str) -> str | None:
    """The name of an option argument (`--api-key`, `-token`), None for anything else."""
    if not arg.startswith("-") or arg in ("-", "--"):
        return None
    name = arg.lstrip("-")
    if not name or not name[0].isalpha():
        return None  # a negative number, not an option
    return name


# Programs whose options carry a password in a shape no option name tells: "value" (the next
# argument or glued, `-Ppw`), "glued" (only glued: mysql's `-pPASSWORD`; `-p db` prompts and names a
# database) and "userinfo" (`user:password`, the user kept; Samba's `user%password` and lftp's
# `user,password` the same with their own separator). From each program's manual; see
# tests/reference/redaction_shapes.md.
_MYSQL = {"-p": "glued"}
_SAMBA = {"-U": "userinfo%", "--user": "userinfo%"}
_PROGRAM_OPTIONS: dict[str, dict[str, str]] = {
    "curl": {"-u": "userinfo", "--user": "userinfo", "-U": "userinfo", "--proxy-user": "userinfo"},
    "sshpass": {"-p": "value"},
    "redis-cli": {"-a": "value"},
    "mongo": {"-p": "value"},
    "mongosh": {"-p": "value"},
    "zip": {"-P": "value"},
    "unzip": {"-P": "value"},
    "lftp": {"-u": "userinfo,", "--user": "userinfo,"},
    "open": {"-u": "userinfo,", "--user": "userinfo,"},  # lftp's own command, in `lftp -c 'open -u ...'`
    "openssl": {"-k": "next"},  # `openssl enc -k password` (openssl-enc(1)); `-key`, `-keyout` are others
    **dict.fromkeys(("smbclient", "rpcclient", "smbcacls", "smbget", "smbtree"), _SAMBA),
    "7z": {"-p": "glued"},
    "7za": {"-p": "glued"},
    **dict.fromkeys(("mysql", "mysqldump", "mysqladmin", "mysqlimport", "mysqlshow", "mysqlcheck"), _MYSQL),
    **dict.fromkeys(("mariadb", "mariadb-dump", "mariadb-admin"), _MYSQL),
}


def _userinfo(value: str, separator: str = ":") -> str:
    user, sep, password = value.partition(separator)
    return f"{user}{sep}{MARKER}" if sep and password else text(value)


def _shown_value(how: str, value: str) -> str:
    """A password option's value as shown: "userinfo<sep>" keeps the user, the rest goes."""
    return _userinfo(value, how.removeprefix("userinfo") or ":") if how.startswith("userinfo") else MARKER


def _value_rule(option: str, how: str | None) -> Callable[[str], str] | None:
    """How the argument after `option` is shown, or None when it is an argument like any other."""
    if how is not None and how.startswith("userinfo"):
        return lambda value: _shown_value(how, value)
    if how in ("value", "next"):
        return lambda value: MARKER
    name = option.lstrip("-")
    if option == "-p":
        # `-p WORD` is ambiguous (mysql, sshpass and many scripts: a password; ssh, docker: a port;
        # mkdir: a flag before a path): a number, a port mapping or a path is kept, a word is not.
        return lambda value: text(value) if _rules()["plain_p"].fullmatch(value) else MARKER
    if secret_name(name) or key_name(name):
        return lambda value: MARKER if secret_pair(name, value) else text(value)
    return None


def argv(args: Iterable[str]) -> list[str]:
    """A command line with its secret values replaced; the program (args[0]) is never changed.

    `--name=value` and `--name value` are redacted when `secret_pair(name, value)` says so; `-p
    WORD` unless WORD is a number, a port mapping or a path; the password options of the
    programs in _PROGRAM_OPTIONS (also after a wrapper: `env X=y mysql -pSECRET`, `sudo curl -u
    bob:pw`); every argument also goes through `text` (URLs with passwords, key=value pairs,
    AWS key IDs, random runs).
    """
    items = list(args)
    if not items:
        return []
    if len(items) == 1 and _rules()["space"].search(items[0]):
        # A process that rewrote its argv (setproctitle: Ray workers, gunicorn, postgres) shows its
        # whole command line as one string: its words are read as a command line's arguments.
        parts = _rules()["space"].split(items[0])
        words = parts[0::2]
        parts[0::2] = [words[0], *_tokens(words[1:], _PROGRAM_OPTIONS.get(_program(words[0]), {}), text)]
        return ["".join(parts)]
    return [items[0], *_tokens(items[1:], _PROGRAM_OPTIONS.get(_program(items[0]), {}), text)]


_SHELL_SEPARATORS = frozenset({"&&", "||", "|", ";", "&"})


def _tokens(items: list[str], table: dict[str, str], plain: Callable[[str], str]) -> list[str]:
    """The option-aware pass over the arguments of a command (or the words of a text): options
    whose values are secrets, `-p WORD`, the password options of a program named in `table` or
    met on the way; `plain` shows every other argument."""
    out: list[str] = []
    pending: Callable[[str], str] | None = None  # the rule for the value of the option just seen
    for arg in items:
        name = _option_name(arg)
        if not arg or (pending is not None and name is None):
            out.append(pending(arg) if pending is not None and arg else arg)
            pending = None if arg else pending
            continue
        pending = None
        if name is None:
            out.append(plain(arg))
            if arg in _SHELL_SEPARATORS or arg.endswith(";"):
                table = {}  # the next command's program starts afresh
            else:  # a program started by a wrapper (`env X=y mysql`, `bash -c "mysql`): its rules are
                # added, never in place of the rules met so far (a database or URL named `open`)
                table = {**_PROGRAM_OPTIONS.get(_program(arg.lstrip("'\"(`")), {}), **table}
            continue
        option, eq, value = arg.partition("=")
        glued = next(
            (o for o, how in table.items() if len(o) == 2 and how != "next" and arg.startswith(o) and len(arg) > 2),
            None,
        )
        glued = None if eq else glued
        if glued is not None:  # -pSECRET, -ubob:pw
            out.append(glued + _shown_value(table[glued], arg[2:]))
            continue
        cluster = _clustered(arg, table) if not eq else None
        if cluster is not None:  # curl -sSu bob:pw, -fsSLubob:pw: the flags, then the one that takes a value
            at, how = cluster
            rest = arg[at + 1 :]
            if rest:
                out.append(arg[: at + 1] + _shown_value(how, rest))
            else:
                out.append(arg)
                pending = _value_rule(f"-{arg[at]}", how)
            continue
        rule = _value_rule(option, table.get(option))
        if eq:
            out.append(f"{option}={rule(value)}" if rule is not None and value else plain(arg))
            continue
        pending = rule
        out.append(plain(arg))
    return out


def _clustered(arg: str, table: dict[str, str]) -> tuple[int, str] | None:
    """In a cluster of short flags (`-sSu`), where the program's value-taking option stands and its
    rule: getopt reads the flags before it and gives it the rest of the word, or the next one."""
    if not table or not arg.startswith("-") or arg.startswith("--") or len(arg) < 3:
        return None
    for at in range(1, len(arg)):
        how = table.get(f"-{arg[at]}")
        if how is not None and how not in ("glued", "next"):
            return at, how
        if not arg[at].isalpha():
            return None
    return None


def _program(arg: str) -> str:
    return arg.rsplit("/", 1)[-1]


def redacted(value: str | None) -> bool:
    """Whether a text gpudoctor produced had something redacted from it."""
    return bool(value) and MARKER in str(value)
