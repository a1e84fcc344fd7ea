"""The files a `check` writes beside its report: JUnit, Prometheus, the GitHub summary.

Each is checked before the run (a planted link or a missing directory is refused before minutes
of active checks), written after it; one that fails then is one line on stderr and exit 3, and the
report itself is still printed, so nothing the run found is lost.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from gpudoctor.errors import EXIT_UNAVAILABLE, UserError
from gpudoctor.findings import Report
from gpudoctor.safe_io import check_target


@dataclass
class Outputs:
    junit: str | None = None
    prometheus: str | None = None
    github: bool | None = None  # --github / --no-github; None: GITHUB_ACTIONS decides
    environ: Mapping[str, str] = field(default_factory=lambda: os.environ)

    def files(self) -> list[tuple[str, str, Callable[[Report, str], None]]]:
        out = []
        if self.junit:
            from gpudoctor.render.junit import write_junit

            out.append(("JUnit file", self.junit, write_junit))
        if self.prometheus:
            from gpudoctor.render.prometheus import write_prometheus

            out.append(("Prometheus file", self.prometheus, write_prometheus))
        return out

    def precheck(self) -> None:
        """Refuse, before any work, a target gpudoctor would not write (a link, a directory, no directory)."""
        for what, path, _ in self.files():
            try:
                check_target(path)
                parent = Path(path).parent
                if not parent.is_dir():
                    raise FileNotFoundError(2, f"no directory {str(parent)!r}")
            except OSError as exc:
                raise UserError(
                    f"cannot write {what} {path}: {exc.strerror}", EXIT_UNAVAILABLE, "unavailable"
                ) from None

    def write(self, report: Report, err: IO[str]) -> list[str]:
        """Write every output; the one-line problems of those that failed."""
        problems = []
        for what, path, writer in self.files():
            try:
                writer(report, path)
            except OSError as exc:
                problems.append(f"cannot write {what} {path}: {exc.strerror or exc}")
        from gpudoctor.render import github

        if github.enabled(self.github, self.environ):
            problem = github.publish(report, self.environ, err)
            if problem:
                problems.append(problem)
        return problems
