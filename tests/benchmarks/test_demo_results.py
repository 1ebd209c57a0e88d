"""The README's results block is generated from the recorded demo run, never typed."""

from __future__ import annotations

import json

import pytest

from benchmarks.demo_results import END, ORDERING, PAGES, README_PATH, SNAPSHOT, START, readme_block, render


def _snapshot(difference: float = 0.25, p_holm: float = 0.0028) -> dict:
    return {
        "measured": {
            "at": "2026-11-26", "cpu": "Some CPU", "cores": 2, "wall_minutes": 9.1,
            "timed": "around the process", "check": "passed", "pairs_tested": 28,
        },
        "rows": [
            {"name": "ret-syn-eps8", "epsilon": "8.00",
             "ndcg@10": [0.35, 0.31, 0.39], "recall@10": [0.5, 0.45, 0.55]},
            {"name": "brand-new-row", "epsilon": "∞",
             "ndcg@10": [0.1, 0.05, 0.15], "recall@10": [0.2, 0.1, 0.3]},
        ],
        "ordering": [
            {"better": "ret-syn-eps8", "worse": "ret-dp-group-eps8", "difference": difference,
             "ci": [difference - 0.05, difference + 0.05], "p": 0.0001, "p_holm": p_holm},
        ],
    }  # fmt: skip


def test_render_prints_every_row_with_its_interval_and_each_comparison_with_its_verdict():
    text = render(_snapshot())
    row = "| synthetic, 1 query per public document | 8.00 + selection ∞ † | 0.350 [0.310, 0.390] |"
    assert row in text
    assert "| brand-new-row | ∞ |" in text  # a row without a label keeps its name
    pair = "synthetic ε = 8 − direct DP group ε = 8 | +0.250 [+0.200, +0.300] | 0.0028 (**significant**)"
    assert pair in text
    assert "Holm over all 28 pairs" in text and "2026-11-26" in text
    # a comparison that went the other way, or that is not significant, says so
    assert "(not significant)" in render(_snapshot(difference=-0.01, p_holm=0.001))
    assert "(not significant)" in render(_snapshot(p_holm=0.2))


def test_readme_block_replaces_only_the_block_and_needs_its_markers():
    text = f"before\n{START}\nold figures\n{END}\nafter\n"
    rewritten = readme_block(text, _snapshot())
    assert rewritten.startswith("before\n") and rewritten.endswith("\nafter\n")
    assert "old figures" not in rewritten and render(_snapshot()) in rewritten
    with pytest.raises(SystemExit, match="no <!-- demo-results:start -->"):
        readme_block("no block here", _snapshot())


def test_the_readme_shows_exactly_the_recorded_demo_run():
    """Edit the snapshot (`demo_results.py record`), then `demo_results.py readme`: a figure typed
    into the README by hand fails here."""
    snapshot = json.loads(SNAPSHOT.read_text(encoding="utf-8"))
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        assert readme_block(text, snapshot) == text, f"{page}: run benchmarks/demo_results.py readme"
    lines = README_PATH.read_text(encoding="utf-8").splitlines()
    assert lines.index(START) + 3 < 80  # the table starts on the first screen
    pairs = {(p["better"], p["worse"]) for p in snapshot["ordering"]}
    assert pairs == set(ORDERING)
    assert snapshot["measured"]["check"] == "passed"
