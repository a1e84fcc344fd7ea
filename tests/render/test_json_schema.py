"""Every JSON document `gpudoctor check` prints validates against the shipped schema."""

from __future__ import annotations

import jsonschema
import pytest

from gpudoctor.schemas import report_schema
from tests.helpers.cli import run_cli
from tests.helpers.snapshots import FIXTURE_NAMES, fixture


def test_the_schema_itself_is_valid() -> None:
    jsonschema.Draft202012Validator.check_schema(report_schema())


def test_every_fixture_is_covered() -> None:
    assert len(FIXTURE_NAMES) >= 8


@pytest.mark.parametrize("name", FIXTURE_NAMES)
@pytest.mark.parametrize("extra", [(), ("--fail-on", "warn", "--expect-gpus", "8")])
def test_report_for_every_fixture_validates(
    capsys: pytest.CaptureFixture[str], name: str, extra: tuple[str, ...]
) -> None:
    r = run_cli(capsys, "check", "--snapshot", str(fixture(name)), "--json", *extra)
    doc = r.doc  # validates
    assert doc["exit_code"] == r.exit_code
    assert sum(doc["summary"].values()) == len(r.findings())
    assert {"visibility", "identity", "topology", "memory"} <= {c["name"] for c in doc["checks"]}


def test_a_report_that_breaks_the_contract_is_rejected(capsys: pytest.CaptureFixture[str]) -> None:
    # The test above would be worthless if the schema accepted anything.
    doc = run_cli(capsys, "check", "--snapshot", str(fixture("single_gpu")), "--json").doc
    doc["checks"][0]["findings"][0]["subject"] = "GPU zero"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(doc, report_schema())
