"""GD2 (launch config): is the rendezvous port free, and does MASTER_ADDR resolve? (static)."""

from __future__ import annotations

from gpudoctor.engine import CheckContext, Code, check
from gpudoctor.findings import Finding, Status
from gpudoctor.snapshot import Missing

PORT_BUSY = Code(
    "GD221",
    "master-port-in-use",
    "The rendezvous port (MASTER_PORT, or torchrun's 29500) is free",
    what="Tries to bind MASTER_ADDR:MASTER_PORT (29500, torchrun's default, when MASTER_PORT is "
    "unset) the way a c10d store does, and names the process holding it.",
    why="torchrun and init_process_group fail with `DistNetworkError: ... failed to bind ... "
    "(errno: 98 - Address already in use)` when an earlier run or another job still holds the "
    "port (pytorch#126510, torchtune#392).",
    fix="Stop the named process if it is a leftover run, or pick a free port: "
    "`torchrun --master-port <free port>` or `--rdzv-endpoint localhost:0` on one node.",
)
ADDR = Code(
    "GD222",
    "master-addr-unresolvable",
    "MASTER_ADDR resolves to an address",
    what="Looks up MASTER_ADDR (127.0.0.1 when unset) the way c10d does.",
    why="Every rank connects to MASTER_ADDR; a name that does not resolve makes the ranks fail, or "
    "wait until the rendezvous timeout.",
    fix="Set MASTER_ADDR to the first node's IP address or a name that resolves on every node "
    "(check with `getent hosts $MASTER_ADDR`).",
)
BAD_PORT = Code(
    "GD223",
    "master-port-invalid",
    "MASTER_PORT is a valid port number",
    what="Reads MASTER_PORT and checks that it is an integer from 1 to 65535.",
    why="torch.distributed rejects a MASTER_PORT that is not a port number when the ranks start.",
    fix="Set MASTER_PORT to a free port number, e.g. `export MASTER_PORT=29501`, or unset it.",
)
CODES = [PORT_BUSY, ADDR, BAD_PORT]


def _launched(env: dict[str, str]) -> bool:
    """Under torchrun/srun the launcher's own store holds the port: that is expected."""
    return "RANK" in env and "WORLD_SIZE" in env


@check("launch_port", "Rendezvous port and address", codes=CODES)
def launch_port(ctx: CheckContext) -> list[Finding]:
    status = ctx.snapshot.host.master_port
    env = ctx.snapshot.env
    if isinstance(status, Missing):
        if status.reason == "error" and "MASTER_PORT" in status.detail:
            return [
                Finding(
                    BAD_PORT.code,
                    Status.FAIL,
                    "host",
                    status.detail,
                    BAD_PORT.fix,
                    {"MASTER_PORT": env.get("MASTER_PORT", "")},
                )
            ]
        return [
            Finding(
                PORT_BUSY.code,
                Status.SKIP,
                "host",
                f"rendezvous port not probed ({status.reason})",
                "",
                {"reason": status.reason},
            )
        ]
    where = f"{status.host}:{status.port}"
    evidence = {
        "host": status.host,
        "port": status.port,
        "free": status.free,
        "holder_pid": status.holder_pid,
        "holder_command": status.holder_command,
        # The command line is another process's: its secrets were replaced by `[redacted]`.
        "holder_command_redacted": _redacted(status.holder_command),
        "from_env": "MASTER_PORT" in env,
    }
    if not status.resolves:
        return [
            Finding(ADDR.code, Status.FAIL, "host", f"MASTER_ADDR {status.host!r} does not resolve", ADDR.fix, evidence)
        ]
    if status.free:
        return [Finding(PORT_BUSY.code, Status.PASS, "host", f"rendezvous port {where} is free", "", evidence)]
    holder = (
        f"PID {status.holder_pid} ({status.holder_command or 'command unknown'})"
        if status.holder_pid
        else "a process gpudoctor cannot see (another user or container)"
    )
    if _launched(env):
        return [
            Finding(
                PORT_BUSY.code,
                Status.PASS,
                "host",
                f"rendezvous port {where} is held by {holder}: the launcher's store, as expected under torchrun/srun",
                "",
                evidence,
            )
        ]
    # A busy default port only bites a run that relies on the default; a set MASTER_PORT always does.
    status_ = Status.FAIL if "MASTER_PORT" in env else Status.WARN
    name = "MASTER_PORT" if "MASTER_PORT" in env else "torchrun's default port"
    return [Finding(PORT_BUSY.code, status_, "host", f"{name} {where} is in use by {holder}", PORT_BUSY.fix, evidence)]


def _redacted(command: str | None) -> bool:
    """Whether the holder's command line had secrets replaced; the redaction rules (many regular
    expressions, compiled on import) are loaded only when there is a command line to ask about."""
    if not command:
        return False
    from gpudoctor.safety.redact import redacted

    return redacted(command)
