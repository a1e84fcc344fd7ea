"""`gpudoctor lint` as users and CI run it: the text lines, --json (the report schema), --junit
(read back by junitparser), exit codes and --fail-on, --select/--ignore, and bad input (missing
paths, files that do not parse, FIFOs, huge files, hostile names) as one line or one finding,
never a traceback or a hang. The scripts are never run."""

from __future__ import annotations

import os
from pathlib import Path

import jsonschema
import junitparser
import pytest

from gpudoctor.schemas import report_schema
from tests.helpers.cli import run_cli
from tests.helpers.processes import run_gpudoctor
from tests.paths import REFERENCE

SCRIPTS = REFERENCE / "scripts"
TRAINER = str(SCRIPTS / "pytorch-examples/distributed/minGPT-ddp/mingpt/trainer.py")  # one error (GD761)
MULTIGPU = str(SCRIPTS / "pytorch-examples/distributed/ddp-tutorial-series/multigpu.py")  # one warning (GD750)
NLP = str(SCRIPTS / "accelerate/examples/nlp_example.py")  # one info (GD760)
CLEAN = str(SCRIPTS / "pytorch-examples/distributed/ddp-tutorial-series/multigpu_torchrun.py")
BROKEN = str(SCRIPTS / "seeds/004_1.py")  # does not parse


def test_each_finding_is_a_file_line_row_with_its_hint_and_a_summary(capsys: pytest.CaptureFixture[str]) -> None:
    r = run_cli(capsys, "lint", TRAINER, MULTIGPU, NLP, CLEAN)
    lines = r.out.splitlines()
    assert lines[0].startswith("gpudoctor ") and lines[0].endswith("lint: 4 files")
    assert f"{TRAINER}:107: FAIL GD761 clip-before-unscale: gradients are clipped" in r.out
    assert f"{MULTIGPU}:20: WARN GD750 master-port-hardcoded: " in r.out
    assert f"{NLP}:166: INFO GD760 grad-accum-no-sync: " in r.out
    assert "    hint: scaler.unscale_(optimizer) right before clipping" in lines
    assert CLEAN not in r.out
    assert lines[-1] == "4 files, 1 clean, 1 fail, 1 warn, 1 info  ->  exit 1 (--fail-on fail)"
    assert r.exit_code == 1 and r.err == ""


@pytest.mark.parametrize(
    "paths, fail_on, code",
    [
        ([CLEAN], "fail", 0),
        ([MULTIGPU], "fail", 0),
        ([MULTIGPU], "warn", 1),
        ([NLP], "warn", 0),  # info never gates
        ([TRAINER], "fail", 1),
        ([BROKEN], "fail", 1),  # a file lint could not read proved nothing: gates like a failure
    ],
)
def test_exit_codes_follow_fail_on_like_check(
    capsys: pytest.CaptureFixture[str], paths: list[str], fail_on: str, code: int
) -> None:
    assert run_cli(capsys, "lint", "--fail-on", fail_on, *paths).exit_code == code


def test_json_is_a_report_document_with_one_result_per_file(capsys: pytest.CaptureFixture[str]) -> None:
    r = run_cli(capsys, "lint", "--json", TRAINER, CLEAN, BROKEN)
    doc = r.doc  # validated against gpudoctor/schemas/report.schema.json
    assert doc["command"] == "lint" and doc["exit_code"] == r.exit_code == 1
    assert [c["name"] for c in doc["checks"]] == [TRAINER, CLEAN, BROKEN]
    clip = r.one("GD761")
    assert clip["subject"] == f"{TRAINER}:107" and clip["status"] == "fail"
    assert clip["evidence"] == {
        "rule": "clip-before-unscale",
        "severity": "error",
        "file": TRAINER,
        "line": 107,
        "backward_line": 106,
        "step_line": 108,
    }
    assert r.one("GD799")["status"] == "error" and "IndentationError" in r.one("GD799")["message"]
    assert doc["checks"][1]["findings"] == [] and doc["summary"]["fail"] == 1
    # the schema holds lint's subjects to FILE:LINE (and check's to its own forms)
    doc["checks"][0]["findings"][0]["subject"] = TRAINER
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(doc, report_schema())


def test_junit_has_a_suite_per_file_with_findings_read_back_by_junitparser(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    out = tmp_path / "lint.xml"
    r = run_cli(capsys, "lint", "--junit", str(out), TRAINER, MULTIGPU, CLEAN)
    assert r.exit_code == 1
    suites = {s.name: s for s in junitparser.JUnitXml.fromfile(str(out))}
    # A clean file has no suite: JUnit carries no empty suites (render/junit.py, issue 24).
    assert set(suites) == {TRAINER, MULTIGPU}
    (case,) = list(suites[TRAINER])
    assert case.name == f"GD761 {TRAINER}:107" and isinstance(case.result[0], junitparser.Failure)
    (warn,) = list(suites[MULTIGPU])
    assert warn.is_passed and "warning:" in (warn.system_out or "")


def test_select_and_ignore_take_codes_prefixes_and_rule_names(capsys: pytest.CaptureFixture[str]) -> None:
    def codes(*args: str) -> list[str]:
        return [f["code"] for f in run_cli(capsys, "lint", "--json", *args, TRAINER, MULTIGPU, NLP).findings()]

    assert codes() == ["GD761", "GD750", "GD760"]
    assert codes("--select", "GD75") == ["GD750"]
    assert codes("--select", "clip-before-unscale,GD760") == ["GD761", "GD760"]
    assert codes("--ignore", "master-port-hardcoded", "--ignore", "GD76") == []


def test_select_never_hides_a_file_that_did_not_parse(capsys: pytest.CaptureFixture[str]) -> None:
    r = run_cli(capsys, "lint", "--json", "--select", "GD750", "--ignore", "GD799", BROKEN)
    assert [f["code"] for f in r.findings()] == ["GD799"]


@pytest.mark.parametrize(
    "args, message",
    [
        (("--select", "GD4"), "gpudoctor: --select 'GD4': not a lint code or rule (GD750-GD799; see docs/lint.md)"),
        (("--ignore", "no-such-rule"), "gpudoctor: --ignore 'no-such-rule': not a lint code or rule"),
        (("--launcher", "srun"), "Invalid value for '--launcher'"),
        ((), "gpudoctor: name the scripts or directories to lint (or - for standard input)"),
    ],
)
def test_usage_errors_are_one_line_and_exit_2(
    capsys: pytest.CaptureFixture[str], args: tuple[str, ...], message: str
) -> None:
    r = run_cli(capsys, "lint", *args, *([CLEAN] if args else []))
    assert r.exit_code == 2 and message in r.err and len(r.err.strip().splitlines()) == 1 and r.out == ""


def test_a_missing_path_or_a_directory_without_python_is_exit_2(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    r = run_cli(capsys, "lint", CLEAN, str(tmp_path / "nope.py"))
    assert r.exit_code == 2 and r.err.strip() == f"gpudoctor: {tmp_path / 'nope.py'}: no such file or directory"
    (tmp_path / "README.md").write_text("no python here")
    r = run_cli(capsys, "lint", "--json", str(tmp_path))
    assert r.exit_code == 2 and r.doc["error"]["kind"] == "input"


def test_check_refuses_lint_codes(capsys: pytest.CaptureFixture[str]) -> None:
    from tests.paths import CONTAINER

    r = run_cli(capsys, "check", "--snapshot", CONTAINER, "--select", "GD750")
    assert r.exit_code == 2 and "`gpudoctor lint` codes, which `check` never gives" in r.err
    explained = run_cli(capsys, "explain", "GD753").out
    assert "Raised by `gpudoctor lint`" in explained and "LOCAL_RANK" in explained


def test_a_directory_is_walked_sorted_skipping_hidden_and_virtualenv_folders(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    bad = 'import os\nos.environ["MASTER_PORT"] = "1"\n'
    for rel in ("b.py", "a/train.py", ".venv/lib/x.py", "venv/y.py", "node_modules/z.py", ".hidden/w.py"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(bad)
    (tmp_path / "a" / "loop").symlink_to(tmp_path)  # a link back up is not followed
    # Nor a link to a file (the review: another user's link in a shared folder had lint read /etc/passwd).
    (tmp_path / "passwd.py").symlink_to("/etc/passwd")
    (tmp_path / "a" / "zero.py").symlink_to("/dev/zero")
    (tmp_path / "a" / "again.py").symlink_to(tmp_path / "b.py")
    r = run_cli(capsys, "lint", "--json", str(tmp_path))
    assert [c["name"] for c in r.doc["checks"]] == [str(tmp_path / "a/train.py"), str(tmp_path / "b.py")]
    named = run_cli(capsys, "lint", "--json", str(tmp_path / "a" / "again.py"))  # named: the user's own choice
    assert [c["name"] for c in named.doc["checks"]] == [str(tmp_path / "a" / "again.py")]
    only = tmp_path / "only_links"
    only.mkdir()
    (only / "x.py").symlink_to(tmp_path / "b.py")
    r = run_cli(capsys, "lint", str(only))
    assert r.exit_code == 2 and r.err.strip().endswith(
        "no Python files in this directory (a link to a .py file not followed: name a file to lint it)"
    ), r.err


def test_a_file_found_in_a_folder_that_becomes_a_link_before_it_is_read_is_not_followed(tmp_path: Path) -> None:
    """The second review: the walk skipped links, but the files it found were opened following links,
    so one swapped for a link between the walk and the read was followed."""
    from gpudoctor.lint.runner import collect, lint_report

    script = tmp_path / "train.py"
    script.write_text("x = 1\n")
    files = collect([str(tmp_path)])
    script.unlink()
    script.symlink_to("/etc/passwd")
    (result,) = lint_report([str(tmp_path)], files=files).checks
    assert [(f.code, f.message.split(":")[0]) for f in result.findings] == [("GD799", "this file cannot be read")]


def test_the_script_is_never_run(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    script = tmp_path / "train.py"
    script.write_text(f"open({str(marker)!r}, 'w').write('x')\nimport os\nos._exit(9)\n")
    r = run_cli(capsys, "lint", str(script))
    assert r.exit_code == 0 and not marker.exists()


def test_standard_input_is_linted_as_stdin() -> None:
    r = run_gpudoctor("lint", "-", input='import os\nos.environ["MASTER_PORT"] = "12355"\n', timeout=60)
    assert r.returncode == 0 and "<stdin>:2: WARN GD750" in r.stdout


def test_a_fifo_a_huge_file_and_a_deep_expression_are_findings_not_hangs_or_tracebacks(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "pipe.py")  # opening it for reading would wait for a writer
    (tmp_path / "huge.py").write_bytes(b"x = 1\n" * (1 << 20))  # 6 MiB
    (tmp_path / "deep.py").write_text("x = " + "+".join(["a"] * 200_000) + "\n")
    (tmp_path / "nul.py").write_bytes(b"x = 1\x00\n")
    (tmp_path / "lambdas.py").write_text("f = " + "lambda: " * 3000 + "1\n")  # the parser's MemoryError, wordless
    r = run_gpudoctor("lint", "--json", str(tmp_path), timeout=120)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    import json

    doc = json.loads(r.stdout)
    messages = {Path(c["name"]).name: c["findings"][0]["message"] for c in doc["checks"]}
    assert "is a FIFO, not a regular file" in messages["pipe.py"]
    assert "larger than 2 MiB" in messages["huge.py"]
    assert "RecursionError" in messages["deep.py"]
    assert "does not parse" in messages["nul.py"]
    assert "MemoryError: nested too deeply for Python's parser;" in messages["lambdas.py"]
    assert all(c["findings"][0]["code"] == "GD799" for c in doc["checks"])


def test_a_coding_line_is_honoured(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    script = tmp_path / "latin.py"
    script.write_bytes(b"# -*- coding: latin-1 -*-\n# caf\xe9\nimport os\nos.environ['MASTER_PORT'] = '1'\n")
    r = run_cli(capsys, "lint", "--json", str(script))
    assert [(f["code"], f["evidence"]["line"]) for f in r.findings()] == [("GD750", 4)]


def test_names_and_literals_from_the_file_never_reach_the_terminal_raw(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    script = tmp_path / "evil\x1b[2J.py"
    script.write_text('import os\nos.environ["MASTER_PORT"] = "\\x1b]0;owned\\x07\\n::error::x"\n')
    r = run_cli(capsys, "lint", str(script))
    assert "\x1b" not in r.out and "\x07" not in r.out and "\n::error::" not in r.out
    assert "GD750" in r.out


def test_junit_never_overwrites_a_linted_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("x = 1\n")
    r = run_cli(capsys, "lint", "--junit", str(script), str(script))
    assert r.exit_code == 2 and "would replace that input" in r.err
    assert script.read_text() == "x = 1\n"


def test_verbose_lists_clean_files_and_quiet_drops_hints(capsys: pytest.CaptureFixture[str]) -> None:
    verbose = run_cli(capsys, "lint", "-v", CLEAN, MULTIGPU).out
    assert f"{CLEAN}: clean" in verbose
    quiet = run_cli(capsys, "lint", "-q", CLEAN, MULTIGPU).out.splitlines()
    assert len(quiet) == 2 and quiet[0].startswith(f"{MULTIGPU}:20: WARN GD750")
