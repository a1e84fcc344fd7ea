"""Two runs compared: `check --baseline FILE` and `gpudoctor diff A B`, as two check results.

Each side is a saved `check --json` report or a snapshot (sides.py). Machine facts are compared
for changes (machine_facts.py: GD011-GD013, GD017-GD019), measurements for regressions beyond a
tolerance, default 10% (measurements.py: GD014-GD016). Every finding carries both values. The
codes (codes.py) are gpudoctor's own (area 0), whatever they compare, so `--select GD01` is the
whole comparison.
"""

from __future__ import annotations

from gpudoctor.compare.codes import GPUS, finding
from gpudoctor.compare.machine_facts import (
    compare_gpus,
    compare_links,
    compare_memory_held,
    compare_nccl_env,
    compare_settings,
    compare_software,
)
from gpudoctor.compare.measurements import compare_measurements
from gpudoctor.compare.sides import Side
from gpudoctor.findings import CheckResult, Finding, Status

DEFAULT_TOLERANCE = 0.10


def compare(base: Side, cur: Side, tolerance: float = DEFAULT_TOLERANCE) -> list[CheckResult]:
    """The comparison as two check results: machine facts, then measurements."""
    results = []
    facts: list[Finding]
    if base.facts is None or cur.facts is None:
        old = base if base.facts is None else cur
        why = (
            f"{old.label} records no machine facts (written by gpudoctor {old.written_by or 'before 0.2'}); "
            "save a new report with this gpudoctor to compare them"
        )
        facts = [finding(GPUS, Status.SKIP, "host", why, {})]
    else:
        facts = compare_gpus(base.facts, cur.facts) + compare_software(base.facts, cur.facts)
        facts += compare_links(base.facts, cur.facts) + compare_settings(base.facts, cur.facts, tolerance)
        facts += compare_memory_held(base.facts, cur.facts) + compare_nccl_env(base.facts, cur.facts)
    results.append(CheckResult("baseline_facts", f"Machine facts against {base.label}", facts, 0.0))
    results.append(
        CheckResult(
            "baseline_measurements",
            f"Measurements against {base.label}",
            compare_measurements(base, cur, tolerance),
            0.0,
        )
    )
    return results
