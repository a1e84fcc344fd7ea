"""`check --quick --snapshot` imports what it uses and nothing else (start-up is CI's wait; the
figure itself is measured by benchmarks/check_quick.py, not here)."""

from __future__ import annotations

import subprocess
import sys

from tests.helpers.processes import GpudoctorCli
from tests.helpers.snapshots import fixture
from tests.paths import REPO

PROBE = (
    "import atexit, sys\n"
    "atexit.register(lambda: sys.stderr.write('MODULES ' + ' '.join(sorted(sys.modules)) + '\\n'))\n"
    "sys.argv[0] = 'gpudoctor'\n"
    "from gpudoctor.__main__ import main\n"
    "main()\n"
)
# Not needed to judge a recorded snapshot: the dashboard, the launcher's process machinery, the
# temp-file machinery of writers, rich (JSON output), the JSON schema reader.
NOT_ON_THE_JSON_PATH = [
    "torch",
    "textual",
    "numpy",
    "rich",
    "gpudoctor.cli.watch",
    "gpudoctor.cli.bench",
    "gpudoctor.probe.machine",
    "psutil",
    "subprocess",
    "tempfile",
    "shutil",
    "importlib.resources",
]


def modules(*args: str) -> set[str]:
    p = subprocess.run(
        [sys.executable, "-c", PROBE, *args], capture_output=True, text=True, cwd=REPO, timeout=60, check=False
    )
    line = next(ln for ln in p.stderr.splitlines() if ln.startswith("MODULES "))
    return set(line.split()[1:])


def test_check_quick_json_on_a_snapshot_imports_only_what_it_uses() -> None:
    loaded = modules("check", "--quick", "--snapshot", str(fixture("h100_sxm_8x")), "--json")
    assert "gpudoctor.checks.topology" in loaded  # the probe itself works
    assert sorted(m for m in NOT_ON_THE_JSON_PATH if m in loaded) == []


def test_the_piped_text_report_needs_no_rich_and_color_always_does() -> None:
    snapshot = str(fixture("h100_sxm_8x"))
    piped = modules("check", "--quick", "--snapshot", snapshot)
    assert "gpudoctor.render.text" in piped
    assert sorted(m for m in ("rich", "textual", "torch", "gpudoctor.cli.watch", "subprocess") if m in piped) == []
    assert "rich.console" in modules("check", "--quick", "--snapshot", snapshot, "--color", "always")


def test_subcommands_load_when_named(gpudoctor_cli: GpudoctorCli) -> None:
    assert "gpudoctor.cli.watch" in modules("watch", "--help")
    assert "gpudoctor.cli.bench" in modules("bench", "--help")
    help_text = gpudoctor_cli("--help").stdout
    for name in ("bench", "check", "explain", "list-checks", "report", "snapshot", "watch"):
        assert f"  {name} " in help_text
