"""Tables (markdown + JSON) and the privacy-utility plot, from evaluation results.

Every number is printed with the ε of the retriever it belongs to; rows that never saw
private data (BM25, untrained encoders) show ε = 0.
"""

from __future__ import annotations

import math
from pathlib import Path

from synthq.privacy import format_epsilon
from synthq.retrieval.metrics import HEADLINE, METRICS


def _epsilon(value) -> float:
    return float(value)


def results_table(rows: list[dict], metrics: tuple[str, ...] = HEADLINE) -> str:
    """One markdown table per dataset: row, method, ε, then the metrics (paper layout)."""
    out = []
    for dataset in dict.fromkeys(r["dataset"] for r in rows):
        out.append(f"### {dataset}\n")
        header = ["retriever", "method", "ε", *metrics]
        out.append("| " + " | ".join(header) + " |")
        out.append("|" + "---|" * len(header))
        for row in (r for r in rows if r["dataset"] == dataset):
            cells = [row["retriever"], row["method"], format_epsilon(_epsilon(row["epsilon"]))]
            cells += [f"{row['metrics'][m]:.4f}" for m in metrics]
            out.append("| " + " | ".join(cells) + " |")
        out.append("")
    return "\n".join(out)


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
        ours = [r for r in rows if r["dataset"] == dataset and _same_epsilon(_epsilon(r["epsilon"]), epsilon)]
        for metric in [m for m in METRICS if m in reference]:
            shown = ", ".join(f"{r['metrics'][metric]:.4f} ({r['retriever']})" for r in ours) or "—"
            lines.append(
                f"| {reference['row']} | {format_epsilon(epsilon)} | {dataset} | {metric} "
                f"| {reference[metric]:.4f} | {shown} |"
            )
    return "\n".join(lines) + "\n"


def privacy_utility_plot(rows: list[dict], path: Path, metric: str = "ndcg@10") -> None:
    """NDCG@10 against ε, one line per method; ε = ∞ is drawn at the right edge, ε = 0
    references (BM25, untrained) as horizontal lines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    datasets = list(dict.fromkeys(r["dataset"] for r in rows))
    figure, axes = plt.subplots(1, len(datasets), figsize=(6 * len(datasets), 4.2), squeeze=False)
    finite = [_epsilon(r["epsilon"]) for r in rows if 0 < _epsilon(r["epsilon"]) < math.inf]
    infinity_x = max(finite, default=8.0) * 2.5
    for axis, dataset in zip(axes[0], datasets, strict=True):
        here = [r for r in rows if r["dataset"] == dataset]
        for method in dict.fromkeys(r["method"] for r in here):
            points = sorted(
                (
                    infinity_x if math.isinf(_epsilon(r["epsilon"])) else _epsilon(r["epsilon"]),
                    r["metrics"][metric],
                )
                for r in here
                if r["method"] == method
            )
            if all(x == 0 for x, _ in points):
                axis.axhline(
                    points[0][1],
                    linestyle="--",
                    linewidth=1,
                    label=f"{method} (ε = 0)",
                    color="grey" if "bm25" in method else None,
                )
                continue
            xs, ys = zip(*points, strict=True)
            axis.plot(xs, ys, marker="o", label=method)
            for x, y in points:
                axis.annotate(
                    f"ε={'∞' if x == infinity_x else format_epsilon(x)}",
                    (x, y),
                    fontsize=7,
                    xytext=(3, 3),
                    textcoords="offset points",
                )
        axis.set_xscale("log")
        axis.set_xlabel("ε (log scale; ∞ at the right edge)")
        axis.set_ylabel(metric.upper())
        axis.set_title(dataset)
        axis.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
