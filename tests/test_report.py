"""Tables and plots with ε beside every number, the paper's numbers matched to ours, the privacy
of combined results, and `synthq report` merging evaluation artifacts."""

from __future__ import annotations

import json
import math

import pytest

from synthq.config import EvalConfig, ReportConfig
from synthq.errors import ArtifactError
from synthq.privacy import Guarantee
from synthq.report import (
    combined_guarantee,
    paper_comparison,
    privacy_utility_plot,
    results_markdown,
    results_table,
    zero_shot_table,
)
from synthq.retrieval.metrics import METRICS
from tests.helpers import tiny_retriever_artifact

SCORES = {**dict.fromkeys(METRICS, 0.1), "ndcg@10": 0.5, "recall@10": 0.7}
PUBLIC = Guarantee.public().model_dump(mode="json")
ROWS = [
    {"dataset": "msmarco", "retriever": "ret-syn", "method": "synthetic", "epsilon": 8.0, "metrics": SCORES},
    {"dataset": "msmarco", "retriever": "ret-orig", "method": "original", "epsilon": math.inf,
     "metrics": SCORES},
    {"dataset": "msmarco", "retriever": "BM25", "method": "bm25", "kind": "bm25", "epsilon": 0.0,
     "privacy": PUBLIC, "metrics": SCORES},
    {"dataset": "fiqa", "retriever": "ret-syn", "method": "synthetic", "epsilon": 8.0,
     "metrics": {**SCORES, "ndcg@10": 0.25}},
]  # fmt: skip


def test_results_table_shows_epsilon_for_every_row():
    table = results_table(ROWS)
    assert "| ret-syn | synthetic | 8.00 | 0.5000 | 0.7000 |" in table
    assert "| ret-orig | original | ∞ |" in table and "| BM25 | bm25 | 0 (public) |" in table
    assert "### fiqa" in table and "| ret-syn | synthetic | 8.00 | 0.2500 | 0.7000 |" in table


def test_zero_shot_layout_and_full_markdown():
    table = zero_shot_table(ROWS, "ndcg@10")
    assert "| retriever | ε | msmarco | fiqa |" in table
    assert "| ret-syn | 8.00 | 0.5000 | 0.2500 |" in table and "| ret-orig | ∞ | 0.5000 | — |" in table
    text = results_markdown(ROWS)
    assert "## Across datasets" in text and "**Recall@10**" in text
    assert "| retriever | method | ε | NDCG@10 | Recall@10 | NDCG@1 |" in text  # all metrics section


def test_paper_rows_are_matched_on_dataset_and_epsilon():
    paper = [
        {"row": "T5-Base", "epsilon": 8, "dataset": "msmarco", "ndcg@10": 0.1912},
        {"row": "Original", "epsilon": "inf", "dataset": "msmarco", "ndcg@10": 0.2525},
        {"row": "T5-Base", "epsilon": 3, "dataset": "msmarco", "ndcg@10": 0.1830},
        {"row": "public?", "epsilon": 0, "dataset": "msmarco", "ndcg@10": 0.1},
    ]
    text = paper_comparison(ROWS, paper)
    assert "| T5-Base | 8.00 | msmarco | ndcg@10 | 0.1912 | 0.5000 (ret-syn) |" in text
    assert "| Original | ∞ | msmarco | ndcg@10 | 0.2525 | 0.5000 (ret-orig) |" in text
    assert "| T5-Base | 3.00 | msmarco | ndcg@10 | 0.1830 | — |" in text
    assert "| public? | 0.00 | msmarco | ndcg@10 | 0.1000 | — |" in text  # BM25 is not a private row


def test_plot_is_written(tmp_path):
    privacy_utility_plot(ROWS, tmp_path / "plot.png")
    assert (tmp_path / "plot.png").stat().st_size > 1000


def test_combined_guarantee():
    generator = "g" * 64
    syn_a = Guarantee(
        epsilon=8.0, delta=1e-6, mechanism="dp-adam+post-processing", derived_from=[generator, "s"]
    )
    syn_b = syn_a.model_copy(update={"derived_from": [generator, "t"]})
    direct = Guarantee(epsilon=3.0, delta=2e-6, unit="example", mechanism="dp-sample", accountant="rdp")
    query_level = Guarantee(epsilon=1.0, delta=1e-7, unit="query", mechanism="dp-x")
    # One release (two retrievers on synthetic data from one generator): that release's ε.
    one = combined_guarantee([("ra", syn_a), ("rb", syn_b), ("bm25", Guarantee.public())])
    assert (one.epsilon, one.delta) == (8.0, 1e-6)
    assert set(one.derived_from) == {generator, "s", "t", "ra", "rb"}
    # Independent releases compose; the weaker unit wins.
    both = combined_guarantee([("ra", syn_a), ("rd", direct), ("rq", query_level)])
    assert both.epsilon == pytest.approx(12.0) and both.delta == pytest.approx(3.1e-6)
    assert both.unit == "query" and {"ra", "rd", "rq"} <= set(both.derived_from)
    assert math.isinf(combined_guarantee([("rd", direct), ("ro", Guarantee.non_private("raw"))]).epsilon)
    public = combined_guarantee([("bm25", Guarantee.public())])
    assert public.epsilon == 0 and public.mechanism == "public"


@pytest.fixture(scope="module")
def two_evals(tmp_path_factory, tiny_encoder_dir, tiny_beir):
    from synthq.stages import evaluate

    root = tmp_path_factory.mktemp("report")
    dp = tiny_retriever_artifact(
        root / "ret-dp",
        tiny_encoder_dir,
        Guarantee(epsilon=2.0, delta=1e-6, mechanism="dp-sample"),
        {"dp": "sample"},
    )
    syn = tiny_retriever_artifact(
        root / "ret-syn",
        tiny_encoder_dir,
        Guarantee(epsilon=8.0, delta=1e-6, mechanism="dp-adam+post-processing", derived_from=["g" * 64]),
    )
    first = evaluate.run(
        EvalConfig(retrievers=[str(dp.path)], datasets=[str(tiny_beir)], out=root / "eval-1")
    )
    second = evaluate.run(
        EvalConfig(retrievers=[str(syn.path)], datasets=[str(tiny_beir)], out=root / "eval-2")
    )
    return first, second


def test_report_merges_evaluations(tmp_path, two_evals):
    from synthq.stages import report

    first, second = two_evals
    paper = [{"row": "T5-Base", "epsilon": 8, "dataset": "tiny-beir0", "ndcg@10": 0.19}]
    artifact = report.run(
        ReportConfig(
            evals=[str(first.path), str(second.path)], paper=paper, title="merged", out=tmp_path / "r"
        )
    )
    rows = json.loads((artifact.path / "results.json").read_text())
    assert [r["retriever"] for r in rows] == ["BM25", "ret-dp", "ret-syn"]  # BM25 once
    text = (artifact.path / "README.md").read_text()
    assert text.startswith("# merged") and "| BM25 | bm25 | 0 (public) |" in text
    assert (
        "| ret-dp | direct DP (sample), ? | 2.00 |" in text and "| ret-syn |" in text and "| 8.00 |" in text
    )
    assert "| T5-Base | 8.00 | tiny-beir0 | ndcg@10 | 0.1900 |" in text and "(ret-syn)" in text
    assert (artifact.path / "privacy_utility.png").stat().st_size > 1000
    # The two retrievers are independent DP releases: the report's ε composes them.
    assert artifact.privacy.epsilon == pytest.approx(10.0)
    with pytest.raises(ArtifactError, match="expected 'eval'"):
        report.run(ReportConfig(evals=[str(artifact.path)], out=tmp_path / "again"))
