"""A GPU NVML cannot talk to (lost, no handle) fails GD827 and no other check mislabels it."""

from __future__ import annotations

import dataclasses
from dataclasses import replace
from pathlib import Path

from gpudoctor.checks import identity, lost_gpus, visibility
from gpudoctor.findings import Status
from gpudoctor.probe.gpus import unreachable_gpu
from gpudoctor.probe.machine import collect_machine
from gpudoctor.probe.nvml import Nvml
from gpudoctor.registry import CheckContext, CheckOptions, Selection, run_checks
from gpudoctor.snapshot import Missing, Snapshot, XidEvent, load
from tests.fakes.fake_nvml import FakeNvml

FIXTURES = Path(__file__).parent / "fixtures"


def h100() -> Snapshot:
    return load(FIXTURES / "h100_sxm_8x.json")


def with_gpu(s: Snapshot, index: int, gpu: object) -> Snapshot:
    return replace(s, gpus=[gpu if g.index == index else g for g in s.gpus])


def lost_before_the_probe(s: Snapshot, index: int) -> Snapshot:
    """What the probe records for a GPU whose handle NVML refuses with GPU_IS_LOST."""
    bus = s.gpu(index).pci_bus_id
    return with_gpu(s, index, unreachable_gpu(index, Missing("gpu_lost", "GPU is lost"), bus))


def test_a_gpu_lost_before_the_probe_fails_and_is_named() -> None:
    s = lost_before_the_probe(h100(), 3)
    s = replace(
        s, host=replace(s.host, xid_events=[XidEvent("PCI:0000:5d:00", 79, "fallen off", "Mon Nov 16 03:12:44")])
    )
    (f,) = lost_gpus.lost_gpus(CheckContext(s))
    assert (f.code, f.status, f.subject) == ("GD827", Status.FAIL, "gpu:3")
    assert "GPU 3 (00000000:5D:00.0)" in f.message and "GPU_IS_LOST" in f.message
    assert "XID 79" in f.message and "Mon Nov 16 03:12:44" in f.message
    assert "Power-cycle" in f.hint and f.evidence["xid_79"] == ["Mon Nov 16 03:12:44"]


def test_a_gpu_lost_midway_through_the_probe_is_not_silently_dropped(tmp_path: Path) -> None:
    source = h100()
    probed = collect_machine(
        Nvml(FakeNvml(source, lose_after={5: 12})), {}, root=tmp_path, systemctl=lambda unit: "active"
    )
    assert probed.gpu(5).lost and probed.gpu(5).uuid  # identity was read before the loss
    results = run_checks(CheckContext(probed, CheckOptions(quick=True)), Selection())
    static = [f for r in results for f in r.findings if r.name in {"lost_gpus", "identity", "visibility"}]
    bad = {(f.code, f.subject, f.status) for f in static if f.status not in (Status.PASS, Status.SKIP)}
    assert bad == {("GD827", "gpu:5", Status.FAIL)}, "lost, and nothing else mislabelled"


def test_an_unreachable_gpu_is_not_a_different_model_nor_a_mixed_machine() -> None:
    s = lost_before_the_probe(h100(), 2)
    ctx = CheckContext(s)
    ident = identity.identity(ctx)
    assert all(f.status is Status.PASS for f in ident), [f.message for f in ident if f.status is not Status.PASS]
    assert not any("is an ," in f.message or "is a ," in f.message for f in ident)
    vis = visibility.visibility(ctx)
    assert not any(f.code == "GD205" for f in vis), "one model plus a nameless lost GPU is not a mixed machine"
    (gd201,) = [f for f in vis if f.code == "GD201"]
    assert "GPU 2 does not answer NVML (GD827)" in gd201.message


def test_a_gpu_without_a_handle_for_another_reason_says_the_nvml_error() -> None:
    s = with_gpu(h100(), 6, unreachable_gpu(6, Missing("no_permission", "Insufficient Permissions"), ""))
    (f,) = lost_gpus.lost_gpus(CheckContext(s))
    assert (f.status, f.subject) == (Status.FAIL, "gpu:6")
    assert "Insufficient Permissions" in f.message and "/dev/nvidia" in f.hint
    assert "GPU 6:" in f.message  # no bus id or UUID to show, and no empty parentheses


def test_a_lost_gpu_the_run_does_not_use_only_warns() -> None:
    s = lost_before_the_probe(h100(), 7)
    s = replace(s, env={"CUDA_VISIBLE_DEVICES": "0,1,2,3"})
    (f,) = lost_gpus.lost_gpus(CheckContext(s))
    assert (f.status, f.evidence["used_by_run"]) == (Status.WARN, False)
    assert "does not use" in f.message


def test_every_gpu_answering_passes() -> None:
    (f,) = lost_gpus.lost_gpus(CheckContext(h100()))
    assert f.status is Status.PASS and "all 8 GPU(s)" in f.message


def test_recorded_lost_gpu_reads_back_from_json() -> None:
    from gpudoctor.snapshot import dumps, loads

    s = lost_before_the_probe(h100(), 1)
    again = loads(dumps(s))
    assert again.gpu(1).unreachable == "nvmlDeviceGetHandleByIndex(1): GPU is lost"
    assert dataclasses.replace(again.gpu(1)) == s.gpu(1)


def test_a_lost_gpu_is_not_blamed_on_its_links() -> None:
    # Its NVLink and P2P facts are unknown: GD403 "pairs have no NVLink", GD401 "fewer links" and
    # GD406 "no P2P" would send the user to the cabling for what GD827 explains.
    s = lost_before_the_probe(h100(), 3)
    results = run_checks(CheckContext(s), Selection(select=("topology", "lost_gpus")))
    found = {(f.code, f.status) for r in results for f in r.findings}
    assert ("GD827", Status.FAIL) in found
    assert not [f for f in found if f[0] in ("GD401", "GD403", "GD404", "GD405", "GD406") and f[1] != Status.PASS]
