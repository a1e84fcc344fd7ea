"""`gpudoctor fleet PATH...`: many nodes judged at once from saved files (snapshots and `check
--json` reports), by the judging code of the torchrun/srun `nodes` check.

Each file is one node. Its facts are built as a node builds what it sends to rank 0
(knowledge/node_record.py), held to the same shape and bounds rank 0 holds another node's facts
to (knowledge/node_facts.py `clean_facts`), and judged by the same functions
(checks/active/node_comparison.py): the node(s) whose driver, CUDA, NCCL, torch, GPU models and
count, active NVLinks, VBIOS, NIC firmware, rails, MTU, Ethernet links or GPUDirect RDMA differ
from the majority (GD460-GD463), the node whose measured all-reduce busbw is below 0.7 of the
median of the nodes measured alike (GD683), the reports' own warnings and failures grouped by code
across nodes; with `--baseline FILE`, every node against that file with `diff`'s rules
(compare/rules.py, GD011-GD019), each regression grouped across the nodes that have it.

Cost: each file is read and judged once, the comparisons group values in dicts: linear in nodes
(benchmarks/fleet.py). Input, from a directory other users write (each node saving its own file):
only regular `*.json` files directly in it, symbolic links there refused in the open itself
(O_NOFOLLOW: a link planted there would make gpudoctor read, and quote, a file its planter cannot
read); a file named on the command line may be a link, unless a link on its way is another
user's. FIFOs and devices are refused without blocking, each file at most 32 MiB
(safety/user_files.py), at most MAX_FILES files; a file that cannot be used is one GD464 line
naming it and why.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

from gpudoctor.checks.active.node_codes import FACTS_MISSING, INTRA_SLOW, NETWORK_DIFFERS
from gpudoctor.checks.active.node_comparison import comparison_findings, forwarded, intra_findings
from gpudoctor.compare.codes import GPUS
from gpudoctor.compare.sides import Side
from gpudoctor.errors import EXIT_USAGE, UserError
from gpudoctor.findings import CheckResult, Finding, Status
from gpudoctor.knowledge.facts import dicts
from gpudoctor.knowledge.node_facts import FORWARDED_STATUSES, MAX_FORWARDED, MAX_TEXT, Malformed, clean_facts
from gpudoctor.knowledge.pair_isolation import SLOW_RATIO
from gpudoctor.knowledge.units import listed

MAX_FILES = 10_000  # a heuristic bound: more nodes than the largest clusters' racks of one job
FILE_SUFFIX = ".json"


@dataclass
class FleetNode:
    """One file's node: where it came from, the side `diff` would read, and its node facts."""

    path: str
    side: Side
    facts: dict[str, Any]
    measured: dict[str, Any] | None  # its all-reduce busbw, as the nodes check's own figure


def fleet_files(paths: Sequence[str]) -> tuple[list[tuple[str, bool]], list[tuple[str, str]]]:
    """The files to read, each with whether a symbolic link may be followed (a file named on the
    command line: yes; one found in a directory: no), and the paths that are neither."""
    files: list[tuple[str, bool]] = []
    problems: list[tuple[str, str]] = []
    for path in paths:
        if not os.path.isdir(path):
            files.append((path, True))
        elif why := foreign_link(path):
            problems.append((path, why))
        else:
            try:
                with os.scandir(path) as entries:
                    names = sorted(e.name for e in entries if e.name.endswith(FILE_SUFFIX) and e.name[0] != ".")
            except OSError as exc:
                problems.append((path, f"cannot list the directory: {exc.strerror or exc}"))
                continue
            if not names:
                problems.append((path, f"a directory with no {FILE_SUFFIX} file"))
            files += [(os.path.join(path, name), False) for name in names]
        if len(files) > MAX_FILES:
            raise UserError(
                f"fleet: more than {MAX_FILES} files to read; judge the fleet in parts (a directory each)",
                EXIT_USAGE,
                "input",
            )
    return files, problems


def distinct(files: list[tuple[str, bool]]) -> tuple[list[tuple[str, bool]], list[str]]:
    """Each file once, however it was named (`A ./A`, `dir dir/`, a hard link: the same inode), and
    the names left out: a file counted twice would outvote the others."""
    seen: set[tuple[object, ...]] = set()
    out: list[tuple[str, bool]] = []
    repeated: list[str] = []
    for path, follow in files:
        try:
            st = os.stat(path, follow_symlinks=follow)
            key: tuple[object, ...] = ("inode", st.st_dev, st.st_ino)
        except (OSError, ValueError):
            key = ("path", os.path.realpath(path))
        if key in seen:
            repeated.append(path)
        else:
            seen.add(key)
            out.append((path, follow))
    return out, repeated


def foreign_link(path: str) -> str | None:
    """Why `path` must not be read: a symbolic link on its way belongs to another user, who may point it
    anywhere (`fleet /shared/*.json` names files, `fleet /shared/nodes` a folder: both can be planted)."""
    from gpudoctor.safety.user_files import untrusted_path

    why = untrusted_path(path, {os.geteuid(), 0}, folders=False)
    return None if why is None else f"{why} (not followed: name the folder or file it points to)"


def load_node(path: str, follow: bool) -> FleetNode:
    """One file as a node; UserError (one line: the file and why) when it is not a usable one."""
    from gpudoctor.compare.sides import read_side
    from gpudoctor.knowledge.node_record import from_machine_facts, from_snapshot
    from gpudoctor.safety.user_files import UserFileError, read_json

    why = foreign_link(path) if follow else None  # a file found in a folder: O_NOFOLLOW
    if why is not None:
        raise UserError(why, EXIT_USAGE, "input")
    try:
        data = read_json(path, follow=follow)
    except UserFileError as exc:
        raise UserError(str(exc), EXIT_USAGE, "input") from None
    side, snapshot = read_side(data, path)
    if snapshot is not None:
        facts = from_snapshot(snapshot)
    else:
        facts = {**from_machine_facts(side.facts or {}), "findings": report_findings(data)}
        if facts["host"] is None and isinstance(data.get("hostname"), str):  # a report from before `facts`
            facts["host"] = data["hostname"]
    return FleetNode(path, side, facts, measured_busbw(side.measurements))


def report_findings(report: dict[str, Any]) -> list[dict[str, Any]]:
    """A report's findings that are not a pass, as a node forwards its own (cut to the bounds)."""
    out = []
    for check in dicts(report.get("checks")):  # a file anyone may have written: any shape
        for f in dicts(check.get("findings")):
            if f.get("status") not in FORWARDED_STATUSES:
                continue
            text = {k: f.get(k) for k in ("code", "status", "subject", "message")}
            out.append({k: v[:MAX_TEXT] if isinstance(v, str) else v for k, v in text.items()})
            if len(out) == MAX_FORWARDED:
                return out
    return out


def measured_busbw(measurements: dict[str, Any]) -> dict[str, Any] | None:
    """The report's all-reduce busbw where it is bandwidth-bound (the best of the plateau, as GD601
    and `diff` judge it), as the nodes check's own figure: kind, ranks, GB/s."""
    from gpudoctor.knowledge.busbw import plateau

    sweep = measurements.get("allreduce")
    if not isinstance(sweep, dict) or not sweep.get("sizes"):
        return None
    best, _ = plateau(sweep["sizes"])
    kind = f"allreduce_busbw {sweep.get('device') or '?'}/{sweep.get('backend') or '?'}"
    ranks = sweep.get("ranks") if isinstance(sweep.get("ranks"), int) else 0
    return {"kind": kind, "ranks": ranks, "gbps": float(best["busbw_gbps"])}


def node_labels(nodes: list[FleetNode]) -> list[str]:
    """The name each node goes by: its hostname, or its file where hosts repeat or are unknown, or
    where the hostname is another node's file (the files are distinct: the labels never collide)."""
    hosts = Counter(n.facts.get("host") for n in nodes)
    paths = {n.path for n in nodes}
    return [
        host if isinstance(host, str) and hosts[host] == 1 and host not in paths else n.path
        for n, host in ((n, n.facts.get("host")) for n in nodes)
    ]


HINT_UNUSABLE = (
    "Save each node's file with this gpudoctor, as a regular file in the directory (`gpudoctor snapshot -o FILE`, "
    "`gpudoctor check --json > FILE`); its node is not compared until then."
)
HINT_PARTIAL = (
    "Save the node's file again with this gpudoctor (`gpudoctor snapshot -o FILE`, `gpudoctor check --json > FILE`); "
    "the rest of it is compared meanwhile."
)


def unusable(problems: Sequence[tuple[str, str]], partial: Sequence[tuple[str, str]] = ()) -> list[Finding]:
    """GD464, one line per file that could not be used, or was used but not all of it."""
    return [
        Finding(FACTS_MISSING.code, Status.WARN, f"node:{path}", f"{path}: {why}", hint, {"file": path})
        for items, hint in ((problems, HINT_UNUSABLE), (partial, HINT_PARTIAL))
        for path, why in items
    ]


def judge(
    nodes: list[FleetNode],
    problems: list[tuple[str, str]],
    known_codes: Collection[str],
    baseline: Side | None = None,
    tolerance: float = 0.10,
    repeated: Sequence[str] = (),
) -> list[CheckResult]:
    """The fleet's verdicts, as check results: the files, the facts, the measurements, the nodes'
    own findings and, with a baseline, the regressions."""
    given = len(nodes) + len(problems)
    problems = list(problems)
    partial: list[tuple[str, str]] = []  # files used, but not all of what they hold
    facts: dict[str, dict[str, Any]] = {}
    machine: dict[str, dict[str, Any]] = {}  # the facts of the nodes whose file records machine facts
    kept: dict[str, FleetNode] = {}
    for node, label in zip(nodes, node_labels(nodes), strict=True):
        try:
            facts[label], notes = clean_facts(node.facts, known_codes)
        except Malformed as exc:
            problems.append((node.path, f"its facts are not what gpudoctor writes: {exc}"))
            continue
        partial += [(node.path, note) for note in notes]
        kept[label] = node
        if node.side.facts is not None:
            machine[label] = facts[label]
        else:  # `diff`'s reason; its measurements and findings are still judged
            why = f"records no machine facts (written by gpudoctor {node.side.written_by or 'before 0.2'})"
            partial.append((node.path, f"{why}: its driver, GPUs and the rest are not compared"))
    if len(facts) < 2:
        raise UserError(fewer_than_two(given, problems, repeated), EXIT_USAGE, "input")
    reports = sum(n.side.kind == "report" for n in kept.values())
    machine_reports = sum(kept[label].side.kind == "report" for label in machine)
    files = [
        Finding(
            FACTS_MISSING.code,
            Status.PASS,
            "host",
            f"{len(kept)} nodes read: {len(kept) - reports} snapshot(s), {reports} report(s)"
            + (f"; {twice(repeated)}" if repeated else ""),
            "",
            {"nodes": len(kept), "reports": reports, "repeated": list(repeated[:20])},
        )
    ]
    results = [CheckResult("fleet_files", "Files read", unusable(problems, partial) + files, 0.0)]
    results.append(
        CheckResult("fleet_facts", f"Facts across {len(machine)} nodes", fact_findings(machine, machine_reports), 0.0)
    )
    results.append(CheckResult("fleet_measurements", "Measured all-reduce busbw", measured_findings(kept), 0.0))
    own = forwarded(facts, {k: k for k in facts}, "", "read {node}'s report for the details and hints")
    if own:
        results.append(CheckResult("fleet_findings", "The nodes' own findings", own, 0.0))
    if baseline is not None:
        results.append(
            CheckResult("fleet_baseline", f"Against {baseline.label}", regressions(kept, baseline, tolerance), 0.0)
        )
    return results


def twice(repeated: Sequence[str]) -> str:
    """The names of files already read, in words."""
    more = f" (+{len(repeated) - 3} more)" if len(repeated) > 3 else ""
    return f"{', '.join(repeated[:3])}{more} named more than once, read once"


def fewer_than_two(given: int, problems: list[tuple[str, str]], repeated: Sequence[str] = ()) -> str:
    """The usage error's one line: how many files, and why the first few could not be used."""
    if not problems:
        again = f" ({twice(repeated)})" if repeated else ""
        return f"fleet: {given} node file(s){again}: name two or more snapshots or reports, or their directory"
    said = "; ".join(f"{path}: {why}" for path, why in problems[:3])
    more = f" (+{len(problems) - 3} more)" if len(problems) > 3 else ""
    again = f"; {twice(repeated)}" if repeated else ""
    return f"fleet: fewer than two usable node files among {given}: {said}{more}{again}"


def fact_findings(facts: dict[str, dict[str, Any]], reports: int) -> list[Finding]:
    """GD460-GD463 over the fields every node recorded; a report records fewer than a snapshot."""
    from gpudoctor.knowledge.node_record import REPORTED

    if len(facts) < 2:
        why = f"{len(facts)} file(s) record them, fewer than two (reports by gpudoctor 0.1.0 do not)"
        return [Finding(NETWORK_DIFFERS.code, Status.SKIP, "host", f"machine facts not compared: {why}", "", {})]
    if not reports:
        return comparison_findings(facts)
    skipped = Finding(
        NETWORK_DIFFERS.code,
        Status.SKIP,
        "host",
        f"NCCL, torch and the NICs not compared: {reports} of the {len(facts)} files are reports, which do not "
        "record them (save snapshots, `gpudoctor snapshot -o FILE`, to compare them)",
        "",
        {"reports": reports},
    )
    return comparison_findings(facts, REPORTED) + [skipped]


def measured_findings(nodes: dict[str, FleetNode]) -> list[Finding]:
    """GD683: each node's busbw against the median of the nodes measured alike (device, backend, ranks)."""
    intra = {label: n.measured for label, n in nodes.items() if n.measured is not None}
    if len(intra) < 2:
        why = "fewer than two reports with an all-reduce sweep (snapshots measure nothing)"
        return [Finding(INTRA_SLOW.code, Status.SKIP, "host", f"busbw not compared: {why}", "", {})]
    out = intra_findings(intra, {k: k for k in intra})
    if not out:
        message = f"busbw of {len(intra)} node(s) within {SLOW_RATIO:g} of the median of the nodes measured alike"
        out.append(Finding(INTRA_SLOW.code, Status.PASS, "host", message, "", {"measured": len(intra)}))
    return out


def regressions(nodes: dict[str, FleetNode], baseline: Side, tolerance: float) -> list[Finding]:
    """Each node against the baseline with `diff`'s rules; each change or regression one finding,
    grouped across the nodes that have it. A node nothing could be compared on (every comparison
    skipped, as `diff` would exit 2 on it), and the machine facts of a baseline that records none,
    are skip lines with `diff`'s reason, never a pass."""
    from gpudoctor.compare.rules import compare

    found: dict[str, dict[str, Any]] = {}
    skipped: dict[tuple[str, str], list[str]] = {}  # (what was not compared, why) -> the nodes
    compared = []
    for label, node in nodes.items():
        results = compare(baseline, node.side, tolerance)
        if all(f.status is Status.SKIP for result in results for f in result.findings):
            why = "; ".join(result.findings[0].message for result in results if result.findings)
            skipped.setdefault(("{n} node(s)", why), []).append(label)
            continue
        compared.append(label)
        if baseline.facts is None:
            why = results[0].findings[0].message
            skipped.setdefault(("the machine facts of {n} node(s)", why), []).append(label)
        items = [
            {"code": f.code, "status": f.status.value, "subject": f.subject, "message": f.message}
            for result in results
            for f in result.findings
            if f.status.value in FORWARDED_STATUSES
        ]
        if items:
            found[label] = {"findings": items}
    base = baseline.label.replace("{", "{{").replace("}", "}}")  # the hint is a format string
    hint = f"compare that node alone: `gpudoctor diff {base} FILE` ({{node}}'s file)"
    out = forwarded(found, {k: k for k in found}, "", hint)
    same = [k for k in compared if k not in found]
    if same and not found:
        message = f"{len(same)} node(s) as in {baseline.label}, within {tolerance:.0%}"
        out.append(Finding(GPUS.code, Status.PASS, "host", message, "", {"nodes": len(same)}))
    elif same:
        message = f"{len(same)} node(s) as in {baseline.label}: {listed(same)}"
        out.append(Finding(GPUS.code, Status.PASS, "host", message, "", {"nodes": len(same)}))
    for (what, why), labels in skipped.items():
        message = f"{what.format(n=len(labels))} not compared with {baseline.label}: {why}"
        out.append(Finding(GPUS.code, Status.SKIP, "host", message, "", {"nodes": sorted(labels)}))
    return out
