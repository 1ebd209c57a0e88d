"""``synthq run --check``: compare a pipeline's ``expected:`` figures with its finished artifacts.

A pipeline may end with the figures it is expected to reproduce; ``synthq run --check``
compares them with the finished artifacts' metrics and fails (exit 1) on any figure outside its
tolerance::

    expected:
      - stage: results                     # a stage name
        metric: [embedded/ret-syn-eps8, ndcg@10]   # keys into that manifest's metrics
        value: 0.80
        tolerance: 0.03                    # |actual - value| <= tolerance (or min:, max:)

The block is validated when the pipeline is planned (:func:`synthq.pipeline.plan.plan_pipeline`).
"""

from __future__ import annotations

import fnmatch
from typing import Any

from synthq.artifacts.manifest import open_artifact
from synthq.pipeline.plan import Plan
from synthq.runtime.errors import SynthqError


def check_expected(plan: Plan) -> tuple[list[str], bool]:
    """Compare the pipeline's ``expected:`` figures with its artifacts' metrics.

    Returns one line per figure (``ok`` or ``REGRESSION``) and whether any failed; a missing
    artifact or metric fails too."""
    lines, failed = [], False
    for entry in plan.expected:
        label = f"{entry['stage']}: {' / '.join(map(str, entry['metric']))}"
        try:
            metrics = open_artifact(plan.stage(entry["stage"]).out, verify=False).metrics
            actual = float(_metric(metrics, entry["metric"]))
        except (SynthqError, KeyError, TypeError, ValueError) as error:
            lines.append(f"FAILED {label}: no such metric ({error})")
            failed = True
            continue
        problems = []
        if "value" in entry and not abs(actual - entry["value"]) <= entry["tolerance"]:
            problems.append(f"expected {entry['value']:g} ± {entry['tolerance']:g}")
        if "min" in entry and not actual >= entry["min"]:
            problems.append(f"expected >= {entry['min']:g}")
        if "max" in entry and not actual <= entry["max"]:
            problems.append(f"expected <= {entry['max']:g}")
        failed = failed or bool(problems)
        verdict = f"REGRESSION ({'; '.join(problems)})" if problems else "ok"
        lines.append(f"{verdict} {label} = {actual:.4g}")
    return lines, failed


def _metric(metrics: Any, keys: list[str]) -> Any:
    """``metrics[k1][k2]…``; a key with glob characters must match exactly one key at its level
    (e.g. ``embedded/ret-x3-lr*``: whichever configuration dev selection sent to test)."""
    for key in keys:
        if isinstance(metrics, dict) and key not in metrics and any(ch in key for ch in "*?["):
            matches = [name for name in metrics if fnmatch.fnmatchcase(str(name), key)]
            if len(matches) > 1:
                raise KeyError(f"{key} matches {len(matches)}: {', '.join(map(str, matches))}")
            key = matches[0] if matches else key
        if not isinstance(metrics, dict) or key not in metrics:
            raise KeyError(key)
        metrics = metrics[key]
    return metrics
