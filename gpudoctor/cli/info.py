"""`gpudoctor snapshot`, `gpudoctor list-checks` and `gpudoctor explain`: what gpudoctor records
and what its codes mean."""

from __future__ import annotations

import json

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
def snapshot_cmd(output: str | None) -> None:
    """Record this machine's GPUs, host and allow-listed environment as JSON."""
    from gpudoctor import snapshot as snap
    from gpudoctor.probe import collect

    data = collect()
    if output in (None, "-"):  # a file named "-" is `-o ./-`
        click.echo(snap.dumps(data), nl=False)
        return
    try:
        snap.write(data, output)
    except OSError as exc:
        raise UserError(f"cannot write {output}: {exc.strerror}", EXIT_UNAVAILABLE, "unavailable") from None
    click.echo(f"wrote {output} ({len(data.gpus)} GPU(s))", err=True)


@click.command("list-checks")
@click.option("--json", "as_json", is_flag=True, help="Print the list as JSON.")
def list_checks(as_json: bool) -> None:
    """List every finding code, sorted by code: the check (or command) that raises it and its title."""
    from gpudoctor.catalogue import code_rows

    rows = code_rows()
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    for r in rows:
        click.echo(f"{r['code']}  {r['check']:<14} {r['kind']:<6}  {r['title']}")


@click.command()
@click.argument("code")
@click.option("--json", "as_json", is_flag=True, help="Print the explanation as one JSON document.")
def explain(code: str, as_json: bool) -> None:
    """Explain a finding code: what it checks, why it matters, how to fix it."""
    from gpudoctor.catalogue import explain_doc, explain_text

    if as_json:
        doc = explain_doc(code.strip().upper())
        if doc is None:
            raise UserError(f"unknown finding code {code!r} (see `gpudoctor list-checks`)", EXIT_USAGE, "usage")
        click.echo(json.dumps(doc, indent=2))
        return
    text = explain_text(code.strip().upper())
    if text is None:
        raise UserError(f"unknown finding code {code!r} (see `gpudoctor list-checks`)", EXIT_USAGE, "usage")
    click.echo(text, nl=False)
