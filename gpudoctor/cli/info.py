"""`gpudoctor snapshot`, `gpudoctor list-checks` and `gpudoctor explain`: what gpudoctor records
and what its codes mean."""

from __future__ import annotations

import json
from pathlib import Path

import click

from gpudoctor.cli.options import FILE_NAME
from gpudoctor.errors import EXIT_UNAVAILABLE, EXIT_USAGE, UserError


@click.command("snapshot")
@click.option(
    "-o",
    "--output",
    type=FILE_NAME,
    metavar="FILE",
    help="Write to FILE instead of standard output (`-o -`: standard output, the Unix convention).",
)
@click.option("--force", is_flag=True, help="With -o: overwrite FILE if it already holds something.")
def snapshot_cmd(output: str | None, force: bool) -> None:
    """Record this machine's GPUs, host and allow-listed environment as JSON."""
    from gpudoctor import snapshot as snap
    from gpudoctor.probe import collect

    to_file = output not in (None, "-")
    if force and not to_file:
        raise UserError("--force goes with -o FILE (overwrite FILE)", EXIT_USAGE, "usage")
    if to_file:
        _refuse_overwrite(output, force)  # as `watch --record` does: a kept snapshot is evidence
    data = collect()
    if output in (None, "-"):  # a file named "-" is `-o ./-`
        click.echo(snap.dumps(data), nl=False)
        return
    try:
        snap.write(data, output)
    except OSError as exc:
        from gpudoctor.render.outputs import write_failure

        why = write_failure(exc, Path(output).parent)
        raise UserError(f"cannot write {output}: {why}", EXIT_UNAVAILABLE, "unavailable") from None
    click.echo(f"wrote {output} ({len(data.gpus)} GPU(s))", err=True)


def _refuse_overwrite(path: str, force: bool) -> None:
    """A regular file that holds something is replaced only with --force; an empty one, a FIFO or a
    device (/dev/stdout) are written as before; a link or a directory is refused when writing."""
    import stat

    from gpudoctor.safety.safe_io import check_target

    try:
        st = check_target(path)
    except OSError:
        return  # the write says why, in its own words
    if st is not None and stat.S_ISREG(st.st_mode) and st.st_size > 0 and not force:
        raise UserError(f"{path} exists; use --force to overwrite it, or -o another file", EXIT_USAGE, "usage")


@click.command("list-checks")
@click.option("--json", "as_json", is_flag=True, help="Print the list as JSON.")
def list_checks(as_json: bool) -> None:
    """List every finding code, sorted by code: the check (or command) that raises it and its title."""
    from gpudoctor.catalogue import code_rows
    from gpudoctor.render.text import TableSpec, make_console

    rows = code_rows()
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    # One table, columns as wide as their widest cell (check names run to 16 characters): rich's on
    # a terminal (the title wraps inside its column), aligned plain columns one line a code otherwise.
    table = {
        "columns": ["code", "check", "kind", "title"],
        "rows": [[r[k] for k in ("code", "check", "kind", "title")] for r in rows],
    }
    make_console().print(TableSpec(table))


@click.command()
@click.argument("code")
@click.option("--json", "as_json", is_flag=True, help="Print the explanation as one JSON document.")
def explain(code: str, as_json: bool) -> None:
    """Explain a finding code: what it checks, why it matters, how to fix it.

    CODE may also be a check name (`explain topology`), as --select takes: its codes are listed."""
    from gpudoctor.catalogue import explain_doc, explain_text, owner_doc, owner_text

    token = code.strip()
    by_code = token.upper().startswith("GD")
    if as_json:
        doc = explain_doc(token.upper()) if by_code else owner_doc(token)
        if doc is None:
            raise _unknown(code, by_code)
        click.echo(json.dumps(doc, indent=2))
        return
    text = explain_text(token.upper()) if by_code else owner_text(token)
    if text is None:
        raise _unknown(code, by_code)
    click.echo(text, nl=False)


def _unknown(code: str, by_code: bool) -> UserError:
    what = "finding code" if by_code else "finding code or check"
    from gpudoctor.errors import shown

    return UserError(f"unknown {what} {shown(code, 60)} (see `gpudoctor list-checks`)", EXIT_USAGE, "usage")
