"""NCCL's device-list syntax, as NCCL reads NCCL_IB_HCA and NCCL_SOCKET_IFNAME (one parser for both).

    spec = parse_nccl_list("^=mlx5_1,mlx5_4")
    spec.selects("mlx5_0", port=1)   # True: not excluded

NVIDIA/nccl src/misc/utils.cc (parseStringList, matchIf, matchPort, matchIfList) and the callers
that strip the leading '^' (exclude) then '=' (exact names): src/transport/net_ib/init.cc for
NCCL_IB_HCA, src/os/linux.cc for NCCL_SOCKET_IFNAME (interfaces have no port: -1). Each
comma-separated entry is `<name>[:<port>[:<rail>[:<plane>]]]`; an empty item or an entry with no
name is dropped; the port is C's atoi of its field; an empty list matches everything (so "^"
alone excludes everything). tests/reference/nccl-ib-hca.md has the lines.
"""

from __future__ import annotations

from gpudoctor.records import Record, record


def _atoi(text: str) -> int:
    """C's atoi: leading digits (with a sign), 0 when there are none."""
    digits = ""
    for ch in text.strip():
        if ch.isdigit() or (not digits and ch in "+-"):
            digits += ch
        else:
            break
    try:
        return int(digits)
    except ValueError:
        return 0


@record
class NcclList(Record):
    exclude: bool
    exact: bool
    entries: tuple[tuple[str, int | None], ...]  # (name or prefix, port; None: any port)

    def entry_matches(self, entry: tuple[str, int | None], name: str, port: int = -1) -> bool:
        prefix, want = entry
        named = name == prefix if self.exact else name.startswith(prefix)
        return named and (want is None or port == -1 or want == port)  # matchPort: -1 is any

    def matches(self, name: str, port: int = -1) -> bool:
        """matchIfList: an empty list matches everything."""
        return not self.entries or any(self.entry_matches(e, name, port) for e in self.entries)

    def selects(self, name: str, port: int = -1) -> bool:
        return self.matches(name, port) != self.exclude


def split_nccl_list(value: str) -> tuple[str, list[str]]:
    """The list's flags (`^` first, then `=`, as NCCL strips them) and its comma-separated items."""
    flags = "^" if value.startswith("^") else ""
    text = value[len(flags) :]
    if text.startswith("="):
        flags, text = flags + "=", text[1:]
    return flags, text.split(",")


def parse_nccl_list(value: str) -> NcclList:
    flags, items = split_nccl_list(value)
    exclude, exact = "^" in flags, "=" in flags
    entries = []
    for item in items:
        fields = item.split(":")
        if not fields[0]:
            continue
        port = fields[1] if len(fields) > 1 else ""
        entries.append((fields[0], _atoi(port) if port else None))
    return NcclList(exclude, exact, tuple(entries))


def socket_ifname_read(value: str) -> bool:
    """Whether NCCL reads this NCCL_SOCKET_IFNAME at all: only a value of two characters or more
    (src/misc/socket.cc, ncclFindInterfaces: `if (env && strlen(env) > 1)`); NCCL ignores a shorter one
    ("", "^", "e") and picks an interface itself (ib first, then anything but docker and lo)."""
    return len(value) > 1
