"""Outputs read back by readers we did not write: Prometheus' parser, junitparser, and GitHub's rules."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import junitparser
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpudoctor.findings import CheckResult, Finding, Report, Status
from gpudoctor.render import github
from gpudoctor.render.junit import junit_tree
from gpudoctor.render.prometheus import report_metrics
from gpudoctor.safety.safe_text import CONTROL
from tests.helpers.cli import run_cli
from tests.helpers.processes import clean_env, run_gpudoctor
from tests.helpers.snapshots import load
from tests.paths import FIXTURES, H100, MIXED

V1_CPU = FIXTURES / "reports" / "v1-cpu-2ranks.json"


pytestmark = pytest.mark.usefixtures("no_policy")


def samples(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        assert family.type == "gauge" and family.documentation
        for s in family.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


# --- Prometheus ------------------------------------------------------------------------------


def test_the_prometheus_file_parses_and_carries_checks_and_gpu_facts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    prom = tmp_path / "gpudoctor.prom"
    r = run_cli(capsys, "check", "--snapshot", MIXED, "--prometheus", str(prom))
    assert r.exit_code == 1
    m = samples(prom.read_text())
    assert m["gpudoctor_ready"] == [({}, 0.0)] and m["gpudoctor_exit_code"] == [({}, 1.0)]
    identity = {labels["status"]: v for labels, v in m["gpudoctor_check_status"] if labels["check"] == "identity"}
    assert identity == {"pass": 0, "skip": 0, "warn": 0, "fail": 1, "error": 0}
    assert ({"code": "GD301", "status": "fail"}, 1.0) in m["gpudoctor_problem_findings"]
    gpus = {labels["gpu"]: labels for labels, _ in m["gpudoctor_gpu_info"]}
    assert gpus["1"]["name"] == "NVIDIA GeForce RTX 4080" and gpus["1"]["uuid"].startswith("GPU-")
    width = {labels["gpu"]: v for labels, v in m["gpudoctor_gpu_pcie_link_width_max"]}
    assert width == {"0": 16.0, "1": 16.0, "2": 16.0}
    memory = {labels["gpu"]: v for labels, v in m["gpudoctor_gpu_memory_total_bytes"]}
    recorded = load("rtx4090_2x_rtx4080_1x").gpu(1).memory_total_mib
    assert isinstance(recorded, int) and memory["1"] == recorded * 2**20
    assert [p.name for p in tmp_path.iterdir()] == ["gpudoctor.prom"]  # no temporary left behind


def test_prometheus_measurements_are_in_base_units(tmp_path: Path) -> None:
    from gpudoctor.compare.sides import load_side

    side = load_side(V1_CPU)
    report = Report("check", "live", "now", "0.2", "h", [], facts=None, measurements=side.measurements)
    m = samples(report_metrics(report, now=1700000000.0))
    busbw = {labels["size_bytes"]: v for labels, v in m["gpudoctor_allreduce_busbw_bytes_per_second"]}
    assert busbw["4194304"] == pytest.approx(1.277545e9)
    assert m["gpudoctor_ddp_step_seconds"] == [({}, pytest.approx(0.0022))]
    assert m["gpudoctor_last_run_timestamp_seconds"] == [({}, 1700000000.0)]


def test_label_values_are_escaped_for_the_parser() -> None:
    odd = 'NVIDIA "Quoted" \\ name\nwith a newline'
    facts = {
        "driver_version": "1",
        "cuda_driver_version": "2",
        "gpus": [{"index": 0, "uuid": "GPU-x", "name": odd, "pci_bus_id": "b"}],
    }
    report = Report("check", "live", "now", "0.2", "h", [], facts=facts)
    (info,) = samples(report_metrics(report))["gpudoctor_gpu_info"]
    assert info[0]["name"] == odd


def test_an_unwritable_prometheus_target_is_refused_before_the_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    victim = tmp_path / "victim"
    victim.write_text("keep")
    (tmp_path / "m.prom").symlink_to(victim)
    r = run_cli(capsys, "check", "--snapshot", H100, "--prometheus", str(tmp_path / "m.prom"))
    assert r.exit_code == 3 and r.out == "" and "symbolic link" in r.err and victim.read_text() == "keep"
    r = run_cli(capsys, "check", "--snapshot", H100, "--prometheus", str(tmp_path / "no" / "m.prom"))
    assert r.exit_code == 3 and "no directory" in r.err


# --- JUnit -----------------------------------------------------------------------------------


def test_junit_names_are_unique_and_a_real_reader_agrees_with_the_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "junit.xml"
    doc = run_cli(capsys, "check", "--snapshot", MIXED, "--json", "--junit", str(out)).doc
    xml = junitparser.JUnitXml.fromfile(str(out))
    failures = errors = skipped = cases = 0
    for suite in xml:
        names = [case.name for case in suite]
        assert len(names) == len(set(names)), names
        for case in suite:
            cases += 1
            kinds = {type(r).__name__ for r in case.result}
            failures += "Failure" in kinds
            errors += "Error" in kinds
            skipped += "Skipped" in kinds
    summary = doc["summary"]
    assert cases == sum(summary.values())
    assert (failures, errors, skipped) == (summary["fail"], summary["error"], summary["skip"])  # --fail-on fail


def test_junit_repeated_subjects_get_a_counter_in_report_order() -> None:
    findings = [Finding("GD305", Status.WARN, "host", f"m{i}") for i in range(3)]
    report = Report("check", "live", "now", "0", "h", [CheckResult("identity", "t", findings, 0.0)])
    names = [c.get("name") for c in junit_tree(report).getroot().iter("testcase")]
    assert names == ["GD305 host", "GD305 host #2", "GD305 host #3"]


def test_junit_warn_is_a_failure_only_under_fail_on_warn(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for fail_on, expect in (("fail", 0), ("warn", 4)):
        out = tmp_path / f"{fail_on}.xml"
        run_cli(
            capsys, "check", "--snapshot", MIXED, "--ignore", "GD301,GD302", "--fail-on", fail_on, "--junit", str(out)
        )
        xml = junitparser.JUnitXml.fromfile(str(out))
        warn_failures = [
            r for suite in xml for case in suite for r in case.result if isinstance(r, junitparser.Failure)
        ]
        assert len(warn_failures) == expect and all(r.type == "warn" for r in warn_failures)


# --- GitHub Actions --------------------------------------------------------------------------


def unescape_data(text: str) -> str:
    """What the runner does to a command's message (actions/runner ActionCommand.UnescapeData)."""
    return text.replace("%0D", "\r").replace("%0A", "\n").replace("%25", "%")


def unescape_property(text: str) -> str:
    return text.replace("%0D", "\r").replace("%0A", "\n").replace("%3A", ":").replace("%2C", ",").replace("%25", "%")


COMMAND = re.compile(r"^::(error|warning) title=([^:]*)::(.*)$")


def test_github_summary_and_annotations_with_the_runner_variables(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    summary = tmp_path / "step_summary.md"
    summary.write_text("earlier step\n")
    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    r = run_cli(capsys, "check", "--snapshot", MIXED, "--json")
    assert r.exit_code == 1 and r.doc["exit_code"] == 1  # stdout is still one JSON document
    commands = [COMMAND.match(line) for line in r.err.splitlines()]
    assert all(commands), r.err
    kinds = [c.group(1) for c in commands if c]
    assert kinds.count("error") == 2 and kinds.count("warning") == 4
    first = commands[0]
    assert first is not None and unescape_property(first.group(2)).startswith("gpudoctor GD301 gpu:1 (")
    assert unescape_data(first.group(3)).splitlines()[1].startswith("hint: Train on identical GPUs")
    text = summary.read_text()
    assert text.startswith("earlier step\n## ❌ gpudoctor check: NOT READY")  # appended, not replaced
    assert "| ❌ | GPU models and settings alike | 2 fail |" in text
    assert "`GD301`" in text and "RTX 4080" in text


def test_text_no_utf_8_file_can_hold_is_written_as_a_question_mark_in_every_output(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The review: a GPU name with a lone surrogate (JSON "\\ud800", which json reads) or a snapshot file
    name that is not UTF-8 ended `check` as an internal error (UnicodeEncodeError, exit 3) once the step
    summary or the Prometheus file was written, after the work. Each is written, the text shown as "?"."""
    doc = json.loads(Path(MIXED).read_text())
    doc["gpus"][1]["name"] = "RTX\ud800 4080"
    snapshot = tmp_path / os.fsdecode(b"node-\xff.json")  # a file name that is not UTF-8
    snapshot.write_text(json.dumps(doc))
    summary, prom, junit = tmp_path / "summary.md", tmp_path / "gpu.prom", tmp_path / "junit.xml"
    summary.write_text("")
    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    r = run_cli(capsys, "check", "--snapshot", str(snapshot), "--prometheus", str(prom), "--junit", str(junit))
    assert r.exit_code == 1 and "internal error" not in r.err, r.err  # GD301: the odd card, named
    assert "RTX? 4080" in summary.read_text() and "`GD301`" in summary.read_text()
    assert {"gpu": "1", "name": "RTX? 4080"}.items() <= samples(prom.read_text())["gpudoctor_gpu_info"][1][0].items()
    assert junitparser.JUnitXml.fromfile(str(junit)).failures == 2


def test_no_github_turns_it_off_inside_a_runner(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    summary = tmp_path / "s.md"
    summary.write_text("")
    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    r = run_cli(capsys, "check", "--snapshot", MIXED, "--no-github")
    assert "::error" not in r.err and summary.read_text() == ""


@pytest.mark.parametrize("kind", ["symlink", "missing"])
def test_the_step_summary_is_never_created_nor_written_through_a_link(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    victim = tmp_path / "victim"
    victim.write_text("keep")
    path = tmp_path / "summary.md"
    if kind == "symlink":
        path.symlink_to(victim)
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(path))
    r = run_cli(capsys, "check", "--snapshot", H100, "--github", "--json")
    assert r.exit_code == 3
    assert r.doc["exit_code"] == 0  # the report is still printed whole
    assert r.err.strip().endswith("symbolic link" if kind == "symlink" else "No such file or directory")
    assert victim.read_text() == "keep" and (kind == "symlink" or not path.exists())


def test_annotation_data_and_titles_are_escaped_the_way_the_runner_unescapes() -> None:
    message = "100% of links down\r\nnext line ::set-env name=X::1"
    subject = "node:a,b:c"
    report = Report(
        "check",
        "live",
        "now",
        "0",
        "h",
        [CheckResult("c", "T, with: colons", [Finding("GD401", Status.FAIL, subject, message)], 0.0)],
    )
    (line,) = github.annotations(report)
    assert "\n" not in line and "\r" not in line
    match = COMMAND.match(line)
    assert match is not None
    assert unescape_property(match.group(2)) == f"gpudoctor GD401 {subject} (T, with: colons)"
    assert unescape_data(match.group(3)) == message


def test_annotations_stop_at_githubs_ten_per_kind_and_say_how_many_more() -> None:
    findings = [Finding("GD401", Status.FAIL, f"gpu:{i}", f"link {i} down") for i in range(12)]
    findings.append(Finding("GD105", Status.WARN, "host", "persistence off"))
    report = Report("check", "live", "now", "0", "h", [CheckResult("topology", "Topology", findings, 0.0)])
    lines = github.annotations(report)
    errors = [line for line in lines if line.startswith("::error")]
    assert len(errors) == 10 and "3 more error finding(s)" in unescape_property(errors[-1])
    assert sum(line.startswith("::warning") for line in lines) == 1


def test_summary_cells_cannot_break_the_table_or_inject_html() -> None:
    f = Finding("GD401", Status.FAIL, "host", "a | b <script>alert(1)</script>\nnext", "use `x`")
    report = Report("check", "live", "now", "0", "h", [CheckResult("c", "C", [f], 0.0)])
    row = next(line for line in github.summary_markdown(report).splitlines() if "`GD401`" in line)
    assert row.count(" | ") == 4 and "<script>" not in row and "&lt;script&gt;" in row and "\\|" in row


def test_the_summary_fits_githubs_one_mib() -> None:
    findings = [Finding("GD401", Status.FAIL, f"gpu:{i}", "x" * 2000) for i in range(1000)]
    report = Report("check", "live", "now", "0", "h", [CheckResult("c", "C", findings, 0.0)])
    text = github.summary_markdown(report)
    assert len(text.encode()) <= github.SUMMARY_LIMIT and "1 MiB summary limit" in text


def test_json_document_of_a_failed_side_output_still_validates(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(tmp_path / "absent"))
    r = run_cli(capsys, "check", "--snapshot", H100, "--json", "--github")
    assert json.loads(r.out)["summary"]["pass"] > 0 and r.doc  # .doc validates against the schema
    assert os.path.exists(tmp_path / "absent") is False


# --- output paths: one file each, never an input, never "-" ----------------------------------


@pytest.mark.parametrize("option", ["--junit", "--prometheus"])
def test_dash_is_refused_rather_than_written_as_a_file_named_dash(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], option: str
) -> None:
    r = run_cli(capsys, "check", "--snapshot", H100, "--no-config", option, "-")
    assert r.exit_code == 2 and r.out == "" and r.err.count("\n") == 1
    assert f"{option} -: gpudoctor writes this to a file, not to standard output" in r.err
    assert not (tmp_path / "-").exists()


@pytest.mark.parametrize("second", ["same.out", "./same.out", "{tmp}/same.out", "hard.out"])
def test_two_outputs_naming_the_same_file_are_refused_before_the_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], second: str
) -> None:
    (tmp_path / "same.out").write_text("keep")
    os.link(tmp_path / "same.out", tmp_path / "hard.out")  # the same inode under another name
    other = second.format(tmp=tmp_path)
    r = run_cli(capsys, "check", "--snapshot", H100, "--no-config", "--junit", "same.out", "--prometheus", other)
    assert r.exit_code == 2 and r.out == ""
    assert f"--junit and --prometheus name the same file ({other}): each output needs a file of its own" in r.err
    assert (tmp_path / "same.out").read_text() == "keep"


def test_an_output_never_overwrites_an_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = tmp_path / "base.json"
    base.write_text(run_cli(capsys, "check", "--snapshot", H100, "--json", "--no-config").out)
    kept = base.read_text()
    r = run_cli(capsys, "check", "--snapshot", H100, "--no-config", "--baseline", str(base), "--junit", str(base))
    assert r.exit_code == 2 and f"--junit {base} is the --baseline file" in r.err and base.read_text() == kept
    d = run_cli(capsys, "diff", H100, str(base), "--no-config", "--junit", "base.json")
    assert d.exit_code == 2 and "is report B" in d.err and base.read_text() == kept
    assert run_cli(capsys, "diff", str(base), str(base), "--no-config").exit_code == 0  # inputs may coincide


def test_a_directory_that_takes_no_new_files_is_said_in_words_before_the_run(
    capsys: pytest.CaptureFixture[str],
) -> None:
    r = run_cli(capsys, "check", "--snapshot", H100, "--no-config", "--prometheus", "/proc/version")
    assert r.exit_code == 3 and r.out == "" and r.err.count("\n") == 1
    assert "the directory /proc does not take new files" in r.err and "No such file or directory" not in r.err
    assert run_cli(capsys, "check", "--snapshot", H100, "--no-config", "--junit", "/dev/null").exit_code == 0


def test_the_prometheus_policy_label_is_empty_when_every_policy_file_was_skipped() -> None:
    report = Report("check", "x", "", "0.1.0", "h", [], policy={"path": None, "set": {}, "skipped": []})
    (info,) = samples(report_metrics(report))["gpudoctor_info"]
    assert info[0]["policy"] == ""


def test_the_github_summary_names_a_policy_file_that_was_ignored() -> None:
    skipped = [{"path": "/tmp/gpudoctor.toml", "reason": "every user can write it (mode 0666; chmod o-w)"}]
    report = Report("check", "live", "", "0.1.0", "h", [], policy={"path": None, "set": {}, "skipped": skipped})
    text = github.summary_markdown(report)
    assert "policy file /tmp/gpudoctor.toml ignored: every user can write it" in text
    assert ", policy None" not in text


# --- issue 24: the step summary under the safe-output rules; escape sequences never reach GitHub ---


def _check_with_summary(path: Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = clean_env(GITHUB_ACTIONS="true", GITHUB_STEP_SUMMARY=str(path))
    return run_gpudoctor("check", "--snapshot", H100, "--json", env=env, timeout=timeout)


def test_a_fifo_planted_at_the_step_summary_neither_blocks_the_check_nor_receives_it(tmp_path: Path) -> None:
    fifo = tmp_path / "summary.md"
    os.mkfifo(fifo)
    r = _check_with_summary(fifo)  # (used to wait forever in open() for a reader)
    assert r.returncode == 3 and json.loads(r.stdout)["exit_code"] == 0
    assert r.stderr.strip().endswith("is a FIFO, not a regular file (gpudoctor appends to regular files only)")
    # with someone reading it, still nothing is streamed to them
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    try:
        r = _check_with_summary(fifo)
        assert r.returncode == 3 and "is a FIFO" in r.stderr
        assert os.read(reader, 100) == b""  # (its writer came and went without a byte)
    finally:
        os.close(reader)


def test_the_step_summary_is_not_appended_through_a_hard_link(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("keep")
    os.link(victim, tmp_path / "summary.md")
    r = _check_with_summary(tmp_path / "summary.md")
    assert r.returncode == 3 and "has other hard links" in r.stderr and victim.read_text() == "keep"


ESCAPES = "\x1b]0;owned\x07\x1b[31mred\x1b[0m \u202egnp.exe\u202c \x9b2J"


def test_escape_sequences_from_other_peoples_text_never_reach_annotations_or_the_summary() -> None:
    f = Finding("GD311", Status.FAIL, f"gpu:0 {ESCAPES}", f"pid 7 python {ESCAPES} holds the GPU", f"kill {ESCAPES}")
    report = Report("check", f"snap {ESCAPES}", "now", "0", f"host{ESCAPES}", [CheckResult("c", "C", [f], 0.0)])
    produced = "\n".join([*github.annotations(report), github.summary_markdown(report)])
    assert not CONTROL.search(produced), repr(produced)
    assert "?]0;owned?" in produced and "?[31mred" in produced  # shown, defused


def test_prometheus_temporary_files_left_by_a_killed_run_are_swept(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    """Issue 24: a SIGKILL between writing the temporary file and renaming it left `.NAME.XXXXXXXX.tmp`
    in node_exporter's directory, one more per cron run. Only our own stale ones of that exact shape go."""
    target = tmp_path / "gpudoctor.prom"
    stale = tmp_path / ".gpudoctor.prom.k1ll3d_x.tmp"
    young = tmp_path / ".gpudoctor.prom.wr1t1ng_.tmp"  # a run writing right now
    other = tmp_path / ".gpudoctor.prom.notours.tmp"  # not mkstemp's shape
    mine = tmp_path / ".other.prom.k1ll3d_x.tmp"  # another target's
    for p in (stale, young, other, mine):
        p.write_text("gpudoctor_half_written 1\n")
    link = tmp_path / ".gpudoctor.prom.l1nk3d__.tmp"
    link.symlink_to(other)
    hour_ago = os.path.getmtime(stale) - 3600
    for p in (stale, other, mine):
        os.utime(p, (hour_ago, hour_ago))
    os.utime(link, (hour_ago, hour_ago), follow_symlinks=False)
    assert run_cli(capsys, "check", "--snapshot", H100, "--prometheus", str(target)).exit_code == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in (target, young, other, mine, link))
    assert "gpudoctor_last_run_timestamp_seconds " in target.read_text()  # the metrics, whole
