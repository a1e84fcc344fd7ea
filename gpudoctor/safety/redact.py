"""Redaction by allow-list: what gpudoctor copies from another process is what diagnosis needs.

gpudoctor copies other processes' command lines (the MASTER_PORT holder, processes on the GPUs, a
followed job) into snapshots, reports, JUnit files and recordings that users attach to tickets.
Secrets come in open-ended shapes (tests/reference/redaction/ has 546 lines from 119 tools), so
nothing here recognises a secret. `argv` keeps what a diagnosis reads and replaces every other
argument, or the part of it that is not known, with MARKER (`[redacted]`), which is how an
output says that something was left out:

- the program (argv[0]) and programs named later (`PROGRAMS`: `env X=1 mysql`, `srun python`),
  the `-m` module of Python and its launchers, a few subcommand verbs (`WORDS`: `accelerate
  launch`, `fabric run`, `vllm serve`) and fixed setting words (`WORDS`: `nccl`, `c10d`, `bf16`);
- option names (`--lr`, `--lr=`, `-np`, `-x`, Open MPI's single-dash words, Java's `-Dname`), and
  Hydra/OmegaConf or environment keys (`+trainer.devices=`, `NCCL_DEBUG=`);
- values that are numbers, booleans, `host:port`, an IPv4 address, a file name with a known
  extension (its directory replaced: `[redacted]/train.py`), a URL's scheme and host (userinfo,
  path, query replaced; a known file name at the end of the path kept);
- values of the environment variables gpudoctor keeps by name, by each one's grammar (the
  caller's `known_value`, probe/environment.py: `NCCL_IB_HCA=mlx5_0:1`).

Numbers are kept where they are settings, not where they may be PINs (research's decision
point, tests/reference/redaction/README.md): a number is kept as an option's value (and the
numbers right after it: `--sizes 4 8 16`) or a `key=value` value, and replaced when it stands
alone as an argument (`htpasswd -b f user 1234`), when it is glued to a short option
(`-p99133612`, so `-j8` goes too), and after an option whose name ends in a credential word
(`--password 1234`, `db.pass=1234`: `_credential`) or that a program documents as its password
option under another name (`PASSWORD_OPTIONS`: `redis-cli -a 1234`, `sshpass -p 1234`). An
argument holding spaces (`bash -c "..."`, a PEM block, a rewritten process title) is judged word
by word; `;`, `&&`, `|` start a new command.

`text` is for free text of gpudoctor's own ranks (a log tail, an error): words of ordinary shape
(letters in one case or CamelCase, with a few digits; numbers; identifiers and paths made of
those) are kept, any other word is replaced, and so is a `key=value` value named as a credential.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

MARKER = "[redacted]"
MAX_TEXT = 4096  # a free text is cut here first ("...[cut]"); argv is cut by its caller
MAX_WORD = 256  # a longer value is never one the allow-list keeps

NUMBER = re.compile(
    r"[+-]?(?:0[xX][0-9a-fA-F]{1,16}|\d+-\d+|\d+(?::\d\d){1,3}|(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d{1,3})?"
    r"(?:[KMGTP]i?B?|[kmgtp]b?|%|ms|us|s|h|d)?)"
)
BOOLEANS = frozenset({"true", "false", "yes", "no", "on", "off", "none", "null"})
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_HOST = rf"(?:\d{{1,3}}(?:\.\d{{1,3}}){{3}}|{_LABEL}(?:\.{_LABEL})*|\[[0-9A-Fa-f:.]+\])"
HOST = re.compile(rf"{_HOST}|[0-9A-Fa-f.]*:[0-9A-Fa-f:.]*(?:%[A-Za-z0-9_.-]{{1,15}})?")
HOST_PORT = re.compile(rf"(?P<host>{_HOST}):(?P<port>\d{{1,5}})")
IPV4 = re.compile(r"\d{1,3}(?:\.\d{1,3}){3}")
# File names worth knowing in a training job's command line (a heuristic list: scripts, configs,
# data, checkpoints, archives, logs, certificates by name).
_EXTENSIONS = (
    "py|sh|bash|ipynb|yaml|yml|json|jsonl|toml|cfg|conf|ini|txt|md|csv|tsv|log|out|err|xml|"
    "pt|pth|bin|safetensors|ckpt|onnx|h5|hdf5|npz|npy|pkl|pickle|gguf|ggml|nemo|engine|plan|model|"
    "slurm|sbatch|parquet|arrow|idx|tfrecord|tar|gz|tgz|bz2|xz|zst|zip|7z|rar|so|whl|sqsh|sif|img|pem|crt|key|rdb"
)
FILE_NAME = re.compile(rf"[A-Za-z0-9_+*-][A-Za-z0-9_.+*?-]{{0,127}}\.(?:{_EXTENSIONS})", re.IGNORECASE)
MODULE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*){0,15}")
_URL = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]{0,15})://(?P<auth>[^/?#]*)(?P<path>[^?#]*)(?P<rest>[?#].*)?")
_LONG_OPTION = re.compile(r"--[A-Za-z0-9][A-Za-z0-9_.-]{0,79}")
_KEY = re.compile(r"[+~]{0,2}[A-Za-z_][A-Za-z0-9_.@/-]{0,127}")
_ENV_NAME = re.compile(r"[A-Z_][A-Z0-9_]*")

# Single-dash option words of launchers (Open MPI's mpirun(1), Intel MPI, llama.cpp, terraform):
# other single-dash words are a short option with a value glued on (`-pSECRET`).
SINGLE_DASH_WORDS = frozenset(
    "np ppn npernode mca gmca host hostfile machinefile bind-to map-by rank-by report-bindings x "
    "display-map tag-output oversubscribe genv genvall env wdir ngl ngld ctk ctv var var-file".split()
)
# Programs whose name is kept wherever it stands (after a wrapper: `srun python`, `env X=1 mysql`).
PROGRAMS = frozenset(
    "bash sh zsh cd env nohup sudo nice ionice taskset numactl timeout time stdbuf setsid chrt exec "
    "srun sbatch salloc mpirun mpiexec horovodrun torchrun deepspeed accelerate fabric lightning "
    "nsys ncu strace gdb valgrind xargs docker podman kubectl apptainer singularity enroot conda "
    "uv pip poetry coverage pytest ssh sshpass mysql mysqldump mysqladmin mariadb redis-cli "
    "valkey-cli curl wget zip unzip 7z unrar ipmitool sqlcmd ldapsearch openssl smbclient mongo "
    "mongosh htpasswd".split()
)
_PYTHON = re.compile(r"(?:python|pypy)[0-9.]*")
PYTHON_LAUNCHERS = frozenset({"torchrun", "deepspeed", "accelerate", "fabric", "lightning", "coverage"})
# Subcommand verbs that say what a launcher does, and the fixed words of the settings a diagnosis
# reads (backends, rendezvous, precision, devices): a vocabulary, never a value a user makes up.
WORDS = frozenset(
    "launch run fit validate test predict train eval evaluate serve agent sweep sync show topo diag "
    "profile download upload install checkout lab notebook start stop status exec login logout "
    "config env list info version benchmark nccl gloo mpi ucc c10d etcd etcd-v2 static cuda cpu "
    "auto bf16 fp16 fp32 tf32 16-mixed bf16-mixed 32-true ddp fsdp ring tree".split()
)
# Options that take a password under a name that does not say so, per program (each program's
# manual; tests/reference/redaction/README.md): their value is replaced even when it is a number.
_SAMBA = frozenset({"-U", "--user"})
PASSWORD_OPTIONS: dict[str, frozenset[str]] = {
    "sshpass": frozenset({"-p"}),
    "redis-cli": frozenset({"-a"}),
    "valkey-cli": frozenset({"-a"}),
    "redis-benchmark": frozenset({"-a"}),
    "zip": frozenset({"-P"}),
    "unzip": frozenset({"-P"}),
    "ipmitool": frozenset({"-P"}),
    "sqlcmd": frozenset({"-P"}),
    "bcp": frozenset({"-P"}),
    "mosquitto_pub": frozenset({"-P"}),
    "mosquitto_sub": frozenset({"-P"}),
    "ldapsearch": frozenset({"-w"}),
    "openssl": frozenset({"-k", "-pass", "-passin", "-passout"}),
    "curl": frozenset({"-u", "--user", "-U", "--proxy-user"}),
    "smbclient": _SAMBA,
    "rpcclient": _SAMBA,
    **dict.fromkeys(("mysql", "mysqldump", "mysqladmin", "mariadb", "mongo", "mongosh"), frozenset({"-p"})),
}
# The last word of a name that holds a credential (`--password`, `db.pass`, `HF_TOKEN`, `--api-key`).
_CREDENTIAL_WORDS = frozenset(
    "password passwd pass pwd pw passphrase passcode pin token secret key apikey auth credential "
    "credentials sig signature cookie".split()
)
_SEPARATORS = frozenset({";", "&&", "||", "|", "&"})
_QUOTES = "'\"`()"


def _credential(name: str) -> bool:
    """Whether an option or key name says its value is a credential (its last word does)."""
    words = [w.strip("0123456789") for w in re.split(r"[^a-z0-9]+", name.lower())]
    words = [w for w in words if w]
    return bool(words) and (words[-1] in _CREDENTIAL_WORDS or words[-1].endswith(("password", "token", "secret")))


def _key_like(name: str) -> bool:
    """An option name with a part shaped as a key, not a word: upper case and digits mixed in 8 or
    more characters (`--AKIAIOSFODNN7EXAMPLE`, `--pass-Tr0ub4dor`), or 16 or more with letters and
    digits both (a hex token). Real names pass: `--nEpochs`, `--load_in_4bit`, `--paths2audio_files`
    (a heuristic, held to the corpus of training lines in tests/safety/test_redaction_corpus.py)."""
    for part in re.split(r"[^A-Za-z0-9]+", name):
        digits = sum(c.isdigit() for c in part)
        if len(part) >= 8 and digits and any(c.isupper() for c in part):
            return True
        if len(part) >= 16 and digits >= 3 and len(part) - digits >= 3:
            return True
    return False


def host_port(value: str) -> bool:
    match = HOST_PORT.fullmatch(value)
    return match is not None and int(match.group("port")) < 65536  # (0: any free port)


def host(value: str) -> bool:
    return len(value) <= 253 and HOST.fullmatch(value) is not None


def file_name(value: str) -> str | None:
    """A file name with a known extension, its directory replaced (`./`, `/`, `~/` kept), or None."""
    folder, slash, base = value.rpartition("/")
    if not FILE_NAME.fullmatch(base):
        return None
    return base if not slash else f"{folder if folder in ('', '.', '..', '~') else MARKER}/{base}"


def url(value: str) -> str | None:
    """A URL as its scheme, host and port (and a known file name at the end of its path), or None."""
    match = _URL.fullmatch(value)
    if match is None:
        return None
    userinfo, at, where = match.group("auth").rpartition("@")
    shown = f"{match.group('scheme')}://{MARKER + '@' if at else ''}"
    shown += where if host(where) or host_port(where) else MARKER
    path = match.group("path")
    if path not in ("", "/"):
        name = file_name(path.rsplit("/", 1)[-1])
        shown += f"/{name}" if name and path.count("/") == 1 else f"/{MARKER}" + (f"/{name}" if name else "")
    return shown + (f"{match.group('rest')[0]}{MARKER}" if match.group("rest") else "")


def value(text: str, bare: bool = False) -> str:
    """An argument or option value as shown: kept when the allow-list knows its shape, else MARKER.
    `bare`: the argument stands alone (no option before it), where a number may be a PIN."""
    if not text:
        return text
    if len(text) > MAX_WORD:
        return MARKER
    if NUMBER.fullmatch(text):
        return MARKER if bare else text
    if text.lower() in BOOLEANS or host_port(text) or IPV4.fullmatch(text):
        return text
    if "," in text:
        return _collapse([value(part, bare) for part in text.split(",")], ",")
    if ":" in text and all(FILE_NAME.fullmatch(part) for part in text.split(":")):
        return text  # a list of files (`ckpt_1.pt:ckpt_2.pt`)
    shown = url(text) if "://" in text else file_name(text)
    return shown if shown is not None else MARKER


def _collapse(parts: list[str], sep: str) -> str:
    """Parts joined, a run of MARKERs shown once."""
    out = [p for i, p in enumerate(parts) if not (p == MARKER and i and parts[i - 1] == MARKER)]
    return sep.join(out)


KnownValue = Callable[[str, str], "str | None"]  # (variable, value) -> shown, None: not a known variable


@dataclass
class _State:
    """What the arguments before this one tell about it."""

    known_value: KnownValue | None
    table: frozenset[str] = frozenset()  # the password options of the programs met so far
    python: bool = False  # a Python or a Python launcher was met: `-m` names a module
    pending: str = ""  # what the previous argument makes of this one: credential, module, value, number
    programs: list[str] = field(default_factory=list)

    def program(self, name: str) -> None:
        self.table |= PASSWORD_OPTIONS.get(name, frozenset())
        self.python = self.python or bool(_PYTHON.fullmatch(name)) or name in PYTHON_LAUNCHERS

    def reset(self) -> None:
        self.table, self.python, self.pending = frozenset(), False, ""


def _option(arg: str, state: _State) -> str | None:
    """An option shown (its name kept, a glued or `=` value judged), or None when `arg` is none."""
    if not arg.startswith("-") or arg in ("-", "--") or NUMBER.fullmatch(arg):
        return None
    name, eq, rest = arg.partition("=")
    body = name.lstrip("-")
    credential = _credential(body) or name in state.table
    if name.startswith("--"):
        shown = name if _LONG_OPTION.fullmatch(name) and not _key_like(body) else None
    elif (len(body) == 1 and body.isalnum()) or (len(body) == 2 and body.isalpha()) or body in SINGLE_DASH_WORDS:
        shown = name
    elif body[:1] == "D" and MODULE.fullmatch(body[1:]):
        shown = name  # Java's -Dname=value
    else:  # a value glued to a short option (`-pSECRET`, `-p99133612`, `-j8`): replaced whatever it is
        state.pending = "credential" if credential else ""
        return f"-{body[0]}{MARKER}" if body[:1].isalnum() else MARKER
    if shown is None:
        return MARKER
    if eq:
        state.pending = ""
        return f"{shown}={MARKER if credential else _pair_value(rest, state)}"
    module = name in ("-m", "--module") and state.python
    state.pending = "credential" if credential else "module" if module else "value"
    return shown


def _pair_value(text: str, state: _State, depth: int = 0) -> str:
    """The value of `--name=value`: a `key=value` inside (`--env=HF_TOKEN=x`) is judged as one, to
    a depth of 2 (`a=a=a=...` costs no more than its length)."""
    inner = _assignment(text, state, depth + 1) if depth < 2 else None
    return inner if inner is not None else value(text)


def _assignment(arg: str, state: _State, depth: int = 0) -> str | None:
    """`key=value` (Hydra, OmegaConf, environment): the key kept, the value by its grammar."""
    key, eq, rest = arg.partition("=")
    if not eq or not rest or rest.startswith("=") or not _KEY.fullmatch(key):
        return None  # (`abc==`: base64 padding, not a pair)
    known = state.known_value(key.lstrip("+~"), rest) if state.known_value else None
    if known is not None:
        return f"{key}={known}"
    if state.known_value and _ENV_NAME.fullmatch(key):
        return f"{key}={MARKER}"  # an environment variable not kept by name: its value never is
    return f"{key}={MARKER if _credential(key) else _pair_value(rest, state, depth)}"


def _argument(arg: str, state: _State) -> str:
    """One argument (no whitespace in it) as shown."""
    pending, state.pending = state.pending, ""
    option = _option(arg, state)
    if option is not None:
        return option
    if pending == "credential":
        return MARKER
    base = arg.rsplit("/", 1)[-1]
    if "=" not in arg and (base in PROGRAMS or _PYTHON.fullmatch(base)):
        state.program(base)
        return arg if arg == base else f"{MARKER}/{base}"
    if pending == "module" and MODULE.fullmatch(arg):
        return arg
    if arg in WORDS:
        return arg
    pair = _assignment(arg, state)
    if pair is not None:
        return pair
    shown = value(arg, bare=pending not in ("value", "number"))
    if pending in ("value", "number") and shown == arg and NUMBER.fullmatch(arg):
        state.pending = "number"  # `--sizes 4 8 16`: the numbers after an option's are its values too
    return shown


def _words(arg: str, state: _State) -> str:
    """An argument holding spaces (`bash -c "..."`, a PEM block, a process title), word by word."""
    out: list[str] = []
    for word in arg.split():
        core = word.strip(_QUOTES).rstrip(";")
        if word in _SEPARATORS:
            state.reset()
            out.append(word)
            continue
        shown = _argument(core, state) if core else ""
        if MARKER in shown and not shown.replace(MARKER, "").strip(_PUNCT):
            shown = MARKER  # (`socket,` in code: nothing but punctuation kept)
        ends = word.rstrip(_QUOTES).endswith(";")
        out.append(word if shown == core else shown + (";" if ends else ""))
        if ends:
            state.reset()
    return _collapse(out, " ")


def _arg(arg: str, state: _State) -> str:
    if len(arg) > MAX_TEXT:
        arg = arg[:MAX_TEXT]
    if not any(c.isspace() for c in arg):
        return _argument(arg, state)
    key, eq, rest = arg.partition("=")
    if eq and _KEY.fullmatch(key):  # `msg=hello world`, `--prompt=a b`: the key, then the words
        shown = MARKER if _credential(key) else _words(rest, state)
        return f"{key}={shown}"
    return _words(arg, state)


_PROGRAM = re.compile(r"[A-Za-z0-9_./+~:\[\]-]{1,256}")


def argv(args: Iterable[str], known_value: KnownValue | None = None) -> list[str]:
    """A command line as gpudoctor may copy it into an output (module docstring). `known_value`
    shows the value of a variable kept by name (`NCCL_IB_HCA=...`), None for any other name."""
    items = list(args)
    if not items:
        return []
    state = _State(known_value)
    first, *rest = items[0].split(None, 1) or [""]
    program = first if _PROGRAM.fullmatch(first) else MARKER
    state.program(first.rsplit("/", 1)[-1])
    head = program + (" " + _words(rest[0], state) if rest else "")  # a process title (setproctitle)
    return [head, *(_arg(a, state) for a in items[1:])]


# -- free text of gpudoctor's own ranks ------------------------------------------------------------
# A word of ordinary shape: lower case, Capitalized, UPPER or CamelCase letters, maybe a few digits
# after them (`mlx5`, `cuda`, `c10d`, `ProcessGroupNCCL`), or a number.
_SEGMENT = re.compile(
    r"[a-z]{1,24}\d{0,3}|[A-Z][a-z]{1,23}\d{0,3}|[A-Z]{1,24}\d{0,3}|\d{1,20}|[a-z]{1,4}\d{1,3}[a-z]{1,4}"
    r"|(?:[A-Z][a-z]?)?(?:[A-Z]?[a-z]{2,16}|[A-Z]{2,8}(?![a-z])){1,6}"
)
_PUNCT = "'\"`()[]{}<>,;:.!?*"


def ordinary(word: str) -> bool:
    """A word of ordinary shape (identifiers, paths and dotted names of such words, numbers)."""
    core = word.strip(_PUNCT)
    if len(core) > MAX_WORD or ("@" in core and ":" in core.partition("@")[0]):
        return False  # (user:password@host)
    parts = core.split("=")
    if any(_credential(key) for key in parts[:-1]):
        return False  # a value named as a credential (`token=abc`)
    return all(
        NUMBER.fullmatch(part) or all(_SEGMENT.fullmatch(s) for s in re.split(r"[^A-Za-z0-9]+", part) if s)
        for part in parts
    )


def text(value: str) -> str:
    """A free text of gpudoctor's own ranks with each word of no ordinary shape replaced; a text
    over MAX_TEXT characters is cut there first (marked "...[cut]")."""
    if not value:
        return value
    cut = len(value) > MAX_TEXT
    parts = re.split(r"(\s+)", value[:MAX_TEXT])
    parts[0::2] = [p if ordinary(p) else MARKER for p in parts[0::2]]
    return "".join(parts) + ("...[cut]" if cut else "")


def redacted(value: str | None) -> bool:
    """Whether a text gpudoctor produced had something redacted from it."""
    return bool(value) and MARKER in str(value)
