"""How long a pipeline's stages take: the ``--dry-run`` description with its estimates, and where a
finished run's wall time went, by stage kind."""

from __future__ import annotations

from synthq.artifacts.manifest import is_artifact, open_artifact
from synthq.pipeline.plan import Plan, PlannedStage
from synthq.runtime.errors import SynthqError
from synthq.runtime.precision import EMULATED_BF16_WARNING, would_emulate_bf16


def describe_plan(plan: Plan) -> list[str]:
    """One line for the pipeline, then one per stage: run or skip, its estimate, what it needs."""
    lines = [f"pipeline {plan.name!r} -> {plan.out} ({len(plan.stages)} stages)"]
    for number, stage in enumerate(plan.stages, 1):
        if stage.up_to_date:
            status = "up to date, skip"
        elif stage.decided_at_run:
            status = "run unless up to date (decided when it runs: an input it recorded has moved)"
        else:
            status = "run"
        estimate = estimate_seconds(stage)
        hint = f", ~{minutes(estimate)}" if estimate and not stage.up_to_date else ""
        needs = f" <- {', '.join(stage.depends_on)}" if stage.depends_on else ""
        lines.append(f"  {number:2d}. {stage.name} ({stage.stage}): {status}{hint}{needs}")
    return lines


def precision_warnings(plan: Plan) -> list[str]:
    """The warning each stage that would run prints when it starts at ``--precision bf16`` on this
    CPU without bf16 arithmetic, named by its stage, so that ``--dry-run`` says it first."""
    return [
        f"stage {stage.name!r} ({stage.stage}): {EMULATED_BF16_WARNING}"
        for stage in plan.stages
        if not stage.up_to_date
        and would_emulate_bf16(
            getattr(stage.config, "precision", "auto"), getattr(stage.config, "device", "auto")
        )
    ]


def estimate_seconds(stage: PlannedStage) -> float | None:
    """Seconds a stage is expected to take: its previous run, else the pipeline's hint."""
    if is_artifact(stage.out):
        try:
            return float(open_artifact(stage.out, verify=False).timings.get("wall_seconds"))
        except (SynthqError, TypeError, ValueError):
            return stage.expect_seconds  # an unreadable old artifact: fall back to the hint
    return stage.expect_seconds


def minutes(seconds: float) -> str:
    """``"2.5 min"`` from a minute on, ``"42 s"`` below."""
    return f"{seconds / 60:.1f} min" if seconds >= 60 else f"{seconds:.0f} s"


def seconds_by_kind(stage_times: list[tuple[str, float]]) -> dict[str, dict]:
    """``{kind: {"stages": n, "seconds": total}}`` of ``(stage kind, seconds)`` pairs, the kind
    with the most seconds first."""
    totals: dict[str, dict] = {}
    for kind, seconds in stage_times:
        total = totals.setdefault(kind, {"stages": 0, "seconds": 0.0})
        total["stages"] += 1
        total["seconds"] += seconds
    return dict(sorted(totals.items(), key=lambda item: -item[1]["seconds"]))


def time_by_kind(stage_times: list[tuple[str, float]], wall: float) -> str:
    """Where a run's wall time went: each stage kind's total (most first, with its count and
    share), then what lay between stages (planning, checks, imports), so the parts add up to
    ``wall``."""
    parts = [
        f"{kind} ×{total['stages']} {minutes(total['seconds'])} ({100 * total['seconds'] / wall:.0f} %)"
        for kind, total in seconds_by_kind(stage_times).items()
    ]
    between = max(wall - sum(seconds for _, seconds in stage_times), 0.0)
    return (
        f"time by stage kind: {', '.join(parts)}; between stages {minutes(between)}; {minutes(wall)} in all"
    )
