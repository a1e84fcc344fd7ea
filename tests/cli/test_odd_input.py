"""The CLI with odd input and odd terminals: empty option values, a FIFO or /dev/zero as the
snapshot, text its standard output cannot encode, and JUnit that XML cannot carry."""

from __future__ import annotations

import os
import re
import xml.etree.ElementTree as ET
from dataclasses import replace
from pathlib import Path

import pytest

from gpudoctor.snapshot import MAX_SNAPSHOT_BYTES
from tests.helpers.processes import GpudoctorCli, clean_env
from tests.helpers.snapshots import load, write_variant
from tests.paths import H100


def one_line(stderr: str) -> str:
    assert "Traceback" not in stderr and stderr.count("\n") == 1, stderr
    return stderr


@pytest.mark.parametrize(
    "args",
    [
        ["check", "--junit", "", "--snapshot", H100],
        ["check", "--select", "", "--snapshot", H100],
        ["check", "--select", ",", "--snapshot", H100],
        ["check", "--ignore", "", "--snapshot", H100],
        ["check", "--snapshot", ""],
        ["check", "--snapshot", "   "],
        ["snapshot", "-o", ""],
    ],
    ids=lambda a: " ".join(repr(x) if not x.strip(" ,") else x for x in a if x != H100),
)
def test_an_empty_option_value_is_a_usage_error(args: list[str], gpudoctor_cli: GpudoctorCli) -> None:
    out = gpudoctor_cli(*args)
    assert out.returncode == 2
    assert "needs " in one_line(out.stderr) and "--help" in out.stderr


def test_a_fifo_as_the_snapshot_is_refused_without_waiting(tmp_path: Path, gpudoctor_cli: GpudoctorCli) -> None:
    fifo = tmp_path / "snap.json"
    os.mkfifo(fifo)
    out = gpudoctor_cli("check", "--snapshot", str(fifo), timeout=20)  # used to wait for a writer forever
    assert out.returncode == 2
    assert one_line(out.stderr) == f"gpudoctor: cannot use snapshot {fifo}: is a FIFO, not a regular file\n"


def test_dev_zero_as_the_snapshot_is_refused_without_reading_it(gpudoctor_cli: GpudoctorCli) -> None:
    out = gpudoctor_cli("check", "--snapshot", "/dev/zero", timeout=20)  # used to grow without bound
    assert out.returncode == 2
    assert one_line(out.stderr) == "gpudoctor: cannot use snapshot /dev/zero: is a device, not a regular file\n"


@pytest.mark.parametrize("option", ["--baseline", "--config"])
def test_a_fifo_or_device_as_a_baseline_or_policy_is_refused_without_waiting(
    tmp_path: Path, option: str, gpudoctor_cli: GpudoctorCli
) -> None:
    fifo = tmp_path / "named.json"
    os.mkfifo(fifo)
    for path, kind in ((fifo, "a FIFO"), ("/dev/zero", "a device")):
        out = gpudoctor_cli("check", "--snapshot", H100, option, str(path), timeout=20)
        assert out.returncode == 2
        assert one_line(out.stderr).endswith(f"{path}: is {kind}, not a regular file\n")


def test_a_snapshot_larger_than_the_cap_is_refused(tmp_path: Path, gpudoctor_cli: GpudoctorCli) -> None:
    big = tmp_path / "big.json"
    with open(big, "wb") as f:
        f.truncate(MAX_SNAPSHOT_BYTES + 1)  # sparse: no disk used
    out = gpudoctor_cli("check", "--snapshot", str(big))
    assert out.returncode == 2
    assert one_line(out.stderr) == f"gpudoctor: cannot use snapshot {big}: is larger than 32 MiB\n"


def _named(tmp_path: Path, hostname: str, gpu_name: str | None = None) -> str:
    s = load("h100_sxm_8x")
    s = replace(s, host=replace(s.host, hostname=hostname))
    if gpu_name is not None:
        s = replace(s, gpus=[replace(g, name=gpu_name) if g.index == 0 else g for g in s.gpus])
    return write_variant(tmp_path, s)


def test_a_lone_surrogate_in_a_snapshot_prints_as_a_replacement(tmp_path: Path, gpudoctor_cli: GpudoctorCli) -> None:
    path = _named(tmp_path, "node-\udcff", gpu_name="NVIDIA H100 80GB HBM3\ud800")
    assert "\\udcff" in Path(path).read_text()  # JSON escapes it; loading gives a lone surrogate back
    out = gpudoctor_cli("check", "--snapshot", path, "-v", env=clean_env(PYTHONIOENCODING="utf-8"))
    assert out.returncode == 1, out.stderr  # GD301: GPU 0's name differs; never 3 for standard output
    assert "cannot write" not in out.stderr and "GPU 0 is an NVIDIA H100 80GB HBM3?" in out.stdout


def test_non_ascii_text_on_an_ascii_terminal(tmp_path: Path, gpudoctor_cli: GpudoctorCli) -> None:
    path = _named(tmp_path, "grüne-maschine", gpu_name="NVIDIA H100 80GB HBM3 (grün)")
    env = clean_env(PYTHONIOENCODING="ascii", LANG="C", LC_ALL="C")
    out = gpudoctor_cli("check", "--snapshot", path, "--json", env=env)
    assert out.returncode == 1 and '"hostname": "gr\\u00fcne-maschine"' in out.stdout
    text = gpudoctor_cli("check", "--snapshot", path, "-v", env=env)
    assert text.returncode == 1, text.stderr  # the verdict (GD301), not 3 for standard output
    assert "cannot write" not in text.stderr and "NVIDIA H100 80GB HBM3 (gr?n)" in text.stdout


@pytest.mark.parametrize("color", ["never", "always"])
def test_machine_text_with_newlines_cannot_start_a_ci_workflow_command(
    tmp_path: Path, color: str, gpudoctor_cli: GpudoctorCli
) -> None:
    # A CI runner executes `::add-mask::`/`::error::` at the start of a stdout line; an env value or
    # a GPU name with a newline must not start such a line in the text report.
    s = load("h100_sxm_8x")
    env = {**s.env, "NCCL_ALGO": "ring\n::add-mask::secret", "NCCL_SOCKET_IFNAME": "eth\r\n::error title=x::pwned"}
    s = replace(s, env=env, gpus=[replace(g, name=g.name + "\n::warning::x") if g.index == 1 else g for g in s.gpus])
    out = gpudoctor_cli("check", "--snapshot", write_variant(tmp_path, s), "-vv", "--color", color)
    assert out.returncode == 1, out.stderr
    lines = re.sub(r"\x1b\[[0-9;]*m", "", out.stdout).splitlines()  # styles aside (--color always)
    assert [line for line in lines if line.startswith("::")] == []
    assert "ring\\n::add-mask::secret" in out.stdout  # shown, escaped, so the user sees what is set


def test_junit_from_a_snapshot_with_control_characters_parses(tmp_path: Path, gpudoctor_cli: GpudoctorCli) -> None:
    path = _named(tmp_path, "node\x1b[31m", gpu_name="NVIDIA H100 80GB HBM3\x00\ud800")
    junit = tmp_path / "out.xml"
    out = gpudoctor_cli("check", "--snapshot", path, "--junit", str(junit))
    assert out.returncode == 1, out.stderr
    root = ET.fromstring(junit.read_bytes())  # expat: rejects any character XML 1.0 cannot carry
    messages = [f.get("message", "") for f in root.iter("failure")]
    assert any("NVIDIA H100 80GB HBM3\ufffd\ufffd" in m for m in messages), messages


def test_a_fifo_swapped_for_a_hard_link_before_opening_is_not_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The race safe_io leaves no room for: lstat saw a FIFO, open finds a link to someone's file."""
    from gpudoctor.safety import safe_io

    victim = tmp_path / "victim"
    victim.write_text("someone else's data\n")
    out = tmp_path / "report.xml"
    os.link(victim, out)  # what the path became after lstat
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    monkeypatch.setattr(safe_io, "check_target", lambda path: os.lstat(fifo))  # what lstat saw
    with pytest.raises(OSError, match="replaced while being opened"):
        safe_io.write_text(out, "<testsuites/>\n")
    assert victim.read_text() == "someone else's data\n"


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["explain", "9" * 100_000], "unknown finding code or check '99999"),
        (["watch", "--no-tui", "--", ""], "command not executable: ''"),
    ],
    ids=["explain-100k", "watch-empty-command"],
)
def test_an_odd_argument_is_quoted_short_in_its_one_line(
    args: list[str], said: str, gpudoctor_cli: GpudoctorCli
) -> None:
    """Hostile review L6: explain echoed a 100 KB argument whole; `watch -- ''` named no command."""
    out = gpudoctor_cli(*args)
    assert out.returncode == 2
    line = one_line(out.stderr)
    assert said in line and len(line) < 300, line[:400]


def test_a_snapshot_into_proc_says_why_it_cannot_be_written(gpudoctor_cli: GpudoctorCli) -> None:
    """Hostile review L3: `snapshot -o /proc/version` said "No such file or directory" of a file that exists."""
    out = gpudoctor_cli("snapshot", "-o", "/proc/version")
    assert out.returncode == 3
    assert "the directory /proc does not take new files" in one_line(out.stderr)


def test_an_output_never_replaces_a_file_it_did_not_write(tmp_path: Path, gpudoctor_cli: GpudoctorCli) -> None:
    """Hostile review M8: `--junit evidence.json` replaced a kept snapshot. A report of the last run is replaced."""
    evidence = tmp_path / "evidence.json"
    evidence.write_text(Path(H100).read_text())
    out = gpudoctor_cli("check", "--snapshot", H100, "--junit", str(evidence), "-q")
    assert out.returncode == 2 and "is not a JUnit file gpudoctor wrote" in one_line(out.stderr)
    assert evidence.read_text() == Path(H100).read_text()
    junit, prom = tmp_path / "r.xml", tmp_path / "r.prom"
    for _ in range(2):  # the second run replaces what the first wrote
        out = gpudoctor_cli("check", "--snapshot", H100, "--junit", str(junit), "--prometheus", str(prom), "-q")
        assert out.returncode == 0, out.stderr
    ET.parse(junit)
    assert prom.read_text().startswith("# HELP gpudoctor_")
