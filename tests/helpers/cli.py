"""Run `gpudoctor` in-process for the CLI-level tests, and read its JSON report (validated against
the shipped schema). Snapshots to run it on: tests/helpers/snapshots.py."""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from gpudoctor.cli import main as cli
from gpudoctor.schemas import report_schema
from gpudoctor.snapshot import Snapshot
from tests.helpers.snapshots import write_variant

# The static checks of one machine's make-up: which GPUs a run sees, are they alike, how they connect,
# is there host RAM for them.
MY_CHECKS = "visibility,identity,topology,memory"


@functools.cache
def report_validator() -> Any:
    """The shipped report schema's validator, its schema checked once a session: jsonschema.validate()
    checks the schema and builds a validator on every call (about 7x the validation itself)."""
    schema = report_schema()
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


@dataclass
class Result:
    exit_code: int
    out: str
    err: str

    @property
    def doc(self) -> dict[str, Any]:
        doc = json.loads(self.out)
        report_validator().validate(doc)
        return doc

    def findings(self, code: str | None = None) -> list[dict[str, Any]]:
        found = [f for c in self.doc["checks"] for f in c["findings"]]
        return [f for f in found if code is None or f["code"] == code]

    def one(self, code: str) -> dict[str, Any]:
        found = self.findings(code)
        assert len(found) == 1, f"{code}: {found}"
        return found[0]

    def statuses(self) -> dict[str, set[str]]:
        out: dict[str, set[str]] = {}
        for f in self.findings():
            out.setdefault(f["code"], set()).add(f["status"])
        return out


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> Result:
    with pytest.raises(SystemExit) as exc:
        cli.run(list(args))
    out, err = capsys.readouterr()
    code = exc.value.code
    return Result(code if isinstance(code, int) else (0 if code is None else 1), out, err)


def check_variant(capsys: pytest.CaptureFixture[str], tmp_path: Path, snapshot: Snapshot, *extra: str) -> Result:
    """`gpudoctor check --snapshot VARIANT --json --select MY_CHECKS EXTRA` on `snapshot` written to tmp_path."""
    path = write_variant(tmp_path, snapshot)
    return run_cli(capsys, "check", "--snapshot", path, "--json", "--select", MY_CHECKS, *extra)
