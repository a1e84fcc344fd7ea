"""NVLink generation across driver styles: raw nvmlDeviceGetNvLinkVersion answers as drivers give them.

Older drivers answer the plain generation (H100 -> 4), newer ones nvml.h's nvmlNvlinkVersion_t
(H100 -> 6 = NVML_NVLINK_VERSION_4_0), and some answer 7 for an H100. Whatever the driver says,
a healthy HGX H100 must be expected at NVLink 4's rate (18 links x NCCL's 20.6 GB/s), never NVLink 5's.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from gpudoctor import snapshot as snap
from gpudoctor.knowledge.expectations import expected_busbw
from gpudoctor.probe.machine import collect_machine
from gpudoctor.probe.nvml import Nvml
from gpudoctor.snapshot import Missing, Snapshot
from tests.fakes.fake_nvml import FakeNvml
from tests.fakes.machines import h100_nvswitch_8x
from tests.helpers.snapshots import SnapshotOf

# 18 links x NCCL's rate per link (topo.h) x ring efficiency x NVLS gain on 8 GPUs (expectations.py)
H100_NVLINK_BUSBW = 18 * 20.6 * 0.95 * 1.29  # ~454 GB/s
B200_NVLINK_BUSBW = 18 * 40.1 * 0.95 * 1.29  # ~885 GB/s


def with_links(source: Snapshot, *, raw: int | None = None, version: int | None = None, cc: object = None) -> Snapshot:
    """Every GPU answers `raw` for its links (and reports compute capability `cc` when given)."""
    gpus = []
    for gpu in source.gpus:
        links = [
            dataclasses.replace(
                link,
                version_raw=raw if raw is not None else link.version_raw,
                version=version if version is not None else link.version,
            )
            for link in gpu.nvlinks
        ]
        changes: dict[str, object] = {"nvlinks": links}
        if cc is not None:
            changes["compute_capability"] = cc
        gpus.append(dataclasses.replace(gpu, **changes))
    return dataclasses.replace(source, gpus=gpus)


def probe(source: Snapshot, tmp_path: Path, **fake_options: object) -> Snapshot:
    return collect_machine(Nvml(FakeNvml(source, **fake_options)), {}, root=tmp_path, systemctl=lambda unit: "active")


def expectation(s: Snapshot) -> tuple[float, str, str]:
    e = expected_busbw(s, [g.index for g in s.gpus])
    assert e is not None
    return e.busbw_gbps, e.link, e.basis


@pytest.mark.parametrize("raw", [4, 6, 7], ids=["plain-generation", "nvml-enum-4.0", "reports-5.0"])
def test_h100_is_nvlink_4_whatever_the_driver_answers(raw: int, tmp_path: Path) -> None:
    collected = probe(with_links(h100_nvswitch_8x(), raw=raw), tmp_path)
    links = collected.gpu(0).nvlinks
    assert {link.version for link in links} == {4}
    assert {link.version_raw for link in links} == {raw}  # the snapshot shows what the driver said
    busbw, link, basis = expectation(collected)
    assert link == "nvlink" and busbw == pytest.approx(H100_NVLINK_BUSBW)
    assert basis.startswith("18 NVLink 4 links per GPU through NVSwitch x 20.6 GB/s")


def test_an_nvml_answer_that_fits_no_driver_style_is_named_in_the_basis(tmp_path: Path) -> None:
    _, _, basis = expectation(probe(with_links(h100_nvswitch_8x(), raw=7), tmp_path))
    assert "answer 7" in basis and "ignored" in basis
    for raw in (4, 6):
        _, _, basis = expectation(probe(with_links(h100_nvswitch_8x(), raw=raw), tmp_path))
        assert "ignored" not in basis


def test_fake_driver_styles_answer_nvml_h_values(tmp_path: Path) -> None:
    enum = probe(h100_nvswitch_8x(), tmp_path)
    plain = probe(h100_nvswitch_8x(), tmp_path, nvlink_version_style="generation")
    assert {link.version_raw for link in enum.gpu(3).nvlinks} == {6}  # NVML_NVLINK_VERSION_4_0
    assert {link.version_raw for link in plain.gpu(3).nvlinks} == {4}
    assert expectation(enum)[0] == expectation(plain)[0] == pytest.approx(H100_NVLINK_BUSBW)


@pytest.mark.parametrize("raw", [3, 4, 5], ids=["plain-generation", "nvml-enum-3.0", "nvml-enum-3.1"])
def test_a100_is_nvlink_3_whatever_the_driver_answers(raw: int, tmp_path: Path, snapshot_of: SnapshotOf) -> None:
    a100 = snapshot_of("a100_sxm_8x")
    collected = probe(with_links(a100, raw=raw), tmp_path)
    assert {link.version for g in collected.gpus for link in g.nvlinks if link.active} == {3}
    busbw, _, basis = expectation(collected)
    assert busbw == pytest.approx(12 * 20.0 * 0.95) and basis.startswith("12 NVLink 3 links per GPU")


def test_blackwell_is_nvlink_5_from_its_architecture(tmp_path: Path) -> None:
    b200 = with_links(h100_nvswitch_8x(), raw=7, cc="10.0")
    collected = probe(b200, tmp_path)
    assert {link.version for link in collected.gpu(0).nvlinks} == {5}
    busbw, _, basis = expectation(collected)
    assert busbw == pytest.approx(B200_NVLINK_BUSBW) and "ignored" not in basis


@pytest.mark.parametrize(("raw", "generation"), [(4, 3), (5, 3), (6, 4), (7, 5), (2, 2)])
def test_unknown_architecture_decodes_the_raw_answer_cautiously(raw: int, generation: int, tmp_path: Path) -> None:
    # No compute capability: the raw answer decides, and where the two styles disagree
    # (4: plain NVLink 4 or enum 3.0; 5: plain NVLink 5 or enum 3.1) the lower generation wins.
    unknown = with_links(h100_nvswitch_8x(), raw=raw, cc=Missing("unsupported"))
    collected = probe(unknown, tmp_path)
    assert {link.version for link in collected.gpu(0).nvlinks} == {generation}


def test_an_older_snapshot_without_version_raw_reads_writes_and_expects_the_same(tmp_path: Path) -> None:
    text = snap.dumps(h100_nvswitch_8x())
    assert "version_raw" not in text  # not collected: left out, so older recordings stay byte-identical
    recorded = snap.loads(text)
    assert all(isinstance(link.version_raw, Missing) for link in recorded.gpu(0).nvlinks)
    assert snap.dumps(recorded) == text
    assert expectation(recorded)[0] == pytest.approx(H100_NVLINK_BUSBW)
    probed = probe(with_links(h100_nvswitch_8x(), raw=7), tmp_path)
    assert snap.loads(snap.dumps(probed)).gpu(5).nvlinks[0].version_raw == 7  # a recording keeps it


def test_a_recorded_wrong_version_does_not_change_a_known_architecture() -> None:
    # A snapshot written by an older gpudoctor that decoded an H100's 7 as NVLink 5.
    old = with_links(h100_nvswitch_8x(), version=5)
    assert expectation(old)[0] == pytest.approx(H100_NVLINK_BUSBW)
