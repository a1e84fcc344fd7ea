"""What other nodes send is input (issue 24): the nodes check judges it, never crashes on it, never
forwards what this gpudoctor does not know (knowledge/node_facts.py)."""

from __future__ import annotations

from typing import Any

import pytest

from gpudoctor.checks import context
from gpudoctor.checks.active.nodes import nodes
from gpudoctor.engine import CheckOptions
from gpudoctor.findings import Finding
from gpudoctor.knowledge.node_facts import DROPPED, Malformed, clean_facts
from tests.checks.active.test_nodes import facts, run_data
from tests.fakes.machines import h100_nvswitch_8x
from tests.helpers.findings import verdicts

KNOWN = {"GD440", "GD510"}


class _Ran:
    """The shared launch's result, as the runner hands it to the check."""

    def __init__(self, data: dict[str, Any]) -> None:
        self.data = data

    def results(self, task: str) -> Any:
        return self.data if task == "nodes" else None


def run_check(data: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> list[Finding]:
    import gpudoctor.launch

    monkeypatch.setattr(gpudoctor.launch, "torchrun_env", lambda environ: True)  # as under torchrun
    ctx = context(h100_nvswitch_8x(), CheckOptions())
    ctx.shared = lambda name: _Ran(data)
    found, _ = nodes(ctx)
    return found


def three_nodes(**per_node: Any) -> dict[str, Any]:
    data = run_data({"a": 370.0, "b": 370.0, "c": 370.0}, 370.0, 384.0)
    capacity = {"expected_gbps": 384.0, "basis": "8x 400G"}
    data["facts"] = {k: facts(capacity=capacity, findings=[]) for k in ("a", "b", "c")}
    data["facts"].update(per_node)
    data["node"] = "a"
    return data


@pytest.mark.parametrize(
    ("bad", "field"),
    [
        ({"gpus": 5}, "gpus is not a list"),
        ({"nics": [{"name": "mlx5_0", "ports": [{"port": 1, "rate_gbps": "fast"}]}]}, "nics[0].ports[0].rate_gbps"),
        ({"driver": "5" * 100_000}, "driver is not a text of at most 300 characters"),
        ({"capacity": {"expected_gbps": float("nan"), "basis": "x"}}, "capacity.expected_gbps is not a finite number"),
        ({"mtu": {"ib0": -1}}, "mtu['ib0'] is not a whole number"),
        ({"counters": {"mlx5_0:1": {"link_downed": True}}}, "counters['mlx5_0:1']['link_downed']"),
    ],
)
def test_a_node_whose_facts_have_another_shape_is_reported_not_a_crash(
    bad: dict[str, Any], field: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = three_nodes(b=facts(**bad))  # (a wrong type used to crash the check: GD001)
    found = run_check(data, monkeypatch)
    [gd464] = [f for f in found if f.code == "GD464"]
    assert gd464.subject == "node:b" and field in gd464.message and gd464.status.value == "warn"
    assert ("GD460", "pass", "host") in verdicts(found)  # the two usable nodes are still compared


def test_a_payload_the_gather_dropped_is_said_with_its_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    data = three_nodes(c={DROPPED: "it sent 209715200 bytes, over the 1024 KiB a node may send"})
    [gd464] = [f for f in run_check(data, monkeypatch) if f.code == "GD464"]
    assert gd464.subject == "node:c" and "209715200 bytes" in gd464.message


def test_findings_with_codes_this_gpudoctor_does_not_know_are_not_forwarded(monkeypatch: pytest.MonkeyPatch) -> None:
    invented = {"code": "GD999", "status": "fail", "subject": "host", "message": "invented"}
    real = {"code": "GD510", "status": "warn", "subject": "host", "message": "/dev/shm 64 MiB"}
    data = three_nodes(b=facts(findings=[invented, real]), c=facts(findings=[{**real, "status": "bogus"}]))
    found = run_check(data, monkeypatch)
    assert "GD999" not in {f.code for f in found}
    assert ("GD510", "warn", "node:b") in verdicts(found)  # a real one still is
    assert any(f.code == "GD464" and "GD999" in f.message for f in found)


def test_clean_facts_keeps_the_shape_gpudoctor_sends() -> None:
    sent = facts(capacity={"expected_gbps": 384.0, "basis": "8x 400G"}, findings=[])
    kept, notes = clean_facts(sent, KNOWN)
    assert notes == [] and kept["gpus"] == sent["gpus"] and kept["nics"] == sent["nics"] and kept["mtu"] == sent["mtu"]
    with pytest.raises(Malformed, match="no facts object"):
        clean_facts(None, KNOWN)
    with pytest.raises(Malformed, match="is not an object"):
        clean_facts(["a list"], KNOWN)
