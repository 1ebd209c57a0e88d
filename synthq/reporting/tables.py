"""Tables (markdown + JSON), the privacy-utility plot and the privacy of combined results.

Every number is printed with the ε of the retriever it belongs to. Rows that never saw private
data (BM25, untrained public encoders) carry :meth:`Guarantee.public` and show ``0 (public)``.

Layouts follow Carranza et al.: per dataset, one row per retriever with ε, NDCG@10 and
Recall@10 (Tables 3 and 4); across datasets, retrievers × datasets for each headline metric
(Table 5); then every metric.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np

from synthq.privacy.guarantee import Guarantee, compose_all, format_epsilon
from synthq.retrieval.metrics import HEADLINE, METRICS
from synthq.retrieval.significance import bootstrap_ci, compare_all
from synthq.runtime.errors import ArtifactError

# The files an eval writes that other stages read (report, eval --select-on): one name each.
RESULTS_FILE = "results.json"  # one row per retriever × dataset: metrics, ε, settings
PER_QUERY_FILE = "per_query.json"  # dataset -> retriever -> metric -> query -> score
SELECTION_FILE = "selection.md"  # the candidates' dev scores behind --select-on


def read_per_query(directory: Path) -> dict:
    """An evaluation's ``per_query.json`` (``{dataset: {retriever: {metric: {query: v}}}}``);
    empty for evaluations written before per-query scores were kept."""
    path = Path(directory) / PER_QUERY_FILE
    if not path.is_file():
        return {}
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as error:
        raise ArtifactError(f"{path}: unreadable per-query scores ({error})") from error


def attach_per_query(rows: list[dict], scores: dict) -> list[dict]:
    """Copies of ``rows`` with ``per_query`` (metric -> {query: value}) where ``scores`` has it."""
    out = []
    for row in rows:
        mine = scores.get(row["dataset"], {}).get(row["retriever"])
        out.append({**row, "per_query": mine} if mine else dict(row))
    return out


# Seed of the bootstrap and randomization draws: the same inputs always print the same table.
RESAMPLING_SEED = 0

DISPLAY = {
    "ndcg@1": "NDCG@1", "ndcg@3": "NDCG@3", "ndcg@5": "NDCG@5", "ndcg@10": "NDCG@10",
    "ndcg@100": "NDCG@100", "recall@10": "Recall@10", "recall@100": "Recall@100",
    "mrr@10": "MRR@10", "map": "MAP",
}  # fmt: skip


def _epsilon(value) -> float:
    return float(value)  # "inf" strings from JSON come back as math.inf


def is_public(row: dict) -> bool:
    """A reference row that never saw private data: a public guarantee, or BM25 / an untrained
    public encoder on public queries (on a private split their scores are ε = ∞ like any row's)."""
    privacy = row.get("privacy") or {}
    reference = row.get("kind") in ("bm25", "untrained") and _epsilon(row["epsilon"]) == 0
    return privacy.get("mechanism") == "public" or reference


def shown_epsilon(row: dict) -> tuple[float, str | None, bool]:
    """``(ε, unit, unaccounted)`` as tables and plots show a row: a row whose configuration was
    chosen on private dev queries without noise is ∞, and is shown at the ε it has without that
    choice, with ``unaccounted`` set so the choice is printed beside it."""
    selection = row.get("selection") or {}
    epsilon, unit = _epsilon(row["epsilon"]), (row.get("privacy") or {}).get("unit")
    unaccounted = math.isinf(_epsilon(selection.get("epsilon", 0.0))) and math.isinf(epsilon)
    if unaccounted and "row_epsilon_without" in selection:
        epsilon, unit = _epsilon(selection["row_epsilon_without"]), selection.get("row_unit_without")
    return epsilon, unit, unaccounted


def epsilon_cell(row: dict) -> str:
    """``∞``, ``8.00``, ``8.00 per user`` (a user-level guarantee) or ``0 (public)`` for a row
    that never saw private data; ``8.00 + selection ∞`` for a row chosen on private dev queries
    without noise (its ε is ∞; the reader sees why, :func:`shown_epsilon`)."""
    if is_public(row):
        return "0 (public)"
    epsilon, unit, unaccounted = shown_epsilon(row)
    text = format_epsilon(epsilon) + (" per user" if unit == "user" and math.isfinite(epsilon) else "")
    return f"{text} + selection ∞" if unaccounted and math.isfinite(epsilon) else text


def _datasets(rows: list[dict]) -> list[str]:
    return list(dict.fromkeys(r["dataset"] for r in rows))


def _seedless(label: str) -> str:
    """``ret-orig-seed1`` -> ``ret-orig``: the name of a system trained with several seeds."""
    return _SEED_SUFFIX.sub("", label) or label


_SEED_SUFFIX = re.compile(r"[-_.]?s(?:eed)?\d+$")


def systems(rows: list[dict]) -> list[dict]:
    """Rows merged over training seeds and generator replicates: rows on one dataset and split
    whose ``variant`` (the training configuration without seed and output path, a synthetic set
    replaced by its recipe; set by ``eval``) is the same are one system; when they rest on
    different releases (replicates), the system's guarantee is their composition
    (``system_privacy``). A system has the first row's fields, ``seeds``, ``metrics`` (mean over seeds),
    ``metrics_std`` (sample std over seeds, 0 for one seed) and, when every member has
    per-query scores, ``per_query`` (metric -> ``[seeds, queries]`` array) and ``query_ids``."""
    groups: dict[tuple, list[dict]] = {}
    for index, row in enumerate(rows):
        key = (row["dataset"], row.get("split"), row.get("variant") or f"row:{index}", str(row["epsilon"]))
        runs = [(r.get("seed"), r.get("replicate")) for r in groups.get(key, [])]
        if (row.get("seed"), row.get("replicate")) in runs:  # the same run twice: keep both rows
            key = (*key, f"row:{index}")
        groups.setdefault(key, []).append(row)
    merged = []
    for members in groups.values():
        first = members[0]
        system = {**first, "members": [r["retriever"] for r in members]}
        system["seeds"] = [r.get("seed") for r in members]
        replicates = len({r.get("replicate") for r in members})
        if len(members) > 1:
            runs = f"{len(members)} seeds" + (f", {replicates} generators" if replicates > 1 else "")
            system["retriever"] = f"{_seedless(first['retriever'])} ({runs})"
        if len(members) > 1 and first.get("system_privacy"):  # several releases behind one number
            system["privacy"] = first["system_privacy"]
            system["epsilon"] = first["system_privacy"]["epsilon"]
            if first.get("selection"):
                without = first["system_privacy_without_selection"]
                system["selection"] = {
                    **first["selection"],
                    "row_epsilon_without": without["epsilon"],
                    "row_unit_without": without["unit"],
                }
        names = [m for m in first["metrics"] if all(m in r["metrics"] for r in members)]
        values = {m: np.array([r["metrics"][m] for r in members], dtype=float) for m in names}
        system["metrics"] = {m: float(v.mean()) for m, v in values.items()}
        system["metrics_std"] = {m: float(v.std(ddof=1)) if len(v) > 1 else 0.0 for m, v in values.items()}
        if all(r.get("per_query") for r in members):
            query_ids = sorted(set.intersection(*(set(r["per_query"]["ndcg@10"]) for r in members)))
            system["query_ids"] = query_ids
            system["per_query"] = {
                m: np.array([[r["per_query"][m][q] for q in query_ids] for r in members])
                for m in first["per_query"]
                if all(m in r["per_query"] for r in members)
            }
        else:
            system.pop("per_query", None)
        merged.append(system)
    return merged


def _cell(system: dict, metric: str) -> str:
    """``0.7949``, with ``± std`` over seeds and ``[low, high]`` (95 % bootstrap CI) when known."""
    text = f"{system['metrics'][metric]:.4f}"
    if len(system.get("seeds") or []) > 1:
        text += f" ± {system['metrics_std'][metric]:.4f}"
    if metric in (system.get("per_query") or {}):
        low, high = bootstrap_ci(system["per_query"][metric], seed=RESAMPLING_SEED)
        text += f" [{low:.3f}, {high:.3f}]"
    return text


def results_table(rows: list[dict], metrics: tuple[str, ...] = HEADLINE) -> str:
    """One markdown table per dataset: retriever, method, ε, then the metrics (Tables 3-4).

    Rows trained with several seeds are one line (mean ± std over seeds); with per-query scores
    every number carries its 95 % bootstrap interval over queries (and seeds)."""
    out = []
    merged = systems(rows)
    for dataset in _datasets(rows):
        here = [r for r in merged if r["dataset"] == dataset]
        split = here[0].get("split")
        out.append(f"### {dataset}" + (f" ({split})" if split else "") + "\n")
        header = ["retriever", "method", "ε", *(DISPLAY.get(m, m) for m in metrics)]
        out.append("| " + " | ".join(header) + " |")
        out.append("|" + "---|" * len(header))
        for row in here:
            cells = [row["retriever"], row["method"], epsilon_cell(row)]
            cells += [_cell(row, m) for m in metrics]
            out.append("| " + " | ".join(cells) + " |")
        out.append("")
    return "\n".join(out)


def significance_table(rows: list[dict], metric: str = "ndcg@10", confidence: float = 0.95) -> str:
    """Every pair of systems on each dataset: the difference of ``metric`` (higher first), its
    paired bootstrap interval, the sign-flip randomization p-value and the Holm-adjusted
    p-value over all pairs on that dataset; ``**yes**`` where the adjusted p ≤ 1 - confidence.
    Empty when no dataset has two systems with per-query scores."""
    out = []
    name = DISPLAY.get(metric, metric)
    for dataset in _datasets(rows):
        here = [s for s in systems(rows) if s["dataset"] == dataset and metric in (s.get("per_query") or {})]
        if len(here) < 2:
            continue
        common = sorted(set.intersection(*(set(s["query_ids"]) for s in here)))
        scores = {}
        for s in here:
            position = {q: i for i, q in enumerate(s["query_ids"])}
            scores[s["retriever"]] = s["per_query"][metric][:, [position[q] for q in common]]
        comparisons = compare_all(scores, confidence=confidence, seed=RESAMPLING_SEED)
        alpha = 1 - confidence
        out += [
            f"### {dataset}: paired differences of {name} ({len(common)} queries)\n",
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


def zero_shot_table(rows: list[dict], metric: str) -> str:
    """Retrievers × datasets for one metric, ε beside each retriever (Table 5 layout)."""
    merged = systems(rows)
    datasets = _datasets(rows)
    retrievers = list(dict.fromkeys(r["retriever"] for r in merged))
    header = ["retriever", "ε", *datasets]
    lines = [
        f"**{DISPLAY.get(metric, metric)}**\n",
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
    ]
    for name in retrievers:
        mine = {r["dataset"]: r for r in merged if r["retriever"] == name}
        first = next(iter(mine.values()))
        cells = [name, epsilon_cell(first)]
        cells += [f"{mine[d]['metrics'][metric]:.4f}" if d in mine else "—" for d in datasets]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def results_markdown(rows: list[dict], title: str = "Retrieval results") -> str:
    """The whole ``results.md``: headline tables, significance, the zero-shot layout, then every
    metric."""
    sections = [
        f"# {title}\n",
        "Every number is shown with the ε of the retriever it belongs to; `0 (public)` marks "
        "reference rows that never saw private data. `[a, b]`: 95 % bootstrap interval over "
        "queries; `± s`: standard deviation over training seeds.\n",
        "## NDCG@10 and Recall@10\n",
        results_table(rows),
    ]
    if significance := significance_table(rows):
        sections += ["## Which differences are significant\n", significance]
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
    non-private model makes the whole artifact ε = ∞. The unit is the weakest of the releases'
    (:func:`synthq.privacy.guarantee.compose_all`), and the parts are kept so ε is recomputed on open.
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
    if len(releases) == 1:
        (only,) = releases.values()
        return only.model_copy(
            update={"derived_from": derived, "mechanism": f"{only.mechanism}+post-processing"}
        )
    combined = compose_all(list(releases.values()), f"basic composition of {len(releases)} DP releases")
    return combined.model_copy(update={"derived_from": derived})


def epsilon_positions(values: list[float]) -> list[tuple[float, str]]:
    """The x axis of the privacy-utility plot: ε values within 5 % of each other (7.99 and 8.00)
    merge into one tick labelled by their rounded mean; ∞ comes last. Returns ``(representative
    ε, label)`` in axis order; a value is placed at the index of its cluster."""
    finite = sorted(v for v in values if math.isfinite(v))
    clusters: list[list[float]] = []
    for value in finite:
        if clusters and _same_epsilon(clusters[-1][0], value):
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
    """NDCG@10 against ε with 95 % intervals, one panel per dataset.

    The x axis is ordinal: one tick per ε present (values within 5 % merged, ∞ = no privacy at
    the right), so one or many finite ε stay readable and never overprint. Each method is one
    line labelled once in the legend, its points offset slightly so intervals do not hide each
    other; public references (BM25, untrained) are horizontal lines with their interval shaded.
    Seeds are averaged (:func:`systems`); intervals are the bootstrap intervals of the tables."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    merged = systems(rows)
    datasets = _datasets(rows)
    ticks = epsilon_positions([shown_epsilon(r)[0] for r in merged if not is_public(r)])
    unaccounted = any(shown_epsilon(r)[2] for r in merged if not is_public(r))
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
            "ε (ordinal axis; ∞ = no privacy)"
            + ("\nconfigurations chosen on private dev queries: not counted in ε" if unaccounted else "")
        )
        axis.set_ylabel(f"{DISPLAY.get(metric, metric)} (95 % CI)")
        axis.set_title(dataset)
        axis.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.3), ncol=2, frameon=False)
    figure.tight_layout()
    figure.savefig(path, dpi=120, bbox_inches="tight")  # the legends sit below their panels
    plt.close(figure)
