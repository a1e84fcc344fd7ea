"""Real incidents as the test (issue 21): for every public failure report in tests/reference/incidents/,
gpudoctor names the established cause at the right subject and severity with an actionable hint; on
every healthy machine from public readings nothing fails. Incidents whose readings the snapshot cannot
hold are blind spots (listed in the corpus README): they are expected to stay unmatched, so a test
notices when one starts to match and the README must change. `python -m tests.incidents` prints the table."""

from __future__ import annotations

import json

import pytest

from tests.incidents import CORPUS, Incident, findings, incidents, judge

ALL = incidents()
CASES = [
    pytest.param(i, id=i.id, marks=pytest.mark.xfail(reason=i.expected["blind_spot"], strict=True))
    if i.expected.get("blind_spot")
    else pytest.param(i, id=i.id)
    for i in ALL
]


@pytest.mark.parametrize("incident", CASES)
def test_gpudoctor_names_the_cause_of_each_incident_and_no_healthy_machine_fails(incident: Incident) -> None:
    got = [f[:3] for f in findings(incident.id)]
    assert judge(incident) == "yes", f"{incident.expected} not found in {got}"


def test_the_corpus_is_what_the_issue_asks_for() -> None:
    real = [i for i in ALL if not i.healthy]
    probes = [i for i in ALL if i.healthy]
    assert len(real) >= 40 and len(probes) >= 5
    assert len({i.cause for i in real}) >= 12
    for i in ALL:
        source = (i.folder / "source.md").read_text(encoding="utf-8")
        assert "- **Source:** https://" in source and "## Quote establishing the cause" in source, i.id
        snapshot = json.loads((i.folder / "snapshot.json").read_text(encoding="utf-8"))
        assert snapshot["schema_version"] == 1
        if not i.healthy:
            assert {"code", "subject", "status", "cause", "hint_contains"} <= set(i.expected), i.id
    readme = (CORPUS / "README.md").read_text(encoding="utf-8")
    for i in ALL:
        if i.expected.get("blind_spot"):
            assert i.id in readme, f"{i.id} is a blind spot the README does not list"
