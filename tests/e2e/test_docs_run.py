"""The code blocks of README.md and docs/ run (issue 24: a recipe without its imports, sample outputs
and line counts that were no longer what the commands print).

- A block marked `<!-- docs:output -->` is what its `$ commands` print, whole
  (scripts/gen_doc_outputs.py rewrites them).
- A Python block names nothing it does not define or import (ruff's undefined-name rule, the pinned
  ruff); one marked `<!-- docs:fragment -->` shows part of a program and must only parse.
- Every `gpudoctor ...` command line in a shell or plain block parses: its command and options
  exist and take the values shown (click itself reads them; nothing runs).
- A TOML block that sets gpudoctor keys is a policy gpudoctor reads.
"""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

import click
import pytest

from gpudoctor.cli.main import main as cli_main
from scripts.gen_doc_outputs import FRAGMENT_MARK, OUTPUT_MARK, Block, blocks, commands, documents, stale

ALL_BLOCKS = [b for path in documents() for b in blocks(path)]
SHELL = ("bash", "sh", "shell", "console", "")
OPERATORS = {"|", "||", "&&", ";", "&", ">", ">>", "<", "2>", "2>&1", "(", ")"}


def test_the_documents_have_blocks_of_every_kind() -> None:
    kinds = {b.lang for b in ALL_BLOCKS}
    assert {"python", "bash", "toml"} <= kinds
    assert sum(b.mark == OUTPUT_MARK for b in ALL_BLOCKS) >= 2  # README's sample and docs/gates.md's counts


def test_sample_outputs_are_what_the_commands_print() -> None:
    changed = stale()
    assert not changed, "stale sample output (run `python scripts/gen_doc_outputs.py`): " + ", ".join(
        f"{b.where} ({commands(b)[0]})" for b, _ in changed
    )


def test_the_generator_rewrites_a_stale_block_and_only_it(tmp_path: Path) -> None:
    from scripts import gen_doc_outputs as gen

    doc = tmp_path / "doc.md"
    doc.write_text(
        f"# t\n\n{OUTPUT_MARK}\n```console\n$ echo fresh\nold\n```\n\n```console\n$ echo untouched\nx\n```\n"
    )
    changes = gen.stale([doc])
    assert [(b.line, fresh) for b, fresh in changes] == [(4, ["$ echo fresh", "fresh"])]
    assert gen.write(changes) == 1
    assert doc.read_text().splitlines()[4:7] == ["$ echo fresh", "fresh", "```"]
    assert "$ echo untouched\nx\n" in doc.read_text() and gen.stale([doc]) == []


PYTHON = [b for b in ALL_BLOCKS if b.lang == "python"]


@pytest.mark.parametrize("block", PYTHON, ids=[b.where for b in PYTHON])
def test_python_blocks_name_what_they_use(block: Block) -> None:
    source = "\n".join(block.body) + "\n"
    if block.mark == FRAGMENT_MARK:
        compile(source + "    pass\n" if source.rstrip().endswith(":") else source, block.where, "exec")
        return
    ruff = Path(sys.executable).parent / "ruff"
    done = subprocess.run(
        [str(ruff), "check", "--isolated", "--select", "F821,F822,F823,E9", "--output-format", "concise", "-"],
        input=source,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, f"{block.where}: {done.stdout}{done.stderr}"


def invocations(block: Block) -> list[list[str]]:
    """The arguments of every `gpudoctor` command in a shell or plain block (synopses with [options]
    and lines with shell variables left out: they are not commands as written)."""
    text = "\n".join(line[2:] if line.startswith("$ ") else line for line in block.body)
    text = text.replace("\\\n", " ")
    out = []
    for line in text.splitlines():
        if "gpudoctor" not in line or line.startswith(("gpudoctor preflight:", "gpudoctor 0.", "  ")):
            continue
        lexer = shlex.shlex(line, posix=True, punctuation_chars="|&;<>()")
        lexer.whitespace_split = True
        lexer.commenters = "#"
        try:
            tokens = list(lexer)
        except ValueError:
            continue
        for i, tok in enumerate(tokens):
            if tok != "gpudoctor":
                continue
            args = []
            for t in tokens[i + 1 :]:
                if t in OPERATORS or set(t) <= set("|&;<>()"):
                    break
                args.append(t)
            if args and not any(a.startswith("[") or "$" in a or a == "..." for a in args):
                out.append(args)
    return out


COMMAND_LINES = [(b, args) for b in ALL_BLOCKS if b.lang in SHELL and b.mark != OUTPUT_MARK for args in invocations(b)]


def test_command_lines_are_found() -> None:
    assert len(COMMAND_LINES) > 30  # the docs show many: an extractor that finds none tests nothing


def _parse(group: click.Group, args: list[str], parent: click.Context | None = None) -> None:
    """Parse like the command line does, down to the subcommand; run nothing."""
    ctx = group.make_context(group.name or "gpudoctor", list(args), parent=parent)
    rest = [*ctx._protected_args, *ctx.args]
    if not rest:
        return
    name, cmd, rest = group.resolve_command(ctx, rest)
    assert cmd is not None, f"no command {name!r}"
    if isinstance(cmd, click.Group):
        _parse(cmd, rest, ctx)
    else:
        cmd.make_context(name or "", rest, parent=ctx)


@pytest.mark.parametrize(("block", "args"), COMMAND_LINES, ids=[f"{b.where} {' '.join(a)}" for b, a in COMMAND_LINES])
def test_gpudoctor_command_lines_in_the_docs_parse(block: Block, args: list[str]) -> None:
    try:
        _parse(cli_main, args)
    except click.exceptions.Exit:  # --help, --version: they parse
        pass
    except click.ClickException as exc:
        pytest.fail(f"{block.where}: `gpudoctor {' '.join(args)}`: {exc.format_message()}")


TOML = [b for b in ALL_BLOCKS if b.lang == "toml"]


@pytest.mark.parametrize("block", TOML, ids=[b.where for b in TOML])
def test_toml_blocks_are_policies_gpudoctor_reads(block: Block, tmp_path: Path) -> None:
    from gpudoctor import policy

    text = "\n".join(block.body) + "\n"
    name = "pyproject.toml" if "[tool.gpudoctor]" in text else "gpudoctor.toml"
    path = tmp_path / name
    path.write_text(text)
    loaded = policy.load(path)
    assert loaded.path is not None and loaded.to_json()["set"], f"{block.where}: the policy sets nothing"


def test_the_readme_test_command_carries_the_environment_the_tests_need() -> None:
    """.ci/run runs the README's block as written, with no environment of its own, so a reader who
    pastes it runs what CI runs (issue 24: OMP_NUM_THREADS was set by .ci/run only)."""
    from tests.paths import REPO

    readme = (REPO / "README.md").read_text().splitlines()
    at = readme.index("<!-- ci:test-command -->")
    (block,) = [b for b in blocks(REPO / "README.md") if b.line == at + 2]
    (command,) = block.body
    assert "OMP_NUM_THREADS=1 python -m pytest" in command
    ci = (REPO / ".ci" / "run").read_text()
    exported = [line for line in ci.splitlines() if line.startswith("export ")]
    assert exported == ["export PIP_DISABLE_PIP_VERSION_CHECK=1"], exported
