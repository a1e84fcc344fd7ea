"""The option table: every option of `gpudoctor check` (and `diff`), defined once.

From this table are made: the command line's click options (gpudoctor/cli/options.py), the Python
API's keywords and their validation (engine/arguments.py, gpudoctor/api.py), the policy file's
keys and readers (gpudoctor/policy.py), and the keyword names a Python caller's error messages
use (`--expect-gpus 16` reads `expect_gpus=16`). A name, a type, a range, a default, a help text
and whether a policy file may set it: change it here and every door changes with it.

Torch-free and click-free: the table is plain data (`check --quick` start-up).
"""

from __future__ import annotations

from typing import Any

from gpudoctor.records import Record, record

# The longest --timeout (and policy timeout) accepted: a day. Ranks turn the deadline into OS
# timers and torch's C++ timeouts, which overflow (OverflowError: "C int", "time_t") long before
# 1e308; a workload start that needs more than a day is a setup that will not start at all.
MAX_TIMEOUT_S = 86400.0
DEFAULT_LEVEL = 2  # `check` without --level or --quick: static and active checks

# Kinds of value: each has a click type, an API validator and a policy reader.
INT, REAL, CHOICE, TEXT, FLAG, NAMES, PATH, SHARE, BUSBW, COLLECTIVES = (
    "int",
    "real",
    "choice",
    "text",
    "flag",
    "names",
    "path",
    "share",
    "busbw",
    "collectives",
)


@record
class Option(Record):
    name: str  # the Python keyword (run_checks(expect_gpus=8)) and CheckOptions' field
    flag: str  # the long option, "--expect-gpus" ("" for a policy-only key)
    kind: str
    help: str
    low: float | None = None  # INT, REAL: the least value
    high: float | None = None  # INT, REAL: the greatest value
    above: bool = False  # REAL: `low` itself is refused
    choices: tuple[str, ...] = ()  # CHOICE
    default: Any = None  # what applies when neither the argument nor the policy sets it
    show_default: bool = False  # the command line's help prints the default beside the option
    policy: str = ""  # the policy file's key ("" when a policy cannot set it)
    metavar: str = ""
    wants: str = ""  # TEXT: what an empty value lacks, for the message ("needs a model name")
    # The bound on the merged value (argument or policy) is checked once, after they meet
    # (pipeline.check_options), with one message whichever door it came from.
    bound_after_merge: bool = False

    @property
    def policy_field(self) -> str:
        """The Policy dataclass's field for this key (policy files speak in the table's units)."""
        return {"min_shm": "min_shm_gb"}.get(self.name, self.name)


_FILE = "FILE"
OPTIONS: tuple[Option, ...] = (
    Option(
        "snapshot",
        "--snapshot",
        PATH,
        "Check a recorded snapshot instead of this machine (- reads it from standard input).",
        metavar=_FILE,
    ),
    Option("quick", "--quick", FLAG, "Skip the checks that run workloads (no torch import): --level 1.", default=False),
    Option(
        "level",
        "--level",
        INT,
        "1 static checks (--quick), 2 adds the active checks (default), 3 adds the deep checks under "
        "load: GEMM, silent data corruption, GPU memory, host links (docs/deep-checks.md).",
        low=1,
        high=3,
    ),
    Option(
        "duration_s",
        "--duration",
        REAL,
        "How long level 3's sustained load runs (default 60); the whole level takes about 1.5x this.",
        low=1,
        high=86400,
        metavar="SECONDS",
    ),
    Option(
        "mem_share",
        "--mem-share",
        REAL,
        "Share of free GPU memory level 3's memory test writes and verifies (default 0.8).",
        low=0.01,
        high=0.95,
        metavar="FRACTION",
    ),
    Option(
        "select",
        "--select",
        NAMES,
        "Only these codes, prefixes (GD4) or check names.",
        policy="select",
        metavar="CODES",
    ),
    Option(
        "ignore",
        "--ignore",
        NAMES,
        "Leave out these codes, prefixes or check names.",
        policy="ignore",
        metavar="CODES",
    ),
    Option("expect_gpus", "--expect-gpus", INT, "Fail when fewer GPUs are visible.", low=1, policy="expect-gpus"),
    Option(
        "expect_model",
        "--expect-model",
        TEXT,
        "Fail when a visible GPU's name does not contain NAME (GD010).",
        policy="expect-model",
        metavar="NAME",
        wants="a model name",
    ),
    Option(
        "fail_on",
        "--fail-on",
        CHOICE,
        "What makes the exit code 1.  [default: fail]",
        choices=("warn", "fail"),
        policy="fail-on",
    ),
    Option(
        "device",
        "--device",
        CHOICE,
        "Where workloads run: cpu uses N processes with gloo.",
        choices=("auto", "cuda", "cpu"),
        default="auto",
        show_default=True,
    ),
    Option("ranks", "--ranks", INT, "Ranks for --device cpu (default 2).", low=1, high=64),
    # Not a policy key: a file found upwards of the working directory must not choose what runs.
    Option(
        "python",
        "--python",
        PATH,
        "Run the ranks with this Python: your training environment's interpreter (its torch, CUDA and "
        "NCCL are judged); gpudoctor itself can then be installed without torch.",
        metavar="PATH",
    ),
    Option(
        "timeout_s",
        "--timeout",
        REAL,
        "Deadline in seconds for all workloads together (level 3's run gets this plus its planned load), "
        "at most 86400 (a day).  [default: 120]",
        low=1,
        high=MAX_TIMEOUT_S,
        policy="timeout",
        metavar="SECONDS",
        bound_after_merge=True,
    ),
    Option(
        "min_busbw",
        "--min-busbw",
        BUSBW,
        "Required all-reduce busbw: GB/s, or a share of the expected busbw (80%).",
        policy="min-busbw",
        metavar="GB/s|N%",
    ),
    Option(
        "allow_mig",
        "--allow-mig",
        FLAG,
        "Do not fail multi-GPU checks on MIG-enabled GPUs.",
        policy="allow-mig",
    ),
    Option(
        "collectives",
        "--collectives",
        COLLECTIVES,
        "Also run and judge these beside all-reduce: allgather, reducescatter (what FSDP/ZeRO use; "
        "`fsdp` names both), alltoall, broadcast, sendrecv, or all.",
        policy="collectives",
        metavar="LIST",
    ),
    Option(
        "ram_per_gpu_gb",
        "--ram-per-gpu",
        REAL,
        "Host RAM wanted per visible GPU (GD501).  [default: 16]",
        low=0,
        policy="ram-per-gpu",
        metavar="GiB",
    ),
    Option("min_shm", "", REAL, "/dev/shm wanted, GiB (GD510).", low=0, above=True, policy="min-shm"),
    Option(
        "baseline",
        "--baseline",
        PATH,
        "Compare with a saved `check --json` report or a snapshot.",
        metavar=_FILE,
    ),
    Option(
        "tolerance",
        "--tolerance",
        SHARE,
        "Regression allowed against --baseline.  [default: 10%]",
        policy="tolerance",
        metavar="N%",
    ),
    Option(
        "config",
        "--config",
        PATH,
        "Policy file (default: gpudoctor.toml or pyproject.toml found upwards).",
        metavar=_FILE,
    ),
)

BY_NAME: dict[str, Option] = {o.name: o for o in OPTIONS}
BY_POLICY_KEY: dict[str, Option] = {o.policy: o for o in OPTIONS if o.policy}
# `--expect-gpus` -> `expect_gpus`: a Python caller's error messages name keywords, not flags.
KEYWORDS: dict[str, str] = {o.flag: o.name for o in OPTIONS if o.flag}


def option(name: str) -> Option:
    return BY_NAME[name]
