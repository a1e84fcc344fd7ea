"""A GPU NVML cannot talk to (lost, no handle) fails GD827 and no other check mislabels it."""

from __future__ import annotations

import dataclasses
from dataclasses import replace
from pathlib import Path

from gpudoctor.checks import identity, lost_gpus, registry, visibility
from gpudoctor.engine import CheckContext, CheckOptions, Selection
from gpudoctor.engine.runner import run_checks
from gpudoctor.findings import Status
from gpudoctor.probe.gpus import unreachable_gpu
from gpudoctor.probe.machine import collect_machine
from gpudoctor.probe.nvml import Nvml
from gpudoctor.snapshot import Missing, Snapshot, XidEvent, load
from tests.fakes.fake_nvml import FakeNvml
from tests.helpers.cli import run_cli
from tests.helpers.snapshots import SnapshotOf
from tests.paths import FIXTURES


def swap_gpu(s: Snapshot, index: int, gpu: object) -> Snapshot:
    """GPU `index` replaced by `gpu` (tests/helpers/snapshots.with_gpu changes fields instead)."""
    return replace(s, gpus=[gpu if g.index == index else g for g in s.gpus])


def lost_before_the_probe(s: Snapshot, index: int) -> Snapshot:
    """What the probe records for a GPU whose handle NVML refuses with GPU_IS_LOST."""
    bus = s.gpu(index).pci_bus_id
    return swap_gpu(s, index, unreachable_gpu(index, Missing("gpu_lost", "GPU is lost"), bus))


def test_a_gpu_lost_before_the_probe_fails_and_is_named(snapshot_of: SnapshotOf) -> None:
    s = lost_before_the_probe(snapshot_of("h100_sxm_8x"), 3)
    s = replace(
        s, host=replace(s.host, xid_events=[XidEvent("PCI:0000:5d:00", 79, "fallen off", "Mon Nov 16 03:12:44")])
    )
    (f,) = lost_gpus.lost_gpus(CheckContext(s))
    assert (f.code, f.status, f.subject) == ("GD827", Status.FAIL, "gpu:3")
    assert "GPU 3 (00000000:5D:00.0)" in f.message and "GPU_IS_LOST" in f.message
    assert "XID 79" in f.message and "Mon Nov 16 03:12:44" in f.message
    assert "Power-cycle" in f.hint and f.evidence["xid_79"] == ["Mon Nov 16 03:12:44"]


def test_a_gpu_lost_midway_through_the_probe_is_not_silently_dropped(tmp_path: Path, snapshot_of: SnapshotOf) -> None:
    source = snapshot_of("h100_sxm_8x")
    probed = collect_machine(
        Nvml(FakeNvml(source, lose_after={5: 12})), {}, root=tmp_path, systemctl=lambda unit: "active"
    )
    assert probed.gpu(5).lost and probed.gpu(5).uuid  # identity was read before the loss
    results = run_checks(registry(), CheckContext(probed, CheckOptions(quick=True)), Selection())
    static = [f for r in results for f in r.findings if r.name in {"lost_gpus", "identity", "visibility"}]
    bad = {(f.code, f.subject, f.status) for f in static if f.status not in (Status.PASS, Status.SKIP)}
    assert bad == {("GD827", "gpu:5", Status.FAIL)}, "lost, and nothing else mislabelled"


def test_an_unreachable_gpu_is_not_a_different_model_nor_a_mixed_machine(snapshot_of: SnapshotOf) -> None:
    s = lost_before_the_probe(snapshot_of("h100_sxm_8x"), 2)
    ctx = CheckContext(s)
    ident = identity.identity(ctx)
    assert all(f.status is Status.PASS for f in ident), [f.message for f in ident if f.status is not Status.PASS]
    assert not any("is an ," in f.message or "is a ," in f.message for f in ident)
    vis = visibility.visibility(ctx)
    assert not any(f.code == "GD205" for f in vis), "one model plus a nameless lost GPU is not a mixed machine"
    (gd201,) = [f for f in vis if f.code == "GD201"]
    assert gd201.message.startswith("7 GPU(s) visible") and "cuda:2=GPU 3" in gd201.message
    assert "GPU 2 does not answer NVML and CUDA does not enumerate it: left out (GD827)" in gd201.message


def test_a_gpu_without_a_handle_for_another_reason_says_the_nvml_error(snapshot_of: SnapshotOf) -> None:
    s = swap_gpu(
        snapshot_of("h100_sxm_8x"), 6, unreachable_gpu(6, Missing("no_permission", "Insufficient Permissions"), "")
    )
    (f,) = lost_gpus.lost_gpus(CheckContext(s))
    assert (f.status, f.subject) == (Status.FAIL, "gpu:6")
    assert "Insufficient Permissions" in f.message and "/dev/nvidia" in f.hint
    assert "GPU 6:" in f.message  # no bus id or UUID to show, and no empty parentheses


def test_a_lost_gpu_the_run_does_not_use_only_warns(snapshot_of: SnapshotOf) -> None:
    s = lost_before_the_probe(snapshot_of("h100_sxm_8x"), 7)
    s = replace(s, env={"CUDA_VISIBLE_DEVICES": "0,1,2,3"})
    (f,) = lost_gpus.lost_gpus(CheckContext(s))
    assert (f.status, f.evidence["used_by_run"]) == (Status.WARN, False)
    assert "does not use" in f.message


def test_every_gpu_answering_passes(snapshot_of: SnapshotOf) -> None:
    (f,) = lost_gpus.lost_gpus(CheckContext(snapshot_of("h100_sxm_8x")))
    assert f.status is Status.PASS and "all 8 GPU(s)" in f.message


def test_recorded_lost_gpu_reads_back_from_json(snapshot_of: SnapshotOf) -> None:
    from gpudoctor.snapshot import dumps, loads

    s = lost_before_the_probe(snapshot_of("h100_sxm_8x"), 1)
    again = loads(dumps(s))
    assert again.gpu(1).unreachable == "nvmlDeviceGetHandleByIndex(1): GPU is lost"
    assert dataclasses.replace(again.gpu(1)) == s.gpu(1)


def test_a_lost_gpu_is_not_blamed_on_its_links(snapshot_of: SnapshotOf) -> None:
    # Its NVLink and P2P facts are unknown: GD403 "pairs have no NVLink", GD401 "fewer links" and
    # GD406 "no P2P" would send the user to the cabling for what GD827 explains.
    s = lost_before_the_probe(snapshot_of("h100_sxm_8x"), 3)
    results = run_checks(registry(), CheckContext(s), Selection(select=("topology", "lost_gpus")))
    found = {(f.code, f.status) for r in results for f in r.findings}
    assert ("GD827", Status.FAIL) in found
    assert not [f for f in found if f[0] in ("GD401", "GD403", "GD404", "GD405", "GD406") and f[1] != Status.PASS]


# ------------------------------------------------------------------ a lost GPU is not a CUDA device
# CUDA does not enumerate a GPU the driver lost: visibility leaves it out in one place, so every
# check counts, lists and plans the same GPUs, and GD201 alone says it was left out (GD827).

FALLEN = FIXTURES / "faults" / "gpu_fallen_off_bus.json"  # GPU 3 of 8 H100 lost, XID 79


def every_finding(capsys, path: Path, *extra: str) -> list[dict]:  # type: ignore[no-untyped-def, type-arg]
    r = run_cli(capsys, "check", "--snapshot", str(path), "--json", *extra)
    return [f for c in r.doc["checks"] for f in c["findings"]]


def the(findings: list[dict], code: str) -> dict:  # type: ignore[type-arg]
    (f,) = [f for f in findings if f["code"] == code]
    return f


def test_a_lost_gpu_is_left_out_of_every_count_and_said_once(capsys) -> None:  # type: ignore[no-untyped-def]
    found = every_finding(capsys, FALLEN, "--expect-gpus", "8")
    gd201 = the(found, "GD201")
    assert gd201["message"].startswith("7 GPU(s) visible: cuda:0=GPU 0, cuda:1=GPU 1, cuda:2=GPU 2, cuda:3=GPU 4")
    assert [d["nvml_index"] for d in gd201["evidence"]["devices"]] == [0, 1, 2, 4, 5, 6, 7]
    assert not any("cuda:7" in f["message"] for f in found), "CUDA numbers the 7 GPUs it sees 0-6"
    assert (the(found, "GD202")["status"], the(found, "GD202")["message"]) == (
        "fail",
        "7 GPU(s) visible, --expect-gpus 8: too few",
    )
    assert the(found, "GD202")["evidence"]["lost"] == [3]
    assert the(found, "GD401")["message"].startswith("7 GPUs: all 21 pairs NV18")
    assert the(found, "GD301")["message"] == "7 GPUs alike: model NVIDIA H100 80GB HBM3"
    assert (the(found, "GD827")["status"], the(found, "GD827")["subject"]) == ("fail", "gpu:3")
    said = [f["code"] for f in found if "left out (GD827)" in f["message"]]
    assert said == ["GD201"], "one finding says the lost GPU is left out"
    # Its XID 79 is the run's problem: a GPU the run would have used, not "a GPU this run does not use".
    xid = the(found, "GD810")
    assert xid["status"] == "fail" and "(lost: see GD827)" in xid["message"] and "does not use" not in xid["message"]


def test_the_active_checks_plan_the_gpus_visibility_gives() -> None:
    from gpudoctor.checks.active.common import plan

    p = plan(CheckContext(load(FALLEN), CheckOptions(device="cuda")))
    assert p.gpus == [0, 1, 2, 4, 5, 6, 7] and p.ranks == 7 and not p.skip


def lost_midway(s: Snapshot, index: int) -> Snapshot:
    """What the probe records for a GPU that answered GPU_IS_LOST after giving its identity."""
    lost = Missing("gpu_lost", "GPU is lost")
    keep = {"index", "uuid", "name", "pci_bus_id", "lost"}
    gpu = s.gpu(index)
    changes = {f.name: lost for f in dataclasses.fields(gpu) if f.name not in keep}
    return swap_gpu(s, index, replace(gpu, lost=True, **changes))


def test_a_mig_machine_with_a_lost_gpu_counts_one_device_everywhere(
    capsys, tmp_path: Path, snapshot_of: SnapshotOf
) -> None:  # type: ignore[no-untyped-def]
    # a100_mig: GPU 0, 2, 3 in MIG mode, GPU 1 whole; GPU 1 falls off the bus. CUDA sees MIG 0 of GPU 0 only.
    path = tmp_path / "mig_lost.json"
    from gpudoctor.snapshot import write

    write(lost_midway(snapshot_of("a100_mig"), 1), path)
    found = every_finding(capsys, path)
    assert the(found, "GD201")["message"].startswith("1 device(s) visible: cuda:0=MIG 0 of GPU 0")
    assert "this run sees 1 device(s) (cuda:0=MIG 0 of GPU 0" in the(found, "GD820")["message"]
    assert the(found, "GD301")["message"].startswith("one GPU visible")
    assert the(found, "GD401")["message"] == "one GPU visible (GPU 0): no GPU pairs"
    assert (the(found, "GD827")["status"], the(found, "GD827")["subject"]) == ("fail", "gpu:1")


def test_integer_entries_after_a_lost_gpu_select_other_gpus_and_gd204_says_so(snapshot_of: SnapshotOf) -> None:
    s = replace(lost_before_the_probe(snapshot_of("h100_sxm_8x"), 3), env={"CUDA_VISIBLE_DEVICES": "4,5,6,7"})
    ctx = CheckContext(s)
    assert ctx.visible.nvml_indices == (5, 6, 7)
    found = visibility.visibility(ctx)
    shifted = [f for f in found if f.code == "GD204" and f.evidence["problem"] == "lost_shift"]
    assert len(shifted) == 1 and "now selects GPU 5, 6, 7, not GPU 4, 5, 6, 7" in shifted[0].message
    assert "UUID" in shifted[0].message
    (past,) = [f for f in found if f.code == "GD204" and f.evidence["problem"] == "out_of_range"]
    assert "there is no GPU 7 (CUDA sees 7: GPU 3 is lost)" in past.message
    (gd827,) = lost_gpus.lost_gpus(ctx)
    assert gd827.status is Status.WARN, "GPU 3 is not among the GPUs 4-7 the run asked for"


def test_a_lost_gpu_the_run_asks_for_fails_and_its_uuid_ends_the_list(snapshot_of: SnapshotOf) -> None:
    s = lost_before_the_probe(snapshot_of("h100_sxm_8x"), 3)
    by_index = CheckContext(replace(s, env={"CUDA_VISIBLE_DEVICES": "2,3"}))
    assert lost_gpus.lost_gpus(by_index)[0].status is Status.FAIL
    uuid3, uuid4 = snapshot_of("h100_sxm_8x").gpu(3).uuid, snapshot_of("h100_sxm_8x").gpu(4).uuid
    # Lost midway: NVML gave its UUID before the loss, so the entry is named for what it is.
    by_uuid = CheckContext(
        replace(lost_midway(snapshot_of("h100_sxm_8x"), 3), env={"CUDA_VISIBLE_DEVICES": f"{uuid3},{uuid4}"})
    )
    assert by_uuid.visible.count == 0
    (dropped,) = [f for f in visibility.visibility(by_uuid) if f.code == "GD204"]
    assert f"entry '{uuid3}' is GPU 3, which is lost (GD827): CUDA stops there" == dropped.message
    assert lost_gpus.lost_gpus(by_uuid)[0].status is Status.FAIL
    # Lost before the probe: no UUID to match, so the entry may be that GPU.
    unnamed = CheckContext(replace(s, env={"CUDA_VISIBLE_DEVICES": uuid3}))
    (dropped,) = [f for f in visibility.visibility(unnamed) if f.code == "GD204"]
    assert "matches no GPU on this machine (perhaps lost GPU 3, whose UUID NVML cannot give: GD827)" in dropped.message


def test_every_gpu_lost_leaves_none_visible_and_says_why(snapshot_of: SnapshotOf) -> None:
    s = snapshot_of("h100_sxm_8x")
    for i in range(8):
        s = lost_before_the_probe(s, i)
    (gd201,) = [f for f in visibility.visibility(CheckContext(s)) if f.code == "GD201"]
    assert gd201.status is Status.FAIL
    assert gd201.message == (
        "no GPU is visible to CUDA (8 installed): GPU 0, 1, 2, 3, 4, 5, 6, 7 do not answer NVML and CUDA does "
        "not enumerate them (GD827)"
    )
