"""Tables and plots: ε beside every number, and the paper's numbers matched to ours."""

from __future__ import annotations

import math

from synthq.report import paper_comparison, privacy_utility_plot, results_table

METRICS = {"ndcg@10": 0.5, "recall@10": 0.7}
ROWS = [
    {"dataset": "msmarco", "retriever": "ret-syn", "method": "synthetic", "epsilon": 8.0, "metrics": METRICS},
    {"dataset": "msmarco", "retriever": "ret-orig", "method": "original", "epsilon": math.inf, "metrics": METRICS},  # noqa: E501
    {"dataset": "msmarco", "retriever": "BM25", "method": "bm25", "epsilon": 0.0, "metrics": METRICS},
]


def test_results_table_shows_epsilon_for_every_row():
    table = results_table(ROWS)
    assert "| ret-syn | synthetic | 8.00 | 0.5000 | 0.7000 |" in table
    assert "| ret-orig | original | ∞ |" in table and "| BM25 | bm25 | 0.00 |" in table


def test_paper_rows_are_matched_on_dataset_and_epsilon():
    paper = [
        {"row": "T5-Base", "epsilon": 8, "dataset": "msmarco", "ndcg@10": 0.1912},
        {"row": "Original", "epsilon": "inf", "dataset": "msmarco", "ndcg@10": 0.2525},
        {"row": "T5-Base", "epsilon": 3, "dataset": "msmarco", "ndcg@10": 0.1830},
    ]
    text = paper_comparison(ROWS, paper)
    assert "| T5-Base | 8.00 | msmarco | ndcg@10 | 0.1912 | 0.5000 (ret-syn) |" in text
    assert "| Original | ∞ | msmarco | ndcg@10 | 0.2525 | 0.5000 (ret-orig) |" in text
    assert "| T5-Base | 3.00 | msmarco | ndcg@10 | 0.1830 | — |" in text


def test_plot_is_written(tmp_path):
    privacy_utility_plot(ROWS, tmp_path / "plot.png")
    assert (tmp_path / "plot.png").stat().st_size > 1000
