"""The audit report: scores per audited unit, the rows it gathers, and the files it writes."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from synthq.audit.canaries import OneRunCanary
from synthq.audit.report import AuditReport


def _canaries(users: bool) -> list[OneRunCanary]:
    coins = [True, False, True, False]
    return [
        OneRunCanary(
            f"c{i}", f"doc {i}", f"{i:010d}", coins[i // 2 if users else i], f"u{i // 2}" if users else ""
        )
        for i in range(8 if users else 4)
    ]


def test_a_canary_user_is_scored_by_the_mean_of_their_canaries_with_one_coin():
    report = AuditReport(_canaries(users=True), by_user=True, delta=1e-5, confidence=0.95)
    units, coins = report.unit_scores(np.arange(8, dtype=float))
    assert units.tolist() == [0.5, 2.5, 4.5, 6.5] and coins.tolist() == [True, False, True, False]
    per_canary = AuditReport(_canaries(users=False), by_user=False, delta=1e-5, confidence=0.95)
    units, coins = per_canary.unit_scores(np.arange(4, dtype=float))
    assert units.tolist() == [0, 1, 2, 3] and coins.tolist() == [True, False, True, False]


def test_rows_are_gathered_in_audit_order_and_written(tmp_path):
    report = AuditReport(_canaries(users=False), by_user=False, delta=1e-5, confidence=0.95)
    with report.timed("train_seconds[eps=∞]"):
        report.proven["∞"] = math.inf
    report.add_one_run(
        "generator", math.inf, np.array([3.0, 0.0, 2.0, 1.0]), "generator, ε = ∞", "generator[eps=∞]"
    )
    report.add_one_run(
        "retriever (private pairs)", math.inf, np.array([1.0, 0.0, 1.0, 0.0]), "t", "retriever[original]"
    )
    assert [r["audited"] for r in report.one_run_rows] == ["generator", "retriever (private pairs)"]
    assert list(report.timings) == ["train_seconds[eps=∞]"] and report.timings["train_seconds[eps=∞]"] >= 0
    report.write(tmp_path, "query", [])
    written = json.loads((tmp_path / "audit.json").read_text())
    assert written["one_run_scores"] == {
        "canaries": ["c0", "c1", "c2", "c3"],
        "generator[eps=∞]": [3.0, 0.0, 2.0, 1.0],
        "retriever[original]": [1.0, 0.0, 1.0, 0.0],
    }
    assert "canary_users" not in written and written["exposure"] == {"summary": [], "canaries": []}
    assert (tmp_path / "audit.md").read_text().startswith("## One-run audit")
    assert (tmp_path / "scores.png").is_file() and not (tmp_path / "exposure.png").exists()
    metrics = report.metrics([])
    assert list(metrics) == ["one-run/generator/eps=∞", "one-run/retriever (private pairs)/eps=∞"]
    assert metrics["one-run/generator/eps=∞"]["auroc"] == pytest.approx(1.0)


def test_coins_that_put_every_canary_on_one_side_give_an_undefined_auroc_not_a_crash(tmp_path):
    """Two canaries whose coins agree (probability ½): AUROC and TPR need both sides, so they are
    reported as undefined; the one-run bound is still computed and the report is written."""
    canaries = [OneRunCanary(f"canary-{i}", "some words", f"secret {i}", True) for i in range(2)]
    report = AuditReport(canaries, by_user=False, delta=1e-5, confidence=0.95)
    report.add_one_run("generator", 8.0, np.array([0.3, 0.7]), "generator ε = 8", "generator")
    (row,) = report.one_run_rows
    assert row["auroc"] is None and row["tpr_at_fpr_1"] is None and row["epsilon_lower_bound"] >= 0
    report.write(tmp_path, "query", [])
    assert "the coins put every canary on one side" in (tmp_path / "audit.md").read_text()
    assert json.loads((tmp_path / "audit.json").read_text())["one_run"][0]["auroc"] is None
