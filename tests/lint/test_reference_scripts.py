"""`gpudoctor lint` on real scripts nobody here wrote, against the oracle of
tests/reference/lint/expected.json (reasoned file by file in expected.md): every expected finding
at its line with its severity, nothing else; the clean scripts give no finding at all. Of the 24
upstream scripts (pytorch/examples, accelerate, pytorch/tutorials) 16 are clean and 8 carry one
true mistake each: those findings stand (docs/lint.md says why for each).

The small runtime reproductions in tests/reference/lint/repro/ are linted too, beside their logs:
what lint says of each script is what running it showed.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from gpudoctor.findings import Finding
from gpudoctor.lint import lint_paths
from gpudoctor.lint.codes import BY_CODE, BY_NAME
from tests.paths import REFERENCE

SCRIPTS = REFERENCE / "scripts"
REPRO = REFERENCE / "lint" / "repro"
ORACLE: dict[str, dict[str, Any]] = json.loads((REFERENCE / "lint" / "expected.json").read_text())
UPSTREAM = [p for p in ORACLE if not p.startswith("seeds/")]


def found(findings: list[Finding]) -> list[tuple[str, int, str]]:
    """(rule name, line, severity) of each finding."""
    out = []
    for f in findings:
        rule = BY_CODE[f.code].name
        out.append((rule, int(f.subject.rsplit(":", 1)[1]), f.evidence["severity"]))
    return sorted(out)


def expected(rel: str, launcher: str = "auto") -> list[tuple[str, int, str]]:
    out = []
    for f in ORACLE[rel]["findings"]:
        if "parse_error" in f:
            out.append(("script-unreadable", f["line"], "error"))
        elif f"--launcher {launcher}" in f.get("only_with", [f"--launcher {launcher}"]):
            severity = "error" if launcher == "torchrun" and f["rule"] == "master-port-hardcoded" else f["severity"]
            out.append((f["rule"], f["line"], severity))
    return sorted(out)


def test_the_oracle_covers_every_copied_script_and_names_real_rules() -> None:
    copied = {str(p.relative_to(SCRIPTS)) for p in SCRIPTS.rglob("*.py")}
    assert copied == set(ORACLE)
    for entry in ORACLE.values():
        for f in entry["findings"] + entry["must_not_flag"]:
            assert "parse_error" in f or f["rule"] in BY_NAME, f
    assert len(UPSTREAM) == 24


@pytest.mark.parametrize("rel", sorted(ORACLE))
def test_each_script_alone_gives_exactly_the_oracle(rel: str) -> None:
    findings = lint_paths([SCRIPTS / rel])
    assert found(findings) == expected(rel)
    for f in findings:
        assert f.subject == f"{SCRIPTS / rel}:{f.evidence['line']}"
        assert f.message and f.hint


@pytest.mark.parametrize("rel", sorted(ORACLE))
def test_no_trap_line_is_flagged_by_its_rule(rel: str) -> None:
    """The lines a naive detector flags (expected.md's N lines) stay silent for that rule."""
    flagged = {(rule, line) for rule, line, _ in found(lint_paths([SCRIPTS / rel]))}
    traps = {(t["rule"], t["line"]) for t in ORACLE[rel]["must_not_flag"]}
    assert not flagged & traps


def test_parse_errors_name_python_s_exception_and_line_and_the_repaired_copy_is_linted() -> None:
    for rel, entry in ORACLE.items():
        errors = [f for f in entry["findings"] if "parse_error" in f]
        if not errors:
            continue
        (f,) = lint_paths([SCRIPTS / rel])
        assert f.code == "GD799" and f.status.value == "error"
        assert errors[0]["parse_error"].split(":")[0] in f.message  # the exception class, not the wording
        assert f.evidence["line"] == errors[0]["line"]


def test_the_upstream_scripts_16_clean_8_with_one_true_mistake_each() -> None:
    per_file = {rel: lint_paths([SCRIPTS / rel]) for rel in UPSTREAM}
    clean = [rel for rel, fs in per_file.items() if not fs]
    flagged = {rel: [f.code for f in fs] for rel, fs in per_file.items() if fs}
    assert len(clean) == 16
    assert len(flagged) == 8 and all(len(codes) == 1 for codes in flagged.values())
    # The two confirmed upstream: minGPT's clip (pytorch/examples#1196, open) and ddp/example.py's device index.
    assert flagged["pytorch-examples/distributed/minGPT-ddp/mingpt/trainer.py"] == ["GD761"]
    assert flagged["pytorch-examples/distributed/ddp/example.py"] == ["GD753"]


def test_one_global_rank_source_is_one_finding_listing_its_other_device_choices() -> None:
    (f,) = lint_paths([SCRIPTS / "pytorch-examples/distributed/ddp/example.py"])
    assert f.evidence["line"] == 83 and f.evidence["related_lines"] == [38, 39, 46]
    assert f.evidence["source_line"] == 59 and "RANK" in f.message


def test_the_whole_corpus_linted_together_gives_the_same_findings_as_file_by_file() -> None:
    together = lint_paths([SCRIPTS])
    alone = [f for rel in sorted(ORACLE) for f in lint_paths([SCRIPTS / rel])]
    assert sorted((f.subject, f.code) for f in together) == sorted((f.subject, f.code) for f in alone)
    severities = [f.evidence["severity"] for f in together if f.code != "GD799"]
    assert (severities.count("error"), severities.count("warning"), severities.count("info")) == (4, 12, 4)
    assert sum(f.code == "GD799" for f in together) == 7


@pytest.mark.parametrize(
    "folder", ["pytorch-examples/distributed/minGPT-ddp/mingpt", "pytorch-examples/distributed/tensor_parallelism"]
)
def test_a_program_of_several_files_gives_the_same_results_together(folder: str) -> None:
    files = sorted((SCRIPTS / folder).glob("*.py"))
    together = found(lint_paths(files))
    alone = sorted(x for f in files for x in found(lint_paths([f])))
    assert together == alone


def test_the_seed_page_s_torchrun_advice_turns_its_spawn_script_into_three_findings() -> None:
    """Seed 004 tells readers to run its mp.spawn script with `torchrun --nproc_per_node=4`."""
    rel = "seeds/004_1.reindented.py"
    findings = lint_paths([SCRIPTS / rel], launcher="torchrun")
    assert found(findings) == expected(rel, "torchrun")
    assert ("spawn-under-torchrun", 51, "error") in found(findings)


@pytest.mark.parametrize(
    "rel, spawn_line",
    [
        ("pytorch-examples/distributed/ddp-tutorial-series/multigpu.py", 104),
        ("pytorch-tutorials/intermediate_source/ddp_tutorial/ddp_tutorial_spawn.py", 66),
        ("seeds/001_2.py", 68),
    ],
)
def test_an_mp_spawn_script_said_to_run_under_torchrun_is_an_error(rel: str, spawn_line: int) -> None:
    default = found(lint_paths([SCRIPTS / rel]))
    under = found(lint_paths([SCRIPTS / rel], launcher="torchrun"))
    assert ("spawn-under-torchrun", spawn_line, "error") in under
    assert not any(r == "spawn-under-torchrun" for r, _, _ in default)
    port = [x for x in under if x[0] == "master-port-hardcoded"]
    assert port and all(sev == "error" for _, _, sev in port)
    assert found(lint_paths([SCRIPTS / rel], launcher="spawn")) == default


def test_imagenet_s_flag_chosen_spawn_is_not_called_under_torchrun() -> None:
    """imagenet spawns only with --multiprocessing-distributed; under torchrun it does not."""
    findings = lint_paths([SCRIPTS / "pytorch-examples/imagenet/main.py"], launcher="torchrun")
    assert [f.code for f in findings] == ["GD759"]


# ---- the runtime reproductions: lint says what running them showed ----------------------------


def _log(name: str) -> str:
    return (REPRO / "logs" / f"{name}.log").read_text()


def test_a_torchrun_script_that_overwrites_master_port_hung_and_is_an_error() -> None:
    assert re.search(r"client socket has timed out", _log("torchrun_overwrites_port"))
    (f,) = lint_paths([REPRO / "torchrun_overwrites_port.py"])
    assert (f.code, f.evidence["line"], f.evidence["severity"]) == ("GD750", 3, "error")
    assert "init_process_group without rank or world_size" in f.message  # how lint knew it is torchrun's


def test_setdefault_joined_and_is_clean() -> None:
    assert "rank 0 joined" in _log("torchrun_setdefault_port") and "rank 1 joined" in _log("torchrun_setdefault_port")
    assert lint_paths([REPRO / "torchrun_setdefault_port.py"]) == []


def test_random_split_drew_two_splits_and_is_flagged() -> None:
    tests = re.findall(r"test=(\[[^\]]*\])", _log("split_per_rank"))
    assert len(tests) == 2 and tests[0] != tests[1]
    (f,) = lint_paths([REPRO / "split_per_rank.py"])
    assert (f.code, f.evidence["line"]) == ("GD756", 5)


def test_the_spawn_script_that_failed_under_torchrun_is_flagged() -> None:
    assert "ProcessRaisedException" in _log("spawn_under_torchrun")
    codes = {(f.code, f.evidence["line"]) for f in lint_paths([REPRO / "spawn_under_torchrun.py"], launcher="torchrun")}
    assert codes == {("GD750", 4), ("GD752", 9)}
    # without being told: its worker reads torchrun's RANK, which only torchrun sets
    auto = {(f.code, f.evidence["line"]) for f in lint_paths([REPRO / "spawn_under_torchrun.py"])}
    assert ("GD752", 9) in auto


def test_a_taken_port_failed_and_the_literal_store_port_is_flagged() -> None:
    assert "EADDRINUSE" in _log("port_in_use")
    lines = sorted(f.evidence["line"] for f in lint_paths([REPRO / "port_in_use.py"]) if f.code == "GD750")
    assert lines == [3, 4]


def test_a_world_size_lint_cannot_see_is_not_guessed() -> None:
    """world_size=2 in a one-process run timed out; a literal is not device_count(): no finding."""
    assert "1/2 clients joined" in _log("world_size_mismatch")
    assert lint_paths([REPRO / "world_size_mismatch.py"]) == []
