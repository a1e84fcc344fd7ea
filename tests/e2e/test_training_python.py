"""`--python PATH` (issue 24): gpudoctor installed light (no torch) runs the active checks' ranks in
the training environment's own interpreter, which need not have gpudoctor installed; that
interpreter's torch is what GD002 judges; a path that is no usable Python is a usage error."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.cli import run_cli
from tests.helpers.processes import GpudoctorCli, hiding


def _script(path: Path, text: str) -> str:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


@pytest.fixture(scope="module")
def bare_python(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A real Python without torch (a fresh virtual environment): what a training node's wrong env is."""
    where = tmp_path_factory.mktemp("bare") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(where)], check=True, timeout=120)
    python = where / "bin" / "python"
    found = subprocess.run([str(python), "-c", "import torch"], capture_output=True, check=False, timeout=60)
    assert found.returncode != 0, "the bare environment has torch: the test would prove nothing"
    return str(python)


@pytest.mark.parametrize(
    ("make", "why"),
    [
        (lambda d: str(d / "missing"), "no such file"),
        (lambda d: str(d), "is a directory"),
        (lambda d: (d / "plain").write_text("x") and str(d / "plain"), "is not an executable file"),
        (lambda d: _script(d / "tool", "#!/bin/sh\necho hello\n"), "is not a Python 3.10+ interpreter"),
        (lambda d: _script(d / "old", '#!/bin/sh\necho \'{"too_old": "3.8.10"}\'\n'), "is Python 3.8.10"),
    ],
    ids=["missing", "directory", "not-executable", "not-python", "too-old"],
)
def test_a_python_the_ranks_cannot_run_in_is_a_usage_error(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, make, why: str
) -> None:  # type: ignore[no-untyped-def]
    path = make(tmp_path)
    r = run_cli(capsys, "check", "--device", "cpu", "--ranks", "2", "--python", path)
    assert r.exit_code == 2 and r.out == ""
    assert r.err.startswith(f"gpudoctor: --python {path}: ") and why in r.err and r.err.count("\n") == 1
    bench = run_cli(capsys, "bench", "allreduce", "--device", "cpu", "--python", path)
    assert bench.exit_code == 2 and why in bench.err


def test_python_needs_a_level_that_starts_ranks(capsys: pytest.CaptureFixture[str]) -> None:
    r = run_cli(capsys, "check", "--quick", "--python", sys.executable)
    assert r.exit_code == 2 and "not with --quick or --snapshot" in r.err


def test_a_training_python_without_torch_is_gd002_naming_it(
    capsys: pytest.CaptureFixture[str], bare_python: str
) -> None:
    r = run_cli(capsys, "check", "--device", "cpu", "--ranks", "2", "--python", bare_python, "--json")
    assert r.exit_code == 1
    gd002 = r.one("GD002")
    assert gd002["status"] == "fail" and gd002["evidence"]["python"] == bare_python
    assert gd002["message"] == f"PyTorch is not installed in {bare_python} (--python): " + (
        "the active checks and the training run need it"
    )
    assert {f["status"] for f in r.findings() if f["code"] in ("GD601", "GD701")} == {"skip"}


@pytest.mark.slow
def test_a_light_gpudoctor_runs_its_ranks_in_the_training_python(gpudoctor_cli: GpudoctorCli, tmp_path: Path) -> None:
    """gpudoctor's own Python has no torch (hidden, as after a light install); the ranks run in
    another interpreter, which has torch and no gpudoctor of its own on its path (only the link)."""
    log = tmp_path / "invocations"
    training = _script(
        tmp_path / "train-python",
        f'#!/bin/sh\necho "$PYTHONPATH $*" >> {log}\nunset GPUDOCTOR_TEST_HIDE\nexec {sys.executable} "$@"\n',
    )
    env = hiding("torch")
    light = gpudoctor_cli("check", "--device", "cpu", "--ranks", "2", "--json", env=env, timeout=60)
    assert light.returncode == 1 and "gpudoctor[torch]" in json.dumps(json.loads(light.stdout))
    out = gpudoctor_cli(
        "check", "--device", "cpu", "--ranks", "2", "--python", training, "--json", env=env, timeout=300
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    doc = json.loads(out.stdout)
    statuses = {c["name"]: c["status"] for c in doc["checks"]}
    assert statuses["torch_install"] == statuses["allreduce"] == statuses["ddp"] == "pass"
    (gd002,) = [f for c in doc["checks"] for f in c["findings"] if f["code"] == "GD002"]
    assert gd002["message"].startswith("torch ") and gd002["message"].endswith(f"in {training} (--python)")
    ranks = [line for line in log.read_text().splitlines() if "-m gpudoctor.workloads.rank" in line]
    assert len(ranks) == 2
    # each rank imported this gpudoctor through the private link, first on its path
    first = [line.split(" ", 1)[0].split(os.pathsep)[0] for line in ranks]
    assert all(p.endswith("/pythonpath") and "gpudoctor-rank" in p for p in first), first
    assert not any(Path(p).exists() for p in first), "the link directory outlived the run"
