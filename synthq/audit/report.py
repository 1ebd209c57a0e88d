"""What a canary audit found, gathered model by model, and how it is written out.

:class:`AuditReport` collects, in the order the models are audited, the one-run rows (one per
audited generator or retriever and ε, with the bound of :func:`synthq.audit.one_run.one_run_audit`
per audited unit), the score histograms, the per-canary scores and the exposure rows; then
:meth:`AuditReport.write` writes ``audit.json``, ``audit.md`` and the plots, and
:meth:`AuditReport.metrics` the headline numbers of the artifact's metrics.

At ``--privacy-unit user`` the audited unit is a canary user: their score is the mean of their
canaries' scores and their coin is shared by all of them (:func:`synthq.audit.canaries.per_user`).
"""

from __future__ import annotations

import json
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from synthq.audit.canaries import OneRunCanary, per_user
from synthq.audit.exposure_tables import one_run_markdown, plot_exposure, plot_scores, summarize, to_markdown
from synthq.audit.one_run import one_run_audit, score_summary
from synthq.privacy.guarantee import format_epsilon


@dataclass
class AuditReport:
    """The audit's results so far; ``add_*`` in audit order, :meth:`write` once at the end.

    Args:
        one_run: the one-run canaries (empty when only the exposure method runs).
        by_user: whether the audited unit is a canary user (``--privacy-unit user``).
        delta: the δ the bounds are tested at.
        confidence: the confidence of the one-run bounds.
    """

    one_run: list[OneRunCanary]
    by_user: bool
    delta: float
    confidence: float
    one_run_rows: list[dict] = field(default_factory=list)
    panels: list[tuple[str, np.ndarray, np.ndarray]] = field(default_factory=list)
    per_canary: dict[str, list[float]] = field(default_factory=dict)
    exposure_rows: list[dict] = field(default_factory=list)
    proven: dict[str, float] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)

    @contextmanager
    def timed(self, name: str):
        """Record the seconds the block takes as ``timings[name]`` (rounded to 0.1 s)."""
        started = time.perf_counter()
        yield
        self.timings[name] = round(time.perf_counter() - started, 1)

    def unit_scores(self, scores: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Scores and coins per audited unit: each canary, or each canary user (mean score)."""
        if not self.by_user:
            return scores, np.array([c.included for c in self.one_run], dtype=bool)
        _, means, user_coins = per_user(self.one_run, scores)
        return np.array(means), np.array(user_coins, dtype=bool)

    def add_one_run(self, audited: str, proven: float, scores: np.ndarray, title: str, column: str) -> None:
        """One audited model's one-run row, histogram panel ``title`` and per-canary ``column``."""
        units, coins = self.unit_scores(scores)
        result = one_run_audit(units, coins, delta=self.delta, confidence=self.confidence)
        summary = score_summary(units[coins], units[~coins])
        self.one_run_rows.append(
            {"audited": audited, "proven_epsilon": proven, **result.to_dict(), **summary}
        )
        self.panels.append((title, units, coins))
        self.per_canary[column] = scores.round(4).tolist()

    def add_exposure(self, key: str, scored: list[dict], leaks: list[bool]) -> None:
        """The exposure canaries' rows under the generator at ε ``key``."""
        for row, leaked in zip(scored, leaks, strict=True):
            self.exposure_rows.append({**row, "epsilon": key, "leaked": leaked})

    def exposure_table(self, epsilons: list[float]) -> list[dict]:
        """Table 7's rows (:func:`synthq.audit.exposure_tables.summarize`); empty without exposure
        canaries."""
        return summarize(self.exposure_rows, epsilons, self.proven, self.delta)

    def write(self, directory: Path, privacy_unit: str, table: list[dict]) -> None:
        """``audit.json``, ``audit.md`` and the plots (``scores.png``, ``exposure.png``)."""
        users = list(dict.fromkeys(c.user for c in self.one_run))
        report = {
            "delta": self.delta,
            "privacy_unit": privacy_unit,
            **({"canary_users": users} if self.by_user else {}),
            "one_run": self.one_run_rows,
            "one_run_scores": {"canaries": [c.canary_id for c in self.one_run], **self.per_canary},
            "exposure": {"summary": table, "canaries": self.exposure_rows},
        }
        (directory / "audit.json").write_text(json.dumps(report, indent=2, default=str), encoding="utf-8")
        markdown = []
        if self.one_run_rows:
            markdown.append("## One-run audit\n\n" + one_run_markdown(self.one_run_rows))
            plot_scores(self.panels, directory / "scores.png")
        if table:
            markdown.append("## Exposure audit (Table 7)\n\n" + to_markdown(table))
            plot_exposure(table, directory / "exposure.png")
        (directory / "audit.md").write_text("\n".join(markdown), encoding="utf-8")

    def metrics(self, table: list[dict]) -> dict[str, dict]:
        """The headline numbers: each one-run row's bounds and AUROC, and each ε × repetition
        count's exposure summary over all shapes."""
        one_run = {
            f"one-run/{r['audited']}/eps={format_epsilon(r['proven_epsilon'])}": {
                "epsilon_lower_bound": r["epsilon_lower_bound"],
                "gdp_epsilon_lower_bound": r["gdp_epsilon_lower_bound"],
                "auroc": r["auroc"],
            }
            for r in self.one_run_rows
        }
        exposure = {
            f"exposure/eps={r['epsilon']}/rep={r['repetitions']}": {
                "rank": r["mean_rank"], "leaked": r["leaked"], "exposure": r["exposure_extrapolated"],
                "group_epsilon_lower_bound": r["group_epsilon_lower_bound"],
                "pair_epsilon_lower_bound": r["pair_epsilon_lower_bound"],
            }
            for r in table
            if r["shape"] == "all"
        }  # fmt: skip
        return one_run | exposure
