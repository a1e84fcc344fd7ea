"""Another Python interpreter (`--python PATH`): the training environment's own, in which the ranks
of the active checks run. The truthful test of the stack a job will use is that stack itself, and
gpudoctor can then be installed light (no torch) beside it.

That interpreter need not have gpudoctor installed: it imports THIS gpudoctor (pure Python) through
a private directory holding only a link to this package (and to pynvml, pure Python too, which GPU
ranks read NVML with), put first on its PYTHONPATH. Nothing else of this environment's
site-packages is offered to it: compiled packages (psutil) built for another Python would break it.

`software_of(path)` validates the interpreter (exists, runs, Python >= 3.10) and reads its software
stack (torch, its CUDA and NCCL, nvidia-ml-py) with the same code `gpudoctor snapshot` uses, without
importing torch; an unusable one raises InterpreterError (a usage error: one line, exit 2).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import tempfile
from functools import lru_cache
from pathlib import Path

from gpudoctor.errors import EXIT_USAGE, UserError
from gpudoctor.snapshot import SnapshotError, Software, part_from_jsonable

MIN_PYTHON = (3, 10)  # pyproject's requires-python: the code the ranks run is this package's
ANSWER_S = 60.0  # how long the interpreter may take to start and answer (a cold NFS home, a busy node)
MAX_ANSWER_BYTES = 1 << 16
# Runs in the other interpreter. Its first lines parse on any Python 3, so an old one says so.
_PROBE = f"""\
import json, sys
if sys.version_info < {MIN_PYTHON!r}:
    print(json.dumps({{"too_old": "%d.%d.%d" % tuple(sys.version_info[:3])}}))
    sys.exit(0)
from gpudoctor.probe.software import read_software
from gpudoctor.snapshot import to_jsonable
print(json.dumps({{"executable": sys.executable, "software": to_jsonable(read_software())}}))
"""


class InterpreterError(UserError, ValueError):
    """--python names something the ranks cannot run in: a usage error (exit 2), one line."""

    def __init__(self, message: str) -> None:
        super().__init__(message, EXIT_USAGE, "usage")


def link_package(directory: Path) -> Path:
    """Make `directory`/pythonpath hold links to this gpudoctor package and to pynvml; returns it
    (put it first on the other interpreter's PYTHONPATH)."""
    import importlib.util

    here = directory / "pythonpath"
    here.mkdir(mode=0o700)
    (here / "gpudoctor").symlink_to(Path(__file__).resolve().parent.parent, target_is_directory=True)
    try:
        spec = importlib.util.find_spec("pynvml")  # a single pure-Python module (nvidia-ml-py)
    except (ImportError, ValueError):
        spec = None
    if spec is not None and spec.origin and spec.origin.endswith(".py"):
        (here / "pynvml.py").symlink_to(spec.origin)
    return here


def python_env(environ: dict[str, str], pythonpath: Path) -> dict[str, str]:
    """`environ` for the other interpreter: our linked package first on its PYTHONPATH, the user's after."""
    before = environ.get("PYTHONPATH", "")
    return {**environ, "PYTHONPATH": str(pythonpath) + (os.pathsep + before if before else "")}


def _refuse(path: str, why: str) -> InterpreterError:
    return InterpreterError(f"--python {path}: {why}")


def _usable_file(path: str) -> None:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise _refuse(path, "no such file") from None
    except OSError as exc:
        raise _refuse(path, exc.strerror or str(exc)) from None
    if stat.S_ISDIR(st.st_mode):
        raise _refuse(path, "is a directory, not a Python interpreter (name its bin/python)")
    if not stat.S_ISREG(st.st_mode) or not os.access(path, os.X_OK):
        raise _refuse(path, "is not an executable file")


def software_of(path: str) -> Software:
    """The software stack of the Python at `path` (made absolute, links kept: a venv's python is a
    link whose name decides the environment), validated (InterpreterError otherwise)."""
    return _software_of(os.path.abspath(path))


@lru_cache(maxsize=8)  # the pipeline validates, then the launch asks again: one run of the probe
def _software_of(path: str) -> Software:
    _usable_file(path)
    work = Path(tempfile.mkdtemp(prefix="gpudoctor-python-"))  # 0700, removed below
    try:
        env = python_env(dict(os.environ), link_package(work))
        answer = _ask(path, env, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if "too_old" in answer:
        low = ".".join(map(str, MIN_PYTHON))
        raise _refuse(path, f"is Python {answer['too_old']}; the ranks need Python {low} or later")
    try:
        return part_from_jsonable(Software, answer.get("software"), "software")
    except SnapshotError as exc:
        raise _refuse(path, f"answered something gpudoctor cannot read ({exc})") from None


def _ask(path: str, env: dict[str, str], cwd: Path) -> dict:
    """Run the probe in the interpreter (its own session, killed whole on a timeout); its JSON answer."""
    try:
        proc = subprocess.Popen(
            [path, "-c", _PROBE],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            cwd=cwd,  # not the caller's directory: a gpudoctor/ folder there must not shadow the link
            start_new_session=True,
        )
    except OSError as exc:
        raise _refuse(path, f"cannot run it: {exc.strerror or exc}") from None
    try:
        out, err = proc.communicate(timeout=ANSWER_S)
    except subprocess.TimeoutExpired:
        _kill(proc)
        raise _refuse(path, f"did not answer within {ANSWER_S:g} s") from None
    except BaseException:
        _kill(proc)
        raise
    text = out[:MAX_ANSWER_BYTES].decode("utf-8", "replace").strip()
    try:
        answer = json.loads(text.splitlines()[-1]) if text else None
    except ValueError:
        answer = None
    if not isinstance(answer, dict):
        said = err[:MAX_ANSWER_BYTES].decode("utf-8", "replace").strip().splitlines()
        detail = said[-1][:200] if said else f"it exited {proc.returncode} without an answer"
        low = ".".join(map(str, MIN_PYTHON))
        raise _refuse(path, f"is not a Python {low}+ interpreter gpudoctor can use ({detail})")
    return answer


def _kill(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        pass
    proc.wait()
