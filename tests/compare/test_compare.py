"""--baseline and diff: changed facts and measured regressions, from recorded reports and snapshots.

tests/fixtures/reports/ holds two reports written by gpudoctor 0.1.0 (report schema 1, before
`facts` and `measurements` existed): a static check of the 8x H100 fixture, and a real CPU run
with 2 gloo ranks (all-reduce sweep and DDP run) on the development machine.
"""

from __future__ import annotations

import copy
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from gpudoctor.compare import machine_facts, sides
from gpudoctor.errors import UserError
from tests.helpers.cli import run_cli
from tests.helpers.snapshots import fixture, load, with_env, with_gpu, write_variant
from tests.paths import FIXTURES, H100

REPORTS = FIXTURES / "reports"
V1_STATIC = REPORTS / "v1-h100-static.json"
V1_CPU = REPORTS / "v1-cpu-2ranks.json"


def save(tmp_path: Path, name: str, doc: dict[str, Any]) -> str:
    path = tmp_path / name
    path.write_text(json.dumps(doc))
    return str(path)


def codes(findings: list[dict[str, Any]], status: str | None = None) -> set[str]:
    return {f["code"] for f in findings if status is None or f["status"] == status}


pytestmark = pytest.mark.usefixtures("no_policy")


# --- reading old and new reports -------------------------------------------------------------


def test_a_v1_report_is_read_and_its_measurements_recovered() -> None:
    side = sides.load_side(V1_CPU)
    assert side.kind == "report" and side.facts is None and side.written_by == "0.1.0"
    ar = side.measurements["allreduce"]
    assert (
        ar["backend"] == "gloo"
        and ar["ranks"] == 2
        and [s["bytes"] for s in ar["sizes"]]
        == [
            65536,
            262144,
            1048576,
            4194304,
        ]
    )
    assert ar["sizes"][-1]["busbw_gbps"] == pytest.approx(1.277545)
    ddp = side.measurements["ddp"]
    assert ddp["ranks"] == 2 and ddp["step_s"] == pytest.approx(0.0022)  # the rank table's "2.2" ms


def test_a_report_whose_facts_list_a_gpu_twice_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Hostile review M5: a report with its GPU list doubled passed `diff` as "16 GPU(s) as in the baseline"."""
    report = run_cli(capsys, "check", "--snapshot", str(H100), "--json").doc
    doubled = copy.deepcopy(report)
    doubled["facts"]["gpus"] *= 2
    path = save(tmp_path, "doubled.json", doubled)
    r = run_cli(capsys, "diff", save(tmp_path, "r.json", report), path)
    assert r.exit_code == 2
    assert "its `facts` cannot be one machine's: two GPUs share the GPU index 0" in r.err
    fleet = run_cli(capsys, "fleet", path, str(H100), str(FIXTURES / "a100_sxm_8x.json"), "--json")
    assert any("two GPUs share the GPU index 0" in f["message"] for f in fleet.findings("GD464"))


def test_a_new_report_carries_facts_and_measurements(capsys: pytest.CaptureFixture[str]) -> None:
    doc = run_cli(capsys, "check", "--snapshot", H100, "--json").doc
    assert doc["schema_version"] == 1
    assert len(doc["facts"]["gpus"]) == 8 and doc["facts"]["driver_version"] == "550.54.15"
    assert doc["facts"]["gpus"][0]["nvlinks_active"] == 18 and doc["measurements"] == {}


def test_baseline_against_a_v1_report_compares_what_it_holds(capsys: pytest.CaptureFixture[str]) -> None:
    r = run_cli(capsys, "check", "--snapshot", H100, "--json", "--baseline", str(V1_STATIC))
    assert r.exit_code == 0
    gd011 = r.one("GD011")
    assert gd011["status"] == "skip" and "records no machine facts" in gd011["message"]


# --- facts -----------------------------------------------------------------------------------


def diff_json(capsys: pytest.CaptureFixture[str], a: str, b: str, *extra: str) -> Any:
    return run_cli(capsys, "diff", a, b, "--json", *extra)


def test_the_same_snapshot_twice_is_all_pass(capsys: pytest.CaptureFixture[str]) -> None:
    r = diff_json(capsys, H100, H100)
    assert r.exit_code == 0 and r.doc["command"] == "diff"
    assert codes(r.findings(), "pass") == {"GD011", "GD012", "GD013", "GD017", "GD018", "GD019"}
    assert "same UUIDs" in r.one("GD011")["message"]


def test_a_gpu_that_fell_off_the_bus_fails(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    h100 = load("h100_sxm_8x")
    gone = replace(h100, gpus=h100.gpus[:7], pairs=[p for p in h100.pairs if 7 not in (p.a, p.b)])
    r = diff_json(capsys, H100, write_variant(tmp_path, gone))
    assert r.exit_code == 1
    (f,) = r.findings("GD011")
    assert f["status"] == "fail" and f["subject"] == "gpu:7"
    assert "is gone: 7 GPU(s) now, 8 in the baseline" in f["message"]
    assert f["evidence"]["baseline"]["pci_bus_id"] == h100.gpus[7].pci_bus_id


def test_links_down_and_a_narrower_slot_fail_with_both_values(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    h100 = load("h100_sxm_8x")
    links = h100.gpu(3).nvlinks
    assert isinstance(links, list)
    fewer = [replace(link, active=link.link < 12) for link in links]
    variant = with_gpu(with_gpu(h100, 3, nvlinks=fewer), 5, pcie_width_max=8)
    r = diff_json(capsys, H100, write_variant(tmp_path, variant))
    by_field = {f["evidence"]["field"]: f for f in r.findings("GD013")}
    assert by_field["nvlinks_active"]["status"] == "fail" and by_field["nvlinks_active"]["subject"] == "gpu:3"
    assert "active NVLinks: 18 in the baseline, 12 now" in by_field["nvlinks_active"]["message"]
    width = by_field["pcie_width_max"]
    assert width["status"] == "fail" and width["subject"] == "gpu:5"
    assert (width["evidence"]["baseline"], width["evidence"]["current"]) == (16, 8)
    assert r.exit_code == 1


def test_more_links_than_the_baseline_only_warn(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    h100 = load("h100_sxm_8x")
    links = h100.gpu(0).nvlinks
    assert isinstance(links, list)
    degraded = with_gpu(h100, 0, nvlinks=[replace(link, active=link.link < 17) for link in links])
    r = diff_json(capsys, write_variant(tmp_path, degraded), H100)
    (f,) = r.findings("GD013")
    assert f["status"] == "warn" and "refresh" in f["hint"] and r.exit_code == 0


def test_driver_and_vbios_changes_warn(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    h100 = load("h100_sxm_8x")
    updated = replace(h100, driver=replace(h100.driver, driver_version="560.35.03"))
    updated = replace(updated, gpus=[replace(g, vbios="96.00.99.00.01") for g in updated.gpus])
    r = diff_json(capsys, H100, write_variant(tmp_path, updated))
    found = {f["message"]: f for f in r.findings("GD012")}
    assert any("driver 550.54.15 -> 560.35.03" in m for m in found)
    vbios = next(f for f in found.values() if f["evidence"].get("field") == "vbios")
    assert vbios["subject"] == "host" and vbios["evidence"]["gpus"] == list(range(8))  # one finding for 8 GPUs
    assert {f["status"] for f in found.values()} == {"warn"} and r.exit_code == 0


def test_an_inforom_or_gsp_firmware_update_on_one_gpu_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    h100 = load("h100_sxm_8x")
    old = h100.gpu(5)
    assert isinstance(old.inforom_image, str) and isinstance(old.gsp_firmware, str)  # the fixture records both
    updated = with_gpu(h100, 5, inforom_image="G520.0200.00.99", gsp_firmware="560.35.03")
    r = diff_json(capsys, H100, write_variant(tmp_path, updated))
    by_field = {f["evidence"].get("field"): f for f in r.findings("GD012")}
    assert by_field["inforom_image"]["subject"] == "gpu:5"
    assert (
        f"InfoROM image: {old.inforom_image} in the baseline, G520.0200.00.99 now"
        in by_field["inforom_image"]["message"]
    )
    assert by_field["gsp_firmware"]["status"] == "warn"


def test_a_replaced_board_warns_on_the_same_host_and_another_host_is_not_uuid_compared(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    h100 = load("h100_sxm_8x")
    swapped = with_gpu(h100, 2, uuid="GPU-00000000-1111-2222-3333-444444444444")
    r = diff_json(capsys, H100, write_variant(tmp_path, swapped, "swapped"))
    (f,) = r.findings("GD011")
    assert f["status"] == "warn" and f["subject"] == "gpu:2" and "was replaced" in f["message"]
    other = replace(
        h100,
        host=replace(h100.host, hostname="node-b"),
        gpus=[replace(g, uuid=f"GPU-{g.index:08d}-0000-0000-0000-000000000000") for g in h100.gpus],
    )
    r = diff_json(capsys, H100, write_variant(tmp_path, other, "other"))
    assert r.one("GD011")["status"] == "pass" and "another machine" in r.one("GD011")["message"]


def test_diff_text_output_names_both_sides(capsys: pytest.CaptureFixture[str]) -> None:
    a100 = str(fixture("a100_sxm_8x"))
    r = run_cli(capsys, "diff", H100, a100)
    assert r.exit_code == 1
    lines = r.out.splitlines()
    assert lines[0].endswith(f"diff on {H100} -> {a100}")
    assert any("GPUs 0, 1, 2, 3, 4, 5, 6, 7 model: NVIDIA H100 80GB HBM3 in the baseline" in line for line in lines)
    assert len(lines) < 20  # equal changes on 8 GPUs are one finding each


# --- measurements ----------------------------------------------------------------------------


def regressed(doc: dict[str, Any], busbw_factor: dict[int, float], step_factor: float = 1.0) -> dict[str, Any]:
    """The recorded CPU report with chosen sizes' busbw and the DDP step time scaled."""
    out = copy.deepcopy(doc)
    for check in out["checks"]:
        if check["name"] == "allreduce":
            for row in check["details"]["sweep"]["rows"]:
                row["busbw_gbps"] *= busbw_factor.get(row["bytes"], 1.0)
        if check["name"] == "ddp":
            for row in check["details"]["tables"][0]["rows"]:
                row[5] = f"{float(row[5]) * step_factor:.1f}"
    return out


def test_busbw_and_step_time_regressions_from_a_recorded_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = json.loads(V1_CPU.read_text())
    worse = save(tmp_path, "worse.json", regressed(base, {1 << 20: 0.5, 4 << 20: 0.85}, step_factor=1.5))
    r = diff_json(capsys, str(V1_CPU), worse)
    assert r.exit_code == 1
    busbw = r.one("GD014")
    assert busbw["status"] == "fail"
    # Judged where the sweep is bandwidth-bound (the plateau: 1 and 4 MiB here), each size named.
    assert "where it is bandwidth-bound (1 MiB to 4 MiB): best 1.09 GB/s, baseline 1.28 GB/s (-15%)" in busbw["message"]
    assert "1 MiB 0.52 -> 0.26 GB/s (-50%)" in busbw["message"]
    rows = {row["bytes"]: row for row in busbw["evidence"]["sizes"]}
    assert rows[4 << 20]["baseline_gbps"] == pytest.approx(1.277545)
    assert rows[4 << 20]["measured_gbps"] == pytest.approx(1.277545 * 0.85)
    step = r.one("GD015")
    assert step["status"] == "warn" and "2.2 ms in the baseline, 3.3 ms now (+50%)" in step["message"]
    # The same figures within a 60% tolerance pass.
    assert diff_json(capsys, str(V1_CPU), worse, "--tolerance", "60%").exit_code == 0


def test_a_faster_run_is_not_a_regression(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    better = save(tmp_path, "better.json", regressed(json.loads(V1_CPU.read_text()), {1 << 20: 2.0}, 0.5))
    r = diff_json(capsys, str(V1_CPU), better)
    assert r.exit_code == 0 and r.one("GD014")["status"] == "pass" and r.one("GD015")["status"] == "pass"


def test_runs_of_different_shapes_are_not_compared(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc = json.loads(V1_CPU.read_text())
    wider = copy.deepcopy(doc)
    for check in wider["checks"]:
        if check["name"] == "allreduce":
            check["details"]["sweep"]["world_size"] = 4
    r = diff_json(capsys, str(V1_CPU), save(tmp_path, "wider.json", wider))
    busbw = r.one("GD014")
    assert busbw["status"] == "skip" and "ranks 2, this run 4" in busbw["message"]


def p2p_report(gbps: dict[str, float]) -> dict[str, Any]:
    doc = json.loads(V1_STATIC.read_text())
    doc["measurements"] = {
        "p2p": {pair: {"p2p_gbps": v, "staged_gbps": 20.0, "path": "NV18"} for pair, v in gbps.items()}
    }
    return doc


def test_p2p_regression_names_the_pair(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = save(tmp_path, "base.json", p2p_report({"0-1": 380.0, "0-2": 381.0}))
    now = save(tmp_path, "now.json", p2p_report({"0-1": 379.0, "0-2": 190.0}))
    r = diff_json(capsys, base, now)
    (f,) = [f for f in r.findings("GD016") if f["status"] == "fail"]
    assert f["subject"] == "pair:0-2" and "381.0 GB/s in the baseline, 190.0 GB/s now" in f["message"]


def test_check_with_a_baseline_adds_the_comparison_to_the_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = run_cli(capsys, "check", "--snapshot", H100, "--json").out
    path = tmp_path / "base.json"
    path.write_text(base)
    r = run_cli(capsys, "check", "--snapshot", H100, "--json", "--baseline", str(path))
    assert r.exit_code == 0
    names = [c["name"] for c in r.doc["checks"]]
    assert names[-2:] == ["baseline_facts", "baseline_measurements"]
    assert r.one("GD014")["status"] == "skip"  # --snapshot measures nothing
    only = run_cli(capsys, "check", "--snapshot", H100, "--json", "--baseline", str(path), "--ignore", "GD01")
    assert "baseline_facts" not in [c["name"] for c in only.doc["checks"]]


# --- refusals --------------------------------------------------------------------------------


def refusal_cases(tmp_path: Path) -> dict[str, tuple[str, str]]:
    newer = json.loads(V1_STATIC.read_text()) | {"schema_version": 99}
    error = {"schema_version": 1, "command": "check", "exit_code": 2, "error": {"kind": "usage", "message": "x"}}
    bench = {"schema_version": 1, "command": "bench", "exit_code": 0, "results": {}}
    (tmp_path / "nan.json").write_text('{"schema_version": 1, "command": "check", "checks": [], "x": NaN}')
    (tmp_path / "text.json").write_text("not json at all")
    return {
        "newer": (save(tmp_path, "newer.json", newer), "newer than this gpudoctor reads (1): upgrade gpudoctor"),
        "error": (save(tmp_path, "error.json", error), "the error document of a run that did not finish"),
        "bench": (save(tmp_path, "bench.json", bench), "a `gpudoctor bench` document"),
        "nan": (str(tmp_path / "nan.json"), "NaN is not a number JSON allows"),
        "text": (str(tmp_path / "text.json"), "not valid JSON"),
        "other": (save(tmp_path, "other.json", {"hello": 1}), "not a gpudoctor report"),
        "missing": (str(tmp_path / "missing.json"), "no such file"),
        "bad snapshot": (save(tmp_path, "snap.json", {"schema_version": 1, "gpus": "x"}), "cannot be read"),
    }


@pytest.mark.parametrize("case", ["newer", "error", "bench", "nan", "text", "other", "missing", "bad snapshot"])
def test_an_unusable_baseline_is_refused_in_one_line_before_any_check(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str
) -> None:
    path, why = refusal_cases(tmp_path)[case]
    r = run_cli(capsys, "check", "--snapshot", H100, "--baseline", path)
    assert r.exit_code == 2 and r.out == ""
    assert r.err.count("\n") == 1 and f"cannot compare with {path}: " in r.err and why in r.err, r.err
    d = run_cli(capsys, "diff", path, H100, "--json")
    assert d.exit_code == 2 and why in d.doc["error"]["message"]


@pytest.mark.parametrize("value", ["10", "0", "100%", "abc", "-5%"])
def test_a_bad_tolerance_is_a_usage_error(capsys: pytest.CaptureFixture[str], value: str) -> None:
    r = run_cli(capsys, "diff", H100, H100, "--tolerance", value)
    assert r.exit_code == 2 and "tolerance" in r.err and r.err.count("\n") == 1


def test_pairing_by_bus_id_survives_a_missing_gpu_in_the_middle() -> None:
    gpus = [{"index": i, "pci_bus_id": f"0000:{i:02x}:00.0"} for i in range(4)]
    after = [dict(g, index=n) for n, g in enumerate(g for g in gpus if g["index"] != 1)]  # NVML renumbers
    pairs, gone, new = machine_facts.pair_gpus(gpus, after)
    assert [g["pci_bus_id"] for g in gone] == ["0000:01:00.0"] and not new
    assert [(b["index"], c["index"]) for b, c in pairs] == [(0, 0), (2, 1), (3, 2)]


def test_a_snapshot_side_reads_like_a_report() -> None:
    side = sides.side_from_json(json.loads(Path(H100).read_text()), "x")
    assert side.kind == "snapshot" and side.measurements == {} and side.facts is not None
    assert side.facts == sides.load_side(H100).facts


def test_select_gd01_runs_only_the_comparison(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    r = run_cli(capsys, "check", "--snapshot", H100, "--json", "--baseline", H100, "--select", "GD01")
    assert r.exit_code == 0
    assert [c["name"] for c in r.doc["checks"]] == ["baseline_facts", "baseline_measurements"]
    empty = run_cli(capsys, "diff", H100, H100, "--ignore", "GD01")
    assert empty.exit_code == 2 and "no comparison left" in empty.err


@pytest.mark.slow
def test_a_real_cpu_run_against_the_recorded_one(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Both sides measured for real (gloo, 2 ranks): the comparison runs on live figures.

    The tolerance is wide on purpose: CPU timings on a shared machine vary by a factor; what is
    tested is that every measurement is compared, size by size and step by step, both values kept.
    """
    prom = tmp_path / "m.prom"
    r = run_cli(
        capsys,
        *("check", "--device", "cpu", "--ranks", "2", "--json", "--tolerance", "99%"),
        *("--baseline", str(V1_CPU), "--prometheus", str(prom), "--select", "allreduce,ddp,GD01"),
    )
    doc = r.doc  # validates against the schema, measurements included
    measured = doc["measurements"]
    assert [s["bytes"] for s in measured["allreduce"]["sizes"]] == [65536, 262144, 1048576, 4194304]
    assert measured["ddp"]["ranks"] == 2 and measured["ddp"]["step_s"] > 0
    busbw = r.one("GD014")
    assert busbw["status"] == "pass" and len(busbw["evidence"]["sizes"]) == 4
    assert {row["baseline_gbps"] for row in busbw["evidence"]["sizes"]} == {
        s["busbw_gbps"] for s in sides.load_side(V1_CPU).measurements["allreduce"]["sizes"]
    }
    assert r.one("GD015")["evidence"]["baseline_step_s"] == pytest.approx(0.0022)
    assert "gpudoctor_allreduce_busbw_bytes_per_second" in prom.read_text()


@pytest.mark.parametrize("path", [V1_STATIC, V1_CPU], ids=lambda p: p.name)
def test_reports_of_gpudoctor_0_1_still_validate_against_the_schema(path: Path) -> None:
    import jsonschema

    from gpudoctor.schemas import report_schema

    jsonschema.validate(json.loads(path.read_text()), report_schema())  # schema 1 grew, it did not break


# --- a GPU that fell off the bus is lost, not swapped ------------------------------------------

FALLEN = str(FIXTURES / "faults" / "gpu_fallen_off_bus.json")  # GPU 3: no handle, GPU_IS_LOST
MIDWAY = str(FIXTURES / "faults" / "gpu_lost_midway.json")  # GPU 5: lost after its identity was read


def test_facts_record_which_gpus_nvml_could_not_talk_to(capsys: pytest.CaptureFixture[str]) -> None:
    gpus = run_cli(capsys, "check", "--snapshot", FALLEN, "--json", "--no-config").doc["facts"]["gpus"]
    assert [g["lost"] for g in gpus] == [i == 3 for i in range(8)]
    assert gpus[3]["unreachable"] == "nvmlDeviceGetHandleByIndex(3): GPU is lost" and gpus[2]["unreachable"] is None


@pytest.mark.parametrize(("after", "gpu"), [(FALLEN, 3), (MIDWAY, 5)], ids=["no handle", "lost midway"])
def test_a_gpu_that_fell_off_the_bus_is_reported_lost_with_its_links_down(
    capsys: pytest.CaptureFixture[str], after: str, gpu: int
) -> None:
    r = diff_json(capsys, H100, after)
    assert r.exit_code == 1
    (lost,) = r.findings("GD011")
    assert lost["status"] == "fail" and lost["subject"] == f"gpu:{gpu}"
    assert "is lost: NVML answers GPU_IS_LOST (fallen off the bus)" in lost["message"]
    assert "NVIDIA H100 80GB HBM3 in the baseline" in lost["message"]
    assert "GD827" in lost["hint"] and "do not refresh the baseline" in lost["hint"]
    assert "replaced" not in json.dumps(r.doc) and "model:" not in json.dumps(r.doc)  # no board swap
    (links,) = r.findings("GD013")
    assert links["status"] == "fail" and links["subject"] == f"gpu:{gpu}"
    assert "18 active NVLinks and PCIe Gen5 x16 in the baseline, none now" in links["message"]
    assert links["evidence"]["current"]["nvlinks_active"] == 0 and links["evidence"]["baseline"]["nvlinks_active"] == 18


def test_check_with_a_baseline_on_the_machine_with_the_lost_gpu(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    r = run_cli(capsys, "check", "--snapshot", FALLEN, "--json", "--baseline", H100, "--select", "GD01,GD827")
    assert r.one("GD827")["status"] == "fail"
    assert r.one("GD011")["status"] == "fail" and "is lost" in r.one("GD011")["message"]


def test_a_report_written_before_lost_was_recorded_still_shows_the_gpu_as_lost(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = run_cli(capsys, "check", "--snapshot", FALLEN, "--json", "--no-config").doc
    for g in doc["facts"]["gpus"]:
        del g["lost"], g["unreachable"]  # as gpudoctor wrote facts before this change
    r = diff_json(capsys, H100, save(tmp_path, "old.json", doc))
    (lost,) = r.findings("GD011")
    assert lost["status"] == "fail" and "is lost" in lost["message"]


def test_a_baseline_recorded_with_a_lost_gpu_asks_for_a_new_one(capsys: pytest.CaptureFixture[str]) -> None:
    r = diff_json(capsys, FALLEN, H100)
    (back,) = r.findings("GD011")
    assert back["status"] == "warn" and "answers now; it was lost when the baseline was recorded" in back["message"]
    assert r.one("GD013")["status"] == "pass"


# --- busbw is judged where it is bandwidth-bound ---------------------------------------------


def test_one_noisy_latency_bound_size_is_not_a_regression(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = json.loads(V1_CPU.read_text())
    noisy = save(tmp_path, "noisy.json", regressed(base, {65536: 0.4}))  # 64 KiB: -60%
    r = diff_json(capsys, str(V1_CPU), noisy)
    busbw = r.one("GD014")
    assert busbw["status"] == "pass" and r.exit_code == 0
    assert "1 latency-bound size(s) slower, not judged" in busbw["message"]
    rows = {row["bytes"]: row for row in busbw["evidence"]["sizes"]}
    assert rows[65536]["change"] == pytest.approx(-0.6) and rows[65536]["bandwidth_bound"] is False
    assert busbw["evidence"]["bandwidth_bound_bytes"] == [1 << 20, 4 << 20]


def test_one_slow_repetition_on_the_plateau_is_not_a_regression(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = json.loads(V1_CPU.read_text())
    r = diff_json(capsys, str(V1_CPU), save(tmp_path, "one.json", regressed(base, {1 << 20: 0.5})))
    assert r.one("GD014")["status"] == "pass"  # 4 MiB, the plateau's best, holds


def test_a_regression_of_the_whole_curve_is_caught(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = json.loads(V1_CPU.read_text())
    everywhere = {size: 0.7 for size in (65536, 262144, 1 << 20, 4 << 20)}
    r = diff_json(capsys, str(V1_CPU), save(tmp_path, "slow.json", regressed(base, everywhere)))
    busbw = r.one("GD014")
    assert busbw["status"] == "fail" and r.exit_code == 1
    assert busbw["evidence"]["change"] == pytest.approx(-0.3, abs=1e-3)
    assert "(-30%)" in busbw["message"] and "1 MiB to 4 MiB" in busbw["message"]


# --- a malformed baseline is refused before any run; the comparison never crashes ------------


def _report_with_measurements(capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    doc = run_cli(capsys, "check", "--snapshot", H100, "--json", "--no-config").doc
    doc["measurements"] = sides.load_side(V1_CPU).measurements
    doc["measurements"]["p2p"] = {"0-1": {"p2p_gbps": 100.0, "staged_gbps": None, "path": "NV18"}}
    return doc


MUTATED_PATHS = [
    ("measurements", "allreduce", "sizes", 0, "busbw_gbps"),
    ("measurements", "allreduce", "sizes", 0, "bytes"),
    ("measurements", "allreduce", "sizes", 0, "algbw_gbps"),
    ("measurements", "allreduce", "sizes", 0),
    ("measurements", "allreduce", "sizes"),
    ("measurements", "allreduce", "ranks"),
    ("measurements", "allreduce"),
    ("measurements", "ddp", "step_s"),
    ("measurements", "ddp"),
    ("measurements", "p2p", "0-1", "p2p_gbps"),
    ("measurements", "p2p", "0-1"),
    ("measurements", "p2p"),
    ("measurements",),
    ("facts", "gpus", 0),
    ("facts", "gpus", 0, "index"),
    ("facts", "gpus", 0, "pci_bus_id"),
    ("facts", "gpus", 0, "nvlinks_active"),
    ("facts", "gpus", 0, "name"),
    ("facts", "gpus", 0, "uuid"),
    ("facts", "gpus", 0, "memory_total_mib"),
    ("facts", "gpus", 0, "pcie_width_current"),
    ("facts", "gpus", 0, "lost"),
    ("facts", "hostname"),
    ("facts", "driver_version"),
    ("facts", "gpus"),
    ("facts",),
    ("schema_version",),
    ("command",),
    ("checks",),
]
DELETE = object()
VALUES = [None, "x", -1, 0, 1e308, -1e308, 5e-324, 10**400, [], {}, True, "NaN", DELETE]


def mutated(doc: dict[str, Any], path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    out = copy.deepcopy(doc)
    node = out
    for key in path[:-1]:
        node = node[key]
    if value is DELETE:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return out


def test_every_malformed_baseline_is_refused_or_compared_never_a_crash(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The review's 216 crashes: each mutation on either side is a one-line refusal (UserError) or
    a report that renders and validates against the schema."""
    import jsonschema

    from gpudoctor.schemas import report_schema

    schema = report_schema()
    validator = jsonschema.validators.validator_for(schema)(schema)  # checked and built once, not per report
    good = save(tmp_path, "good.json", _report_with_measurements(capsys))
    outcomes = {"refused": 0, "compared": 0}
    for path in MUTATED_PATHS:
        for value in VALUES:
            bad = save(tmp_path, "bad.json", mutated(json.loads(Path(good).read_text()), path, value))
            for a, b in ((good, bad), (bad, good)):
                try:
                    report = compare_api(a, b)
                except UserError as exc:
                    assert "\n" not in str(exc) and len(str(exc)) < 400, str(exc)
                    outcomes["refused"] += 1
                    continue
                doc = json.loads(json.dumps(report.to_json(), allow_nan=False))
                validator.validate(doc)
                outcomes["compared"] += 1
    assert outcomes["refused"] > 150 and outcomes["compared"] > 100, outcomes


def _paths(node: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every key and list element of a document, containers and leaves alike."""
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    return [p for key, value in items for p in [(*path, key), *_paths(value, (*path, key))]]


def test_a_report_malformed_anywhere_in_its_checks_is_refused_or_read_by_diff_fleet_and_baseline(
    tmp_path: Path,
) -> None:
    """A saved report is a file anyone may have written (a fleet folder others can write to): every key
    and element of a real report's `checks` (findings, the DDP rank table that an old report's step
    time is read from) set to a wrong type or an absurd number is a one-line refusal of that file or
    is read, by `diff` (either side), `fleet` (the other nodes still judged) and `check --baseline`.
    The review found `findings: 1` and a table's `rows: 1` ended as internal errors (exit 3)."""
    import gpudoctor
    from gpudoctor.api import fleet_report

    good = json.loads(V1_CPU.read_text())
    shapes: dict[tuple[Any, ...], tuple[Any, ...]] = {}
    for path in _paths(good):  # one path per shape (list elements alike), the DDP check's (read for its table) apart
        if path[0] == "checks":
            ddp = len(path) > 1 and good["checks"][path[1]]["name"] == "ddp"
            shapes.setdefault((ddp, *("#" if isinstance(k, int) else k for k in path)), path)
    paths = list(shapes.values())
    assert len(paths) > 60 and any(p[-1] == "rows" for p in paths) and any(p[-1] == "findings" for p in paths)
    nodes = tmp_path / "nodes"
    nodes.mkdir()
    (nodes / "a.json").write_text(V1_CPU.read_text())
    (nodes / "b.json").write_text(V1_CPU.read_text())
    bad = nodes / "z.json"
    outcomes = {"refused": 0, "read": 0}
    for path in paths:
        for value in (1, True, 1e308, "x", {}, [1], DELETE):
            bad.write_text(json.dumps(mutated(good, path, value)))
            calls = [
                lambda: compare_api(str(V1_CPU), str(bad)),
                lambda: compare_api(str(bad), str(V1_CPU)),
                lambda: fleet_report([str(nodes)], use_config=False),
            ]
            if value == 1:  # `check --baseline` reads a side as `diff` does (sides.load_side): one value is enough
                calls.append(lambda: gpudoctor.run_checks(snapshot=H100, quick=True, baseline=bad, use_config=False))
            for call in calls:
                try:
                    report = call()
                except UserError as exc:
                    assert "\n" not in str(exc) and len(str(exc)) < 400, str(exc)
                    outcomes["refused"] += 1
                    continue
                json.dumps(report.to_json(), allow_nan=False)
                outcomes["read"] += 1
    assert outcomes["read"] > outcomes["refused"] > 0, outcomes


def compare_api(a: str, b: str) -> Any:
    import gpudoctor

    return gpudoctor.diff_report(a, b, use_config=False, fail_on="fail")


def test_the_shape_check_agrees_with_jsonschema(capsys: pytest.CaptureFixture[str]) -> None:
    """json_shape.problem() against the real jsonschema, on the report blocks it guards. Three
    deliberate differences: an integer must be a JSON integer (jsonschema takes 3.0), a number
    must fit a double (jsonschema takes a 400-digit integer), and keys the schema does not know
    are taken (a newer gpudoctor adds fields within one schema version)."""
    import jsonschema

    from gpudoctor.safety.json_shape import problem
    from gpudoctor.schemas import report_schema

    schema = report_schema()
    closed = json.dumps(schema).replace('"additionalProperties": false', '"additionalProperties": true')
    schema = json.loads(closed)  # a reader takes the fields a newer gpudoctor adds (json_shape.py)
    checker = jsonschema.Draft202012Validator.TYPE_CHECKER.redefine(
        "integer", lambda _, v: isinstance(v, int) and not isinstance(v, bool)
    )
    strict = jsonschema.validators.extend(jsonschema.Draft202012Validator, type_checker=checker)
    doc = _report_with_measurements(capsys)
    for path in [p for p in MUTATED_PATHS if p[0] in ("facts", "measurements") and len(p) > 1]:
        for value in [*VALUES, 3.0, 1e400]:
            block = mutated(doc, path, value)[path[0]]
            sub = {**schema["properties"][path[0]], "$defs": schema["$defs"]}
            too_big = (
                value is not DELETE and value is not True and isinstance(value, int | float) and abs(value) > 1e308
            )
            expected = strict(sub).is_valid(block) and not too_big
            found = problem(block, schema["properties"][path[0]], schema, path[0])
            assert (found is None) == expected, (path, value, found)


@pytest.mark.parametrize(
    ("change", "words"),
    [
        (lambda d: d["measurements"]["ddp"].__setitem__("step_s", "fast"), "measurements.ddp.step_s: expected number"),
        (lambda d: d["facts"]["gpus"].__setitem__(0, 7), "facts.gpus[0]: expected object, got 7"),
        (lambda d: d.__setitem__("schema_version", 10**400), "schema_version 1000000... (401 digits) is newer"),
    ],
    ids=["step time", "gpu entry", "version"],
)
def test_check_with_a_malformed_baseline_refuses_before_starting_any_rank(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], change: Any, words: str
) -> None:
    doc = _report_with_measurements(capsys)
    change(doc)
    bad = save(tmp_path, "bad.json", doc)
    r = run_cli(capsys, "check", "--device", "cpu", "--ranks", "2", "--select", "allreduce,GD01", "--baseline", bad)
    assert r.exit_code == 2 and r.out == "" and "starting" not in r.err  # no rank was spawned
    assert r.err.count("\n") == 1 and f"cannot compare with {bad}: " in r.err and words in r.err, r.err


def _paths(node: Any, here: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every key and index path under `node`: where a mutation can land."""
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else []
    out = []
    for key, child in items:
        out.append((*here, key))
        out.extend(_paths(child, (*here, key)))
    return out


def test_any_json_anywhere_in_a_baseline_is_refused_or_compared(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The same promise as above, for values hypothesis draws, at any path of facts and measurements."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    good_doc = _report_with_measurements(capsys)
    good = save(tmp_path, "good.json", good_doc)
    paths = [p for p in _paths(good_doc) if p[0] in ("facts", "measurements", "schema_version")]
    scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8)
    values = st.recursive(
        scalars,
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
        max_leaves=6,
    )

    @settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(path=st.sampled_from(paths), value=values, baseline_side=st.booleans())
    def check(path: tuple[Any, ...], value: Any, baseline_side: bool) -> None:
        bad = save(tmp_path, "bad.json", mutated(good_doc, path, value))
        a, b = (bad, good) if baseline_side else (good, bad)
        try:
            report = compare_api(a, b)
        except UserError as exc:
            assert "\n" not in str(exc)
            return
        json.dumps(report.to_json(), allow_nan=False)

    check()


def test_a_report_from_a_newer_gpudoctor_with_more_measurements_is_still_compared(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = _report_with_measurements(capsys)
    doc["measurements"]["alltoall"] = {"backend": "nccl", "sizes": []}  # a field added within schema 1
    doc["facts"]["gpus"][0]["c2c_links"] = 4
    newer = save(tmp_path, "newer.json", doc)
    r = diff_json(capsys, newer, newer)
    assert r.exit_code == 0 and r.one("GD014")["status"] == "pass"


# --- settings, memory held and the NCCL environment (review3 V4) -----------------------------


def facts_findings(capsys, tmp_path: Path, after: Any, code: str) -> list[dict[str, Any]]:  # type: ignore[no-untyped-def]
    r = diff_json(capsys, H100, write_variant(tmp_path, after, "after"))
    return [f for f in r.findings(code) if f["status"] != "pass"]


@pytest.mark.parametrize(
    ("changes", "status", "words"),
    [
        ({"power_limit_w": 300.0}, "fail", "GPU 2 power limit: 700 W in the baseline, 300 W now"),
        ({"power_limit_w": 650.0}, "warn", "GPU 2 power limit: 700 W in the baseline, 650 W now"),  # within 10%
        ({"mig_mode_current": True}, "fail", "GPU 2 MIG mode: off in the baseline, on now"),
        ({"mig_mode_pending": True}, "fail", "GPU 2 MIG mode after the next GPU reset: off in the baseline, on now"),
        ({"compute_mode": "prohibited"}, "fail", "GPU 2 compute mode: default in the baseline, prohibited now"),
        ({"compute_mode": "exclusive_process"}, "warn", "compute mode: default in the baseline, exclusive_process"),
        ({"persistence_mode": False}, "warn", "GPU 2 persistence mode: on in the baseline, off now"),
        ({"ecc_mode_current": False}, "warn", "GPU 2 ECC mode: on in the baseline, off now"),
    ],
)
def test_a_changed_gpu_setting_is_reported_with_both_values(capsys, tmp_path, changes, status, words) -> None:  # type: ignore[no-untyped-def]
    (f,) = facts_findings(capsys, tmp_path, with_gpu(load("h100_sxm_8x"), 2, **changes), "GD017")
    assert (f["status"], f["subject"]) == (status, "gpu:2") and words in f["message"]
    assert f["hint"]


def test_ecc_off_on_every_gpu_is_one_finding_per_setting(capsys, tmp_path) -> None:  # type: ignore[no-untyped-def]
    after = load("h100_sxm_8x")
    after = replace(after, gpus=[replace(g, ecc_mode_current=False, ecc_mode_pending=False) for g in after.gpus])
    found = facts_findings(capsys, tmp_path, after, "GD017")
    assert [(f["evidence"]["field"], f["evidence"]["gpus"]) for f in found] == [
        ("ecc_mode", list(range(8))),
        ("ecc_mode_pending", list(range(8))),
    ]
    # The other way round the baseline is the odd one: still named, with a hint to refresh it.
    r = diff_json(capsys, write_variant(tmp_path, after, "before"), H100)
    back = [f for f in r.findings("GD017") if f["status"] != "pass"]
    assert back and all("refresh it" in f["hint"] for f in back)


def test_gpu_memory_held_since_the_baseline_warns(capsys, tmp_path) -> None:  # type: ignore[no-untyped-def]
    (f,) = facts_findings(capsys, tmp_path, with_gpu(load("h100_sxm_8x"), 2, memory_used_mib=70000), "GD018")
    assert (f["status"], f["subject"]) == ("warn", "gpu:2") and "68.4 GiB in use" in f["message"]
    # The driver's own few hundred MiB are not "held".
    assert facts_findings(capsys, tmp_path, with_gpu(load("h100_sxm_8x"), 2, memory_used_mib=900), "GD018") == []


def test_an_nccl_variable_newly_set_is_named(capsys, tmp_path) -> None:  # type: ignore[no-untyped-def]
    r = diff_json(capsys, H100, str(FIXTURES / "faults" / "nccl_nvls_disabled.json"))
    (f,) = [f for f in r.findings("GD019") if f["status"] != "pass"]
    assert f["status"] == "warn" and f["message"] == "NCCL_NVLS_ENABLE='0' is set now, not in the baseline"
    changed = with_env(load("h100_sxm_8x"), NCCL_ALGO="Ring", TORCH_NCCL_BLOCKING_WAIT="1", HOME="/elsewhere")
    before = write_variant(tmp_path, with_env(load("h100_sxm_8x"), NCCL_ALGO="Tree"), "before")
    r = diff_json(capsys, before, write_variant(tmp_path, changed, "after"))
    messages = sorted(f["message"] for f in r.findings("GD019"))
    assert messages == [
        "NCCL_ALGO is 'Ring' now, 'Tree' in the baseline",
        "TORCH_NCCL_BLOCKING_WAIT='1' is set now, not in the baseline",
    ]
    r = diff_json(capsys, write_variant(tmp_path, changed, "after"), H100)
    assert "NCCL_ALGO is no longer set ('Ring' in the baseline)" in {f["message"] for f in r.findings("GD019")}


def test_a_baseline_without_the_new_facts_is_passed_over(capsys, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A report written before settings, memory and the NCCL environment were recorded: nothing flagged."""
    r = run_cli(capsys, "check", "--snapshot", H100, "--json", "--quick")
    old = json.loads(r.out)
    for g in old["facts"]["gpus"]:
        for key in ("power_limit_w", "ecc_mode", "ecc_mode_pending", "mig_mode", "mig_mode_pending", "compute_mode"):
            g.pop(key)
        g.pop("persistence_mode"), g.pop("memory_used_mib")
    old["facts"].pop("nccl_env")
    after = with_gpu(with_env(load("h100_sxm_8x"), NCCL_NVLS_ENABLE="0"), 2, power_limit_w=300.0, memory_used_mib=70000)
    r = diff_json(capsys, save(tmp_path, "old.json", old), write_variant(tmp_path, after, "after"))
    assert r.exit_code == 0
    assert {f["code"]: f["status"] for f in r.findings() if f["code"] in ("GD017", "GD018", "GD019")} == {
        "GD017": "skip",
        "GD018": "skip",
        "GD019": "skip",
    }
