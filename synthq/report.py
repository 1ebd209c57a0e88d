"""Tables (markdown + JSON), the privacy-utility plot and the privacy of combined results.

Every number is printed with the ε of the retriever it belongs to. Rows that never saw private
data (BM25, untrained public encoders) carry :meth:`Guarantee.public` and show ``0 (public)``.

Layouts follow Carranza et al.: per dataset, one row per retriever with ε, NDCG@10 and
Recall@10 (Tables 3 and 4); across datasets, retrievers × datasets for each headline metric
(Table 5); then every metric.
"""

from __future__ import annotations

import math
from pathlib import Path

from synthq.privacy import Guarantee, format_epsilon
from synthq.retrieval.metrics import HEADLINE, METRICS

DISPLAY = {
    "ndcg@1": "NDCG@1", "ndcg@3": "NDCG@3", "ndcg@5": "NDCG@5", "ndcg@10": "NDCG@10",
    "ndcg@100": "NDCG@100", "recall@10": "Recall@10", "recall@100": "Recall@100",
    "mrr@10": "MRR@10", "map": "MAP",
}  # fmt: skip


def _epsilon(value) -> float:
    return float(value)  # "inf" strings from JSON come back as math.inf


def is_public(row: dict) -> bool:
    privacy = row.get("privacy") or {}
    return privacy.get("mechanism") == "public" or row.get("kind") in ("bm25", "untrained")


def epsilon_cell(row: dict) -> str:
    """``∞``, ``8.00`` or ``0 (public)`` for a row that never saw private data."""
    return "0 (public)" if is_public(row) else format_epsilon(_epsilon(row["epsilon"]))


def _datasets(rows: list[dict]) -> list[str]:
    return list(dict.fromkeys(r["dataset"] for r in rows))


def results_table(rows: list[dict], metrics: tuple[str, ...] = HEADLINE) -> str:
    """One markdown table per dataset: retriever, method, ε, then the metrics (Tables 3-4)."""
    out = []
    for dataset in _datasets(rows):
        here = [r for r in rows if r["dataset"] == dataset]
        split = here[0].get("split")
        out.append(f"### {dataset}" + (f" ({split})" if split else "") + "\n")
        header = ["retriever", "method", "ε", *(DISPLAY.get(m, m) for m in metrics)]
        out.append("| " + " | ".join(header) + " |")
        out.append("|" + "---|" * len(header))
        for row in here:
            cells = [row["retriever"], row["method"], epsilon_cell(row)]
            cells += [f"{row['metrics'][m]:.4f}" for m in metrics]
            out.append("| " + " | ".join(cells) + " |")
        out.append("")
    return "\n".join(out)


def zero_shot_table(rows: list[dict], metric: str) -> str:
    """Retrievers × datasets for one metric, ε beside each retriever (Table 5 layout)."""
    datasets = _datasets(rows)
    retrievers = list(dict.fromkeys(r["retriever"] for r in rows))
    header = ["retriever", "ε", *datasets]
    lines = [
        f"**{DISPLAY.get(metric, metric)}**\n",
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
    ]
    for name in retrievers:
        mine = {r["dataset"]: r for r in rows if r["retriever"] == name}
        first = next(iter(mine.values()))
        cells = [name, epsilon_cell(first)]
        cells += [f"{mine[d]['metrics'][metric]:.4f}" if d in mine else "—" for d in datasets]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def results_markdown(rows: list[dict], title: str = "Retrieval results") -> str:
    """The whole ``results.md``: headline tables, the zero-shot layout, then every metric."""
    sections = [
        f"# {title}\n",
        "Every number is shown with the ε of the retriever it belongs to; `0 (public)` marks "
        "reference rows that never saw private data.\n",
        "## NDCG@10 and Recall@10\n",
        results_table(rows),
    ]
    if len(_datasets(rows)) > 1:
        sections.append("## Across datasets\n")
        sections += [zero_shot_table(rows, metric) for metric in HEADLINE]
    sections += ["## All metrics\n", results_table(rows, METRICS)]
    return "\n".join(sections)


def _same_epsilon(a: float, b: float) -> bool:
    return (math.isinf(a) and math.isinf(b)) or (
        math.isfinite(a) and math.isfinite(b) and math.isclose(a, b, rel_tol=0.05)
    )


def paper_comparison(rows: list[dict], paper: list[dict]) -> str:
    """The paper's reported numbers beside ours, matched on dataset and ε (all our rows at
    that ε are listed, named by retriever)."""
    lines = [
        "| paper row | ε | dataset | metric | paper | ours (retriever) |",
        "|---|---|---|---|---|---|",
    ]
    for reference in paper:
        epsilon = _epsilon(reference.get("epsilon", math.inf))
        dataset = str(reference.get("dataset", ""))
        ours = [
            r
            for r in rows
            if r["dataset"] == dataset and not is_public(r) and _same_epsilon(_epsilon(r["epsilon"]), epsilon)
        ]
        for metric in [m for m in METRICS if m in reference]:
            shown = ", ".join(f"{r['metrics'][metric]:.4f} ({r['retriever']})" for r in ours) or "—"
            lines.append(
                f"| {reference['row']} | {format_epsilon(epsilon)} | {dataset} | {metric} "
                f"| {reference[metric]:.4f} | {shown} |"
            )
    return "\n".join(lines) + "\n"


def combined_guarantee(sources: list[tuple[str, Guarantee]]) -> Guarantee:
    """The guarantee of one artifact that publishes results of several models.

    Args:
        sources: ``(manifest hash, guarantee)`` of every model whose results are published.

    Each DP release of the private data is counted once: models that post-process the same
    release (retrievers trained on synthetic data from one generator, whose ``derived_from``
    starts with that generator) share its guarantee, and a model with its own accountant (direct
    DP) is its own release. Releasing results of several independent releases of the same data
    composes (basic composition: ε and δ add). With a single release this is exactly that
    release's guarantee, i.e. the largest ε of the models; taking the largest ε when there are
    several independent releases would understate the loss. Public models add nothing; one
    non-private model makes the whole artifact ε = ∞. The unit is ``query`` if any release
    protects only queries (an ``example`` guarantee implies the ``query`` one).
    """
    derived = sorted({h for key, g in sources for h in [*g.derived_from, key] if g.mechanism != "public"})
    private = [(key, g) for key, g in sources if g.mechanism != "public" and g.epsilon > 0]
    if not private:
        return Guarantee.public("results of public models (BM25, untrained encoders) on public data only")
    if any(not g.is_private for _, g in private):
        non_private = Guarantee.non_private("includes results of a model trained on private data without DP")
        return non_private.model_copy(update={"derived_from": derived})
    releases: dict[str, Guarantee] = {}
    for key, g in private:
        release = g.derived_from[0] if g.derived_from else key
        # Within one release every model is its post-processing; the largest recorded ε is kept
        # so that a model that composed extra accounting on top is never understated.
        if release not in releases or g.epsilon > releases[release].epsilon:
            releases[release] = g
    unit = "query" if any(g.unit == "query" for g in releases.values()) else "example"
    if len(releases) == 1:
        (only,) = releases.values()
        return only.model_copy(
            update={"derived_from": derived, "mechanism": f"{only.mechanism}+post-processing"}
        )
    return Guarantee(
        epsilon=sum(g.epsilon for g in releases.values()),
        delta=sum(g.delta for g in releases.values()),
        unit=unit,
        mechanism=f"basic composition of {len(releases)} DP releases",
        accountant="basic-composition",
        derived_from=derived,
        details={"releases": {key: {"epsilon": g.epsilon, "delta": g.delta} for key, g in releases.items()}},
        note="each release's ε comes from its own accountant; they add up as all may read the same data",
    )


def privacy_utility_plot(rows: list[dict], path: Path, metric: str = "ndcg@10") -> None:
    """NDCG@10 against ε, one line per method and one panel per dataset; ε = ∞ is drawn at the
    right edge (tick ``∞``), public references (BM25, untrained) as horizontal lines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    datasets = _datasets(rows)
    figure, axes = plt.subplots(1, len(datasets), figsize=(6 * len(datasets), 4.2), squeeze=False)
    finite = [
        _epsilon(r["epsilon"]) for r in rows if not is_public(r) and math.isfinite(_epsilon(r["epsilon"]))
    ]
    infinity_x = max(finite, default=8.0) * 2.5
    ticks = sorted({*finite, infinity_x}) if finite else [infinity_x]
    for axis, dataset in zip(axes[0], datasets, strict=True):
        here = [r for r in rows if r["dataset"] == dataset]
        for method in dict.fromkeys(r["method"] for r in here):
            members = [r for r in here if r["method"] == method]
            if all(is_public(r) for r in members):
                axis.axhline(
                    members[0]["metrics"][metric],
                    linestyle="--",
                    linewidth=1,
                    label=f"{method} (ε = 0, public)",
                    color="grey" if "bm25" in method.lower() else None,
                )
                continue
            points = sorted(
                (
                    infinity_x if math.isinf(_epsilon(r["epsilon"])) else _epsilon(r["epsilon"]),
                    r["metrics"][metric],
                )
                for r in members
            )
            xs, ys = zip(*points, strict=True)
            axis.plot(xs, ys, marker="o", label=method)
            for x, y in points:
                label = "∞" if x == infinity_x else format_epsilon(x)
                axis.annotate(f"ε={label}", (x, y), fontsize=7, xytext=(3, 3), textcoords="offset points")
        axis.set_xscale("log")
        axis.set_xticks(ticks, ["∞" if t == infinity_x else format_epsilon(t) for t in ticks])
        axis.minorticks_off()
        axis.set_xlabel("ε (log scale; ∞ = no privacy, at the right edge)")
        axis.set_ylabel(DISPLAY.get(metric, metric))
        axis.set_title(dataset)
        axis.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
