"""GPU memory errors (GD801-805, GD829-830): ECC counts in SRAM or DRAM, retired pages, the SRAM
threshold and the row-remap banks."""

from __future__ import annotations

from gpudoctor.checks import memory_errors
from gpudoctor.engine import CheckContext
from gpudoctor.findings import Status
from gpudoctor.snapshot import Missing, RemapHistogram, SramEcc
from tests.helpers.findings import not_ok
from tests.helpers.snapshots import SnapshotOf, with_gpu


def test_retired_pages_pending_fails(snapshot_of: SnapshotOf) -> None:
    s = with_gpu(snapshot_of("a100_sxm_8x"), 4, retired_pages_pending=True)
    assert not_ok(memory_errors.memory_errors(CheckContext(s))) == [("GD803", "gpu:4", Status.FAIL)]


def test_ecc_counts_say_whether_the_errors_are_in_sram_or_dram(snapshot_of: SnapshotOf) -> None:
    s = with_gpu(
        snapshot_of("h100_sxm_8x"),
        1,
        ecc_uncorrected_volatile=3,
        ecc_uncorrected_aggregate=3,
        ecc_uncorrected_dram_volatile=1,
        sram_ecc=SramEcc(2, 0, 2, 0, False),
    )
    found = {f.code: f for f in memory_errors.memory_errors(CheckContext(s))}
    assert "(SRAM 2, DRAM 1)" in found["GD801"].message
    assert (found["GD801"].evidence["sram"], found["GD801"].evidence["dram"]) == (2, 1)
    assert found["GD829"].status is Status.WARN  # SRAM errors, RMA threshold not reached


def test_an_ecc_split_that_does_not_add_up_is_called_unknown(snapshot_of: SnapshotOf) -> None:
    """A recording whose SRAM/DRAM parts (0, 0) contradict its total (2) does not print them."""
    s = snapshot_of("faults/ecc_uncorrectable")
    (f,) = [f for f in memory_errors.memory_errors(CheckContext(s)) if f.code == "GD801"]
    assert "2 uncorrectable ECC error(s)" in f.message and "(SRAM/DRAM split unknown)" in f.message
    assert "SRAM 0" not in f.message and f.evidence["split"] == "unknown" and "sram" not in f.evidence
    # Only one part known (a driver without the SRAM status): unknown too, not "(DRAM 0)".
    one = with_gpu(snapshot_of("h100_sxm_8x"), 2, ecc_uncorrected_aggregate=1, ecc_uncorrected_dram_aggregate=0)
    one = with_gpu(one, 2, sram_ecc=Missing("unsupported"))
    (g,) = [f for f in memory_errors.memory_errors(CheckContext(one)) if f.code == "GD802"]
    assert "(SRAM/DRAM split unknown)" in g.message and "DRAM 0" not in g.message


def test_sram_threshold_flag_is_an_rma_case(snapshot_of: SnapshotOf) -> None:
    s = with_gpu(snapshot_of("h100_sxm_8x"), 5, sram_ecc=SramEcc(5, 0, 0, 0, True))
    (f,) = [f for f in memory_errors.memory_errors(CheckContext(s)) if f.code == "GD829"]
    assert (f.status, f.subject) == (Status.FAIL, "gpu:5")
    assert "RMA" in f.message and "field diagnostic" in f.hint


def test_exhausted_remap_banks_warn_before_the_remap_fails(snapshot_of: SnapshotOf) -> None:
    s = with_gpu(snapshot_of("a100_sxm_8x"), 3, remap_histogram=RemapHistogram(630, 4, 2, 3, 1))
    (f,) = not_ok(memory_errors.memory_errors(CheckContext(s)))
    assert f == ("GD830", "gpu:3", Status.WARN)
    (full,) = [x for x in memory_errors.memory_errors(CheckContext(s)) if x.code == "GD830"]
    assert "1 of 640 DRAM banks have no spare rows" in full.message and "3 more have few" in full.message
    healthy = with_gpu(snapshot_of("a100_sxm_8x"), 3, remap_histogram=RemapHistogram(640, 0, 0, 0, 0))
    (p,) = memory_errors.memory_errors(CheckContext(healthy))
    assert p.status is Status.PASS and "every DRAM bank has spare rows on GPU 0, 1, 2, 3, 4, 5, 6, 7" in p.message
