"""Where and how the ranks run: the device, the launcher's variables, the ranks' environment.

- `choose_device`: `--device auto|cuda|cpu` against the visible GPUs (the rule `check` and `bench` share).
- `torch_missing_message`: nothing starts without torch; the message names the install.
- `torchrun_env`, `launcher_env`, `check_launcher_env`: under torchrun/srun (RANK, WORLD_SIZE and
  MASTER_ADDR set) this process starts ONE rank, its own, with the env:// rendezvous the launcher
  set up; its variables are read the way torch reads them, and a value torch could not use is a
  one-line usage error (`LauncherEnvError`), not a crash in every active check.
- `rank_env`: the spawned ranks' environment on one node: the GPUs named by UUID in rank order
  (CUDA_DEVICE_ORDER=PCI_BUS_ID, CUDA_VISIBLE_DEVICES=<UUIDs>), gloo and NCCL bootstrap on the
  loopback interface (`loopback_interface`) unless the user named an NCCL interface, in the
  environment or an NCCL config file (`nccl_names_interface`). Under torchrun/srun the user's
  environment is left alone.

Torch-free.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from gpudoctor.errors import EXIT_USAGE, UserError

NO_GPU = "no GPU is visible"
NO_GPU_AUTO = f"{NO_GPU}; `--device cpu --ranks N` runs the same machinery on CPU"


def choose_device(requested: str, visible_gpus: int) -> tuple[str, str]:
    """Where workloads run for `--device auto|cuda|cpu`: ("cuda" | "cpu", "") or ("", why not).

    The one rule `check` and `bench` share: cpu when asked for; otherwise the GPUs, when one is
    visible. `auto` on a machine without a visible GPU runs nothing rather than measuring the
    CPU in place of the GPUs it was asked about; the reason says how to run on CPU.
    """
    if requested == "cpu":
        return "cpu", ""
    if visible_gpus > 0:
        return "cuda", ""
    return "", NO_GPU if requested == "cuda" else NO_GPU_AUTO


TORCH_INSTALL = "pip install 'gpudoctor[torch]'"  # the extra that brings torch (pyproject.toml)


def torch_missing_message(python: str | None = None) -> str | None:
    """Why the ranks cannot import torch (a clear install hint), or None when they can. `python`:
    the interpreter they run in (--python, validated: InterpreterError otherwise); None: this one."""
    if python is not None:
        from gpudoctor.probe.interpreter import software_of
        from gpudoctor.snapshot import Missing

        torch = software_of(python).torch
        if not (isinstance(torch, Missing) and torch.reason == "unsupported"):
            return None
        return (
            f"PyTorch is not installed in {python} (--python): the ranks run torch. Install the torch you "
            f"train with into that environment (`{python} -m pip install torch`)"
        )
    from gpudoctor.probe.software import torch_installed  # light: importlib only

    if torch_installed():
        return None
    return (
        f"PyTorch is not installed in {sys.executable}: the ranks run torch. Install it (`{TORCH_INSTALL}`, or "
        f"`{Path(sys.executable).name} -m pip install torch`), or run them in your training environment's Python "
        "with `--python PATH`, or run the static checks alone with --quick"
    )


def torchrun_env(environ: Mapping[str, str]) -> bool:
    """True when a launcher (torchrun, srun + env) already set up a rendezvous for us."""
    return all(k in environ for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR"))


class LauncherEnvError(UserError, ValueError):
    """A torchrun/srun variable the ranks cannot use: a usage error (exit 2), one line."""

    def __init__(self, message: str) -> None:
        super().__init__(message, EXIT_USAGE, "usage")


@dataclass(frozen=True)
class LauncherEnv:
    """What torchrun/srun told this process: its rank, the world, its place on its node."""

    rank: int
    world_size: int
    local_rank: int
    node_rank: int


# (name, required, smallest value). torch's env:// rendezvous reads RANK, WORLD_SIZE and
# MASTER_PORT with int() (torch/distributed/rendezvous.py `_env_rendezvous_handler`); the ranks
# read LOCAL_RANK (their GPU) and GROUP_RANK (torchrun's node rank) the same way.
_LAUNCHER_INTS = (
    ("WORLD_SIZE", True, 1),
    ("RANK", True, 0),
    ("MASTER_PORT", True, 1),
    ("LOCAL_RANK", False, 0),
    ("LOCAL_WORLD_SIZE", False, 1),
    ("GROUP_RANK", False, 0),
)
_WHAT = {"WORLD_SIZE": "a process count", "LOCAL_WORLD_SIZE": "a process count", "MASTER_PORT": "a port number"}


def launcher_env(environ: Mapping[str, str]) -> LauncherEnv | None:
    """The launcher's environment, read the way torch reads it (int()), or None when no launcher
    set one up (`torchrun_env`). Raises LauncherEnvError naming the first variable torch (or
    the ranks) could not use, e.g. `RANK='x' is not a rank number`."""
    if not torchrun_env(environ):
        return None
    from gpudoctor.safety.redact import text as redact_text  # a value may be anything the user typed

    values: dict[str, int] = {}
    for name, required, least in _LAUNCHER_INTS:
        if name not in environ and not required:
            continue
        raw = environ.get(name, "")
        what = _WHAT.get(name, "a rank number")
        try:
            value = int(raw)
        except ValueError:
            value = None
        if value is None or value < least or (name == "MASTER_PORT" and value > 65535):
            shown = f"{name}={redact_text(raw)!r}" if name in environ else f"{name} is not set and"
            raise LauncherEnvError(
                f"{shown} is not {what}: under torchrun/srun (RANK, WORLD_SIZE and MASTER_ADDR set) "
                "gpudoctor joins the launcher's process group; fix the variable or unset RANK to run on this node alone"
            )
        values[name] = value
    for name, limit in (("RANK", "WORLD_SIZE"), ("LOCAL_RANK", "LOCAL_WORLD_SIZE")):
        if name in values and limit in values and values[name] >= values[limit]:
            raise LauncherEnvError(
                f"{name}={values[name]} is not below {limit}={values[limit]}: ranks count from 0 to {limit}-1"
            )
    return LauncherEnv(values["RANK"], values["WORLD_SIZE"], values.get("LOCAL_RANK", 0), values.get("GROUP_RANK", 0))


def check_launcher_env(environ: Mapping[str, str] | None = None) -> LauncherEnv | None:
    """`launcher_env` of this process, read before any rank starts (`check` at level 2 and up,
    `bench`), so a broken torchrun/srun variable is one usage line, not a crash per check."""
    return launcher_env(os.environ if environ is None else environ)


def rank_env(
    environ: Mapping[str, str], *, device: str, gpu_uuids: Sequence[str] | None, under_launcher: bool
) -> dict[str, str]:
    """The environment of gpudoctor's spawned ranks.

    On one node with GPUs, rank i must drive exactly the GPU gpudoctor names for it: the ranks
    get CUDA_VISIBLE_DEVICES=<UUIDs in rank order> (so cuda:i is the i-th UUID, whatever the
    user's CUDA_DEVICE_ORDER would have made of indices) and CUDA_DEVICE_ORDER=PCI_BUS_ID. On one
    node, GLOO_SOCKET_IFNAME names the loopback interface (gloo carries the CPU runs and the GPU
    runs' side groups): gloo otherwise listens on the address the host name resolves to (a public
    one on most servers) for the whole run. Its pair sockets then listen on loopback, reachable
    by local users, but the addresses they trust come from the rendezvous store, which is a
    private file (rundir.py `private_store`). NCCL's bootstrap sockets go to loopback the same way
    (`NCCL_SOCKET_IFNAME==lo`, an exact name) unless the user named an interface, in the
    environment or in an NCCL config file (`nccl_names_interface`): that is their training's
    setting, and GD626 judges it. One node needs no network. Under torchrun/srun the user's (and
    launcher's) environment is left as it is.
    """
    env = dict(environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    env["PYTHONUNBUFFERED"] = "1"
    uuids = list(gpu_uuids or [])
    if device == "cuda" and not under_launcher and uuids and all(_is_uuid(u) for u in uuids):
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
        env["CUDA_VISIBLE_DEVICES"] = ",".join(uuids)
    if not under_launcher:
        env["GLOO_SOCKET_IFNAME"] = loopback_interface()
        if device == "cuda" and not nccl_names_interface(env):
            env["NCCL_SOCKET_IFNAME"] = "=" + env["GLOO_SOCKET_IFNAME"]
    return env


NCCL_CONF_MAX_BYTES = 1 << 20


def nccl_names_interface(env: Mapping[str, str]) -> bool:
    """Whether NCCL would use an interface the user named: NCCL_SOCKET_IFNAME of two or more
    characters (NCCL ignores shorter values) in the environment, or else in the config file NCCL
    reads (NCCL_CONF_FILE, or ~/.nccl.conf, then /etc/nccl.conf; the environment wins). NCCL's
    `ncclFindInterfaces` and `initEnv` (src/misc/socket.cc, src/misc/param.cc;
    tests/reference/nccl_env_variables.md)."""
    if "NCCL_SOCKET_IFNAME" in env:
        return len(env["NCCL_SOCKET_IFNAME"]) > 1
    conf = env.get("NCCL_CONF_FILE", "")
    home = env.get("HOME", "")
    files = [conf] if conf else ([f"{home}/.nccl.conf"] if home else [])
    from gpudoctor.safety.safe_io import read_text

    for name in [*files, "/etc/nccl.conf"]:
        try:  # a regular file only: a FIFO planted as ~/.nccl.conf would block the open
            text = read_text(name, NCCL_CONF_MAX_BYTES)
        except (OSError, UnicodeDecodeError):
            continue
        for line in text.splitlines():
            key, eq, value = line.strip().partition("=")
            if eq and not key.startswith("#") and key.strip() == "NCCL_SOCKET_IFNAME" and len(value.strip()) > 1:
                return True
    return False


def loopback_interface() -> str:
    """The name of the interface that holds 127.0.0.1 ("lo" on Linux)."""
    import socket

    try:
        import psutil  # lazy: only the active checks need it

        for name, addrs in psutil.net_if_addrs().items():
            if any(a.family == socket.AF_INET and a.address == "127.0.0.1" for a in addrs):
                return name
    except Exception:  # noqa: BLE001  (no psutil view of the interfaces: Linux's name)
        pass
    return "lo"


def _is_uuid(text: object) -> bool:
    return isinstance(text, str) and text.startswith(("GPU-", "MIG-")) and "," not in text
