"""The canary audit's tables and plots: Table 7's exposure layout, the one-run table, the
exposure curve and the score histograms."""

from __future__ import annotations

import math
import statistics
from pathlib import Path

import numpy as np

from synthq.audit.exposure import SECRET_SPACE, held_out_epsilon_lower_bound, per_pair_from_group
from synthq.privacy.guarantee import format_epsilon


def _mean(values: list[float]) -> float:
    return float(statistics.fmean(values)) if values else math.nan


def summarize(rows: list[dict], epsilons: list[float], proven: dict[str, float], delta: float) -> list[dict]:
    """Table 7 rows: one per ε × repetition (0 = held-out control) × shape, plus "all" shapes.

    The ε lower bound of repetition r is for the r-fold group, with the threshold chosen on half
    of the canaries and scored on the other half; ``pair_epsilon_lower_bound`` is its per-pair
    conversion by group privacy."""
    table = []
    for epsilon in epsilons:
        key = format_epsilon(epsilon)
        at_epsilon = [r for r in rows if r["epsilon"] == key]
        controls = [r["exposure_extrapolated"] for r in at_epsilon if r["repetitions"] == 0]
        for repetition in sorted({r["repetitions"] for r in at_epsilon}):
            for shape in [*sorted({r["shape"] for r in at_epsilon}), "all"]:
                group = [
                    r for r in at_epsilon if r["repetitions"] == repetition and shape in (r["shape"], "all")
                ]
                if not group:
                    continue
                members = [r["exposure_extrapolated"] for r in group]
                bound_at = held_out_epsilon_lower_bound(members, controls) if repetition > 0 else None
                table.append(
                    {
                        "epsilon": key,
                        "proven_epsilon": proven[key],
                        "repetitions": repetition,
                        "shape": shape,
                        "canaries": len(group),
                        "mean_rank": _mean([r["rank"] for r in group]),
                        "candidates": group[0]["candidates"],
                        "leaked": _mean([float(r["leaked"]) for r in group]),
                        "exposure": _mean([r["exposure"] for r in group]),
                        "exposure_extrapolated": _mean(members),
                        "group_epsilon_lower_bound": (
                            None if bound_at is None else bound_at(min(1.0, repetition * delta))
                        ),
                        "pair_epsilon_lower_bound": (
                            None if bound_at is None else per_pair_from_group(bound_at, repetition, delta)
                        ),
                    }
                )
    return table


def _bound_text(value: float | None) -> str:
    return "—" if value is None else f"{value:.3f}"


def to_markdown(table: list[dict]) -> str:
    """The exposure method's table (Table 7's layout plus the group and per-pair bounds)."""
    lines = [
        "| ε (proven) | repetitions | shape | canaries | rank | leaked | exposure (rank) "
        "| exposure (extrapolated) | ε lower bound, r-fold group | per pair |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in table:
        repetitions = "held out" if row["repetitions"] == 0 else str(row["repetitions"])
        lines.append(
            f"| {row['epsilon']} ({format_epsilon(row['proven_epsilon'])}) | {repetitions} | {row['shape']} "
            f"| {row['canaries']} | {row['mean_rank']:.1f}/{row['candidates']} | {100 * row['leaked']:.0f}% "
            f"| {row['exposure']:.2f} | {row['exposure_extrapolated']:.2f} "
            f"| {_bound_text(row['group_epsilon_lower_bound'])} "
            f"| {_bound_text(row['pair_epsilon_lower_bound'])} |"
        )
    return "\n".join(lines) + "\n"


def _undefined(value) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def _percent(value) -> str:
    return "— (one side empty)" if _undefined(value) else f"{100 * value:.1f}%"


def _auroc(row: dict) -> str:
    if _undefined(row["auroc"]):
        return "— (the coins put every canary on one side)"
    return f"{row['auroc']:.3f} [{row['auroc_low']:.3f}, {row['auroc_high']:.3f}]"


def one_run_markdown(rows: list[dict]) -> str:
    """The one-run table: one row per audited model (generator or retriever) and ε."""
    lines = [
        "| audited | ε (proven) | canaries in/out | guesses (k₊+k₋) | correct | ε lower bound (ε, δ) "
        "| Gaussian-DP ε lower bound | TPR@FPR 1% | TPR@FPR 10% | AUROC [95% CI] |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row['audited']} | {format_epsilon(row['proven_epsilon'])} "
            f"| {row['included']}/{row['canaries'] - row['included']} | {row['guesses']} ({row['k_plus']}+"
            f"{row['k_minus']}) | {row['correct']} | **{row['epsilon_lower_bound']:.2f}** "
            f"| {row['gdp_epsilon_lower_bound']:.2f} | {_percent(row['tpr_at_fpr_1'])} "
            f"| {_percent(row['tpr_at_fpr_10'])} | {_auroc(row)} |"
        )
    delta = rows[0]["delta"] if rows else math.nan
    confidence = rows[0]["confidence"] if rows else math.nan
    lines.append(
        f"\nLower bounds hold with {100 * confidence:.0f}% confidence at δ = {delta:.2e} "
        "(Steinke et al. 2023, Bonferroni over the guess counts tried); the Gaussian-DP column is "
        "the ε at that δ of the largest μ-GDP profile the same test rejects "
        "(not Mahloujifar et al.'s sharper f-DP analysis)."
    )
    return "\n".join(lines) + "\n"


def plot_exposure(table: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(6, 4))
    for epsilon in dict.fromkeys(r["epsilon"] for r in table):
        rows = sorted(
            (r for r in table if r["epsilon"] == epsilon and r["shape"] == "all"),
            key=lambda r: r["repetitions"],
        )
        axis.plot(
            [max(r["repetitions"], 0.5) for r in rows],
            [r["exposure_extrapolated"] for r in rows],
            marker="o",
            label=f"ε = {epsilon}",
        )
    axis.set_xscale("log")
    axis.set_xlabel("canary repetitions (0.5 = held-out control)")
    axis.set_ylabel("exposure (bits, skew-normal extrapolation)")
    axis.axhline(math.log2(SECRET_SPACE), color="grey", linestyle=":", linewidth=1)
    axis.set_title("Canary exposure of the query generator")
    axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def plot_scores(panels: list[tuple[str, np.ndarray, np.ndarray]], path: Path) -> None:
    """Histograms of included vs excluded canaries' scores, one panel per audited model."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, len(panels), figsize=(4 * len(panels), 3.2), squeeze=False)
    for axis, (title, scores, included) in zip(axes[0], panels, strict=True):
        bins = np.histogram_bin_edges(scores, bins=30)
        axis.hist(scores[included], bins=bins, alpha=0.6, label="included")
        axis.hist(scores[~included], bins=bins, alpha=0.6, label="excluded")
        axis.set_title(title, fontsize=9)
        axis.set_xlabel("membership score")
    axes[0][0].set_ylabel("canaries")
    axes[0][0].legend()
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
