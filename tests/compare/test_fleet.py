"""`gpudoctor fleet`: many nodes judged at once from saved files, by the nodes check's own judging
code. The agreement test feeds the same nodes' snapshots to the torchrun/srun path (each node's
facts built as a node sends them, judged by the `nodes` check at rank 0) and to the fleet command
(the snapshots saved as files): both must name the same odd nodes with the same words."""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path
from typing import Any

import pytest

from gpudoctor import snapshot as snap
from gpudoctor.api import fleet_report
from gpudoctor.checks import context
from gpudoctor.checks.active.common import Plan
from gpudoctor.checks.active.node_task import node_facts
from tests.checks.active.test_nodes import run_data
from tests.checks.active.test_nodes_input import run_check
from tests.helpers.cli import run_cli
from tests.paths import FIXTURES

pytestmark = pytest.mark.usefixtures("no_policy")

NETWORK = FIXTURES / "network"
V1_CPU = FIXTURES / "reports" / "v1-cpu-2ranks.json"
NODE_CODES = ("GD460", "GD461", "GD462", "GD463")


def node_docs() -> dict[str, dict[str, Any]]:
    """Five recorded HGX H100 nodes: two alike, one with a rail at a lower rate, one with another
    driver, one with a port down (a rail fewer)."""
    healthy = json.loads((NETWORK / "h100_ib_healthy.json").read_text())
    docs = {
        "hgx-a": healthy,
        "hgx-b": copy.deepcopy(healthy),
        "hgx-c": json.loads((NETWORK / "h100_ib_rate_low.json").read_text()),
        "hgx-d": copy.deepcopy(healthy),
        "hgx-e": copy.deepcopy(healthy),
    }
    docs["hgx-d"]["driver"]["driver_version"] = "535.129.03"
    for host, doc in docs.items():
        doc["host"]["hostname"] = host
    return docs


def verdicts(findings: list[Any]) -> list[tuple[str, str, str, str]]:
    rows = []
    for f in findings:
        code, status = (f.code, f.status.value) if hasattr(f, "code") else (f["code"], f["status"])
        subject, message = (f.subject, f.message) if hasattr(f, "code") else (f["subject"], f["message"])
        if code in NODE_CODES and status != "skip":
            rows.append((code, status, subject, message))
    return sorted(rows)


def test_the_torchrun_path_and_the_fleet_name_the_same_odd_nodes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    docs = node_docs()
    # The torchrun/srun path: each node's parent builds what it sends from its snapshot; rank 0 judges.
    sent = {
        host: node_facts(context(snap.from_jsonable(doc)), Plan("cuda", 8, list(range(8))))
        for host, doc in docs.items()
    }
    data = run_data(dict.fromkeys(docs, 370.0), 370.0, None)
    data["facts"] = sent
    data["node"] = "hgx-a"
    torchrun = verdicts(run_check(data, monkeypatch))
    # The fleet: the same snapshots as files in a directory.
    for host, doc in docs.items():
        (tmp_path / f"{host}.json").write_text(json.dumps(doc))
    fleet = verdicts(fleet_report([str(tmp_path)]).findings)
    assert fleet == torchrun
    named = {(code, subject) for code, _, subject, _ in fleet}
    assert {("GD460", "node:hgx-d"), ("GD463", "node:hgx-c")} <= named
    assert all("hgx-a" not in subject and "hgx-b" not in subject for _, _, subject, _ in fleet)


def save(path: Path, doc: Any) -> str:
    path.write_text(json.dumps(doc))
    return str(path)


def cpu_reports(tmp_path: Path, slow: dict[str, float]) -> list[str]:
    """Four copies of a recorded CPU report (gpudoctor 0.1.0), one per host, busbw scaled per host."""
    base = json.loads(V1_CPU.read_text())
    out = []
    for host in ("cpu-0", "cpu-1", "cpu-2", "cpu-3"):
        doc = copy.deepcopy(base)
        doc["hostname"] = host
        for check in doc["checks"]:
            if check["name"] == "allreduce":
                for row in check["details"]["sweep"]["rows"]:
                    row["busbw_gbps"] *= slow.get(host, 1.0)
        out.append(save(tmp_path / f"{host}.json", doc))
    return out


def test_the_node_with_low_busbw_and_the_regressions_against_a_baseline_are_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    files = cpu_reports(tmp_path, {"cpu-2": 0.5})
    r = run_cli(capsys, "fleet", *files, "--baseline", str(V1_CPU), "--json")
    assert r.exit_code == 1
    low = r.one("GD683")
    assert low["status"] == "warn" and low["subject"] == "node:cpu-2" and "0.50 of the other nodes'" in low["message"]
    [busbw] = [f for f in r.findings("GD014") if f["status"] != "pass"]
    assert busbw["status"] == "fail" and busbw["message"].startswith("on node cpu-2: busbw fell more than 10%")
    assert busbw["evidence"]["nodes"] == ["cpu-2"]
    # The same files without the slow one: every node as in the baseline, none low; the reports'
    # own failure (the recorded VM has no NVIDIA driver) is one finding for the three nodes.
    r = run_cli(capsys, "fleet", *[f for f in files if "cpu-2" not in f], "--baseline", str(V1_CPU), "--json")
    assert r.one("GD683")["status"] == "pass" and {f["status"] for f in r.findings("GD014")} == set()
    [same] = [f for f in r.findings("GD011") if f["status"] == "pass"]
    assert same["message"].startswith("3 node(s) as in")
    # The recorded baseline holds no machine facts: said, with diff's reason, for the nodes compared.
    [facts] = [f for f in r.findings("GD011") if f["status"] == "skip"]
    assert facts["message"].startswith(f"the machine facts of 3 node(s) not compared with {V1_CPU}: {V1_CPU} records")
    assert r.one("GD101")["message"].startswith("on 3 nodes (cpu-0, cpu-1, cpu-3): no NVIDIA driver")


def test_reports_and_snapshots_are_compared_on_what_both_record(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    docs = node_docs()
    snapshot = save(tmp_path / "hgx-a.json", docs["hgx-a"])
    reports = []
    for host in ("hgx-b", "hgx-d"):
        path = save(tmp_path / f"{host}-snap.json", docs[host])
        r = run_cli(capsys, "check", "--snapshot", path, "--quick", "--json")
        reports.append(save(tmp_path / f"{host}-report.json", json.loads(r.out)))
        os.unlink(path)
    r = run_cli(capsys, "fleet", snapshot, *reports, "--json")
    # The driver differs on hgx-d; NCCL, torch and the NICs are not in a report: not compared, said.
    assert verdicts(r.findings()) == [
        ("GD460", "warn", "node:hgx-d", "node hgx-d has driver 535.129.03, the other 2 node(s) 550.54.15")
    ]
    assert any(f["status"] == "skip" and "2 of the 3 files are reports" in f["message"] for f in r.findings("GD463"))


def test_unusable_files_are_one_line_each_and_never_hang(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    docs = node_docs()
    for host in ("hgx-a", "hgx-b", "hgx-d"):
        save(tmp_path / f"{host}.json", docs[host])
    (tmp_path / "garbage.json").write_text("{not json")
    save(tmp_path / "bench.json", {"schema_version": 1, "command": "bench", "exit_code": 0})
    save(tmp_path / "future.json", {"schema_version": 99, "command": "check", "checks": []})
    save(tmp_path / "wrong.json", {**docs["hgx-a"], "gpus": 5})
    os.mkfifo(tmp_path / "pipe.json")  # a reader that opened it blocking would wait forever
    secret = tmp_path.parent / "private.json"
    save(secret, docs["hgx-a"])
    os.symlink(secret, tmp_path / "planted.json")  # someone else's link to a file only we can read
    (tmp_path / "notes.txt").write_text("not a node")
    r = run_cli(capsys, "fleet", str(tmp_path), "--json")
    assert r.exit_code == 0  # warnings only: --fail-on fail
    bad = {f["evidence"]["file"].rsplit("/", 1)[1]: f["message"] for f in r.findings("GD464") if f["status"] == "warn"}
    assert sorted(bad) == ["bench.json", "future.json", "garbage.json", "pipe.json", "planted.json", "wrong.json"]
    assert "not valid JSON" in bad["garbage.json"] and "is a FIFO" in bad["pipe.json"]
    assert "symbolic link" in bad["planted.json"] and "newer than this gpudoctor reads" in bad["future.json"]
    assert all("\n" not in m and "Traceback" not in m for m in bad.values())
    assert ("GD460", "warn", "node:hgx-d") in {(c, s, n) for c, s, n, _ in verdicts(r.findings())}
    assert run_cli(capsys, "fleet", str(tmp_path), "--fail-on", "warn", "--json").exit_code == 1


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a link to another user needs root")
def test_a_named_file_reached_through_another_users_link_is_not_followed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`gpudoctor fleet /shared/*.json`: the shell names each file, so the folder rule (links refused) does
    not apply; a link another user planted there still must not be followed, ours may."""
    docs = node_docs()
    shared = tmp_path / "shared"
    shared.mkdir()
    for host in ("hgx-a", "hgx-b", "hgx-d"):
        save(shared / f"{host}.json", docs[host])
    private, mine = tmp_path / "private.json", tmp_path / "mine.json"
    save(private, docs["hgx-a"])
    save(mine, docs["hgx-b"])
    os.symlink(private, shared / "planted.json")
    os.lchown(shared / "planted.json", 65534, 65534)  # the link is nobody's, pointing at our file
    os.symlink(mine, shared / "ours.json")
    named = sorted(str(p) for p in shared.glob("*.json"))  # as the shell expands shared/*.json
    r = run_cli(capsys, "fleet", *named, "--json")
    bad = {f["evidence"]["file"].rsplit("/", 1)[1]: f["message"] for f in r.findings("GD464") if f["status"] == "warn"}
    assert list(bad) == ["planted.json"], bad
    assert "owned by" in bad["planted.json"] and "not followed" in bad["planted.json"]
    assert "\n" not in bad["planted.json"]
    os.symlink(shared, tmp_path / "nodes")
    os.lchown(tmp_path / "nodes", 65534, 65534)  # `fleet /shared/nodes`: a folder reached through their link
    for form in ("nodes", "nodes/"):
        r = run_cli(capsys, "fleet", str(tmp_path / form), str(shared / "hgx-a.json"), str(shared / "hgx-b.json"))
        assert "reached through the link" in r.out + r.err and "Facts across 5 nodes" not in r.out, r.out


def test_many_unusable_files_give_their_shared_hint_once(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Hostile review L5: 9,998 unreadable files printed the same two-line hint 9,998 times (3 MB)."""
    docs = node_docs()
    for host in ("hgx-a", "hgx-b"):
        save(tmp_path / f"{host}.json", docs[host])
    for i in range(40):
        (tmp_path / f"junk{i:02d}.json").write_text("{not json")
    r = run_cli(capsys, "fleet", str(tmp_path), str(tmp_path / "hgx-a.json"))
    assert r.out.count("GD464") == 40 and r.out.count("hint:") == 1, r.out
    assert r.out.splitlines()[0].endswith(f"42 file(s): {tmp_path}, {tmp_path / 'hgx-a.json'}")


def test_fewer_than_two_usable_files_is_a_usage_error_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    one = save(tmp_path / "one.json", node_docs()["hgx-a"])
    (tmp_path / "bad.json").write_text("[]")
    r = run_cli(capsys, "fleet", one, str(tmp_path / "bad.json"), str(tmp_path / "missing.json"))
    assert r.exit_code == 2
    [line] = r.err.strip().splitlines()
    assert "fewer than two usable node files among 3" in line and "missing.json: no such file" in line


def test_junit_never_overwrites_a_node_file_named_or_in_a_named_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    docs = node_docs()
    a, b = (save(tmp_path / f"{host}.json", docs[host]) for host in ("hgx-a", "hgx-b"))
    before = Path(b).read_text()
    r = run_cli(capsys, "fleet", a, b, "--junit", b)
    assert r.exit_code == 2 and f"--junit {b} is the node file {b}: writing it would replace that input" in r.err
    r = run_cli(capsys, "fleet", str(tmp_path), "--junit", b)
    assert r.exit_code == 2 and "would replace that input" in r.err
    assert Path(b).read_text() == before


def test_a_baseline_nothing_could_be_compared_with_is_a_skip_with_diffs_reason_never_a_pass(
    capsys: pytest.CaptureFixture[str],
) -> None:
    nodes = [str(FIXTURES / "h100_sxm_8x.json"), str(FIXTURES / "a100_sxm_8x.json")]
    r = run_cli(capsys, "fleet", *nodes, "--baseline", str(V1_CPU), "--json")
    [line] = r.findings("GD011")
    assert line["status"] == "skip" and line["evidence"]["nodes"] == ["hgx-h100-07", "ip-172-31-8-41"]
    assert line["message"].startswith(f"2 node(s) not compared with {V1_CPU}: {V1_CPU} records no machine facts")
    assert {f["status"] for f in r.findings() if f["code"].startswith("GD01")} == {"skip"}


def test_a_report_without_machine_facts_is_one_gd464_line_and_left_out_of_the_facts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    docs = node_docs()
    snapshots = [save(tmp_path / f"{host}.json", docs[host]) for host in ("hgx-a", "hgx-b")]
    old = str(FIXTURES / "reports" / "v1-h100-static.json")
    r = run_cli(capsys, "fleet", *snapshots, old, "--json")
    # Not "driver unknown, GPU models none" against the snapshots: the two snapshots alike.
    assert [(c, s) for c, s, _, m in verdicts(r.findings())] == [("GD460", "pass")]
    [line] = [f for f in r.findings("GD464") if f["status"] == "warn"]
    assert line["evidence"]["file"] == old
    assert "records no machine facts (written by gpudoctor 0.1.0)" in line["message"]
    assert "not compared until then" not in line["hint"]


def test_labels_never_collide_and_a_file_named_twice_is_one_node(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    docs = node_docs()
    docs["hgx-b"]["host"]["hostname"] = "hgx-a"  # two nodes named alike: each goes by its file
    docs["hgx-d"]["host"]["hostname"] = "hgx-a.json"  # a hostname that is the other's file
    files = [save(Path(f"{host}.json"), docs[host]) for host in ("hgx-a", "hgx-b", "hgx-d", "hgx-e")]
    r = run_cli(capsys, "fleet", *files, "--json")
    assert r.one("GD464")["message"].startswith("4 nodes read")
    [driver] = [f for f in r.findings("GD460") if f["status"] == "warn"]
    assert driver["subject"] == "node:hgx-d.json"  # its file: its hostname is another node's file
    # The same file twice, however named, is one node, said on the Files-read line.
    for named in (["hgx-a.json", "./hgx-a.json", "hgx-e.json"], [str(tmp_path), f"{tmp_path}/"]):
        r = run_cli(capsys, "fleet", *named, "--json")
        line = r.one("GD464")["message"]
        assert line.startswith(f"{2 if len(named) == 3 else 4} nodes read") and "named more than once" in line
    r = run_cli(capsys, "fleet", "hgx-a.json", "hgx-a.json")
    assert r.exit_code == 2
    [line] = r.err.strip().splitlines()
    assert "1 node file(s)" in line and "hgx-a.json named more than once" in line


def test_a_dash_is_refused_as_diff_refuses_it_stdin_is_not_read(capsys: pytest.CaptureFixture[str]) -> None:
    r = run_cli(capsys, "fleet", "-", str(FIXTURES / "h100_sxm_8x.json"), str(FIXTURES / "a100_sxm_8x.json"))
    assert r.exit_code == 2
    [line] = r.err.strip().splitlines()
    assert "fleet -:" in line and "only `check --snapshot -` reads stdin" in line
