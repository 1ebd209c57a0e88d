"""Results tables in markdown: per dataset, across datasets, significance, paper vs ours, similarity.

Every number is printed with the ε of the retriever it belongs to
(:func:`synthq.reporting.epsilon.epsilon_cell`); rows trained with several seeds or generator
replicates are one line (:func:`synthq.reporting.systems.systems`).

Layouts follow Carranza et al.: per dataset, one row per retriever with ε, NDCG@10 and
Recall@10 (Tables 3 and 4); across datasets, retrievers × datasets for each headline metric
(Table 5); then every metric.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

from synthq.privacy.guarantee import format_epsilon
from synthq.reporting.epsilon import (
    epsilon_cell,
    epsilon_value,
    is_public,
    same_epsilon,
    scores_cell,
    scores_differ,
    scores_statement,
    shown_epsilon,
)
from synthq.reporting.systems import datasets_of, systems
from synthq.retrieval.metrics import HEADLINE, METRICS
from synthq.retrieval.significance import bootstrap_ci, compare_all

if TYPE_CHECKING:
    from synthq.artifacts.manifest import Artifact

# Seed of the bootstrap and randomization draws: the same inputs always print the same table.
RESAMPLING_SEED = 0

DISPLAY = {
    "ndcg@1": "NDCG@1", "ndcg@3": "NDCG@3", "ndcg@5": "NDCG@5", "ndcg@10": "NDCG@10",
    "ndcg@100": "NDCG@100", "recall@10": "Recall@10", "recall@100": "Recall@100",
    "mrr@10": "MRR@10", "map": "MAP",
}  # fmt: skip


def _cell(system: dict, metric: str) -> str:
    """``0.7949``, with ``± std`` over seeds and ``[low, high]`` (95 % bootstrap CI) when known."""
    text = f"{system['metrics'][metric]:.4f}"
    if len(system.get("seeds") or []) > 1:
        text += f" ± {system['metrics_std'][metric]:.4f}"
    if metric in (system.get("per_query") or {}):
        low, high = bootstrap_ci(system["per_query"][metric], seed=RESAMPLING_SEED)
        text += f" [{low:.3f}, {high:.3f}]"
    return text


def results_table(rows: list[dict], metrics: tuple[str, ...] = HEADLINE, statement: bool = True) -> str:
    """One markdown table per dataset: retriever, method, ε, then the metrics (Tables 3-4).

    The ε column is the model's guarantee (what releasing the retriever costs). Where the scores
    cost more than their models (scores of private queries: ε = ∞), the column is headed
    ``model ε``, a ``scores ε`` column follows, and one sentence under the heading says what the
    scores' ε is and why (:func:`synthq.reporting.epsilon.scores_statement`; ``statement=False``
    leaves it to an earlier table of the same document).

    Rows trained with several seeds are one line (mean ± std over seeds); with per-query scores
    every number carries its 95 % bootstrap interval over queries (and seeds)."""
    out = []
    merged = systems(rows)
    for dataset in datasets_of(rows):
        here = [r for r in merged if r["dataset"] == dataset]
        split = here[0].get("split")
        out.append(f"### {dataset}" + (f" ({split})" if split else "") + "\n")
        two = any(scores_differ(r) for r in here)
        if two and statement:
            out.append(scores_statement(here) + "\n")
        columns = ["model ε", "scores ε"] if two else ["ε"]
        header = ["retriever", "method", *columns, *(DISPLAY.get(m, m) for m in metrics)]
        out.append("| " + " | ".join(header) + " |")
        out.append("|" + "---|" * len(header))
        for row in here:
            cells = [row["retriever"], row["method"], epsilon_cell(row)]
            cells += [scores_cell(row)] if two else []
            cells += [_cell(row, m) for m in metrics]
            out.append("| " + " | ".join(cells) + " |")
        out.append("")
    return "\n".join(out)


def pairwise_comparisons(
    rows: list[dict], metric: str = "ndcg@10", confidence: float = 0.95
) -> dict[str, tuple[int, list]]:
    """Every pair of systems on each dataset that has two with per-query ``metric`` scores:
    dataset -> (number of common queries, :class:`~synthq.retrieval.significance.Comparison`
    list, higher mean first, Holm-adjusted over the dataset's pairs)."""
    found = {}
    for dataset in datasets_of(rows):
        here = [s for s in systems(rows) if s["dataset"] == dataset and metric in (s.get("per_query") or {})]
        if len(here) < 2:
            continue
        common = sorted(set.intersection(*(set(s["query_ids"]) for s in here)))
        scores = {}
        for s in here:
            position = {q: i for i, q in enumerate(s["query_ids"])}
            scores[s["retriever"]] = s["per_query"][metric][:, [position[q] for q in common]]
        found[dataset] = (len(common), compare_all(scores, confidence=confidence, seed=RESAMPLING_SEED))
    return found


def significance_metrics(found: dict[str, tuple[int, list]]) -> dict[str, dict]:
    """:func:`pairwise_comparisons` as manifest metrics: dataset -> ``"better > worse"`` ->
    difference, interval, p and Holm p (what ``synthq run --check`` can hold a run to)."""
    return {
        dataset: {
            f"{c.a} > {c.b}": {
                "difference": c.difference, "ci": [c.ci_low, c.ci_high], "p": c.p_value, "p_holm": c.p_holm,
            }
            for c in comparisons
        }
        for dataset, (_, comparisons) in found.items()
    }  # fmt: skip


def significance_table(
    rows: list[dict], metric: str = "ndcg@10", confidence: float = 0.95, found: dict | None = None
) -> str:
    """Every pair of systems on each dataset: the difference of ``metric`` (higher first), its
    paired bootstrap interval, the sign-flip randomization p-value and the Holm-adjusted
    p-value over all pairs on that dataset; ``**yes**`` where the adjusted p ≤ 1 - confidence.
    Empty when no dataset has two systems with per-query scores. ``found``: the
    :func:`pairwise_comparisons` of these rows, when the caller already has them."""
    out = []
    name = DISPLAY.get(metric, metric)
    if found is None:
        found = pairwise_comparisons(rows, metric, confidence)
    for dataset, (queries, comparisons) in found.items():
        alpha = 1 - confidence
        out += [
            f"### {dataset}: paired differences of {name} ({queries} queries)\n",
            f"Sign-flip randomization test over queries (two-sided), {100 * confidence:.0f} % paired "
            f"bootstrap interval of the difference, Holm-Bonferroni correction over all "
            f"{len(comparisons)} pairs on this dataset; significant = Holm-adjusted p ≤ {alpha:g}. "
            "Systems with several seeds are compared on their seed-averaged per-query scores; "
            "their interval also resamples seeds.\n",
            f"| better | worse | Δ {name} | {100 * confidence:.0f} % CI | p | p (Holm) | significant |",
            "|---|---|---|---|---|---|---|",
        ]
        for c in sorted(comparisons, key=lambda c: c.p_value):
            mark = "**yes**" if c.significant else "no"
            out.append(
                f"| {c.a} | {c.b} | {c.difference:+.4f} | [{c.ci_low:+.4f}, {c.ci_high:+.4f}] "
                f"| {_p(c.p_value)} | {_p(c.p_holm)} | {mark} |"
            )
        out.append("")
    return "\n".join(out)


def _p(value: float) -> str:
    return f"{value:.4f}" if value >= 1e-4 else f"{value:.1e}"


def zero_shot_table(rows: list[dict], metric: str, statement: bool = True) -> str:
    """Retrievers × datasets for one metric, the model's ε beside each retriever (Table 5
    layout); where scores cost more than their models, one sentence says so."""
    merged = systems(rows)
    datasets = datasets_of(rows)
    retrievers = list(dict.fromkeys(r["retriever"] for r in merged))
    two = any(scores_differ(r) for r in merged)
    header = ["retriever", "model ε" if two else "ε", *datasets]
    lines = [f"**{DISPLAY.get(metric, metric)}**\n"]
    lines += [scores_statement(merged) + "\n"] if two and statement else []
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for name in retrievers:
        mine = {r["dataset"]: r for r in merged if r["retriever"] == name}
        cells = [name, _model_cells(list(mine.values()))]
        cells += [f"{mine[d]['metrics'][metric]:.4f}" if d in mine else "—" for d in datasets]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _model_cells(rows: list[dict]) -> str:
    """One retriever's model ε over datasets: one value, or each dataset's when they differ."""
    cells = list(dict.fromkeys(epsilon_cell(r) for r in rows))
    if len(cells) == 1:
        return cells[0]
    return ", ".join(f"{epsilon_cell(r)} ({r['dataset']})" for r in rows)


def results_markdown(rows: list[dict], title: str = "Retrieval results", found: dict | None = None) -> str:
    """The whole ``results.md``: headline tables, significance (``found``: the rows'
    :func:`pairwise_comparisons` of NDCG@10, when the caller has them), the zero-shot layout, then
    every metric."""
    sections = [
        f"# {title}\n",
        "Every number is shown with the ε of the retriever it belongs to (the model's guarantee: what "
        "releasing the retriever costs); `0 (public)` marks reference models that never saw private "
        "data. Where the scores themselves cost more (scores of private queries read without noise), "
        "the table says so and adds a scores ε column. `[a, b]`: 95 % bootstrap interval over "
        "queries; `± s`: standard deviation over training seeds.\n",
        "## NDCG@10 and Recall@10\n",
        results_table(rows),
    ]
    if significance := significance_table(rows, found=found):
        sections += ["## Which differences are significant\n", significance]
    if len(datasets_of(rows)) > 1:
        sections.append("## Across datasets\n")
        sections += [zero_shot_table(rows, metric, statement=False) for metric in HEADLINE]
    sections += ["## All metrics\n", results_table(rows, METRICS, statement=False)]
    return "\n".join(sections)


def paper_comparison(rows: list[dict], paper: list[dict]) -> str:
    """The paper's reported numbers beside ours, matched on dataset and the model's ε (the
    paper's ε is its models'; all our rows at that ε are listed, named by retriever)."""
    lines = [
        "| paper row | ε | dataset | metric | paper | ours (retriever) |",
        "|---|---|---|---|---|---|",
    ]
    for reference in paper:
        epsilon = epsilon_value(reference.get("epsilon", math.inf))
        dataset = str(reference.get("dataset", ""))
        ours = [
            r
            for r in rows
            if r["dataset"] == dataset and not is_public(r) and same_epsilon(shown_epsilon(r)[0], epsilon)
        ]
        for metric in [m for m in METRICS if m in reference]:
            shown = ", ".join(f"{r['metrics'][metric]:.4f} ({r['retriever']})" for r in ours) or "—"
            lines.append(
                f"| {reference['row']} | {format_epsilon(epsilon)} | {dataset} | {metric} "
                f"| {reference[metric]:.4f} | {shown} |"
            )
    return "\n".join(lines) + "\n"


def _synthetic_epsilon(artifact: Artifact) -> float:
    """The synthetic set's ε of a similarity artifact: its recorded metric where this installation
    sealed it; elsewhere the ε of everything its manifest records, its own noiseless read of the
    private queries included (∞: which of its releases is "its own" is a field the editor
    chooses), never read from an editable metric."""
    if artifact.verified:
        return float(artifact.metrics.get("synthetic_epsilon", "inf"))
    (stand_in,) = artifact.vouched_releases() or [{"guarantee": {"epsilon": 0.0}}]
    return float(stand_in["guarantee"]["epsilon"])


def similarity_table(artifacts: list[Artifact]) -> str:
    """BLEU, MAUVE, distinct-2 and verbatim copies of each ``similarity`` artifact, beside its
    synthetic set's ε. The scores compare the synthetic queries with the private ones without
    noise: they are ε = ∞ (the artifact's guarantee), which the table says; the ε column is the
    synthetic set's alone."""
    lines = [
        "The synthetic set's ε column is what releasing each synthetic set costs. The similarity scores "
        "compare it with the **private** queries without noise: **ε = ∞, keep them inside**.\n",
        "| synthetic set | synthetic set's ε | scores ε | BLEU | MAUVE | distinct-2 | verbatim copies |",
        "|---|---|---|---|---|---|---|",
    ]
    for artifact in artifacts:
        m = artifact.metrics
        synthetic_epsilon = _synthetic_epsilon(artifact)
        has_mauve = m.get("mauve_mean") is not None
        mauve = f"{m['mauve_mean']:.3f} ± {m['mauve_std']:.3f}" if has_mauve else "—"
        lines.append(
            f"| {Path(artifact.config['synthetic']).name} | {format_epsilon(synthetic_epsilon)} "
            f"| {format_epsilon(artifact.privacy.epsilon)} | {m['bleu']:.2f} | {mauve} "
            f"| {m['distinct_2']:.3f} | {100 * m['verbatim_copy_rate']:.1f}% |"
        )
    return "\n".join(lines) + "\n"
