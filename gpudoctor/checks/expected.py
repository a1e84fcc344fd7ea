"""GD010 (gpudoctor's policy): the visible GPUs are the model the team's policy expects.

Runs only when a policy (or the API) sets `expect-model`; `expect-gpus` is judged by the
visibility check (GD202), which exists without a policy too.
"""

from __future__ import annotations

from gpudoctor.checks.targets import target_gpus
from gpudoctor.engine import CheckContext, Code, check
from gpudoctor.findings import Finding, Status, gpu_subject

EXPECTED_MODEL = Code(
    "GD010",
    "policy-gpu-model",
    "The visible GPUs are the model the policy expects",
    what="Compares the product name (nvmlDeviceGetName) of every GPU the run will see with the policy's "
    "`expect-model` (or `--expect-model`, `preflight(expect_model=...)`): the name must contain it, "
    "ignoring case, so 'H100' accepts every H100 and 'H100 80GB HBM3' only the SXM5 board.",
    why="A job scheduled for one GPU model on a node with another (a mislabelled node, a partition "
    "holding mixed hardware, a PCIe card where an SXM board was expected) runs slower or out of memory "
    "without any error, and its measurements mean nothing against a baseline of the expected model.",
    fix="Run on the nodes that carry the model (check the scheduler's partition or node labels), or "
    "correct `expect-model` in the policy if the fleet changed.",
)
CODES = [EXPECTED_MODEL]


@check(
    "expected",
    "GPUs the policy expects",
    codes=CODES,
    needs="visible",
    wanted=lambda options: options.expect_model is not None,
)
def expected(ctx: CheckContext) -> list[Finding]:
    want = ctx.options.expect_model or ""
    gpus = target_gpus(ctx)
    odd = [g for g in gpus if want.lower() not in g.name.lower()]
    if not odd:
        names = sorted({g.name for g in gpus})
        return [
            Finding(
                EXPECTED_MODEL.code,
                Status.PASS,
                "host",
                f"{len(gpus)} GPU(s) are {', '.join(names)} (policy expects {want!r})",
                "",
                {"expected": want, "models": names},
            )
        ]
    return [
        Finding(
            EXPECTED_MODEL.code,
            Status.FAIL,
            gpu_subject(g.index),
            f"GPU {g.index} is an {g.name}, the policy expects {want!r}",
            EXPECTED_MODEL.fix,
            {"expected": want, "model": g.name},
        )
        for g in odd
    ]
