"""Redaction: other people's secrets never reach an output; the shape of their commands does."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpudoctor.probe.ports import check_port
from gpudoctor.probe.processes import command_line, resolve
from gpudoctor.safety import redact

M = redact.MARKER
NCCL_LINE = "NCCL INFO NCCL_IB_HCA set by environment to mlx5_0,"  # what NCCL_DEBUG=INFO prints

# (argv, what it must become): secrets by option name, key=value, URL passwords, headers, random runs.
SECRETS = [
    (["python", "serve.py", "--api-key=sk-live-0001"], ["python", "serve.py", f"--api-key={M}"]),
    (["python", "serve.py", "--token", "hunter2"], ["python", "serve.py", "--token", M]),
    (["app", "--password=hunter2", "--db-password", "pw"], ["app", f"--password={M}", "--db-password", M]),
    (["app", "--hf_token", "abc", "-secret", "x"], ["app", "--hf_token", M, "-secret", M]),
    (["app", "--aws-secret-access-key", "wJalrXUtnFEMI/K7MDENG/bPxRfiCY"], ["app", "--aws-secret-access-key", M]),
    (["app", "--key", "k1", "--access-key", "k2"], ["app", "--key", M, "--access-key", M]),
    (["app", "key=abc", "API_KEY=def", "x=1"], ["app", f"key={M}", f"API_KEY={M}", "x=1"]),
    (
        ["git", "clone", "https://alice:s3cr3t@example.com/r.git"],
        ["git", "clone", f"https://alice:{M}@example.com/r.git"],
    ),
    (["curl", "-H", "Authorization: Bearer eyJhbGciOi.x.y"], ["curl", "-H", f"Authorization: {M}"]),
    (["curl", "-H", "X-Api-Key: zzz"], ["curl", "-H", f"X-Api-Key: {M}"]),
    (["curl", "https://h/p?access_token=abc&n=1"], ["curl", f"https://h/p?access_token={M}&n=1"]),
    (["run", "ghp_R4nd0mAlph4Num3r1cStr1ngOf36Chars"], ["run", f"ghp_{M}"]),
    (["run", "hf_AbCdEfGhIjKlMnOpQrStUvWxYzAbCdEfGh"], ["run", f"hf_{M}"]),
    (["run", "--data", "/mnt/x/Zm9vYmFyMTIzNDU2Nzg5MGFiY2RlZg/y"], ["run", "--data", f"/mnt/x/{M}/y"]),
    # review3 S4: shapes that got through
    (["python", "train.py", "-p", "hunter2p"], ["python", "train.py", "-p", M]),
    (["sshpass", "-p", "hunter2", "ssh", "node1"], ["sshpass", "-p", M, "ssh", "node1"]),
    (
        ["python", "t.py", "--wandb-key", "0123456789abcdef0123456789abcdef01234567"],
        ["python", "t.py", "--wandb-key", M],
    ),
    (
        ["python", "t.py", "--wandb_key=0123456789abcdef0123456789abcdef01234567"],
        ["python", "t.py", f"--wandb_key={M}"],
    ),
    (["env", "PGPASSWORD=hunter2x", "python", "x.py"], ["env", f"PGPASSWORD={M}", "python", "x.py"]),
    (["env", "MYSQL_PWD=hunter2", "dbpass=hunter3"], ["env", f"MYSQL_PWD={M}", f"dbpass={M}"]),
    (["curl", "-u", "bob:hunter2", "https://h/x"], ["curl", "-u", f"bob:{M}", "https://h/x"]),
    (["/usr/bin/curl", "--user=bob:hunter2", "-ubob:hunter3"], ["/usr/bin/curl", f"--user=bob:{M}", f"-ubob:{M}"]),
    (
        ["sudo", "curl", "--proxy-user", "p:hunter2", "-u", "bob"],
        ["sudo", "curl", "--proxy-user", f"p:{M}", "-u", "bob"],
    ),
    (["mysql", "-phunter2", "-u", "root", "db"], ["mysql", f"-p{M}", "-u", "root", "db"]),
    (["env", "X=1", "mysqldump", "-p123456", "db"], ["env", "X=1", "mysqldump", f"-p{M}", "db"]),
    (["python", "x.py", "--pass", "hunter2", "--dbpass", "h3"], ["python", "x.py", "--pass", M, "--dbpass", M]),
    (["redis-cli", "-a", "hunter2", "-p", "6379"], ["redis-cli", "-a", M, "-p", "6379"]),
    (["unzip", "-P", "hunter2", "a.zip"], ["unzip", "-P", M, "a.zip"]),
    (
        ["azcopy", "copy", "https://a.blob.core.windows.net/c?sv=2022-11-02&sp=r&sig=AbCd%2BeFgH%2FiJ%3D"],
        ["azcopy", "copy", f"https://a.blob.core.windows.net/c?sv=2022-11-02&sp=r&sig={M}"],
    ),
    (["aws", "configure", "set", "key", "AKIAIOSFODNN7EXAMPLE"], ["aws", "configure", "set", "key", f"AKIA{M}"]),
    (["run", "ASIAY34FZKBOKMUTVV7A,x"], ["run", f"ASIA{M},x"]),
    (
        ["python", "x.py", "--hf-token=hf_x", "--mytoken", "t", "--clientsecret", "s"],
        ["python", "x.py", f"--hf-token={M}", "--mytoken", M, "--clientsecret", M],
    ),
    # review4: a pair glued to an option (`--env=NAME=value`), a URL password with no user,
    # curl's clustered short flags and a header without a space after its colon.
    (["docker", "run", "--env=HF_TOKEN=hf_xyzabc", "img"], ["docker", "run", f"--env=HF_TOKEN={M}", "img"]),
    (["helm", "install", "--set=auth.password=hunter2"], ["helm", "install", f"--set=auth.password={M}"]),
    (["python", "x.py", "redis://:hunter2@host:6379/0"], ["python", "x.py", f"redis://:{M}@host:6379/0"]),
    (["curl", "-sSu", "bob:pw", "https://x"], ["curl", "-sSu", f"bob:{M}", "https://x"]),
    (["curl", "-fsSLubob:pw", "https://x"], ["curl", f"-fsSLubob:{M}", "https://x"]),
    (["curl", "-H", "X-Auth-Token:abcdefgh", "https://x"], ["curl", "-H", f"X-Auth-Token: {M}", "https://x"]),
    # Shapes the last closing note listed as gaps: OpenSSL's pass phrase argument, Samba's and lftp's
    # user/password separators, `--pw`, a password in code given to `python -c`, a JSON pair.
    (["openssl", "pkcs12", "-passout", "pass:hunter2"], ["openssl", "pkcs12", "-passout", f"pass:{M}"]),
    (["smbclient", "//h/s", "-U", "DOM\\bob%hunter2"], ["smbclient", "//h/s", "-U", f"DOM\\bob%{M}"]),
    (["smbclient", "--user=bob%hunter2"], ["smbclient", f"--user=bob%{M}"]),
    (["lftp", "-u", "bob,hunter2", "sftp://h"], ["lftp", "-u", f"bob,{M}", "sftp://h"]),
    (["python", "x.py", "--pw", "hunter2", "db_pw=x1"], ["python", "x.py", "--pw", M, f"db_pw={M}"]),
    (
        ["python", "-c", "from huggingface_hub import login; login(token='abc123')"],
        ["python", "-c", f"from huggingface_hub import login; login(token='{M}')"],
    ),
    (["python", "-c", 'password = "hunter2"; run()'], ["python", "-c", f'password = "{M}"; run()']),
    (
        ["app", "--config", '{"api_key": "abc", "lr": "0.1"}'],
        ["app", "--config", f'{{"api_key": "{M}", "lr": "0.1"}}'],
    ),
]

# Realistic command lines that must come out exactly as they went in.
UNTOUCHED = [
    ["docker", "run", "--env=CUDA_VISIBLE_DEVICES=0,1", "img"],
    ["curl", "-sSfL", "https://example.com/install.sh"],
    [
        "torchrun",
        "--nproc_per_node=8",
        "--nnodes=2",
        "--rdzv-endpoint=10.0.0.1:29500",
        "--rdzv_backend=c10d",
        "train.py",
    ],
    ["python", "train.py", "--model", "Meta-Llama-3.1-70B-Instruct", "--lr", "3e-4", "--seed", "-1", "--bf16"],
    ["python", "-m", "torch.distributed.run", "--master_port=29501", "finetune.py", "--batch-size", "64"],
    [
        "python",
        "eval.py",
        "/home/u/.cache/huggingface/hub/models--meta-llama--Llama-2-7b-hf/snapshots/"
        "8cca527612d856d7d32bd94f8103728d614eb852/config.json",
        "--revision",
        "8cca527612d856d7d32bd94f8103728d614eb852",
    ],
    ["python", "x.py", "--sort-key", "loss", "--metric_key", "acc", "--keyfile-dir", "/etc/ssl"],
    ["docker", "run", "nvcr.io/nvidia/pytorch:24.05-py3@sha256:0123abcd", "--gpus", "all"],
    ["python", "x.py", "--checkpoint", "checkpoints/Llama2Model7B/Epoch10Step2000/model.safetensors"],
    ["python", "x.py", "TransformerEncoderLayerWithRotaryEmbedding", "NVIDIAGeForceRTX4090", "run-20240501-123456"],
    ["python", "x.py", "--gpu", "GPU-5a2b3c4d-1111-2222-3333-444455556666", "--container", "0" * 64],
    ["/usr/bin/python3", "-c", "import time; time.sleep(60)", "12345678901234567890"],
    # review3 S4's guard against over-redaction: what a training command line is made of stays.
    ["torchrun", "--nproc-per-node", "8", "train.py", "--batch-size", "64", "--lr", "3e-4", "-p", "8"],
    ["python", "gen.py", "--max-tokens", "4096", "--max_new_tokens", "256", "--tokenizer", "meta-llama/Llama-2-7b-hf"],
    [
        "python",
        "x.py",
        "--key-file",
        "~/.ssh/id_ed25519",
        "--password-file",
        "/run/secrets/db",
        "--token-path",
        "t.txt",
    ],
    ["ssh", "-p", "2222", "node1"],
    ["docker", "run", "-p", "8080:80", "-p", "127.0.0.1:9000:9000/tcp", "-u", "1000:1000", "img"],
    ["mkdir", "-p", "/data/run-1/ckpt"],
    ["python", "-u", "train.py", "--bypass-cache", "--compass", "north", "--sort-key", "loss"],
    ["python", "x.py", "--metric-key", "val_accuracy_top5_ema", "--cache-key", "v2"],
    ["find", ".", "-path", "./x", "-prune", "-o", "-print"],
    ["mysql", "-p", "-u", "root", "-h", "db.local", "-P", "3306"],
    ["python", "x.py", "--config", "configs/AKIA_style_name.yaml", "--signal", "SIGTERM"],
    ["openssl", "req", "-passin", "env:KEY_PASS", "-in", "req.pem"],
    ["smbclient", "//h/s", "-U", "bob", "-W", "DOM"],
    ["python", "-c", "x = 3; assert x == 3", "--config", '{"lr": "0.1", "model": "resnet50"}'],
]


@pytest.mark.parametrize(("argv", "expected"), SECRETS, ids=[" ".join(a) for a, _ in SECRETS])
def test_secret_values_are_redacted_and_the_shape_kept(argv: list[str], expected: list[str]) -> None:
    assert redact.argv(argv) == expected


@pytest.mark.parametrize("argv", UNTOUCHED, ids=[a[1] for a in UNTOUCHED])
def test_realistic_command_lines_are_not_damaged(argv: list[str]) -> None:
    assert redact.argv(argv) == argv


def test_the_program_is_never_redacted() -> None:
    program = "/opt/bin/Zm9vYmFyMTIzNDU2Nzg5MGFiY2RlZg"
    assert redact.argv([program, "--token=x"])[0] == program


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("mlx5_0:1,mlx5_1:1,token=abc", f"mlx5_0:1,mlx5_1:1,token={M}"),
        ("admin:hunter2@10.0.0.1", f"admin:{M}@10.0.0.1"),
        ("eth0,ib0", "eth0,ib0"),
        ("expandable_segments:True,max_split_size_mb:128", "expandable_segments:True,max_split_size_mb:128"),
        ("GPU-5a2b3c4d-1111-2222-3333-444455556666,GPU-6a2b", "GPU-5a2b3c4d-1111-2222-3333-444455556666,GPU-6a2b"),
        ("Basic checks passed; Token indices too long", "Basic checks passed; Token indices too long"),
        (NCCL_LINE + "token=abc", NCCL_LINE + f"token={M}"),
        # review3 S4: commands and assignments inside a text (a log line, `bash -c "..."`)
        ("PGPASSWORD=hunter2", f"PGPASSWORD={M}"),
        ("curl -u bob:hunter2 https://h/x", f"curl -u bob:{M} https://h/x"),
        ("mysql -phunter2 db && echo ok", f"mysql -p{M} db && echo ok"),
        ("run.sh --pass hunter2 --epochs 3", f"run.sh --pass {M} --epochs 3"),
        (
            "https://a.blob.core.windows.net/c/f?sv=2022-11-02&sig=Ab%2Bc%3D",
            f"https://a.blob.core.windows.net/c/f?sv=2022-11-02&sig={M}",
        ),
        ("AWS key AKIAIOSFODNN7EXAMPLE in use", f"AWS key AKIA{M} in use"),
        (
            "NCCL INFO NET/IB : Using [0]mlx5_0:1/IB ; OOB eth0:10.0.0.1<0>",
            "NCCL INFO NET/IB : Using [0]mlx5_0:1/IB ; OOB eth0:10.0.0.1<0>",
        ),
        (
            "torchrun --nproc-per-node 8 -p 8 train.py --max-tokens 512",
            "torchrun --nproc-per-node 8 -p 8 train.py --max-tokens 512",
        ),
    ],
)
def test_values_keep_everything_but_their_credentials(value: str, expected: str) -> None:
    assert redact.text(value) == expected


# review5: string literals in code and YAML (to the closing quote), keys written through a subscript.
CODE_SECRETS = [
    ('password = "correct horse battery staple"', f'password = "{M}"'),
    ("export PASSWORD='hunter2 two'", f"export PASSWORD='{M}'"),
    ("password='a,b'", f"password='{M}'"),
    ('password: "hunter2"', f'password: "{M}"'),
    ("api_key: 'abc'", f"api_key: '{M}'"),
    ("import os; os.environ['HF_TOKEN']='hunter2'", f"import os; os.environ['HF_TOKEN']='{M}'"),
    ("data['token'] = 'abc'", f"data['token'] = '{M}'"),
    ("token=r'abc'", f"token=r'{M}'"),
    ("_SECRET=abc env _PW=x 0sig=abc", f"_SECRET={M} env _PW={M} 0sig={M}"),
    ('{\\"api_key\\": \\"abc\\", \\"lr\\": 1}', f'{{\\"api_key\\": \\"{M}\\", \\"lr\\": 1}}'),
    ("lftp -c 'open -u bob,hunter2 sftp://h; mirror'", f"lftp -c 'open -u bob,{M} sftp://h; mirror'"),
    ("openssl enc -aes-256-cbc -k hunter2 -in a", f"openssl enc -aes-256-cbc -k {M} -in a"),
    (
        "openssl req -passin pass:x1 -in req.pem -out r.csr && echo done",
        f"openssl req -passin pass:{M} -in req.pem -out r.csr && echo done",
    ),
]
# review6: a word like `open` or `net` among a program's arguments, a literal that holds a pair, a
# value starting with `=`, a later `password:` on a log line, a quoted program, a numbered name.
REVIEW6_ARGV = [
    (["curl", "https://h/v1/net", "-u", "bob:hunter2"], ["curl", "https://h/v1/net", "-u", f"bob:{M}"]),
    (["mysql", "-u", "root", "-D", "open", "-phunter2"], ["mysql", "-u", "root", "-D", "open", f"-p{M}"]),
    (
        ["python", "-c", 'cmd = "docker run --env=PGPASSWORD=hunter2pw img"'],
        ["python", "-c", f'cmd = "docker run --env=PGPASSWORD={M} img"'],
    ),
    (["python", "-c", 'import os;c=OpenAI(api_key="hunter2")'], ["python", "-c", f'import os;c=OpenAI(api_key="{M}")']),
    (["docker", "run", "--env", "PASSWORD==xhunter2"], ["docker", "run", "--env", f"PASSWORD={M}"]),
    (['sh -c "mysql -pX db && curl -u bob:pw h"'], [f'sh -c "mysql -p{M} db && curl -u bob:{M} h"']),
    (
        ["openssl", "req", "-key", "server.key", "-keyout", "k.pem"],
        ["openssl", "req", "-key", "server.key", "-keyout", "k.pem"],
    ),
]


@pytest.mark.parametrize(("argv", "expected"), REVIEW6_ARGV, ids=[" ".join(a)[:40] for a, _ in REVIEW6_ARGV])
def test_review6_command_lines(argv: list[str], expected: list[str]) -> None:
    assert redact.argv(argv) == expected


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("2024-05-01 ERROR: auth failed, password: hunter2", f"2024-05-01 ERROR: auth failed, password: {M}"),
        ("db_key: hunter2", f"db_key: {M}"),
        ('bash -c "mysql -pSECRET db"', f'bash -c "mysql -p{M} db"'),
        ("PASSWORD2=x API_KEY2=y", f"PASSWORD2={M} API_KEY2={M}"),
        ("password=<hunter2secret>", f"password={M}"),
        # kept: metrics with `pass`/`token`/`sig` in their names, special tokens
        ("humaneval pass_at_1: 0.42, pass_at_10: 0.6", "humaneval pass_at_1: 0.42, pass_at_10: 0.6"),
        ("val_token_acc: 0.51 pad_token_id: 0 sig_figs: 3", "val_token_acc: 0.51 pad_token_id: 0 sig_figs: 3"),
        (
            "t.pad_token = '[PAD]'; pad_token='<|finetune_right_pad_id|>'",
            "t.pad_token = '[PAD]'; pad_token='<|finetune_right_pad_id|>'",
        ),
    ],
)
def test_review6_texts(value: str, expected: str) -> None:
    assert redact.text(value) == expected


# review5: code, comparisons and configs that only look like secrets.
CODE_UNTOUCHED = [
    "    if self.token == other.token:",
    "assert password == 'x'",
    "key = jax.random.PRNGKey(0)",
    "tokenizer.pad_token = tokenizer.eos_token",
    "password = os.environ['PW']",
    "token = None",
    '{"pad_token": "<pad>", "eos_token": "</s>", "token_type": "bpe", "auth": "none"}',
    "python train.py --pw-kernel 1 --pw_groups=4 model.pw_conv=true --auth-mode none",
]


@pytest.mark.parametrize(("value", "expected"), CODE_SECRETS)
def test_string_literals_in_code_are_redacted_to_their_closing_quote(value: str, expected: str) -> None:
    assert redact.text(value) == expected


@pytest.mark.parametrize("value", CODE_UNTOUCHED)
def test_code_and_configs_that_hold_no_secret_are_untouched(value: str) -> None:
    assert redact.text(value) == value


@pytest.mark.parametrize(
    ("run", "random"),
    [
        ("R4nd0mAlph4Num3r1cStr1ngOf36Chars", True),  # base62
        ("AKIA4QWE7RTY2UIO5PAS", True),  # base32-like (upper case and digits)
        ("dGhpcyBpcyBhIHNlY3JldA", True),  # base64
        ("8cca527612d856d7d32bd94f8103728d614eb852", False),  # a commit hash
        ("TransformerEncoderLayerWithRotaryEmbedding", False),  # CamelCase: switches at words only
        ("NVIDIAGeForceRTX4090xx", False),
        ("thisisaverylonglowercaseword", False),
        ("Short1a2B", False),  # too short to judge
    ],
)
def test_the_long_random_string_rule(run: str, random: bool) -> None:
    assert redact.looks_random(run) is random


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
        _, _, command = resolve(proc.pid, Path("/"), False)
        assert command is not None and "tok-0000-secret" not in command
        assert command.endswith(f"--token {M} --epochs 3")
    finally:
        proc.kill()
        proc.wait()


def test_the_master_port_holder_is_named_without_its_secrets() -> None:
    code = (
        "import socket, sys, time\n"
        "s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen()\n"
        "print(s.getsockname()[1], flush=True); time.sleep(30)\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code, "--api-key=sk-live-9999", "https://bob:pw-7777@hub.example/x"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline())
        status = check_port("127.0.0.1", port)
        assert not status.free and status.holder_pid == proc.pid
        assert status.holder_command is not None
        assert "sk-live-9999" not in status.holder_command and "pw-7777" not in status.holder_command
        assert f"--api-key={M} https://bob:{M}@hub.example/x" in status.holder_command
    finally:
        proc.kill()
        proc.wait()


def test_a_master_addr_with_credentials_is_not_repeated_by_the_port_probe() -> None:
    status = check_port("admin:hunter2@no-such-host.invalid", 29500)
    assert "hunter2" not in status.host and status.host == f"admin:{M}@no-such-host.invalid"
    assert not status.resolves


def test_a_command_line_rewritten_into_one_string_is_redacted_too() -> None:
    # setproctitle (Ray workers, gunicorn, postgres) leaves /proc/PID/cmdline as one string.
    from gpudoctor.safety.redact import argv

    (line,) = argv(["python train.py --password hunter2 --hf-token=hf_abc --batch-size 64"])
    assert line == f"python train.py --password {M} --hf-token={M} --batch-size 64"
    assert argv(["mysql -phunter2 db"]) == [f"mysql -p{M} db"]
    assert argv(["ray::IDLE"]) == ["ray::IDLE"]


@pytest.mark.timeout(60)  # a guard against the quadratic stall this pins, not a speed test
def test_no_input_can_stall_redaction() -> None:
    # review4 H2: another user's 128 KiB argument (on port 29500, or on a GPU) took minutes to
    # redact, long enough for a Slurm prolog to call the check hung and drain the node.
    from gpudoctor.probe.processes import command_line
    from gpudoctor.safety.redact import MAX_TEXT, text

    huge = "aB1" * 43690  # 128 KiB, one argument
    line = command_line(["python", "-c", huge, "--password", "hunter2"])
    assert len(line) <= 300 and "hunter2" not in line
    cut = text("a=" * 60000)
    assert cut.endswith("...[cut]") and len(cut) <= MAX_TEXT + len("...[cut]")
    assert text("token=" + "x" * 10000).startswith(f"token={M}")


def test_a_secret_value_never_survives_whatever_surrounds_its_name() -> None:
    """Names that say "secret" with the separators, prefixes and endings that code, logs, YAML,
    JSON and shells put around them (review5 found `_SECRET=x` and `0sig=x` passed through)."""
    import random

    names = ["token", "password", "api_key", "HF_TOKEN", "_SECRET", "PGPASSWORD", "secret", "--password"]
    names += ["--api-key", "db_pw", "X-Api-Key", "access_token", "sig", "key", "client_secret", "mytoken"]
    seps = ["=", ": ", ":", " = '", "='", '="']  # (`name = value` unquoted is code: kept)
    before = ["", " ", "export ", "env ", "x,", "?", "&", "(", "a.", "_", "0"]
    shapes = [(b, s) for b in before for s in seps]
    shapes += [("{'", "':'"), ('{"', '": "'), ("os.environ['", "']='"), ("data['", "'] = '"), ('\\"', '\\": \\"')]
    after = ["", "'", '"', ")", ",n=1", " --lr 3", "&x=1", ";", "\n", "]"]
    rng = random.Random(0)
    for _ in range(3000):
        opening, sep = rng.choice(shapes)
        line = opening + rng.choice(names) + sep + "Zq9xSecretVal0123456789ab" + rng.choice(after)
        for shown in (line, f'python -c "{line}"'):
            assert "Zq9xSecretVal0123456789ab" not in redact.text(shown), shown
