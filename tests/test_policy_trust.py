"""A policy file someone else could have written never decides (policy.py, tests/reference/policy-trust.md).

Discovery skips, with one line on stderr and an entry in the report's policy block, a file not
owned by the caller or root, a file its group or others can write, and a file in a world-writable
directory; the walk goes on above it. `--config FILE` is refused (exit 2) when others can write
the file, or when it is owned by neither the caller nor root and its group can write it or it
lies in a world-writable directory.

The planted policy of the review: `ignore = ["GD1"]` in /tmp turns a machine without a driver
READY. The tests plant it for real: a directory with mode 1777 (what /tmp and /scratch are) and,
where the tests run as root, a file owned by nobody (uid 65534).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpudoctor import policy as pol
from tests.helpers.cli import run_cli
from tests.helpers.files import write
from tests.helpers.snapshots import fixture
from tests.paths import H100

NO_DRIVER = str(fixture("no_driver"))  # GD101 fails: NOT READY (exit 1) unless GD1 is ignored
PLANTED = 'ignore = ["GD1"]\n'
NOBODY = 65534

as_root = pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user needs root")


@pytest.fixture
def scratch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """/scratch: a world-writable, sticky directory with a job directory of the caller's inside."""
    shared = tmp_path / "scratch"
    shared.mkdir()
    shared.chmod(0o1777)
    (shared / "job").mkdir(mode=0o755)
    monkeypatch.chdir(shared / "job")
    return shared


def ignored_line(err: str, path: Path) -> str:
    lines = [line for line in err.splitlines() if f"policy file {path} ignored" in line]
    assert len(lines) == 1, err
    return lines[0]


@as_root
def test_a_file_planted_in_a_world_writable_directory_does_not_make_a_machine_ready(
    scratch: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    planted = write(scratch / "gpudoctor.toml", PLANTED, owner=NOBODY)
    r = run_cli(capsys, "check", "--snapshot", NO_DRIVER, "--json")
    assert r.exit_code == 1 and r.one("GD101")["status"] == "fail"  # what it would be without a policy
    line = ignored_line(r.err, planted)
    assert line.startswith("gpudoctor: warning: ") and "world-writable directory" in line and "user nobody" in line
    assert r.doc["policy"]["path"] is None
    assert r.doc["policy"]["skipped"] == [{"path": str(planted), "reason": line.split(" ignored: ", 1)[1]}]
    text = run_cli(capsys, "check", "--snapshot", NO_DRIVER)
    assert text.exit_code == 1 and "NOT READY" in text.out
    assert f"(no policy: {planted} ignored)" in text.out.splitlines()[0] and "None" not in text.out.splitlines()[0]


def test_even_the_callers_own_file_in_a_world_writable_directory_is_skipped(
    scratch: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A sticky /tmp keeps others from replacing it, not from having put it there before the caller.
    planted = write(scratch / "gpudoctor.toml", PLANTED)
    r = run_cli(capsys, "check", "--snapshot", NO_DRIVER, "--json")
    assert r.exit_code == 1
    assert f"lies in the world-writable directory {scratch}" in ignored_line(r.err, planted)


@pytest.mark.parametrize(("mode", "words"), [(0o664, "its group can write it"), (0o646, "every user can write it")])
def test_a_file_others_can_write_is_skipped_and_the_walk_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], mode: int, words: str
) -> None:
    team = write(tmp_path / "repo" / "gpudoctor.toml", "expect-gpus = 8\n")
    loose = write(tmp_path / "repo" / "sub" / "gpudoctor.toml", PLANTED, mode=mode)
    monkeypatch.chdir(loose.parent)
    r = run_cli(capsys, "check", "--snapshot", H100, "--json")
    assert words in ignored_line(r.err, loose) and f"mode {mode:04o}" in r.err
    assert r.doc["policy"]["path"] == str(team.resolve())  # the next file up is the policy
    assert r.doc["policy"]["set"] == {"expect_gpus": 8}
    assert r.doc["policy"]["skipped"][0]["path"] == str(loose)


@as_root
def test_a_file_owned_by_another_user_is_skipped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    other = write(tmp_path / "alice" / "gpudoctor.toml", PLANTED, owner=NOBODY)
    monkeypatch.chdir(other.parent)
    r = run_cli(capsys, "check", "--snapshot", NO_DRIVER, "--json")
    assert r.exit_code == 1
    assert "owned by user nobody, not by you or root" in ignored_line(r.err, other)


def test_a_link_to_a_file_in_a_world_writable_directory_is_skipped(
    scratch: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    target = write(scratch / "shared.toml", PLANTED)
    (tmp_path / "repo").mkdir()
    (tmp_path / "repo" / "gpudoctor.toml").symlink_to(target)
    monkeypatch.chdir(tmp_path / "repo")
    r = run_cli(capsys, "check", "--snapshot", NO_DRIVER, "--json")
    assert r.exit_code == 1 and "world-writable directory" in r.err


def test_the_python_api_says_so_on_stderr_and_in_the_report(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import gpudoctor

    loose = write(tmp_path / "gpudoctor.toml", PLANTED, mode=0o666)
    monkeypatch.chdir(tmp_path)
    report = gpudoctor.run_checks(snapshot=NO_DRIVER)
    assert report.exit_code == 1 and report.policy is not None and report.policy["path"] is None
    assert str(loose) in capsys.readouterr().err


def test_a_trusted_file_is_read_once_and_found_as_before(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write(tmp_path / "gpudoctor.toml", "expect-gpus = 4\n", mode=0o600)
    monkeypatch.chdir(tmp_path)
    found = pol.find()
    assert found.path == path and found.skipped == () and found.text == "expect-gpus = 4\n"
    assert pol.load().to_json() == {"path": str(path), "set": {"expect_gpus": 4}}


# --- --config FILE: the user's choice, unless anyone could have written the file --------------


def test_config_refuses_a_file_every_user_can_write(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path / "p.toml", "expect-gpus = 8\n", mode=0o666)
    r = run_cli(capsys, "check", "--snapshot", H100, "--config", str(path))
    assert r.exit_code == 2 and r.out == "" and r.err.count("\n") == 1
    assert r.err.startswith(f"gpudoctor: policy file {path}: refused: every user can write it (mode 0666")


def test_config_takes_the_callers_own_group_writable_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # umask 002 is common on shared clusters: the caller chose to let the group write it.
    path = write(tmp_path / "p.toml", "expect-gpus = 8\n", mode=0o664)
    r = run_cli(capsys, "check", "--snapshot", H100, "--json", "--config", str(path))
    assert r.exit_code == 0 and r.doc["policy"]["path"] == str(path)


@as_root
def test_config_takes_another_users_read_only_file_and_refuses_their_group_writable_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    team = write(tmp_path / "team" / "gpudoctor.toml", "expect-gpus = 8\n", owner=NOBODY)
    assert run_cli(capsys, "check", "--snapshot", H100, "--config", str(team)).exit_code == 0
    team.chmod(0o664)
    r = run_cli(capsys, "check", "--snapshot", H100, "--config", str(team))
    assert r.exit_code == 2 and "owned by user nobody, its group can write it" in r.err


@as_root
def test_config_refuses_another_users_file_in_a_world_writable_directory(
    scratch: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    planted = write(scratch / "gpudoctor.toml", PLANTED, owner=NOBODY)
    r = run_cli(capsys, "check", "--snapshot", NO_DRIVER, "--config", str(planted))
    assert r.exit_code == 2 and "world-writable directory" in r.err and "user nobody" in r.err
    mine = write(scratch / "mine.toml", 'ignore = ["GD3"]\n')  # the caller's own: named on purpose
    assert run_cli(capsys, "check", "--snapshot", NO_DRIVER, "--config", str(mine)).exit_code == 1


# --- links and folders on the way (git's safe.directory) --------------------------------------


@as_root
def test_a_link_another_user_planted_in_their_own_folder_is_not_followed_to_a_lax_policy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The review's attack: root runs the check in another user's project, where that user linked
    gpudoctor.toml to a root-owned policy written for something else (`ignore = ["GD1"]`)."""
    lax = write(tmp_path / "site" / "lax.toml", PLANTED)  # root's, mode 0644, in a root folder
    project = tmp_path / "mallory" / "project"
    project.mkdir(parents=True)
    link = project / "gpudoctor.toml"
    link.symlink_to(lax)
    for path in (tmp_path / "mallory", project):
        os.chown(path, NOBODY, NOBODY)
    os.lchown(link, NOBODY, NOBODY)
    monkeypatch.chdir(project)
    r = run_cli(capsys, "check", "--snapshot", NO_DRIVER, "--json")
    assert r.exit_code == 1 and r.one("GD101")["status"] == "fail"
    assert f"reached through {tmp_path / 'mallory'}, owned by user nobody" in ignored_line(r.err, link)


@as_root
def test_a_link_owned_by_another_user_in_a_root_folder_is_not_followed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    lax = write(tmp_path / "site" / "lax.toml", PLANTED)
    (tmp_path / "job").mkdir()
    link = tmp_path / "job" / "gpudoctor.toml"
    link.symlink_to(lax)
    os.lchown(link, NOBODY, NOBODY)
    monkeypatch.chdir(tmp_path / "job")
    r = run_cli(capsys, "check", "--snapshot", NO_DRIVER, "--json")
    assert r.exit_code == 1
    assert f"reached through the link {link}, owned by user nobody" in ignored_line(r.err, link)


@as_root
def test_a_link_to_a_policy_in_another_users_folder_is_not_followed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    target = write(tmp_path / "mallory" / "policy.toml", PLANTED)  # root's file, in a folder nobody owns
    os.chown(tmp_path / "mallory", NOBODY, NOBODY)
    (tmp_path / "repo").mkdir()
    (tmp_path / "repo" / "gpudoctor.toml").symlink_to(target)
    monkeypatch.chdir(tmp_path / "repo")
    r = run_cli(capsys, "check", "--snapshot", NO_DRIVER, "--json")
    assert r.exit_code == 1 and f"reached through {tmp_path / 'mallory'}, owned by user nobody" in r.err


def test_the_callers_own_link_to_their_own_policy_is_followed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = write(tmp_path / "shared" / "team.toml", "expect-gpus = 8\n")
    (tmp_path / "repo").mkdir()
    (tmp_path / "repo" / "gpudoctor.toml").symlink_to("../shared/team.toml")  # relative, as people write them
    monkeypatch.chdir(tmp_path / "repo")
    found = pol.find()
    assert found.path == tmp_path.resolve() / "repo" / "gpudoctor.toml" and found.skipped == ()
    assert pol.load().to_json()["set"] == {"expect_gpus": 8} and target.exists()


def test_a_folder_every_user_can_write_without_the_sticky_bit_refuses_even_a_named_file(tmp_path: Path) -> None:
    loose = tmp_path / "loose"
    loose.mkdir()
    loose.chmod(0o777)  # anyone may rename the file away and put another in its place
    path = write(loose / "policy.toml", "expect-gpus = 8\n")
    with pytest.raises(pol.PolicyError, match="can be written by others"):
        pol.load(path)
