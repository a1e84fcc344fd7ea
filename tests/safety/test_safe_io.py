"""gpudoctor.safety.safe_io: what a hostile user on a shared machine can plant at an output path does not
make gpudoctor (often root) overwrite another file, and a failed write never loses the old file."""

from __future__ import annotations

import errno
import os
import stat
import sys
import threading
from pathlib import Path

import pytest

from gpudoctor.safety import safe_io
from tests.helpers.processes import GpudoctorCli, clean_env
from tests.paths import H100


def test_a_planted_symlink_is_refused_and_its_target_keeps_its_content(tmp_path: Path) -> None:
    victim = tmp_path / "shadow"
    victim.write_text("root:x:0:0")
    (tmp_path / "report.json").symlink_to(victim)
    for write in (lambda p: safe_io.write_text(p, "{}"), safe_io.open_stream):
        with pytest.raises(OSError, match="symbolic link"):
            write(tmp_path / "report.json")
    assert victim.read_text() == "root:x:0:0"
    assert (tmp_path / "report.json").is_symlink()


def test_the_old_predictable_temp_name_planted_as_a_link_is_never_followed(tmp_path: Path) -> None:
    # The first version wrote `.<name>.tmp` through a plain open: a link planted there redirected it.
    victim = tmp_path / "victim"
    victim.write_text("keep")
    (tmp_path / ".report.json.tmp").symlink_to(victim)
    safe_io.write_text(tmp_path / "report.json", '{"ok": true}')
    assert victim.read_text() == "keep"
    assert (tmp_path / "report.json").read_text() == '{"ok": true}'


@pytest.mark.parametrize("how", ["whole", "stream"])
def test_a_hard_link_at_the_path_is_replaced_not_written_through(tmp_path: Path, how: str) -> None:
    victim = tmp_path / "victim"
    victim.write_text("keep")
    os.link(victim, tmp_path / "out")
    if how == "whole":
        safe_io.write_text(tmp_path / "out", "new")
    else:
        with safe_io.open_stream(tmp_path / "out") as f:
            f.write("new")
    assert victim.read_text() == "keep"
    assert (tmp_path / "out").read_text() == "new"
    assert os.stat(tmp_path / "out").st_ino != os.stat(victim).st_ino


def test_a_write_that_fails_keeps_the_old_file_and_leaves_no_temporary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "snapshot.json"
    out.write_text("old")

    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(safe_io.os, "fsync", full)  # the disk fills as the new file is written
    with pytest.raises(OSError, match="No space"):
        safe_io.write_text(out, "new")
    assert out.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["snapshot.json"]


def test_new_files_get_the_shell_mode_and_replaced_files_keep_theirs(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        safe_io.write_text(tmp_path / "new", "x")
        assert stat.S_IMODE(os.stat(tmp_path / "new").st_mode) == 0o644
        (tmp_path / "private").write_text("x")
        os.chmod(tmp_path / "private", 0o600)
        safe_io.write_text(tmp_path / "private", "y")
        assert stat.S_IMODE(os.stat(tmp_path / "private").st_mode) == 0o600
    finally:
        os.umask(old)


def test_a_directory_is_refused(tmp_path: Path) -> None:
    with pytest.raises(IsADirectoryError):
        safe_io.write_text(tmp_path, "x")


def test_a_fifo_and_dev_null_are_written_in_place(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got: list[str] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_text()))
    reader.start()
    safe_io.write_text(fifo, "through the pipe")
    reader.join(timeout=10)
    assert got == ["through the pipe"] and fifo.is_fifo()
    safe_io.write_text("/dev/null", "discarded")  # a character device: no temp file beside it in /dev
    with safe_io.open_stream("/dev/null") as f:
        f.write("discarded")


def test_a_stream_is_in_place_from_its_first_line(tmp_path: Path) -> None:
    out = tmp_path / "run.jsonl"
    with safe_io.open_stream(out) as f:
        f.write("line 1\n")
        f.flush()
        assert out.read_text() == "line 1\n"  # readable while being written (report on a live recording)
    assert [p.name for p in tmp_path.iterdir()] == ["run.jsonl"]


@pytest.mark.parametrize(
    "args",
    [
        ("snapshot", "-o", "{out}"),
        ("check", "--snapshot", H100, "--junit", "{out}"),
    ],
    ids=["snapshot -o", "check --junit"],
)
def test_every_output_option_refuses_a_planted_link_with_one_line(
    tmp_path: Path, args: tuple[str, ...], gpudoctor_cli: GpudoctorCli
) -> None:
    victim = tmp_path / "victim"
    victim.write_text("keep")
    (tmp_path / "out").symlink_to(victim)
    r = gpudoctor_cli(*(a.replace("{out}", str(tmp_path / "out")) for a in args))
    assert r.returncode == 3, r.stderr
    assert r.stderr.count("\n") == 1 and "symbolic link" in r.stderr
    assert victim.read_text() == "keep"


def test_watch_record_refuses_a_planted_link_before_the_job_starts(tmp_path: Path, gpudoctor_cli: GpudoctorCli) -> None:
    victim = tmp_path / "victim"
    victim.write_text("keep")
    (tmp_path / "run.jsonl").symlink_to(victim)
    marker = tmp_path / "started"
    r = gpudoctor_cli(
        "watch",
        "--no-tui",
        "--record",
        str(tmp_path / "run.jsonl"),
        "--",
        sys.executable,
        "-c",
        f"open({str(marker)!r}, 'w')",
        env=clean_env(GPUDOCTOR_WATCH_FAKE="healthy:2"),
    )
    assert r.returncode == 3 and "symbolic link" in r.stderr and r.stderr.count("\n") == 1
    assert not marker.exists() and victim.read_text() == "keep"


def test_a_fifo_nobody_reads_is_refused_not_waited_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, gpudoctor_cli: GpudoctorCli
) -> None:
    # A FIFO planted at the report path must not hang a CI job (or root's cron) forever.
    fifo = tmp_path / "report.xml"
    os.mkfifo(fifo)
    monkeypatch.setattr(safe_io, "FIFO_READER_GRACE_S", 0.1)
    with pytest.raises(OSError, match="nothing reads"):
        safe_io.write_text(fifo, "<testsuites/>")
    with pytest.raises(OSError, match="nothing reads"):
        safe_io.open_stream(fifo)
    r = gpudoctor_cli("check", "--snapshot", H100, "--junit", str(fifo))
    assert r.returncode == 3 and "nothing reads" in r.stderr


NOBODY = 65534
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user needs root")


@as_root
def test_a_file_another_user_planted_does_not_lend_its_mode_to_ours(tmp_path: Path) -> None:
    # Another user's `chmod 6777` file at the path: root's report must not come out set-id and world-writable.
    old = os.umask(0o022)
    try:
        planted = tmp_path / "report.xml"
        planted.write_text("planted")
        os.chown(planted, NOBODY, NOBODY)
        os.chmod(planted, 0o6777)
        safe_io.write_text(planted, "<testsuites/>")
        st = os.stat(planted)
        assert (stat.S_IMODE(st.st_mode), st.st_uid) == (0o644, os.geteuid())
        mine = tmp_path / "mine"
        mine.write_text("x")
        os.chmod(mine, 0o4755)
        safe_io.write_text(mine, "y")
        assert stat.S_IMODE(os.stat(mine).st_mode) == 0o755, "our own file keeps its mode, never set-id"
    finally:
        os.umask(old)


@as_root
def test_a_fifo_another_user_planted_in_a_shared_directory_is_refused(tmp_path: Path) -> None:
    shared = tmp_path / "scratch"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    fifo = shared / "report.xml"
    os.mkfifo(fifo, 0o622)
    os.chown(fifo, NOBODY, NOBODY)
    got: list[str] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_text()), daemon=True)
    reader.start()  # the planter listening: nothing may reach it
    with pytest.raises(PermissionError, match="FIFO owned by user nobody in a directory other users can write"):
        safe_io.write_text(fifo, "secret report")
    with pytest.raises(PermissionError):
        safe_io.open_stream(fifo)
    os.chmod(shared, 0o755)  # the same FIFO in a directory only its owner writes: the user's own choice
    safe_io.write_text(fifo, "report")
    reader.join(timeout=10)
    assert got == ["report"]


@as_root
def test_a_fifo_planted_in_a_group_writable_directory_is_refused_and_a_replaced_file_keeps_its_group(
    tmp_path: Path,
) -> None:
    # fs.protected_fifos=2 covers group-writable sticky directories (shared project directories).
    project = tmp_path / "project"
    project.mkdir()
    os.chmod(project, 0o1770)
    fifo = project / "report.xml"
    os.mkfifo(fifo)
    os.chown(fifo, NOBODY, NOBODY)
    with pytest.raises(PermissionError, match="FIFO owned by user nobody"):
        safe_io.write_text(fifo, "report")
    # Replacing one's own 0640 file of another group: that group can still read the new one.
    shared = tmp_path / "shared.json"
    shared.write_text("old")
    os.chown(shared, -1, NOBODY)
    os.chmod(shared, 0o640)
    safe_io.write_text(shared, "new")
    st = os.stat(shared)
    assert (st.st_gid, stat.S_IMODE(st.st_mode)) == (NOBODY, 0o640)
