"""What a user gets from the package index: a license, metadata, links that work off GitHub, type
information, and a CI that lints with the ruff the code was formatted with."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.paths import REPO

tomllib = pytest.importorskip("tomllib")
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
PROJECT = PYPROJECT["project"]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def test_the_license_file_is_the_apache_2_license_pyproject_names() -> None:
    text = (REPO / "LICENSE").read_text(encoding="utf-8")
    assert "Apache License" in text and "Version 2.0, January 2004" in text and "END OF TERMS AND CONDITIONS" in text
    assert PROJECT["license"] == "Apache-2.0" and PROJECT["license-files"] == ["LICENSE"]


def test_metadata_has_classifiers_and_project_urls() -> None:
    classifiers = PROJECT["classifiers"]
    assert "Typing :: Typed" in classifiers and "Environment :: GPU :: NVIDIA CUDA" in classifiers
    assert not [c for c in classifiers if c.startswith("License ::")], "the SPDX license field replaces them"
    urls = PROJECT["urls"]
    assert {"Homepage", "Source", "Documentation", "Issues"} <= set(urls)
    assert all(u.startswith(urls["Source"]) for u in urls.values())


def test_readme_links_work_on_the_package_index() -> None:
    """PyPI renders README.md without the repository: every link is absolute, and those into the
    repository name a file that exists here."""
    source = PROJECT["urls"]["Source"].rstrip("/") + "/blob/main/"
    links = LINK.findall((REPO / "README.md").read_text(encoding="utf-8"))
    assert links, "no links found: the test is broken"
    assert [u for u in links if not u.startswith(("https://", "http://"))] == []
    into_repo = [u for u in links if u.startswith(source)]
    assert into_repo
    assert [u for u in into_repo if not (REPO / u.removeprefix(source)).exists()] == []


def test_the_package_is_typed() -> None:
    assert (REPO / "gpudoctor" / "py.typed").is_file()
    assert "py.typed" in PYPROJECT["tool"]["setuptools"]["package-data"]["gpudoctor"]


def test_ruff_is_pinned_to_the_version_installed_here() -> None:
    pins = [d for d in PROJECT["optional-dependencies"]["test"] if d.startswith("ruff")]
    assert len(pins) == 1 and pins[0].startswith("ruff==")
    installed = subprocess.run(
        [str(Path(sys.executable).parent / "ruff"), "--version"], capture_output=True, text=True, check=False
    ).stdout.split()
    assert installed and pins[0].removeprefix("ruff==") == installed[-1]


def test_ci_lints_and_installs_the_wheel() -> None:
    ci = (REPO / ".ci" / "run").read_text(encoding="utf-8")
    assert "ruff check ." in ci and "ruff format --check ." in ci
    assert "scripts/check_wheel.sh" in ci and (REPO / "scripts" / "check_wheel.sh").is_file()


def test_the_fixture_notes_cite_public_sources_not_a_local_path() -> None:
    for path in (REPO / "tests" / "fixtures" / "README.md", REPO / "tests" / "fixtures" / "make_fixtures.py"):
        text = path.read_text(encoding="utf-8")
        assert not re.search(r"(?<![\w.])/(work|home|root|tmp)/", text), path
    assert "https://github.com/NVIDIA/nccl/issues/1264" in (REPO / "tests" / "fixtures" / "README.md").read_text()
