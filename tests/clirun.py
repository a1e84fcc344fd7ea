"""Helpers for the CLI-level tests: run `gpudoctor` in-process, validate JSON, build variants."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from gpudoctor import cli
from gpudoctor import snapshot as snap
from gpudoctor.render.json import report_schema

FIXTURES = Path(__file__).parent / "fixtures"
REPO_ROOT = Path(__file__).resolve().parent.parent
FIXTURE_NAMES = sorted(p.stem for p in FIXTURES.glob("*.json"))
MY_CHECKS = "visibility,identity,topology,memory"


@dataclass
class Result:
    exit_code: int
    out: str
    err: str

    @property
    def doc(self) -> dict[str, Any]:
        doc = json.loads(self.out)
        jsonschema.validate(doc, report_schema())
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


def fixture(name: str) -> Path:
    return FIXTURES / f"{name}.json"


def load(name: str) -> snap.Snapshot:
    return snap.load(fixture(name))


def write_variant(tmp_path: Path, snapshot: snap.Snapshot, name: str = "variant") -> str:
    path = tmp_path / f"{name}.json"
    snap.write(snapshot, path)
    return str(path)


def with_env(snapshot: snap.Snapshot, **env: str) -> snap.Snapshot:
    return replace(snapshot, env={**snapshot.env, **env})


def with_gpu(snapshot: snap.Snapshot, index: int, **changes: Any) -> snap.Snapshot:
    gpus = [replace(g, **changes) if g.index == index else g for g in snapshot.gpus]
    return replace(snapshot, gpus=gpus)
