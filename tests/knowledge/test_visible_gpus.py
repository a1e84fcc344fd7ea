"""CUDA_VISIBLE_DEVICES / CUDA_DEVICE_ORDER resolution, checked against torch's own parser."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpudoctor.knowledge.visible_gpus import FASTEST_FIRST, PCI_BUS_ID, parse, resolve, strtoul
from gpudoctor.snapshot import Missing, Snapshot
from tests.helpers.snapshots import load

H100 = load("h100_sxm_8x")
UUIDS = [g.uuid for g in H100.gpus]


def vis(snapshot: Snapshot, **env: str):  # type: ignore[no-untyped-def]
    return resolve(replace(snapshot, env=env))


@pytest.mark.parametrize(
    ("text", "value"),
    [("3", 3), (" 3", 3), ("+3", 3), ("3gpu", 3), ("-1", -1), ("", -1), ("gpu", -1), ("+", -1), ("07", 7)],
)
def test_strtoul_reads_like_c(text: str, value: int) -> None:
    assert strtoul(text) == value


@pytest.mark.parametrize(
    ("cvd", "nvml"),
    [
        (None, (0, 1, 2, 3, 4, 5, 6, 7)),
        ("", ()),
        ("3,1", (3, 1)),
        (" 2 , 4", (2, 4)),
        ("1,x,2", (1,)),  # parsing stops at the first invalid entry
        ("5,8,1", (5,)),  # an index past the device count ends the list there
        ("2,3,2", ()),  # a repeated entry hides every GPU
        ("-1", ()),
    ],
)
def test_integer_lists(cvd: str | None, nvml: tuple[int, ...]) -> None:
    env = {} if cvd is None else {"CUDA_VISIBLE_DEVICES": cvd}
    assert vis(H100, **env).nvml_indices == nvml


def test_uuids_and_unique_prefixes_select_gpus() -> None:
    full = f"{UUIDS[6]},{UUIDS[2][:18]}"
    v = vis(H100, CUDA_VISIBLE_DEVICES=full)
    assert v.nvml_indices == (6, 2)
    assert [d.uuid for d in v.devices] == [UUIDS[6], UUIDS[2]]


def test_ambiguous_prefix_and_stray_space_stop_the_list() -> None:
    ambiguous = vis(H100, CUDA_VISIBLE_DEVICES=f"{UUIDS[1]},GPU-0000")
    assert ambiguous.nvml_indices == (1,)
    assert [p.kind for p in ambiguous.problems] == ["ambiguous_uuid"]
    spaced = vis(H100, CUDA_VISIBLE_DEVICES=f"{UUIDS[1]}, {UUIDS[2]}")
    assert spaced.nvml_indices == (1,)
    assert "stray space" in spaced.problems[0].message


def test_same_gpu_by_two_prefixes_hides_everything() -> None:
    v = vis(H100, CUDA_VISIBLE_DEVICES=f"{UUIDS[4]},{UUIDS[4][:20]}")
    assert v.devices == () and v.problems[0].kind == "duplicate"


def test_fastest_first_puts_the_faster_cards_first_and_pci_bus_id_follows_nvidia_smi() -> None:
    mixed = load("rtx4090_2x_rtx4080_1x")
    default = vis(mixed)
    assert default.order == FASTEST_FIRST
    assert default.nvml_indices == (0, 2, 1)
    assert vis(mixed, CUDA_VISIBLE_DEVICES="1").nvml_indices == (2,)  # cuda index 1 is the second 4090
    pci = vis(mixed, CUDA_DEVICE_ORDER="PCI_BUS_ID", CUDA_VISIBLE_DEVICES="1")
    assert pci.order == PCI_BUS_ID and pci.nvml_indices == (1,)
    odd = vis(mixed, CUDA_DEVICE_ORDER="pci")
    assert odd.order == FASTEST_FIRST and odd.problems[0].kind == "unknown_order"


def unreadable_speed(snapshot: Snapshot, index: int, reason: str = "error") -> Snapshot:
    """GPU `index` with its compute capability and memory size unread (NVML answered `reason`)."""
    gone = Missing(reason, "test")
    gpus = [
        replace(g, compute_capability=gone, memory_total_mib=gone) if g.index == index else g for g in snapshot.gpus
    ]
    return replace(snapshot, gpus=gpus)


@pytest.mark.parametrize("reason", ["error", "no_permission", "unsupported"])
def test_an_unreadable_compute_capability_does_not_reorder_identical_gpus(reason: str) -> None:
    # 8 identical H100s: CUDA numbers them in PCI order whatever NVML could read of GPU 3.
    v = vis(unreadable_speed(H100, 3, reason))
    assert v.nvml_indices == tuple(range(8)) and v.order_unknown == ()


def test_an_unreadable_gpu_takes_the_reading_of_its_twin() -> None:
    mixed = load("rtx4090_2x_rtx4080_1x")  # GPU 0, 2: RTX 4090; GPU 1: RTX 4080
    v = vis(unreadable_speed(mixed, 2))
    assert v.nvml_indices == (0, 2, 1) and v.order_unknown == ()  # as with every reading known


def test_a_model_with_no_readable_speed_leaves_the_order_unknown_and_gd205_says_so() -> None:
    from gpudoctor.checks.visibility import visibility
    from gpudoctor.engine import CheckContext

    mixed = unreadable_speed(load("rtx4090_2x_rtx4080_1x"), 1)  # the only 4080
    v = vis(mixed)
    assert v.order_unknown == (1,) and v.nvml_indices == (0, 1, 2), "an unknown never reorders: PCI order"
    found = visibility(CheckContext(mixed))
    (order,) = [f for f in found if f.code == "GD205"]
    assert "which card is cuda:N cannot be predicted" in order.message
    assert "compute capability or memory unreadable on GPU 1" in order.message
    (gd201,) = [f for f in found if f.code == "GD201"]
    assert "cuda: order assumed PCI" in gd201.message
    assert not [
        f for f in visibility(CheckContext(replace(mixed, env={"CUDA_DEVICE_ORDER": PCI_BUS_ID}))) if f.code == "GD205"
    ]


def test_mig_a_process_sees_one_instance() -> None:
    mig = load("a100_mig")
    default = vis(mig)
    assert default.count == 1 and default.devices[0].mig is not None
    first = mig.gpus[2].mig_devices[1].uuid  # type: ignore[union-attr]
    second = mig.gpus[3].mig_devices[0].uuid  # type: ignore[union-attr]
    listed = vis(mig, CUDA_VISIBLE_DEVICES=f"{first},{second}")
    assert [(d.nvml_index, d.uuid) for d in listed.devices] == [(2, first)]
    assert listed.problems[0].kind == "mig_one_instance" and listed.problems[0].dropped == (second,)


def test_visibility_module_does_not_import_torch() -> None:
    code = (
        "import sys, gpudoctor.knowledge.visible_gpus, gpudoctor.knowledge.interconnect; print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# ------------------------------------------------------------------------------ agreement with torch

torch_cuda = pytest.importorskip("torch.cuda")

ENTRY = st.one_of(
    st.integers(-3, 12).map(str),
    st.sampled_from(["GPU-", "MIG-", "gpu", "+", "-", "", "GPU-0000", "MIG-0000", *(u[:14] for u in UUIDS)]),
    st.sampled_from(UUIDS),
    st.text(alphabet="0123456789+-abcGPUMI- \t", max_size=5),
)
CVD = st.one_of(
    st.lists(ENTRY, max_size=6).map(",".join),
    st.lists(st.tuples(st.sampled_from(["", " ", "\t"]), ENTRY), max_size=4).map(
        lambda parts: ",".join(pad + e for pad, e in parts)
    ),
    st.text(alphabet="0123456789,+- GPU-abcdef", max_size=12),
)


def torch_answer(value: str) -> tuple[int, list[int] | None] | None:
    """torch's device count and ordinals for `value` on the 8-GPU fixture; None where torch raises."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CUDA_VISIBLE_DEVICES", value)
        mp.setattr(torch_cuda, "_raw_device_count_nvml", lambda: len(UUIDS))
        mp.setattr(torch_cuda, "_raw_device_uuid_nvml", lambda: list(UUIDS))
        try:
            parsed = torch_cuda._parse_visible_devices()
            count = torch_cuda._device_count_nvml()
        except ValueError:  # torch's _strtoul crashes on a bare sign ("+", "-x"); CUDA reads it as invalid
            return None
    if count < 0:  # MIG UUIDs: torch does not count them
        return count, None
    if parsed and isinstance(parsed[0], str):
        ordinals = torch_cuda._transform_uuid_to_ordinals(parsed, list(UUIDS))
    else:
        ordinals = list(parsed)[:count]
    return count, ordinals


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(CVD)
def test_parser_agrees_with_torch(value: str) -> None:
    expected = torch_answer(value)
    if expected is None:
        assert parse(value).kind == "int"  # we read the entry as invalid instead of crashing
        return
    count, ordinals = expected
    got = vis(H100, CUDA_VISIBLE_DEVICES=value)
    if ordinals is None:
        assert value.startswith("MIG-") and got.count == 0  # no MIG on this machine
        return
    assert got.count == count, (value, got.problems)
    # identical GPUs: FASTEST_FIRST is PCI order, so CUDA ordinals are NVML indices
    assert list(got.nvml_indices) == ordinals


@pytest.mark.parametrize("cvd", ["0,0", "", "9", "GPU-zzz", " GPU-" + UUIDS[0][4:]])
def test_gd201_does_not_repeat_gd204(cvd: str) -> None:
    from gpudoctor.checks.visibility import visibility
    from gpudoctor.engine import CheckContext

    found = visibility(CheckContext(replace(H100, env={"CUDA_VISIBLE_DEVICES": cvd})))
    gd201 = [f for f in found if f.code == "GD201"]
    gd204 = [f.message for f in found if f.code == "GD204"]
    assert gd201 and gd204
    for sentence in gd204:
        assert sentence not in gd201[0].message
    if gd201[0].status.value == "fail":
        assert "GD204 says why" in gd201[0].message


def test_gd201_and_gd820_describe_the_same_mig_device() -> None:
    from gpudoctor.checks.gpu_modes import gpu_modes
    from gpudoctor.checks.visibility import visibility
    from gpudoctor.engine import CheckContext

    ctx = CheckContext(load("a100_mig"))
    (gd201,) = [f for f in visibility(ctx) if f.code == "GD201"]
    (gd820,) = [f for f in gpu_modes(ctx) if f.code == "GD820"]
    seen = "cuda:0=MIG 0 of GPU 0 (19968 MiB)"
    assert seen in gd201.message and seen in gd820.message
    assert gd201.message.startswith("1 device(s) visible") and "sees 1 device(s)" in gd820.message
    assert "GPU 0, 1, 2, 3" in gd820.message  # every MIG GPU the run selected, not just the one it got
    assert gd201.evidence["visible"] == gd820.evidence["devices_seen"] == 1


def test_gd205_says_what_the_users_indices_select_under_fastest_first() -> None:
    """review3 V5: CUDA_VISIBLE_DEVICES=0,2 on 4090, 4080, 4090 picks the 4080; GD205 names the run's
    GPUs under FASTEST_FIRST against what the indices mean in nvidia-smi's numbering, and the fix."""
    from gpudoctor.checks.visibility import visibility
    from gpudoctor.engine import CheckContext

    mixed = load("rtx4090_2x_rtx4080_1x")  # GPU 0, 2: RTX 4090; GPU 1: RTX 4080
    found = visibility(CheckContext(replace(mixed, env={**mixed.env, "CUDA_VISIBLE_DEVICES": "0,2"})))
    (order,) = [f for f in found if f.code == "GD205"]
    assert order.message.startswith(
        "CUDA_VISIBLE_DEVICES='0,2' selects nvidia-smi's GPU 0 (GeForce RTX 4090) and GPU 1 (GeForce RTX 4080) "
        "as cuda:0-1"
    )
    assert "it means GPU 0 (GeForce RTX 4090) and GPU 2 (GeForce RTX 4090)" in order.message
    assert order.message.endswith("set CUDA_DEVICE_ORDER=PCI_BUS_ID")
    assert "cuda:2" not in order.message, "the run has two devices"
    assert (order.evidence["selected"], order.evidence["selected_with_pci_bus_id"]) == ([0, 1], [0, 2])
    # An index FASTEST_FIRST leaves in place, and UUIDs, select the same GPUs either way: said so.
    (same,) = [
        f
        for f in visibility(CheckContext(replace(mixed, env={**mixed.env, "CUDA_VISIBLE_DEVICES": "0"})))
        if f.code == "GD205"
    ]
    assert "'0': the same GPUs either way" in same.message and "CUDA's index 1 is nvidia-smi's GPU 2" in same.message
    uuids = f"{mixed.gpus[1].uuid},{mixed.gpus[0].uuid}"
    (by_uuid,) = [
        f
        for f in visibility(CheckContext(replace(mixed, env={**mixed.env, "CUDA_VISIBLE_DEVICES": uuids})))
        if f.code == "GD205"
    ]
    assert "by UUID, which no order changes" in by_uuid.message


def test_a_very_long_list_is_read_in_one_pass_and_quoted_short() -> None:
    """Hostile review M7: duplicates were looked up in a list (200,000 entries: over a minute)."""
    numbers = ",".join(map(str, range(100_000)))
    assert parse(numbers).values[-1] == 99_999
    (problem,) = parse(numbers + ",7").problems
    assert problem.kind == "duplicate" and "device 7 is listed twice" in problem.message
    assert len(problem.message) < 200  # the value is quoted cut short, not 590 KB of it
    uuids = ",".join(f"GPU-{i:032x}" for i in range(100_000))
    assert len(parse(uuids).values) == 100_000
