"""Running a planned pipeline: every stage in order through its public ``run``, stopping cleanly
(and resumably) on a failure or on synthq's own source changing underneath."""

from __future__ import annotations

import errno
import time
from collections.abc import Callable
from pathlib import Path

from rich.markup import escape

from synthq.artifacts.process_state import owned_by_pipeline
from synthq.bookkeeping.releases import ledger_lines
from synthq.config.registry import stage_entry
from synthq.pipeline.plan import Plan, PlannedStage
from synthq.pipeline.progress import estimate_seconds, minutes, time_by_kind
from synthq.runtime.console import console, info
from synthq.runtime.errors import SynthqError, os_error_behind


def run_plan(plan: Plan) -> dict[str, Path]:
    """Run every stage in order; returns stage name -> artifact path.

    The modules of every stage kind still to run are imported first, and the package's source
    files are fingerprinted; before each stage the fingerprint is compared, so a checkout that
    changes under a running pipeline stops it cleanly (resumable) instead of mixing code."""
    remaining = [s for s in plan.stages if not s.up_to_date]
    run_functions = {s.stage: stage_entry(s.stage).run_function() for s in remaining}
    code = code_fingerprint()
    remaining_estimate = sum(estimate_seconds(s) or 0.0 for s in remaining)
    started = time.perf_counter()
    results: dict[str, Path] = {}
    stage_times: list[tuple[str, float]] = []  # (stage kind, seconds) of the stages run
    for number, stage in enumerate(plan.stages, 1):
        header = escape(f"[{number}/{len(plan.stages)}] {stage.stage} {stage.name}")
        if stage.up_to_date:
            info(f"[green]{header}: up to date, skipped[/]")
            results[stage.name] = stage.out
            continue
        estimate = estimate_seconds(stage) or 0.0
        elapsed = time.perf_counter() - started
        eta = f", pipeline ≈ {minutes(remaining_estimate)} left" if remaining_estimate else ""
        console.rule(f"{header} (elapsed {minutes(elapsed)}{eta})")
        _stop_on_changed_code(plan, code, stage)
        stage_started = time.perf_counter()
        with owned_by_pipeline(stage.out):
            artifact = _run_stage(plan, stage, run_functions[stage.stage], code)
        remaining_estimate = max(remaining_estimate - estimate, 0.0)
        results[stage.name] = Path(artifact.path)
        stage_times.append((stage.stage, time.perf_counter() - stage_started))
        info(f"{header} done in {minutes(stage_times[-1][1])}: {artifact.privacy.describe()}")
    _summarise(plan, results, stage_times, time.perf_counter() - started)
    return results


def _run_stage(plan: Plan, stage: PlannedStage, run: Callable, code: dict[str, tuple[int, int]]):
    """``run(stage.config)``; a failure becomes one error naming the stage (and a code change
    made meanwhile, its likely cause)."""
    config = _continuing(stage)
    try:
        return run(config)
    except KeyboardInterrupt:
        raise
    except Exception as error:
        disk = None if isinstance(error, SynthqError) else os_error_behind(error)
        if disk is not None and disk.errno in (errno.ENOSPC, errno.EDQUOT):
            # a full disk inside a library (a serializer's own error): the one disk line, exit 1
            raise OSError(
                disk.errno,
                f"{disk.strerror} (pipeline {plan.name!r} stopped at stage {stage.name!r}; the artifacts "
                "of earlier stages are intact)",
                disk.filename,
            ) from error
        if config is not stage.config:  # e.g. the interrupted run used other settings
            error = f"{error} (continuing an interrupted run; --force {stage.name} starts it over)"
        if changed := _code_changed(code):
            raise SynthqError(
                f"pipeline {plan.name!r} stopped at stage {stage.name!r} ({stage.stage}): {error}. "
                f"synthq's code changed while it ran ({', '.join(changed[:3])}), which is the likely "
                "cause. Artifacts of earlier stages are intact; rerun the same command to resume."
            ) from error
        raise SynthqError(
            f"pipeline {plan.name!r} stopped at stage {stage.name!r} ({stage.stage}): {error}. "
            "Artifacts of earlier stages are intact; rerun the same command to resume."
        ) from error


def _continuing(stage: PlannedStage):
    """The stage's config, resuming the checkpoint an interrupted run of it left (a rerun of the
    same pipeline continues, as its interruption message promises; ``--force STAGE`` starts over).
    A stale stage may replace its output without ``force`` (the pipeline owns its outputs);
    only the user's ``--force`` means starting over."""
    from synthq.artifacts.freshness import interrupted_checkpoint

    config = stage.config
    if "resume" not in type(config).model_fields or config.resume or stage.forced:
        return config
    if (checkpoints := interrupted_checkpoint(config.out)) is None:
        return config
    info(escape(f"{stage.name}: continuing the interrupted run from {checkpoints.parent}"))
    return config.model_copy(update={"resume": True})


def _summarise(
    plan: Plan, results: dict[str, Path], stage_times: list[tuple[str, float]], wall: float
) -> None:
    """The finished run's lines: its wall time, that time by stage kind, and the privacy ledger."""
    info(f"[bold green]pipeline {plan.name!r} finished[/] in {minutes(wall)}")
    if stage_times:
        info(escape(time_by_kind(stage_times, wall)))
    for line in ledger_lines(list(results.values())):
        info(escape(line))


def _code_root() -> Path:
    return Path(__file__).resolve().parents[1]  # the synthq package


def code_fingerprint() -> dict[str, tuple[int, int]]:
    """Every source file of the installed synthq package -> (size, modification time in ns).

    Stages import their modules lazily (``synthq --help`` must not load torch), so a checkout
    edited or pulled while a long pipeline runs would otherwise mix module versions: the next
    stage imports new code next to old code already loaded, and fails with an ``ImportError``
    far from its cause, or worse, runs. Comparing this before each stage turns that into one
    clear stop (:func:`run_plan`)."""
    root = _code_root()
    fingerprint = {}
    for path in sorted(root.rglob("*.py")):
        stat = path.stat()
        fingerprint[str(path.relative_to(root))] = (stat.st_size, stat.st_mtime_ns)
    return fingerprint


def _code_changed(before: dict[str, tuple[int, int]]) -> list[str]:
    """The synthq source files added, removed or modified since ``before`` was taken."""
    after = code_fingerprint()
    return sorted(name for name in before.keys() | after.keys() if before.get(name) != after.get(name))


def _stop_on_changed_code(plan: Plan, before: dict[str, tuple[int, int]], stage: PlannedStage) -> None:
    changed = _code_changed(before)
    if changed:
        shown = ", ".join(f"synthq/{name}" for name in changed[:3]) + (" ..." if len(changed) > 3 else "")
        raise SynthqError(
            f"pipeline {plan.name!r} stopped before stage {stage.name!r}: synthq's code changed while "
            f"it ran ({shown}), and a stage must not mix the old modules already loaded with the new "
            "ones. Artifacts of earlier stages are intact; rerun the same command to resume."
        )
