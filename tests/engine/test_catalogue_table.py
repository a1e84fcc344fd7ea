"""The catalogue's table (gpudoctor/catalogue_table.py) says what importing every module registers,
and start-up imports only the check modules a command needs (issue 22)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from gpudoctor import catalogue as cat
from tests.paths import FIXTURES, REPO


def test_the_table_is_what_the_generator_writes_from_the_modules() -> None:
    gen = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "gen_catalogue.py"), "--check"], capture_output=True, text=True
    )
    assert gen.returncode == 0, gen.stderr


def test_the_registry_from_the_table_is_the_one_the_modules_build() -> None:
    table, modules = cat.catalogue(), cat.assembled()

    def shape(reg: object) -> object:
        return [
            (c.name, c.title, c.level, c.active, c.needs, c.shares, c.wanted is None, c.code_ids)
            for c in reg.checks.values()  # type: ignore[attr-defined]
        ]

    assert shape(table) == shape(modules)
    assert list(table.codes) == list(modules.codes)
    assert table.owner == modules.owner and table.outside == modules.outside
    assert table.runs.keys() == modules.runs.keys()
    for code, real in modules.codes.items():
        listed = table.codes[code]
        assert (listed.code, listed.name, listed.title, listed.what, listed.why, listed.fix) == (
            real.code,
            real.name,
            real.title,
            real.what,
            real.why,
            real.fix,
        )
        assert listed == real


# Imported by every command that runs checks or lists them: no active or deep check, no comparison,
# no watch or lint code, unless the command needs it.
PROBE = """
import sys
sys.argv[0] = "gpudoctor"
from gpudoctor.cli.main import run
try:
    run(sys.argv[1:])
finally:
    print(sorted(m for m in sys.modules if m.startswith("gpudoctor")), file=sys.stderr)
"""


def _imported(*argv: str) -> list[str]:
    p = subprocess.run([sys.executable, "-c", PROBE, *argv], capture_output=True, text=True, cwd=REPO)
    return eval(p.stderr.strip().splitlines()[-1])  # noqa: S307  (our own list's repr)


HEAVY = ("gpudoctor.checks.active.", "gpudoctor.checks.deep.", "gpudoctor.compare", "gpudoctor.watch", "gpudoctor.lint")


@pytest.mark.parametrize(
    "argv",
    [
        ("check", "--quick", "--snapshot", str(FIXTURES / "h100_sxm_8x.json"), "--json"),
        ("list-checks",),
        ("explain", "GD401"),
    ],
    ids=["check --quick", "list-checks", "explain"],
)
def test_start_up_imports_no_check_module_it_does_not_run(argv: tuple[str, ...]) -> None:
    imported = _imported(*argv)
    assert "gpudoctor.catalogue" in imported
    assert [m for m in imported if m.startswith(HEAVY)] == []
    checks = [m for m in imported if m.startswith("gpudoctor.checks.")]
    if argv[0] == "list-checks":
        assert checks == []
    elif argv[0] == "explain":  # GD401's module (and what it imports), no other check's
        assert "gpudoctor.checks.topology" in checks and "gpudoctor.checks.identity" not in checks


def test_a_baseline_still_brings_the_comparison() -> None:
    report = str(FIXTURES / "h100_sxm_8x.json")
    imported = _imported("check", "--quick", "--snapshot", report, "--baseline", report, "--json")
    assert "gpudoctor.compare.rules" in imported
