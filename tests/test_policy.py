"""The policy file: where it is found, what it changes, and how a bad one is refused (file:line: key)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from gpudoctor import policy as pol
from tests.helpers.cli import run_cli
from tests.helpers.files import write
from tests.paths import H100, MIXED, REPO


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A project directory with a subdirectory to run from (the policy is found walking up)."""
    (tmp_path / "repo" / "src" / "train").mkdir(parents=True)
    monkeypatch.chdir(tmp_path / "repo" / "src" / "train")
    return tmp_path / "repo"


# --- discovery -------------------------------------------------------------------------------


def test_the_nearest_pyproject_with_a_tool_table_is_found_walking_up(project: Path) -> None:
    write(project / "pyproject.toml", '[project]\nname = "x"\n\n[tool.gpudoctor]\nexpect-gpus = 8\n')
    write(project / "src" / "pyproject.toml", '[project]\nname = "inner"\n')  # no table: skipped, like ruff
    found = pol.discover()
    assert found == (project / "pyproject.toml").resolve()
    assert pol.load().expect_gpus == 8


def test_gpudoctor_toml_wins_over_pyproject_in_the_same_directory(project: Path) -> None:
    write(project / "pyproject.toml", "[tool.gpudoctor]\nexpect-gpus = 8\n")
    write(project / "gpudoctor.toml", "expect-gpus = 4\n")
    assert pol.load().expect_gpus == 4


def test_the_nearest_file_is_the_policy_files_are_not_merged(project: Path) -> None:
    write(project / "gpudoctor.toml", 'expect-gpus = 8\nfail-on = "warn"\n')
    write(project / "src" / "gpudoctor.toml", "expect-gpus = 2\n")
    policy = pol.load()
    assert policy.expect_gpus == 2 and policy.fail_on is None


def test_no_file_anywhere_is_no_policy(project: Path) -> None:
    assert pol.discover(project / "src") is None or "gpudoctor" not in str(pol.discover(project / "src"))
    assert pol.load(use_config=False) == pol.NO_POLICY


def test_config_names_a_file_and_no_config_ignores_the_discovered_one(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write(project / "gpudoctor.toml", "expect-gpus = 16\n")
    other = write(project / "ci" / "pyproject.toml", "[tool.gpudoctor]\nexpect-gpus = 4\n")
    found = run_cli(capsys, "check", "--snapshot", H100, "--json")
    assert found.exit_code == 1 and found.one("GD202")["evidence"]["expected"] == 16
    named = run_cli(capsys, "check", "--snapshot", H100, "--json", "--config", str(other))
    assert named.exit_code == 0 and named.one("GD202")["evidence"]["expected"] == 4
    assert named.doc["policy"]["path"] == str(other)
    none = run_cli(capsys, "check", "--snapshot", H100, "--json", "--no-config")
    assert none.exit_code == 0 and none.findings("GD202") == [] and none.doc["policy"] is None


def test_the_report_names_the_policy_file_in_text_and_json(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(project / "gpudoctor.toml", "expect-gpus = 8\nram-per-gpu = 32\n")
    text = run_cli(capsys, "check", "--snapshot", H100)
    assert f"(policy {path.resolve()})" in text.out.splitlines()[0]
    doc = run_cli(capsys, "check", "--snapshot", H100, "--json").doc
    assert doc["policy"] == {"path": str(path.resolve()), "set": {"expect_gpus": 8, "ram_per_gpu_gb": 32.0}}


# --- what a policy changes -------------------------------------------------------------------


def test_thresholds_reach_the_checks(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # The H100 fixture has 252 GiB of RAM per GPU and a 1008 GiB /dev/shm.
    write(project / "gpudoctor.toml", "ram-per-gpu = 300\nmin-shm = 2000\n")
    r = run_cli(capsys, "check", "--snapshot", H100, "--json")
    assert r.one("GD501")["status"] == "fail" and r.one("GD501")["evidence"]["expected_per_gpu_gb"] == 300
    assert r.one("GD510")["status"] != "pass" and r.one("GD510")["evidence"]["expected_bytes"] == 2000 << 30


def test_command_line_flags_win_over_the_policy(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write(project / "gpudoctor.toml", 'ram-per-gpu = 300\nfail-on = "warn"\nexpect-gpus = 16\n')
    r = run_cli(capsys, "check", "--snapshot", H100, "--json", "--ram-per-gpu", "8", "--expect-gpus", "8")
    assert r.one("GD501")["status"] == "pass" and r.one("GD202")["status"] == "pass"
    assert r.doc["fail_on"] == "warn"  # not given on the command line: the policy's
    assert run_cli(capsys, "check", "--snapshot", H100, "--json", "--fail-on", "fail").doc["fail_on"] == "fail"


def test_fail_on_warn_from_the_policy_gates_warnings(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli(capsys, "check", "--snapshot", MIXED, "--json", "--ignore", "GD301,GD302").exit_code == 0
    write(project / "gpudoctor.toml", 'fail-on = "warn"\n')
    assert run_cli(capsys, "check", "--snapshot", MIXED, "--json", "--ignore", "GD301,GD302").exit_code == 1


def test_policy_ignore_and_command_line_ignore_add_up(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write(project / "gpudoctor.toml", 'ignore = ["GD301"]\n')
    r = run_cli(capsys, "check", "--snapshot", MIXED, "--json", "--ignore", "GD302")
    assert not {"GD301", "GD302"} & {f["code"] for f in r.findings()}


def test_severity_override_changes_the_verdict_and_says_so(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(project / "gpudoctor.toml", '[severity]\nGD301 = "warn"\nGD302 = "warn"\nGD105 = "fail"\n')
    r = run_cli(capsys, "check", "--snapshot", MIXED, "--json")
    gd301 = r.one("GD301")
    assert gd301["status"] == "warn"
    assert gd301["evidence"]["policy_severity"] == {"was": "fail", "policy": str(path.resolve())}
    assert r.one("GD105")["status"] == "fail"  # a warning promoted
    assert r.exit_code == 1
    write(project / "gpudoctor.toml", '[severity]\nGD301 = "warn"\nGD302 = "warn"\n')
    assert run_cli(capsys, "check", "--snapshot", MIXED, "--json").exit_code == 0


def test_expect_model_fails_a_machine_of_another_model(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write(project / "gpudoctor.toml", 'expect-model = "A100"\n')
    r = run_cli(capsys, "check", "--snapshot", H100, "--json")
    assert r.exit_code == 1
    failing = r.findings("GD010")
    assert len(failing) == 8 and {f["status"] for f in failing} == {"fail"}
    assert "NVIDIA H100 80GB HBM3" in failing[0]["message"] and "'A100'" in failing[0]["message"]
    ok = run_cli(capsys, "check", "--snapshot", H100, "--json", "--expect-model", "h100 80gb")
    assert ok.exit_code == 0 and ok.one("GD010")["status"] == "pass"


def test_without_expect_model_the_policy_check_is_not_part_of_the_run(capsys: pytest.CaptureFixture[str]) -> None:
    r = run_cli(capsys, "check", "--snapshot", H100, "--json", "--no-config")
    assert "expected" not in [c["name"] for c in r.doc["checks"]]


def test_min_busbw_share_sets_the_fail_ratio() -> None:
    from gpudoctor.pipeline import check_options

    opts = check_options(pol.Policy(min_busbw_share=0.9), 1, {})
    assert opts.busbw_fail_ratio == 0.9 and opts.busbw_warn_ratio == 0.9 and opts.min_busbw_gbps is None
    opts = check_options(pol.Policy(min_busbw_share=0.4), 1, {})
    assert opts.busbw_fail_ratio == 0.4 and opts.busbw_warn_ratio == 0.8
    opts = check_options(pol.Policy(min_busbw_share=0.9), 1, {"min_busbw": "300"})
    assert opts.min_busbw_gbps == 300.0 and opts.busbw_fail_ratio == 0.5  # the flag replaces the policy's


def test_watch_thresholds_are_read_from_the_watch_table(tmp_path: Path) -> None:
    from gpudoctor.watch.thresholds import Thresholds

    path = write(tmp_path / "gpudoctor.toml", "[watch]\nstraggler-gap = 25\nmin-samples = 10\n")
    policy = pol.load(path)
    assert policy.watch == {"straggler_gap": 25.0, "min_samples": 10}
    assert set(pol.watch_keys()) == {f.replace("_", "-") for f in Thresholds.__dataclass_fields__}
    th = pol.watch_thresholds(policy)
    assert th.straggler_gap == 25.0 and th.min_samples == 10 and th.window_s == Thresholds().window_s


# --- bad files: exit 2, naming the file, the line and the key ---------------------------------


BAD = [
    (
        "pyproject.toml",
        '[tool.gpudoctor]\nexpect-gpus = 8\nfail_on = "warn"\n',
        3,
        "tool.gpudoctor.fail_on",
        "did you mean 'fail-on'",
    ),
    ("gpudoctor.toml", 'expect-gpus = "eight"\n', 1, "expect-gpus", "expected an integer"),
    ("gpudoctor.toml", "\n\nram-per-gpu = -4\n", 3, "ram-per-gpu", "at least 0"),
    ("gpudoctor.toml", 'fail-on = "error"\n', 1, "fail-on", "expected one of 'warn', 'fail'"),
    ("gpudoctor.toml", 'ignore = ["GD999"]\n', 1, "ignore", "unknown check or code 'GD999'"),
    ("gpudoctor.toml", 'select = ["topolgy"]\n', 1, "select", "unknown check or code 'topolgy'"),
    (
        "gpudoctor.toml",
        '# policy\n[severity]\nGD301 = "warn"\nGD998 = "fail"\n',
        4,
        "severity.GD998",
        "unknown finding code",
    ),
    ("gpudoctor.toml", '[severity]\nGD301 = "info"\n', 2, "severity.GD301", "expected one of 'warn', 'fail'"),
    (
        "gpudoctor.toml",
        "[watch]\nstraggler-gap = 15\nstragler-share = 0.5\n",
        3,
        "watch.stragler-share",
        "did you mean 'straggler-share'",
    ),
    ("gpudoctor.toml", "[watch]\nmem-gap-share = 1.5\n", 2, "watch.mem-gap-share", "at most 1"),
    ("gpudoctor.toml", "[watch]\nwarmup-s = 1e308\n", 2, "watch.warmup-s", "at most 86400 s (a day)"),
    ("gpudoctor.toml", "[watch]\nhang-min-s-steps = 90000\n", 2, "watch.hang-min-s-steps", "at most 86400 s"),
    ("gpudoctor.toml", "min-busbw = '150%'\n", 1, "min-busbw", "at most 100%"),
    ("gpudoctor.toml", "tolerance = 10\n", 1, "tolerance", "ambiguous"),
    ("gpudoctor.toml", 'collectives = ["all-reduce", "scatter"]\n', 1, "collectives", "unknown collective 'scatter'"),
    ("gpudoctor.toml", "expect-gpus = 8\nexpect-gpus = 4\n", 2, "", "not valid TOML"),
    ("gpudoctor.toml", "severity = 3\n", 1, "severity", "expected a table"),
    ("gpudoctor.toml", "timeout = nan\n", 1, "timeout", "finite"),
]


@pytest.mark.parametrize(("name", "text", "line", "key", "problem"), BAD, ids=[b[3] or "syntax" for b in BAD])
def test_a_bad_policy_is_exit_2_naming_file_line_and_key(
    project: Path, capsys: pytest.CaptureFixture[str], name: str, text: str, line: int, key: str, problem: str
) -> None:
    path = write(project / name, text).resolve()
    r = run_cli(capsys, "check", "--snapshot", H100)
    assert r.exit_code == 2 and r.out == ""
    message = r.err.strip()
    assert r.err.count("\n") == 1, r.err
    assert message.startswith(f"gpudoctor: {path}:{line}: {key}"), message
    assert problem in message, message


def test_a_bad_policy_under_json_is_an_error_document(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write(project / "gpudoctor.toml", "expect_gpus = 8\n")
    r = run_cli(capsys, "check", "--snapshot", H100, "--json")
    assert r.exit_code == 2
    assert r.doc["error"]["kind"] == "input" and "did you mean 'expect-gpus'" in r.doc["error"]["message"]


@pytest.mark.parametrize(
    ("setup", "problem"),
    [
        (lambda d: None, "no such file"),
        (lambda d: (d / "p.toml").mkdir(), "is a directory"),
        (lambda d: (d / "p.toml").write_bytes(b"\xff\xfe not text"), "not UTF-8"),
    ],
    ids=["missing", "directory", "binary"],
)
def test_an_unreadable_config_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str], setup, problem) -> None:
    setup(tmp_path)
    r = run_cli(capsys, "check", "--snapshot", H100, "--config", str(tmp_path / "p.toml"))
    assert r.exit_code == 2 and problem in r.err and r.err.count("\n") == 1


def test_config_and_no_config_together_are_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    r = run_cli(capsys, "check", "--snapshot", H100, "--config", "x.toml", "--no-config")
    assert r.exit_code == 2 and "contradict" in r.err


def test_key_lines_follow_tables_dotted_keys_and_skip_multiline_strings() -> None:
    text = (
        '[tool.gpudoctor]\nnote = """\nfail-on = "x"\n"""\nfail-on = "warn"\n'
        '[tool.gpudoctor.watch]\n"straggler-gap" = 3\n'
    )
    lines = pol.key_lines(text)
    assert lines[("tool", "gpudoctor", "fail-on")] == 5
    assert lines[("tool", "gpudoctor", "watch", "straggler-gap")] == 7


def test_every_key_is_documented() -> None:
    doc = (REPO / "docs" / "gates.md").read_text()
    for key in pol.KEYS:
        assert re.search(rf"`{re.escape(key)}`", doc), key
    assert json.dumps(sorted(pol.KEYS))  # keys are plain strings


# --- values a parser accepts and a float does not hold; spellings TOML allows ----------------


@pytest.mark.parametrize("key", ["expect-gpus", "ram-per-gpu", "min-shm", "timeout", "tolerance", "min-busbw"])
def test_a_400_digit_integer_is_exit_2_naming_key_file_and_line(
    project: Path, capsys: pytest.CaptureFixture[str], key: str
) -> None:
    path = write(project / "gpudoctor.toml", f"# a policy\n{key} = {10**400}\n").resolve()
    r = run_cli(capsys, "check", "--snapshot", H100)
    assert r.exit_code == 2 and r.err.count("\n") == 1, r.err
    assert r.err.startswith(f"gpudoctor: {path}:2: {key}: ")
    assert len(r.err) < 300 and "(401 characters)" in r.err  # the number is not printed whole


def test_a_400_digit_integer_in_the_watch_table_too(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(project / "gpudoctor.toml", f"[watch]\nstraggler-gap = {10**400}\n").resolve()
    r = run_cli(capsys, "check", "--snapshot", H100)
    assert r.exit_code == 2 and r.err.startswith(f"gpudoctor: {path}:2: watch.straggler-gap: expected a finite")


def test_a_utf8_byte_order_mark_is_read_like_any_editor_writes_it(project: Path) -> None:
    path = project / "gpudoctor.toml"
    path.write_bytes(b"\xef\xbb\xbfexpect-gpus = 8\n")
    assert pol.load().expect_gpus == 8
    path.write_bytes(b"\xef\xbb\xbfexpect-gpus = 8\nbogus = 1\n")
    with pytest.raises(pol.PolicyError, match=r"gpudoctor.toml:2: bogus: unknown key"):
        pol.load()  # lines are still counted from the first


@pytest.mark.parametrize(
    "text",
    [
        '[tool."gpudoctor"]\nexpect-gpus = 8\n',
        "tool = {gpudoctor = {expect-gpus = 8}}\n",
        "[tool]\ngpudoctor.expect-gpus = 8\n",
        '[tool."gpu\\u0064octor"]\nexpect-gpus = 8\n',
    ],
    ids=["quoted", "inline", "dotted", "escaped"],
)
def test_a_tool_table_in_any_toml_spelling_is_found(project: Path, text: str) -> None:
    write(project / "pyproject.toml", text + '[project]\nname = "x"\n')  # top-level keys come first
    assert pol.discover() == (project / "pyproject.toml").resolve()
    assert pol.load().expect_gpus == 8


def test_a_multiline_string_naming_the_table_is_not_a_policy(project: Path) -> None:
    write(project / "gpudoctor.toml", "expect-gpus = 8\n")
    inner = project / "src" / "pyproject.toml"
    write(inner, '[project]\nname = "x"\ndescription = """\nHow to write\n[tool.gpudoctor]\n"""\n')
    assert pol.discover() == (project / "gpudoctor.toml").resolve()  # not the inner file's "table"
    assert pol.load().expect_gpus == 8


def test_a_broken_pyproject_that_names_gpudoctor_is_reported_one_that_does_not_is_passed_over(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write(project / "gpudoctor.toml", "expect-gpus = 8\n")
    broken = write(project / "src" / "pyproject.toml", "[project\nname = 'x'\n")
    assert pol.discover() == (project / "gpudoctor.toml").resolve()
    write(broken, "[tool.gpudoctor\nexpect-gpus = 8\n")
    r = run_cli(capsys, "check", "--snapshot", H100)
    assert r.exit_code == 2 and f"{broken.resolve()}:1: not valid TOML" in r.err


def test_config_naming_a_pyproject_without_the_table_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path / "pyproject.toml", "[tool.gpu-doctor]\nexpect-gpus = 8\n")  # misspelt
    r = run_cli(capsys, "check", "--snapshot", H100, "--config", str(path))
    assert (
        r.exit_code == 2
        and r.err == f"gpudoctor: {path}: has no [tool.gpudoctor] table (a pyproject.toml policy lives there)\n"
    )


def test_tolerance_takes_a_fraction_on_the_command_line_as_in_the_file(capsys: pytest.CaptureFixture[str]) -> None:
    r = run_cli(capsys, "diff", H100, H100, "--json", "--no-config", "--tolerance", "0.05")
    assert r.exit_code == 0
    ten = run_cli(capsys, "diff", H100, H100, "--no-config", "--tolerance", "10")
    assert ten.exit_code == 2 and "ambiguous" in ten.err


def test_expect_model_must_name_something(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    r = run_cli(capsys, "check", "--snapshot", H100, "--expect-model", " ")
    assert r.exit_code == 2 and "--expect-model" in r.err and "needs a model name" in r.err
    write(project / "gpudoctor.toml", 'expect-model = ""\n')
    assert run_cli(capsys, "check", "--snapshot", H100).exit_code == 2


@pytest.mark.parametrize("nested", ["[" * 5000 + "]" * 5000, "{a = " * 5000 + "1" + "}" * 5000])
def test_a_policy_nested_deeper_than_the_toml_reader_follows_is_exit_2_not_a_crash(
    project: Path, capsys: pytest.CaptureFixture[str], nested: str
) -> None:
    """Issue 24: tomllib recurses per nested array or inline table; a RecursionError was exit 3."""
    named = write(project / "deep.toml", f"expect-gpus = 8\nx = {nested}\n")
    r = run_cli(capsys, "check", "--snapshot", H100, "--config", str(named))
    assert (
        r.exit_code == 2
        and r.err == f"gpudoctor: {named}: not a policy: values nested deeper than the TOML reader follows\n"
    )
    # Found walking up (a pyproject naming the table), it is reported the same way, not passed over.
    found = write(project / "pyproject.toml", f"[tool.gpudoctor]\nx = {nested}\n")
    r = run_cli(capsys, "check", "--snapshot", H100)
    assert r.exit_code == 2 and f"{found.resolve()}: not a policy: values nested deeper" in r.err
