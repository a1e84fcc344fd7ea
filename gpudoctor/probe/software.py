"""Versions of the software stack, read without importing torch (that costs seconds).

torch's version comes from its distribution metadata, its CUDA version from the text
of torch/version.py, and NCCL's from the nvidia-nccl-cu* wheel that CUDA builds pull in.
"""

from __future__ import annotations

import ast
import importlib.metadata as metadata
import importlib.util
import platform
import re
from pathlib import Path

from gpudoctor.snapshot import Missing, Software
from gpudoctor.version import __version__

NCCL_DISTRIBUTIONS = ("nvidia-nccl-cu13", "nvidia-nccl-cu12", "nvidia-nccl-cu11")
# torch/version.py: `cuda: Optional[str] = '12.4'` (older: `cuda = '11.8'`).
_CUDA_LINE = re.compile(r"^cuda\s*(?::[^=]*)?=\s*(.+?)\s*$", re.MULTILINE)
_VERSION_LINE = re.compile(r"^__version__\s*(?::[^=]*)?=\s*(.+?)\s*$", re.MULTILINE)
TORCH_MISSING = "torch is not installed"


def distribution_version(name: str) -> str | Missing:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return Missing("unsupported", f"{name} is not installed")
    except Exception as exc:  # noqa: BLE001  (a broken dist-info must not stop the probe)
        return Missing("error", f"{name}: {type(exc).__name__}: {exc}")


def torch_cuda_from_text(text: str) -> str | None | Missing:
    match = _CUDA_LINE.search(text)
    if match is None:
        return Missing("error", "torch/version.py has no cuda line")
    try:
        value = ast.literal_eval(match.group(1))
    except (ValueError, SyntaxError):
        return Missing("error", f"torch/version.py: cannot read {match.group(1)!r}")
    return value if value is None or isinstance(value, str) else Missing("error", "torch/version.py: odd cuda value")


def _torch_version_py() -> str | Missing:
    """The text of torch/version.py, found without importing torch."""
    try:
        spec = importlib.util.find_spec("torch")  # a top-level find_spec does not run the package
    except (ImportError, ValueError) as exc:
        return Missing("error", f"cannot locate torch: {exc}")
    if spec is None or spec.origin is None:
        return Missing("unsupported", TORCH_MISSING)
    try:
        return (Path(spec.origin).parent / "version.py").read_text(encoding="utf-8")
    except OSError as exc:
        return Missing("error", f"torch/version.py: {exc.strerror or exc}")


def torch_cuda() -> str | None | Missing:
    """torch.version.cuda without `import torch`; None for a CPU build."""
    text = _torch_version_py()
    return text if isinstance(text, Missing) else torch_cuda_from_text(text)


def torch_version() -> str | Missing:
    """torch's version: its distribution's, else torch/version.py's (a source build on PYTHONPATH)."""
    version = distribution_version("torch")
    if isinstance(version, str):
        return version
    text = _torch_version_py()
    if isinstance(text, Missing):
        return text
    match = _VERSION_LINE.search(text)
    try:
        value = ast.literal_eval(match.group(1)) if match else None
    except (ValueError, SyntaxError):
        value = None
    return value if isinstance(value, str) else Missing("error", "torch/version.py has no __version__")


def torch_installed() -> bool:
    """Whether this Python can import torch (checked without importing it)."""
    try:
        return importlib.util.find_spec("torch") is not None
    except (ImportError, ValueError):
        return False


def nccl_version() -> str | Missing:
    for name in NCCL_DISTRIBUTIONS:
        version = distribution_version(name)
        if isinstance(version, str):
            return version
    return Missing("unsupported", "no nvidia-nccl-cu* package (a CPU build of torch, or NCCL linked statically)")


def read_software() -> Software:
    return Software(
        python=platform.python_version(),
        gpudoctor=__version__,
        nvidia_ml_py=distribution_version("nvidia-ml-py"),
        torch=torch_version(),
        torch_cuda=torch_cuda(),
        torch_nccl=nccl_version(),
    )
