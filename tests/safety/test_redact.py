"""Redaction by allow-list: what a diagnosis needs of another process's command line is kept, every
other argument becomes `[redacted]`. (The corpus test is test_redaction_corpus.py.)"""

from __future__ import annotations

import random
import string
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpudoctor.probe.environment import shown_value
from gpudoctor.probe.pids import OWN_PIDS
from gpudoctor.probe.ports import check_port
from gpudoctor.probe.processes import command_line, resolve
from gpudoctor.safety import redact

M = redact.MARKER

# (argv, shown): what the allow-list keeps, and what it replaces.
CASES = [
    # a launcher line: program, option names, numbers, booleans, host:port, the script, fixed words
    (
        ["torchrun", "--nproc_per_node=8", "--rdzv_endpoint=node-17:29500", "--rdzv_backend", "c10d", "train.py"],
        ["torchrun", "--nproc_per_node=8", "--rdzv_endpoint=node-17:29500", "--rdzv_backend", "c10d", "train.py"],
    ),
    (
        ["python", "examples/lm/train.py", "--lr", "3e-4", "--bf16", "true", "--output_dir", "/data/alice/run7"],
        ["python", f"{M}/train.py", "--lr", "3e-4", "--bf16", "true", "--output_dir", M],
    ),
    # Hydra/OmegaConf keys stay, their values by the same rules
    (
        ["python", "main.py", "+trainer.devices=8", "model.name=llama", "~db", "hydra/launcher=joblib"],
        ["python", "main.py", "+trainer.devices=8", f"model.name={M}", M, f"hydra/launcher={M}"],
    ),
    # `-m` names a module after a Python or one of its launchers; launcher verbs stay
    (
        ["python3", "-m", "torch.distributed.run", "--nnodes", "2", "-m", "torchtitan.train"],
        ["python3", "-m", "torch.distributed.run", "--nnodes", "2", "-m", "torchtitan.train"],
    ),
    (["git", "commit", "-m", "fix.the.bug"], ["git", M, "-m", M]),
    (
        ["accelerate", "launch", "--num_processes", "4", "run.py"],
        ["accelerate", "launch", "--num_processes", "4", "run.py"],
    ),
    # a program started by a wrapper keeps its name, and its password options their meaning
    (["srun", "-N", "2", "python", "t.py"], ["srun", "-N", "2", "python", "t.py"]),
    (["env", "X=1", "redis-cli", "-a", "18138817", "-p", "63"], ["env", f"X={M}", "redis-cli", "-a", M, "-p", "63"]),
    # numbers: kept as an option's values, replaced standing alone, glued, or named as a credential
    (["app", "--sizes", "4", "8", "16", "--seed", "1"], ["app", "--sizes", "4", "8", "16", "--seed", "1"]),
    (["htpasswd", "-nbB", "admin", "89906071"], ["htpasswd", f"-n{M}", M, M]),
    (["mysql", "-uroot", "-p99133612", "-h", "10.0.0.5"], ["mysql", f"-u{M}", f"-p{M}", "-h", "10.0.0.5"]),
    (["python", "t.py", "--password", "77794336", "db.pass=1234"], ["python", "t.py", "--password", M, f"db.pass={M}"]),
    (
        ["python", "t.py", "--pad_token_id", "0", "--pass_k", "10"],
        ["python", "t.py", "--pad_token_id", "0", "--pass_k", "10"],
    ),
    # single-dash words: a launcher's own stay, anything else is a short option with a glued value
    (
        ["mpirun", "-np", "16", "-bind-to", "none", "-x", "NCCL_DEBUG=INFO"],
        ["mpirun", "-np", "16", "-bind-to", "none", "-x", "NCCL_DEBUG=INFO"],
    ),
    (["unrar", "x", "-pQuartz-Raven-Velvet42", "a.rar"], ["unrar", M, f"-p{M}", "a.rar"]),
    (["java", "-Dsonar.login=squ_c88d986d46854ae013b7808e30f20d"], ["java", f"-Dsonar.login={M}"]),
    # URLs: scheme, host and port; userinfo, path and query replaced, a known file name kept
    (
        ["git", "clone", "https://alice:s3cr3t@example.com/r.git"],
        ["git", M, f"https://{M}@example.com/{M}"],
    ),
    (
        ["wget", "https://data.example.com:8443/d/laion.parquet?X-Amz-Signature=abc"],
        ["wget", f"https://data.example.com:8443/{M}/laion.parquet?{M}"],
    ),
    # environment variables in argv: a variable gpudoctor keeps by name is shown by its grammar
    (
        ["env", "NCCL_IB_HCA=mlx5_0:1,token=x", "NCCL_SOCKET_MAGIC=12345678", "HF_TOKEN=hf_x", "python", "t.py"],
        ["env", f"NCCL_IB_HCA=mlx5_0:1,{M}", f"NCCL_SOCKET_MAGIC={M}", f"HF_TOKEN={M}", "python", "t.py"],
    ),
    # shell strings, word by word; `;` `&&` `|` start a new command
    (
        ["bash", "-c", "cd /srv && mysql -p54165581 -h 10.0.0.5 db; redis-cli -a 1234 ping"],
        ["bash", "-c", f"cd {M} && mysql -p{M} -h 10.0.0.5 {M}; redis-cli -a {M}"],
    ),
    # an option name shaped as a key (hostile review L1), beside real names with digits and capitals in them
    (
        [
            "python3",
            "t.py",
            "--AKIAIOSFODNN7EXAMPLE",
            "--db-pass-Tr0ub4dor=1",
            "--a3f9c2e17b4d8e6f0a1b",
            "--nEpochs",
            "2",
        ],
        ["python3", "t.py", M, M, M, "--nEpochs", "2"],
    ),
    (
        ["python", "t.py", "--load_in_4bit", "--paths2audio_files", "a.txt"],
        ["python", "t.py", "--load_in_4bit", "--paths2audio_files", "a.txt"],
    ),
    (
        ["gh", "secret", "set", "K", "--body", "-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBg\nkqhkiG9w0BAQEF\n-----END"],
        ["gh", M, M, M, "--body", M],
    ),
]


@pytest.mark.parametrize(("argv", "shown"), CASES, ids=[" ".join(a)[:50] for a, _ in CASES])
def test_the_allow_list_keeps_what_diagnosis_needs_and_nothing_else(argv: list[str], shown: list[str]) -> None:
    assert redact.argv(argv, shown_value) == shown


def test_a_command_line_rewritten_into_one_string_is_judged_word_by_word() -> None:
    # setproctitle (Ray workers, gunicorn, postgres) leaves /proc/PID/cmdline as one string.
    (line,) = redact.argv(["python train.py --password hunter2 --hf-token=hf_abc --batch-size 64"])
    assert line == f"python train.py --password {M} --hf-token={M} --batch-size 64"
    assert redact.argv(["mysql -phunter2 db"]) == [f"mysql -p{M} {M}"]
    assert redact.argv(["ray::IDLE"]) == ["ray::IDLE"]
    assert redact.argv(["user:pw@host --x 1"]) == [f"{M} --x 1"]


def _random_secret(rng: random.Random) -> str:
    """A credential in one of the shapes services use: prefixed tokens, base64 with `/+=`, hex,
    lower-case words with digits, URL-encoded signatures, word passphrases, digits."""
    pick = rng.randrange(7)
    letters = string.ascii_letters + string.digits
    if pick == 0:
        return rng.choice(["ghp_", "hf_", "sk-proj-", "xoxb-", "glpat-", "AKIA"]) + "".join(rng.choices(letters, k=30))
    if pick == 1:
        return "".join(rng.choices(letters + "/+", k=38)) + "=="
    if pick == 2:
        return "".join(rng.choices("0123456789abcdef", k=40))
    if pick == 3:
        return "".join(rng.choices(string.ascii_lowercase, k=9)) + str(rng.randrange(1000, 9999)) + "!"
    if pick == 4:
        return "".join(rng.choices(letters, k=20)) + "%2B" + "".join(rng.choices(letters, k=10)) + "%3D"
    if pick == 5:
        return "-".join(rng.choice(["Quartz", "raven", "VELVET", "cedar", "Tundra"]) for _ in range(3)) + "42"
    return str(rng.randrange(10_000_000, 99_999_999))


def _planted(secret: str, rng: random.Random) -> list[str]:
    """The secret where command lines carry one."""
    shapes = [
        ["python", "t.py", "--password", secret],
        ["python", "t.py", f"--api-key={secret}"],
        ["mysql", f"-p{secret}", "db"],
        ["sshpass", "-p", secret, "ssh", "h"],
        ["wandb", "login", secret],
        ["env", f"DB_PASSWORD={secret}", "python", "x.py"],
        ["bash", "-c", f"export TOKEN={secret}; python x.py --token {secret}"],
        ["curl", "-u", f"bob:{secret}", f"https://bob:{secret}@h.example/p?sig={secret}&x=1"],
        ["kubectl", "patch", "-p", f'{{"env":[{{"name":"K","value":"{secret}"}}]}}'],
        ["python", "t.py", f"+db.password={secret}", f"cfg.key={secret}"],
        [f"app --secret {secret} --x 1"],
    ]
    return rng.choice(shapes)


def test_no_secret_survives_in_any_shape_or_place() -> None:
    """3,000 random credentials, each where command lines carry one: none survives, whole or in
    part (the pieces a cut at `/`, `+`, `%`, `-` or `!` would leave)."""
    rng = random.Random(24)
    for _ in range(3000):
        secret = _random_secret(rng)
        argv = _planted(secret, rng)
        out = "\n".join(redact.argv(argv, shown_value)) + command_line(argv)
        pieces = [p for p in __import__("re").split(r"[/+%!=-]", secret) if len(p) >= 8 and not p.isdigit()]
        assert [s for s in [secret, *pieces] if s in out] == [], (argv, out)


def test_a_command_line_says_that_it_was_redacted() -> None:
    line = command_line(["python", "serve.py", "--api-key=sk-live-0001", "--port", "8000"])
    assert line == f"python serve.py --api-key={M} --port 8000"
    assert redact.redacted(line) and not redact.redacted("python serve.py")


def test_another_process_seen_through_proc_is_redacted() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(30)", "--token", "tok-0000-secret", "--epochs", "3"]
    )
    try:
        time.sleep(0.2)
        _, _, command = resolve(proc.pid, Path("/"), OWN_PIDS)
        assert command is not None and "tok-0000-secret" not in command
        assert command.startswith(f"{sys.executable} -c ") and command.endswith(f" --token {M} --epochs 3")
    finally:
        proc.kill()
        proc.wait()


def test_a_master_addr_with_credentials_is_not_repeated_by_the_port_probe() -> None:
    status = check_port("admin:hunter2@no-such-host.invalid", 29500)
    assert status.host == M and not status.resolves
    assert check_port("no-such-host.invalid", 29500).host == "no-such-host.invalid"


@pytest.mark.timeout(60)  # a guard against a stall on a huge argument, not a speed test
def test_no_input_can_stall_redaction() -> None:
    huge = "aB1 " * 32768  # 128 KiB of words in one argument
    line = command_line(["python", "-c", huge, "--password", "hunter2"])
    assert len(line) <= 300 and "hunter2" not in line
    cut = redact.text("a=" * 60000)
    assert cut.endswith("...[cut]") and len(cut) <= redact.MAX_TEXT + len("...[cut]")


# Free text of gpudoctor's own ranks (a log tail): ordinary words stay.
LOG = (
    'File "/opt/venv/lib/python3.11/site-packages/torch/distributed/c10d_logger.py", line 79, in wrapper\n'
    "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:29500\n"
    "NCCL INFO NCCL_IB_HCA set by environment to mlx5_0:1,mlx5_1\n"
    "ProcessGroupNCCL.cpp:1234 Watchdog caught collective operation timeout: WorkNCCL(SeqNum=7, OpType=ALLREDUCE)"
)


def test_a_log_tail_keeps_its_ordinary_words() -> None:
    assert redact.text(LOG) == LOG


@pytest.mark.parametrize(
    ("line", "shown"),
    [
        (
            "NCCL INFO NCCL_IB_HCA set by environment to mlx5_0,token=abc",
            f"NCCL INFO NCCL_IB_HCA set by environment to {M}",
        ),
        ("connecting to admin:hunter2@10.0.0.1:29500", f"connecting to {M}"),
        ("using key ghp_R4nd0mAlph4Num3r1cStr1ngOf36Chars now", f"using key {M} now"),
        ("secret wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", f"secret {M}"),
        ("hash 0123456789abcdef0123456789abcdef01234567", f"hash {M}"),
    ],
)
def test_a_log_word_of_no_ordinary_shape_is_replaced(line: str, shown: str) -> None:
    assert redact.text(line) == shown
