"""The check framework: a crashing check becomes an error finding, gating, selection, JUnit."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest

from gpudoctor.catalogue import catalogue
from gpudoctor.engine import Check, CheckContext, Code, Selection, SelectionError
from gpudoctor.engine.runner import run_one
from gpudoctor.findings import CheckResult, Finding, Report, Status
from gpudoctor.render.junit import junit_tree
from gpudoctor.snapshot import Snapshot

EMPTY = Snapshot(schema_version=1, created="2026-01-01T00:00:00+00:00", gpus=[])
CODE = Code("GD099", "test-code", "t", what="w", why="y", fix="f")


def make_check(func) -> Check:  # type: ignore[no-untyped-def]
    return Check("probe-test", "A test check", (CODE,), func)


def test_a_crashing_check_becomes_an_error_finding_naming_the_exception() -> None:
    def boom(ctx: CheckContext) -> list[Finding]:
        raise ZeroDivisionError("division by zero")

    result = run_one(make_check(boom), CheckContext(EMPTY), Selection())
    (finding,) = result.findings
    assert finding.code == "GD001"
    assert finding.status is Status.ERROR
    assert finding.subject == "check:probe-test"
    assert "ZeroDivisionError" in finding.message
    assert finding.evidence["where"].startswith("test_registry.py:")


def test_an_error_finding_gates_like_a_failure() -> None:
    error = Finding("GD001", Status.ERROR, "check:x", "crashed")
    report = Report("check", "live", "now", "0", "h", [CheckResult("x", "X", [error], 0.0)])
    assert report.exit_code == 1


@pytest.mark.parametrize(
    ("statuses", "fail_on", "expected"),
    [
        ([Status.PASS, Status.SKIP], Status.FAIL, 0),
        ([Status.PASS, Status.WARN], Status.FAIL, 0),
        ([Status.PASS, Status.WARN], Status.WARN, 1),
        ([Status.FAIL], Status.FAIL, 1),
        ([Status.SKIP], Status.WARN, 0),
    ],
)
def test_exit_code_follows_fail_on(statuses: list[Status], fail_on: Status, expected: int) -> None:
    findings = [Finding("GD099", s, "host", s.value) for s in statuses]
    report = Report("check", "live", "now", "0", "h", [CheckResult("x", "X", findings, 0.0)], fail_on=fail_on)
    assert report.exit_code == expected


def test_check_status_is_its_worst_finding_and_all_skips_is_skip() -> None:
    mixed = CheckResult(
        "x", "X", [Finding("GD099", Status.PASS, "host", "a"), Finding("GD099", Status.WARN, "host", "b")], 0
    )
    assert mixed.status is Status.WARN
    skipped = CheckResult("x", "X", [Finding("GD099", Status.SKIP, "host", "a")], 0)
    assert skipped.status is Status.SKIP


def test_selection_by_code_prefix_and_unknown_tokens() -> None:
    reg = catalogue()  # check names are known through the registry a selection is bound to
    assert Selection(select=("GD1",), registry=reg).wants("GD101")
    assert not Selection(select=("GD4",), registry=reg).wants("GD101")
    assert not Selection(ignore=("GD101",), registry=reg).wants("GD101")
    assert Selection(select=("nvml",), registry=reg).wants("GD101")
    # A crash is always shown, whatever was selected.
    assert Selection(select=("GD4",), registry=reg).wants("GD001")
    with pytest.raises(SelectionError, match="unknown check or code 'GD77x'"):
        Selection(select=("GD77x",), registry=reg).validate()
    with pytest.raises(SelectionError):
        Selection(ignore=("no-such-check",), registry=reg).validate()


def test_findings_of_unselected_codes_are_dropped() -> None:
    other = Code("GD098", "other", "t", what="w", why="y", fix="f")

    def two(ctx: CheckContext) -> list[Finding]:
        return [Finding("GD099", Status.WARN, "host", "kept"), Finding("GD098", Status.FAIL, "host", "dropped")]

    chk = Check("two", "Two", (CODE, other), two)
    result = run_one(chk, CheckContext(EMPTY), Selection(ignore=("GD098",)))
    assert [f.message for f in result.findings] == ["kept"]


def test_junit_marks_failures_errors_and_skips() -> None:
    findings = [
        Finding("GD099", Status.PASS, "gpu:0", "fine"),
        Finding("GD099", Status.WARN, "gpu:1", "meh", "fix it"),
        Finding("GD099", Status.FAIL, "gpu:2", "broken", "replace it"),
        Finding("GD001", Status.ERROR, "check:x", "crashed"),
        Finding("GD099", Status.SKIP, "host", "n/a"),
    ]
    report = Report("check", "live", "now", "0", "h", [CheckResult("x", "X", findings, 0.5)])
    suite = junit_tree(report).getroot().find("testsuite")
    assert suite is not None
    assert (suite.get("tests"), suite.get("failures"), suite.get("errors"), suite.get("skipped")) == (
        "5",
        "1",
        "1",
        "1",
    )
    failure = suite.find("testcase[@name='GD099 gpu:2']/failure")
    assert failure is not None and "replace it" in (failure.text or "")
    # Under --fail-on warn the warning becomes a failure too.
    report.fail_on = Status.WARN
    suite = junit_tree(report).getroot().find("testsuite")
    assert suite is not None and suite.get("failures") == "2"
    ET.tostring(junit_tree(report).getroot())  # serialises


def test_a_check_that_needs_gpus_skips_once_without_a_driver() -> None:
    called = []

    def body(ctx: CheckContext) -> list[Finding]:
        called.append(True)
        return [Finding("GD099", Status.PASS, "host", "looked at the GPUs")]

    no_driver = Snapshot(schema_version=1, created="x", gpus=[])
    no_driver = type(no_driver)(**{**no_driver.__dict__, "driver": type(no_driver.driver)(nvml_status="no_driver")})
    chk = Check("needy", "Needy", (CODE,), body, needs="gpus")
    result = run_one(chk, CheckContext(no_driver), Selection())
    assert called == []
    assert [(f.code, f.status, f.message) for f in result.findings] == [
        ("GD099", Status.SKIP, "no GPUs to check: see GD101")
    ]
    # A check that needs nothing runs anyway.
    plain = Check("plain", "Plain", (CODE,), body)
    assert run_one(plain, CheckContext(no_driver), Selection()).findings[0].status is Status.PASS


def test_a_skip_never_points_at_a_finding_the_selection_hid(capsys, tmp_path) -> None:  # type: ignore[no-untyped-def]
    from tests.helpers.cli import run_cli
    from tests.helpers.snapshots import fixture, load, with_env, write_variant

    def skips(*args: str) -> set[str]:
        r = run_cli(capsys, "check", "--json", *args)
        return {f["message"] for f in r.findings() if f["status"] == "skip" and f["code"] in ("GD301", "GD401")}

    no_driver = str(fixture("no_driver"))
    assert skips("--snapshot", no_driver) == {"no GPUs to check: see GD101"}
    assert skips("--snapshot", no_driver, "--ignore", "GD101") == {
        "no GPUs to check: no NVIDIA driver: the NVIDIA kernel module is not loaded (GD101, not shown)"
    }
    # Every selected check skips because of the failure the selection hid: that failure is shown
    # (NOT READY, exit 1), and the skips point at it; with --ignore GD101 nothing was checked (exit 2).
    r = run_cli(capsys, "check", "--json", "--snapshot", no_driver, "--select", "GD3,GD4")
    assert r.exit_code == 1 and r.one("GD101")["status"] == "fail"
    r = run_cli(capsys, "check", "--json", "--snapshot", no_driver, "--select", "GD801")
    assert r.exit_code == 1 and r.one("GD801")["message"] == "no GPUs to check: see GD101"
    r = run_cli(capsys, "check", "--json", "--snapshot", no_driver, "--select", "GD801", "--ignore", "GD101")
    assert r.exit_code == 2
    assert "no GPUs to check: no NVIDIA driver: the NVIDIA kernel module is not loaded (GD101, not shown)" in r.err
    hidden = write_variant(tmp_path, with_env(load("h100_sxm_8x"), CUDA_VISIBLE_DEVICES=""))
    assert skips("--snapshot", hidden) == {"no visible GPUs to check: see GD201"}
    assert skips("--snapshot", hidden, "--ignore", "GD201") == {
        "no visible GPUs to check: no GPU is visible to CUDA (8 installed): CUDA_VISIBLE_DEVICES='' selects "
        "none of them (GD204 says why) (GD201, not shown)"
    }


def test_listed_says_how_many_it_left_out() -> None:
    from gpudoctor.knowledge.units import listed

    assert listed(["a", "b"]) == "a, b"
    assert listed([str(i) for i in range(6)]) == "0, 1, 2, 3, +2 more"
    assert listed(["p", "q", "r"], limit=2, sep="; ") == "p; q; +1 more"


def test_a_selected_code_that_could_not_be_judged_keeps_the_failure_that_says_why() -> None:
    # `--select GD601` on a hung all-reduce: GD603 (did not complete) is what a CI gate must see,
    # not a lone skip that turns the run into "nothing was checked" (exit 2).
    from gpudoctor.engine import Selection
    from gpudoctor.engine.runner import shown_findings
    from gpudoctor.findings import Finding, Status

    hung = [
        Finding("GD603", Status.FAIL, "host", "all-reduce sweep did not complete: rank 0 failed"),
        Finding("GD601", Status.SKIP, "host", "busbw not measured"),
        Finding("GD604", Status.WARN, "host", "something else"),
    ]
    assert [f.code for f in shown_findings(hung, Selection(select=("GD601",)))] == ["GD603", "GD601"]
    assert [f.code for f in shown_findings(hung, Selection(select=("GD601",), ignore=("GD603",)))] == ["GD601"]
    measured = [Finding("GD601", Status.PASS, "host", "ok"), Finding("GD603", Status.FAIL, "host", "x")]
    assert [f.code for f in shown_findings(measured, Selection(select=("GD601",)))] == ["GD601"]


def test_a_lost_gpu_the_selection_hid_is_shown_beside_a_pass_that_left_it_out(capsys) -> None:  # type: ignore[no-untyped-def]
    # `--select GD801` on a node with GPU 3 off the bus: memory errors pass on the other seven, and
    # the gate must not say READY: GD827 is shown (exit 1), unless --ignore names it.
    from tests.helpers.cli import run_cli
    from tests.helpers.snapshots import fixture

    fallen = str(fixture("faults/gpu_fallen_off_bus"))
    r = run_cli(capsys, "check", "--json", "--snapshot", fallen, "--select", "GD801")
    assert r.exit_code == 1 and r.one("GD801")["status"] == "pass"
    assert (r.one("GD827")["status"], r.one("GD827")["subject"]) == ("fail", "gpu:3")
    r = run_cli(capsys, "check", "--json", "--snapshot", fallen, "--select", "GD801", "--ignore", "GD827")
    assert r.exit_code == 0 and not r.findings("GD827")
    r = run_cli(capsys, "check", "--json", "--snapshot", str(fixture("h100_sxm_8x")), "--select", "GD801")
    assert r.exit_code == 0 and not r.findings("GD827")


class FakeClock:
    """time.perf_counter, advanced only by what the test says took time."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_checks_duration_is_its_own_work_not_the_import_of_its_module(monkeypatch, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A check module is imported when its check first runs; its duration_s (JSON, JUnit time=) leaves that out."""
    import sys
    import time

    from gpudoctor.catalogue import _deferred

    monkeypatch.setattr(time, "perf_counter", FakeClock())
    (tmp_path / "slow_import_check.py").write_text(
        "import time\n"
        "from gpudoctor.engine import Code, check\n"
        "CODE = Code('GD099', 'test-code', 't', what='w', why='y', fix='f')\n"
        "time.perf_counter.now += 7.0  # the import's own time\n"
        "@check('slow-import', 'A check whose module is slow to import', (CODE,))\n"
        "def slow(ctx):\n"
        "    time.perf_counter.now += 0.25  # the check's work\n"
        "    return []\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "slow_import_check", raising=False)
    deferred = _deferred("slow-import", "A check", "slow_import_check", 1, "", "", False, (CODE,))
    result = run_one(deferred, CheckContext(EMPTY), Selection())
    assert result.findings == [] and result.duration_s == 0.25
