"""`check --level 1|2|3`: each level selects its checks and those below; options that contradict the
level are usage errors; the deep run starts only the workloads of the selected deep checks."""

from __future__ import annotations

import json

import pytest

from gpudoctor.checks import registry
from gpudoctor.checks.active.common import Plan
from gpudoctor.checks.deep.common import Budget, DeepRun, budget, deadline_s, deep_tasks, not_finished, task_owners
from gpudoctor.checks.deep.links import NOT_DONE as GD433
from gpudoctor.checks.deep.load import NOT_DONE as GD855
from gpudoctor.checks.deep.memory import NOT_DONE as GD867
from gpudoctor.checks.deep.sdc import NOT_DONE as GD863
from gpudoctor.engine import CheckContext, CheckOptions, Code, Selection, check
from gpudoctor.engine.runner import run_checks
from gpudoctor.findings import Status
from gpudoctor.launch.results import LaunchResult, RankOutcome
from tests.helpers.cli import run_cli
from tests.helpers.snapshots import fixture, load

ACTIVE = {"allreduce", "collectives", "ddp", "link_probes", "nodes"}
DEEP = {"deep_load", "deep_sdc", "deep_memory", "deep_links"}


def names(**options: object) -> set[str]:
    return {c.name for c in registry().selected(CheckOptions(**options), Selection().wants_check)}  # type: ignore[arg-type]


def test_each_level_adds_its_checks_to_the_ones_below() -> None:
    level1, level2, level3 = names(level=1), names(level=2), names(level=3)
    assert level1 and not level1 & (ACTIVE | DEEP)
    assert all(not registry().checks[n].active for n in level1)
    assert level2 == level1 | ACTIVE
    assert level3 == level2 | DEEP
    assert names(quick=True, level=3) == level1  # --quick is level 1 whatever else is set
    assert names() == level2  # the default stays today's check


def test_every_registered_check_has_a_level_that_matches_whether_it_runs_workloads() -> None:
    for chk in registry().checks.values():
        assert chk.level in (1, 2, 3)
        assert chk.active == (chk.level >= 2), chk.name
    assert {n for n, c in registry().checks.items() if c.level == 3} == DEEP


def test_a_deep_check_must_say_it_runs_a_workload() -> None:
    code = Code("GD879", "x", "x", what="x", why="x", fix="x")
    with pytest.raises(ValueError, match="levels 2 and 3 run workloads"):
        check("not_registered", "x", [code], level=3)(lambda ctx: [])


def test_run_checks_tells_the_checks_which_ones_run() -> None:
    ctx = CheckContext(load("h100_sxm_8x"), CheckOptions(level=1))
    results = run_checks(registry(), ctx, Selection(("topology", "identity")))
    assert ctx.planned == ("identity", "topology") and [r.name for r in results] == ["identity", "topology"]


@pytest.mark.parametrize(
    ("planned", "device", "world", "tasks"),
    [
        ((), "cuda", 8, ("deep_gemm", "deep_allreduce", "deep_memory", "deep_links")),  # nothing said: all
        (("deep_memory",), "cuda", 8, ("deep_memory",)),
        (("deep_load",), "cuda", 8, ("deep_gemm",)),
        (("deep_sdc", "ddp"), "cuda", 8, ("deep_gemm", "deep_allreduce")),
        (("deep_sdc",), "cuda", 1, ("deep_gemm",)),  # one rank: nothing to all-reduce
        (tuple(DEEP), "cpu", 3, ("deep_gemm", "deep_allreduce", "deep_memory")),  # no host links on CPU
    ],
)
def test_the_deep_run_starts_only_what_the_selected_checks_need(
    planned: tuple[str, ...], device: str, world: int, tasks: tuple[str, ...]
) -> None:
    assert deep_tasks(planned, device, world) == tasks


def test_the_duration_sets_the_load_and_the_deadline_covers_it() -> None:
    b = budget(("deep_gemm", "deep_allreduce", "deep_memory", "deep_links"), 60.0, gpus=8, pairs=28)
    assert (b.gemm_s, b.allreduce_s, b.memory_s, b.links_s) == (60.0, 12.0, 12.0, 52.0)
    ctx = CheckContext(load("h100_sxm_8x"), CheckOptions(level=3, timeout_s=120.0))
    assert deadline_s(ctx, b) == 120.0 + 136.0 * 1.25
    assert budget(("deep_memory",), 2.0, gpus=0, pairs=0).total_s == 1.0  # at least a second


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--quick", "--level", "3"], "--quick is --level 1; it cannot be combined with --level 3"),
        (["--snapshot", "SNAP", "--level", "2"], "--snapshot runs the static checks only (level 1), not --level 2"),
        (["--duration", "30"], "--duration sets level 3's load tests: add --level 3"),
        (["--level", "2", "--mem-share", "0.5"], "--mem-share sets level 3's load tests: add --level 3"),
    ],
)
def test_options_that_contradict_the_level_are_usage_errors(
    capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    args = [str(fixture("h100_sxm_8x")) if a == "SNAP" else a for a in args]
    result = run_cli(capsys, "check", *args)
    assert result.exit_code == 2
    assert message in result.err


@pytest.mark.parametrize("value", ["0", "nan", "inf", "90000"])
def test_the_duration_must_be_a_finite_positive_number_of_seconds(
    capsys: pytest.CaptureFixture[str], value: str
) -> None:
    assert run_cli(capsys, "check", "--level", "3", "--duration", value).exit_code == 2


def test_level_1_on_a_snapshot_is_the_quick_check(capsys: pytest.CaptureFixture[str]) -> None:
    quick = run_cli(capsys, "check", "--snapshot", str(fixture("h100_sxm_8x")), "--json", "--quick").doc
    level1 = run_cli(capsys, "check", "--snapshot", str(fixture("h100_sxm_8x")), "--json", "--level", "1").doc
    assert [c["name"] for c in quick["checks"]] == [c["name"] for c in level1["checks"]]


def test_selecting_only_deep_checks_below_level_3_says_which_level_they_need(
    capsys: pytest.CaptureFixture[str],
) -> None:
    result = run_cli(capsys, "check", "--snapshot", str(fixture("h100_sxm_8x")), "--select", "deep_memory")
    assert result.exit_code == 2
    assert "no check ran" in result.err and "deep_memory run at --level 3; this run is level 1" in result.err


def test_deep_host_links_on_cpu_ranks_skip_without_starting_anything(capsys: pytest.CaptureFixture[str]) -> None:
    # Alone, the skip is a run that checked nothing: exit 2 saying why (docs/gates.md), not READY.
    alone = run_cli(capsys, "check", "--device", "cpu", "--level", "3", "--select", "deep_links")
    assert alone.exit_code == 2 and "starting" not in alone.err
    assert "nothing was checked: every selected check skipped (deep_links: host links not measured" in alone.err
    result = run_cli(capsys, "check", "--device", "cpu", "--level", "3", "--select", "deep_links,GD002", "--json")
    assert result.exit_code == 0
    assert [(f["code"], f["status"]) for f in result.findings() if f["code"] != "GD002"] == [("GD430", "skip")]


def test_list_checks_and_explain_show_the_deep_level(capsys: pytest.CaptureFixture[str]) -> None:
    listed = run_cli_ok(capsys, "list-checks")
    assert ["GD850", "deep_load", "deep"] in [line.split()[:3] for line in listed.splitlines()]
    rows = json.loads(run_cli_ok(capsys, "list-checks", "--json"))
    assert {r["level"] for r in rows if r["check"] in DEEP} == {3}
    assert {r["level"] for r in rows if r["check"] in ACTIVE} == {2}
    assert "only with `--level 3`" in run_cli_ok(capsys, "explain", "GD865")


def run_cli_ok(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    result = run_cli(capsys, *args)
    assert result.exit_code == 0, result.err
    return result.out


def fake_run(state: str, phase: str, tasks: tuple[str, ...], planned: tuple[str, ...]) -> DeepRun:
    ranks = [
        RankOutcome(0, 0, 0, state="aborted", last_step="phase", phase=phase),
        RankOutcome(1, 1, 1, state=state, last_step="phase", phase=phase, error="CUDA error: an illegal memory access"),
    ]
    launch = LaunchResult("cuda", "nccl", 2, ranks, 30.0, "tcpstore:port0", deadline_s=120.0)
    return DeepRun(Plan("cuda", 2, [0, 1]), tasks, Budget(), launch, owners=task_owners(planned, tasks))


def test_a_rank_failing_in_one_deep_test_fails_that_test_and_the_later_ones_say_where_to_look() -> None:
    tasks = ("deep_gemm", "deep_allreduce", "deep_memory", "deep_links")
    run = fake_run("error", "deep_memory", tasks, tuple(DEEP))
    (memory,) = not_finished(GD867, "deep_memory", "the memory test", run, "deep_memory")
    assert (memory.status, memory.subject) == (Status.FAIL, "gpu:1")
    assert memory.message == (
        "the memory test did not finish: rank 1 (GPU 1) failed in phase deep_memory: "
        "CUDA error: an illegal memory access"
    )
    (links,) = not_finished(GD433, "deep_links", "the host-link test", run, "deep_links")
    assert links.status is Status.SKIP
    assert links.message == (
        "the host-link test not run: the deep run stopped in deep_memory (rank 1 (GPU 1); see deep_memory)"
    )


def test_the_gemm_comparison_defers_to_the_load_check_when_both_run() -> None:
    tasks = ("deep_gemm", "deep_allreduce")
    both = fake_run("error", "deep_gemm", tasks, ("deep_load", "deep_sdc"))
    (f,) = not_finished(GD863, "deep_gemm", "the GEMM comparison", both, "deep_sdc")
    assert f.status is Status.SKIP and f.message.endswith("; see deep_load)")
    alone = fake_run("error", "deep_gemm", tasks, ("deep_sdc",))
    (g,) = not_finished(GD863, "deep_gemm", "the GEMM comparison", alone, "deep_sdc")
    assert g.status is Status.FAIL


def test_a_failed_rank_is_explained_for_the_device_it_ran_on() -> None:
    on_gpu = fake_run("error", "deep_gemm", ("deep_gemm",), ("deep_load",))
    (f,) = not_finished(GD855, "deep_gemm", "the sustained GEMM load", on_gpu, "deep_load")
    assert "`CUDA_VISIBLE_DEVICES=1 gpudoctor check --level 3 --select deep_load` with GPU 1 alone" in f.hint
    ranks = [RankOutcome(r, None, r, state="error", last_step="phase", phase="deep_gemm", error="boom") for r in (0, 1)]
    launch = LaunchResult("cpu", "gloo", 2, ranks, 3.0, "tcpstore:port0", deadline_s=120.0)
    on_cpu = DeepRun(
        Plan("cpu", 2, []), ("deep_gemm",), Budget(), launch, owners=task_owners(("deep_load",), ("deep_gemm",))
    )
    for g in not_finished(GD855, "deep_gemm", "the sustained GEMM load", on_cpu, "deep_load"):
        assert "alone" not in g.hint and "ran on the CPU (--device cpu)" in g.hint, g.hint
        assert "not a GPU" in g.hint


def test_the_gemm_comparison_alone_does_not_point_at_a_load_check_that_did_not_run() -> None:
    alone = fake_run("error", "deep_gemm", ("deep_gemm", "deep_allreduce"), ("deep_sdc",))
    (g,) = not_finished(GD863, "deep_gemm", "the GEMM comparison", alone, "deep_sdc")
    assert "GD855" not in g.hint and "--select deep_sdc" in g.hint


def test_the_python_api_takes_the_level_and_refuses_the_same_contradictions() -> None:
    import gpudoctor
    from gpudoctor.errors import UserError

    report = gpudoctor.run_checks(snapshot=fixture("h100_sxm_8x"), level=1, use_config=False)
    assert {c.name for c in report.checks} <= names(level=1)
    with pytest.raises(UserError, match="--snapshot runs the static checks only"):
        gpudoctor.run_checks(snapshot=fixture("h100_sxm_8x"), level=3, use_config=False)
    with pytest.raises(UserError, match="--duration sets level 3's load tests"):
        gpudoctor.run_checks(quick=True, duration_s=5.0, use_config=False)
