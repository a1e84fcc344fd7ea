"""gpudoctor.knowledge.xid: the XID table is NVIDIA's catalog (tests/reference/xid_catalog.csv)."""

from __future__ import annotations

import pytest

from gpudoctor.knowledge import xid
from tests.paths import REFERENCE


@pytest.mark.parametrize(
    ("code", "kind"),
    [
        (48, "hardware"),  # WORKFLOW_XID_48
        (79, "hardware"),  # RESTART_BM
        (95, "hardware"),  # RESET_GPU
        (74, "hardware"),  # WORKFLOW_NVLINK_ERR
        (119, "hardware"),  # RESET_GPU
        (125, "hardware"),  # UNEXPECTED_ERR_REPORT_ISSUE
        (61, "hardware"),  # UNEXPECTED_ERR_REPORT_ISSUE
        (109, "hardware"),  # RESET_GPU
        (13, "application"),  # RESTART_APP
        (31, "application"),
        (8, "application"),
        (94, "application"),  # RESTART_APP: only the context that hit the contained error is stopped
        (43, "other"),  # IGNORE
        (45, "other"),  # WORKFLOW_XID_45: act on the XID before it
        (121, "other"),  # IGNORE
        (999, "other"),  # not in the catalog
    ],
)
def test_xid_classes_follow_nvidias_catalog(code: int, kind: str) -> None:
    assert xid.classify(code) == kind


def test_the_xid_table_is_nvidias_catalog() -> None:
    """tests/reference/xid_catalog.csv is NVIDIA's own file (NVSentinel's copy of the XID catalog's
    immediate-action buckets); the table in gpudoctor/knowledge/xid.py must say the same for every XID."""
    import csv

    rows = list(csv.reader((REFERENCE / "xid_catalog.csv").open(encoding="utf-8")))
    assert len(rows) == 162
    for number, mnemonic, bucket, _fatal in rows:
        expected = "RECOVERY_ACTION" if number == "154" else bucket
        assert xid.bucket(int(number)) == expected, (number, mnemonic)
    assert xid.bucket(163) is None and xid.kind(163) == "other"
    assert set(xid.ACTIONS) >= set(xid.BUCKETS), "every bucket says what to do"
