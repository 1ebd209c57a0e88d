"""The privacy-utility plot: a metric against the model's ε with 95 % intervals, one panel per dataset.

Each model is placed at its own guarantee (what releasing it costs,
:func:`synthq.reporting.epsilon.shown_epsilon`), computed from its releases by the same function as
the tables'. When the plotted scores cost more (scores of private queries: ε = ∞) the axis says so.
"""

from __future__ import annotations

import math
from pathlib import Path

from synthq.privacy.guarantee import format_epsilon
from synthq.reporting.epsilon import is_public, privacy_of, same_epsilon, scores_differ, shown_epsilon
from synthq.reporting.systems import datasets_of, systems
from synthq.reporting.tables import DISPLAY, RESAMPLING_SEED
from synthq.retrieval.significance import bootstrap_ci


def epsilon_positions(values: list[float]) -> list[tuple[float, str]]:
    """The x axis of the privacy-utility plot: ε values within 5 % of each other (7.99 and 8.00)
    merge into one tick labelled by their rounded mean; ∞ comes last. Returns ``(representative
    ε, label)`` in axis order; a value is placed at the index of its cluster."""
    finite = sorted(v for v in values if math.isfinite(v))
    clusters: list[list[float]] = []
    for value in finite:
        if clusters and same_epsilon(clusters[-1][0], value):
            clusters[-1].append(value)
        else:
            clusters.append([value])
    ticks = []
    for cluster in clusters:
        mean = sum(cluster) / len(cluster)
        ticks.append((mean, f"{float(f'{mean:.2g}'):g}" if mean >= 1 else f"{mean:.2g}"))
    if any(math.isinf(v) for v in values):
        ticks.append((math.inf, "∞"))
    return ticks


def _x_index(value: float, ticks: list[tuple[float, str]]) -> int:
    """The tick of ``value``: ∞ on ∞, else the nearest finite tick (its own cluster's)."""
    if math.isinf(value):
        return len(ticks) - 1
    return min((abs(t - value), i) for i, (t, _) in enumerate(ticks) if math.isfinite(t))[1]


def privacy_utility_plot(rows: list[dict], path: Path, metric: str = "ndcg@10") -> None:
    """NDCG@10 against the model's ε with 95 % intervals, one panel per dataset.

    The x axis is ordinal: one tick per ε present (values within 5 % merged, ∞ = no privacy at
    the right), so one or many finite ε stay readable and never overprint. Each method is one
    line labelled once in the legend, its points offset slightly so intervals do not hide each
    other; public references (BM25, untrained) are horizontal lines with their interval shaded.
    Seeds are averaged (:func:`systems`); intervals are the bootstrap intervals of the tables."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    merged = systems(rows)
    datasets = datasets_of(rows)
    ticks = epsilon_positions([shown_epsilon(r)[0] for r in merged if not is_public(r)])
    unaccounted = any(shown_epsilon(r)[2] for r in merged if not is_public(r))
    costlier = sorted({format_epsilon(privacy_of(r).scores.epsilon) for r in merged if scores_differ(r)})
    width = max(9.0, 1.4 * len(ticks) + 4)
    figure, axes = plt.subplots(1, len(datasets), figsize=(width * len(datasets), 4.6), squeeze=False)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for axis, dataset in zip(axes[0], datasets, strict=True):
        here = [r for r in merged if r["dataset"] == dataset]
        methods = list(dict.fromkeys(r["method"] for r in here))
        private = [m for m in methods if not all(is_public(r) for r in here if r["method"] == m)]
        for number, method in enumerate(methods):
            members = [r for r in here if r["method"] == method]
            color = colors[number % len(colors)]
            if all(is_public(r) for r in members):
                for member in members:
                    y = member["metrics"][metric]
                    axis.axhline(
                        y, linestyle="--", linewidth=1, color=color, label=f"{member['retriever']} (public)"
                    )
                    if metric in (member.get("per_query") or {}):
                        low, high = bootstrap_ci(member["per_query"][metric], seed=RESAMPLING_SEED)
                        axis.axhspan(low, high, color=color, alpha=0.08)
                continue
            offset = 0.08 * (private.index(method) - (len(private) - 1) / 2)
            points = []
            for member in members:
                y = member["metrics"][metric]
                low, high = (
                    bootstrap_ci(member["per_query"][metric], seed=RESAMPLING_SEED)
                    if metric in (member.get("per_query") or {})
                    else (y, y)
                )
                # one query (or equal scores): the interval is the point, up to rounding
                below, above = max(y - low, 0.0), max(high - y, 0.0)
                points.append((_x_index(shown_epsilon(member)[0], ticks) + offset, y, below, above))
            points.sort()
            xs, ys, below, above = zip(*points, strict=True)
            axis.errorbar(xs, ys, yerr=[below, above], marker="o", capsize=3, color=color, label=method)
        axis.set_xticks(range(len(ticks)), [f"ε = {label}" for _, label in ticks])
        axis.set_xlim(-0.6, max(len(ticks) - 0.4, 0.6))
        axis.set_xlabel(
            "model ε: what releasing the retriever costs (ordinal axis; ∞ = no privacy)"
            + ("\nconfigurations chosen on private dev queries: not counted in ε" if unaccounted else "")
            + (f"\nthe scores themselves: ε = {', '.join(costlier)} (keep them inside)" if costlier else "")
        )
        axis.set_ylabel(f"{DISPLAY.get(metric, metric)} (95 % CI)")
        axis.set_title(dataset)
        axis.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.3), ncol=2, frameon=False)
    figure.tight_layout()
    figure.savefig(path, dpi=120, bbox_inches="tight")  # the legends sit below their panels
    plt.close(figure)
