"""First contact, as a new user tries it (issue 24): the bare commands show their help laid out,
`-V` answers, `explain` takes a check name as --select does, `list-checks` is one aligned table,
and a CI gate that selects an active check on a node whose driver is gone shows why (exit 1)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpudoctor.catalogue import catalogue
from gpudoctor.version import __version__
from tests.helpers.cli import run_cli
from tests.helpers.snapshots import fixture, load

# -- help, version -------------------------------------------------------------------------------


@pytest.mark.parametrize("args", [(), ("bench",)], ids=["gpudoctor", "bench"])
def test_a_bare_group_shows_its_help_laid_out_as_help_does(capsys: pytest.CaptureFixture[str], args: tuple) -> None:
    bare = run_cli(capsys, *args)
    helped = run_cli(capsys, *args, "--help")
    assert helped.exit_code == 0
    assert bare.exit_code == 2 and bare.out == ""  # a usage error, on stderr, as click does
    assert bare.err.rstrip("\n") == helped.out.rstrip("\n")
    assert bare.err.count("\n") > 10 and max(len(line) for line in bare.err.splitlines()) <= 100


@pytest.mark.parametrize("flag", ["-V", "--version"])
def test_version_flags(capsys: pytest.CaptureFixture[str], flag: str) -> None:
    r = run_cli(capsys, flag)
    assert r.exit_code == 0 and r.out == f"gpudoctor, version {__version__}\n"


# -- explain a check name ----------------------------------------------------------------------


def test_explain_a_check_name_lists_its_codes(capsys: pytest.CaptureFixture[str]) -> None:
    r = run_cli(capsys, "explain", "topology")
    assert r.exit_code == 0
    want = sorted(c for c, owner in catalogue().owner.items() if owner == "topology")
    listed = [line.split()[1] for line in r.out.splitlines() if line.startswith("- GD")]
    assert listed == want and "GD401" in want
    assert "`--select topology`" in r.out
    # what it tells the user to type works
    assert run_cli(capsys, "check", "--snapshot", str(fixture("h100_sxm_8x")), "--select", "topology").exit_code == 0
    doc = json.loads(run_cli(capsys, "explain", "topology", "--json").out)
    assert doc["check"] == "topology" and [c["code"] for c in doc["codes"]] == want
    watch = run_cli(capsys, "explain", "watch").out
    assert "GD901" in watch and "--select watch" not in watch  # check --select does not take watch codes
    bad = run_cli(capsys, "explain", "topolgy")
    assert bad.exit_code == 2 and "unknown finding code or check 'topolgy'" in bad.err


# -- list-checks -------------------------------------------------------------------------------


def test_list_checks_is_one_aligned_table(capsys: pytest.CaptureFixture[str]) -> None:
    lines = run_cli(capsys, "list-checks").out.splitlines()
    head, rows = lines[0], lines[1:]
    assert head.split() == ["code", "check", "kind", "title"]
    starts = [head.index(word) for word in ("check", "kind", "title")]
    for line in rows:  # every cell starts under its heading, long check names included (GD834)
        for start in starts:
            assert line[start - 1] == " " and line[start] != " ", line
    assert [r.split()[0] for r in rows] == sorted(catalogue().codes)
    assert any(len(r.split()[1]) > 14 for r in rows), "the check names that overflowed a fixed width"


# -- a gate on an active check, on a node whose driver is gone -----------------------------------


@pytest.mark.parametrize(
    "args",
    [("--select", "GD601"), ("--select", "ddp"), ("--level", "3", "--select", "deep_memory"), ("--select", "GD801")],
    ids=["GD601", "ddp", "deep_memory", "GD801"],
)
def test_selecting_an_active_check_without_a_driver_shows_gd101(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, args: tuple[str, ...]
) -> None:
    monkeypatch.setattr("gpudoctor.probe.collect", lambda: load("no_driver"))  # the probe's boundary
    r = run_cli(capsys, "check", "--json", *args)
    assert r.exit_code == 1, r.err
    assert r.one("GD101")["status"] == "fail"
    skipped = [f for f in r.findings() if f["code"] != "GD101"]
    assert skipped and all(f["status"] == "skip" for f in skipped)
    text = run_cli(capsys, "check", *args).out
    assert "FAIL GD101" in text and "NOT READY (exit 1" in text
    # --ignore GD101 leaves nothing checked: a usage error that says why
    ignored = run_cli(capsys, "check", *args, "--ignore", "GD101")
    assert ignored.exit_code == 2 and "nothing was checked" in ignored.err


def test_selecting_an_active_check_without_torch_shows_gd002(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from dataclasses import replace

    from gpudoctor.snapshot import Missing

    h100 = load("h100_sxm_8x")
    gone = replace(h100, software=replace(h100.software, torch=Missing("unsupported", "torch is not installed")))
    monkeypatch.setattr("gpudoctor.probe.collect", lambda: gone)
    r = run_cli(capsys, "check", "--json", "--select", "GD601")
    assert r.exit_code == 1 and r.one("GD002")["status"] == "fail"
    assert r.one("GD601")["status"] == "skip"


# -- JUnit -------------------------------------------------------------------------------------


def test_junit_has_no_empty_suite(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    from junitparser import JUnitXml  # a reader we did not write

    path = tmp_path / "report.xml"
    r = run_cli(capsys, "check", "--snapshot", str(fixture("h100_sxm_8x")), "--junit", str(path), "--json")
    silent = [c["name"] for c in r.doc["checks"] if not c["findings"]]
    assert silent, "the fixture has checks with nothing to say: the test would prove nothing"
    suites = list(JUnitXml.fromfile(str(path)))
    assert suites and all(len(list(suite)) == suite.tests > 0 for suite in suites)
    assert not {s.name for s in suites} & set(silent)
    assert sum(s.tests for s in suites) == len(r.findings())


# -- options that did nothing, and outputs that overwrite ----------------------------------------


def test_device_on_a_recorded_snapshot_is_said_and_ranks_refused(capsys: pytest.CaptureFixture[str]) -> None:
    h100 = str(fixture("h100_sxm_8x"))
    plain = run_cli(capsys, "check", "--snapshot", h100)
    assert plain.err == ""
    cpu = run_cli(capsys, "check", "--snapshot", h100, "--device", "cpu", "--json")
    assert cpu.exit_code == 0 and "no workload runs on a recorded snapshot; --device cpu" in cpu.err
    driverless = run_cli(capsys, "check", "--snapshot", str(fixture("no_driver")), "--device", "cpu", "--json")
    assert driverless.one("GD101")["status"] == "skip"  # what --device cpu does on a recording
    ranks = run_cli(capsys, "check", "--snapshot", h100, "--device", "cpu", "--ranks", "4")
    assert ranks.exit_code == 2 and "--ranks: no rank runs on a recorded snapshot" in ranks.err


def test_snapshot_o_refuses_to_overwrite_without_force(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr("gpudoctor.probe.collect", lambda: load("h100_sxm_8x"))
    kept = tmp_path / "machine.json"
    kept.write_text("evidence\n")
    r = run_cli(capsys, "snapshot", "-o", str(kept))
    assert r.exit_code == 2 and "exists; use --force to overwrite it" in r.err
    assert kept.read_text() == "evidence\n"
    assert run_cli(capsys, "snapshot", "-o", str(kept), "--force").exit_code == 0
    assert json.loads(kept.read_text())["schema_version"]
    empty = tmp_path / "empty.json"
    empty.touch()  # an empty file holds nothing to lose, as with watch --record
    assert run_cli(capsys, "snapshot", "-o", str(empty)).exit_code == 0
    assert run_cli(capsys, "snapshot", "--force").exit_code == 2  # --force without a file


# -- -q, and a policy that would hide a missing driver ---------------------------------------------


def test_quiet_hides_skips_and_keeps_their_count(capsys: pytest.CaptureFixture[str]) -> None:
    args = ("check", "--snapshot", str(fixture("no_driver")), "--device", "cpu")
    full = run_cli(capsys, *args).out
    quiet = run_cli(capsys, *args, "-q").out
    assert "[-]" in full and "[-]" not in quiet  # a CPU run on a driverless node skips every GPU check
    assert quiet.splitlines()[-1] == full.splitlines()[-1] and " skip" in quiet.splitlines()[-1]


def test_a_policy_ignoring_gd1_does_not_make_a_driverless_node_ready(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr("gpudoctor.probe.collect", lambda: load("no_driver"))
    policy = tmp_path / "gpudoctor.toml"
    policy.write_text('ignore = ["GD1"]\n')
    r = run_cli(capsys, "check", "--quick", "--config", str(policy), "--json")
    assert r.exit_code == 1
    gd101 = r.one("GD101")
    assert gd101["status"] == "fail" and "shown although the policy ignores GD1" in gd101["message"]
    assert gd101["evidence"]["policy_ignore_set_aside"] == ["GD1"]
    # the policy's other ignores still apply; on a healthy node the policy hides GD1 as asked
    healthy = run_cli(capsys, "check", "--snapshot", str(fixture("h100_sxm_8x")), "--config", str(policy), "--json")
    assert healthy.exit_code == 0 and not [f for f in healthy.findings() if f["code"].startswith("GD1")]
    # a CPU run does not need the driver: the policy's ignore stands
    cpu = run_cli(capsys, "check", "--quick", "--device", "cpu", "--config", str(policy), "--json")
    assert not cpu.findings("GD101")


def test_every_mention_of_the_comparison_codes_names_their_whole_range(capsys: pytest.CaptureFixture[str]) -> None:
    """`diff --help` said GD011-GD016 once codes went to GD019: every "GD011-GDxxx" in the help, the
    docs and the docstrings names the last comparison code there is."""
    import re

    from gpudoctor.compare.codes import CODES
    from tests.paths import REPO

    last = max(c.code for c in CODES)
    help_text = run_cli(capsys, "diff", "--help").out
    texts = {"diff --help": help_text, **{str(p): p.read_text() for p in [REPO / "README.md", *REPO.glob("docs/*.md")]}}
    # the user-facing texts (compare/ names sub-ranges: GD011-GD013 are the facts)
    faces = [REPO / "gpudoctor" / "api.py", REPO / "gpudoctor" / "catalogue.py", *REPO.glob("gpudoctor/cli/*.py")]
    texts |= {str(p): p.read_text() for p in faces}
    ranges = {(where, m) for where, text in texts.items() for m in re.findall(r"GD011-(GD0\d\d)", text)}
    assert ("diff --help", last) in ranges
    assert {m for _, m in ranges} == {last}, sorted(r for r in ranges if r[1] != last)
