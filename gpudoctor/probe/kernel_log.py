"""XID events from the kernel log: /dev/kmsg read without blocking, else `dmesg`.

Reading the kernel log needs CAP_SYSLOG where dmesg_restrict is set, which containers
usually lack; that is recorded as Missing("no_permission"), not guessed around.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import subprocess
from pathlib import Path

from gpudoctor.knowledge.interconnect import nvml_bus_id  # '0000:18:00' -> '00000000:18:00.0', as Gpu.pci_bus_id
from gpudoctor.snapshot import Missing, XidEvent

# "NVRM: Xid (PCI:0000:18:00): 79, pid=1234, name=python, GPU has fallen off the bus."
# Old drivers omit "PCI:"; some lines carry the function ("0000:18:00.0").
_BUS = r"[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-7])?"
XID_RE = re.compile(r"NVRM: Xid \((?:PCI:)?(" + _BUS + r")\): (\d+),?\s*(.*)")
DMESG_TIMEOUT_S = 1.0
KMSG_MAX_RECORDS = 200_000  # the ring buffer holds far fewer; a guard against a stream that never ends


def parse_line(message: str, timestamp: str = "") -> XidEvent | None:
    match = XID_RE.search(message)
    if match is None:
        return None
    return XidEvent(
        pci_bus_id=nvml_bus_id(match.group(1)),
        xid=int(match.group(2)),
        text=message[match.start() :].strip(),
        timestamp=timestamp,
    )


def parse_kmsg_record(record: str) -> XidEvent | None:
    """A /dev/kmsg record: 'prio,seq,usec,flags;message' (continuation lines follow)."""
    header, sep, message = record.partition(";")
    if not sep:
        return None
    fields = header.split(",")
    timestamp = ""
    if len(fields) >= 3 and fields[2].isdigit():
        usec = int(fields[2])
        timestamp = f"[{usec // 1_000_000:5d}.{usec % 1_000_000:06d}]"  # as dmesg prints it
    return parse_line(message.splitlines()[0] if message else "", timestamp)


def parse_dmesg(text: str) -> list[XidEvent]:
    events = []
    for line in text.splitlines():
        timestamp = ""
        if line.startswith("["):
            end = line.find("]")
            if end > 0:
                timestamp, line = line[: end + 1], line[end + 1 :]
        event = parse_line(line, timestamp)
        if event is not None:
            events.append(event)
    return events


def read_kmsg(path: Path) -> list[XidEvent]:
    """Every record now in the ring buffer; O_NONBLOCK makes the read stop at the end.

    The device returns one record per read; a plain file (tests) returns many, so the
    bytes are split into lines, and continuation lines (" KEY=value") are skipped.
    """
    events = []
    pending = b""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        for _ in range(KMSG_MAX_RECORDS):
            try:
                chunk = os.read(fd, 8192)
            except BlockingIOError:
                break
            except OSError as exc:
                if exc.errno == errno.EPIPE:  # the record we were at was overwritten: go on
                    continue
                raise
            if not chunk:
                break
            *lines, pending = (pending + chunk).split(b"\n")
            for line in lines:
                if line and not line.startswith(b" "):
                    event = parse_kmsg_record(line.decode("utf-8", "replace"))
                    if event is not None:
                        events.append(event)
    finally:
        os.close(fd)
    if pending and not pending.startswith(b" "):
        event = parse_kmsg_record(pending.decode("utf-8", "replace"))
        if event is not None:
            events.append(event)
    return events


def read_dmesg() -> list[XidEvent] | Missing:
    exe = shutil.which("dmesg")
    if exe is None:
        return Missing("unsupported", "no /dev/kmsg and no dmesg command")
    try:
        done = subprocess.run([exe], capture_output=True, text=True, timeout=DMESG_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        return Missing("error", f"dmesg did not answer within {DMESG_TIMEOUT_S:g} s")
    except OSError as exc:
        return Missing("error", f"dmesg: {exc.strerror or exc}")
    if done.returncode != 0:
        err = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[0]
        reason = "no_permission" if "not permitted" in err or "denied" in err else "error"
        return Missing(reason, f"dmesg: {err}")
    return parse_dmesg(done.stdout)


def xid_events(root: Path) -> list[XidEvent] | Missing:
    kmsg = root / "dev" / "kmsg"
    try:
        return read_kmsg(kmsg)
    except PermissionError:
        return Missing("no_permission", "/dev/kmsg: permission denied (reading the kernel log needs CAP_SYSLOG)")
    except FileNotFoundError:
        if root != Path("/"):
            return Missing("unsupported", "no /dev/kmsg")
        return read_dmesg()
    except OSError as exc:
        if exc.errno in (errno.EPERM, errno.EACCES):
            return Missing("no_permission", "/dev/kmsg: operation not permitted (needs CAP_SYSLOG)")
        return Missing("error", f"/dev/kmsg: {exc.strerror or exc}")
