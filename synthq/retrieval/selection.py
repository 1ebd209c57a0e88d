"""Hyper-parameter selection on a dev evaluation: the best configuration of every method.

A pipeline trains each method with several settings (a sweep over ``lr``, ``clip_norm``, ...)
and seeds, evaluates all of them on the dev split, then evaluates on test only what
:func:`select_best` picks: per method (``eval``'s method label: original / synthetic / direct DP
mode, and encoder), the configuration (``variant``: the training config without seed and output
path) with the highest dev score averaged over its seeds. Every seed of the chosen
configuration goes on to test (:func:`select_retrievers`, what ``eval --select-on`` keeps).

Privacy: when the dev queries are private, choosing among configurations by their dev score is
a release about them. Without a budget it is unaccounted (ε = ∞, as the paper tunes; every
chosen row shows it, :func:`selection_label`); with ``total_epsilon`` it is report-noisy-max
(:func:`selection_guarantee`). Either way the choice is a function of every candidate: the
chosen rows carry every candidate's releases too (:func:`candidate_releases`). Tuning on a public
dataset instead (e.g. a BEIR set, ``--select-on`` an evaluation of it) keeps the guarantee exact.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from synthq.privacy.guarantee import format_epsilon
from synthq.runtime.console import info
from synthq.runtime.errors import DataError

if TYPE_CHECKING:
    from synthq.artifacts.manifest import Artifact
    from synthq.privacy.guarantee import Guarantee

# Training options that never change what is learned (or are shown elsewhere).
NOT_SETTINGS = ("out", "force", "resume", "device", "seed", "data", "encoder", "dp", "epsilon", "delta")


@dataclass
class Candidate:
    """One configuration of a method on the dev split: its seeds' rows and their mean score."""

    variant: str
    rows: list[dict]
    score: float
    settings: dict = field(default_factory=dict)


@dataclass
class Choice:
    """The dev-best configuration of one method, among all its candidates."""

    method: str
    best: Candidate
    candidates: list[Candidate]

    @property
    def model_ids(self) -> set[str]:
        return {r["model_id"] for r in self.best.rows}


def selection_utility(candidate: Candidate, metric: str = "ndcg@10") -> float:
    """Report-noisy-max's utility of a configuration: the sum over dev queries of ``metric``
    (each query's score averaged over the configuration's seeds), pooled over every query of
    the split whatever its layout.

    Sensitivity 1, monotone: a query's score lies in [0, 1] and depends on that query alone, so
    removing one dev query lowers every candidate's utility by between 0 and 1 (adding one
    raises every one). The pooled sum is what makes this true for a dataset of sub-datasets
    too: the score the table prints there is the mean of the sub-datasets' means, in which a
    query of a small sub-dataset weighs N / (P · n_p) and whose changes are neither bounded by 1
    nor of one sign across candidates. So the per-query scores are read when the rows carry them
    (:func:`synthq.reporting.eval_files.read_rows`); without them only a plain dataset's mean ×
    queries is exact, and a row of sub-datasets is refused."""
    per_seed = [(row.get("per_query") or {}).get(metric) for row in candidate.rows]
    if all(per_seed):
        return sum(sum(scores.values()) for scores in per_seed) / len(per_seed)
    if any("parts" in row for row in candidate.rows):
        raise DataError(
            f"{candidate.variant}: report-noisy-max on sub-datasets needs the dev evaluation's "
            "per-query scores (the mean of sub-dataset means has no bounded sensitivity); "
            "re-run the dev eval with this synthq"
        )
    return candidate.score * candidate.rows[0].get("queries", 1)


def select_best(
    rows: list[dict],
    metric: str = "ndcg@10",
    total_epsilon: float | None = None,
    rng=None,
    across_data: bool = False,
) -> dict[str, Choice]:
    """Per method and ε, the configuration with the highest ``metric`` averaged over its seeds
    (rows at different ε are different methods: each privacy level gets its own best).

    Args:
        rows: ``results.json`` rows of a dev evaluation (one dataset); only trained retrievers
            (``kind == "retriever"``) are candidates. Ties go to the configuration listed first.
        metric: the selection score.
        total_epsilon: choose by report-noisy-max spending this ε (:func:`_noisy_choices`).
        across_data: the synthetic set is a tuned setting too: rows are grouped by their
            ``family`` (the method without queries per document and filters), so one
            configuration is chosen per generator and encoder among all its sets, and the set
            (the row's own method label) is shown as the setting ``synthetic set``.

    Returns: ``"<method label>, ε = <ε>"`` -> :class:`Choice`.
    """
    datasets = {(r["dataset"], r.get("split")) for r in rows if r.get("kind") == "retriever"}
    if len(datasets) > 1:
        raise DataError(f"select on one dev dataset, not {sorted(map(str, datasets))}")
    by_method: dict[str, dict[str, list[dict]]] = {}
    for row in rows:
        if row.get("kind") != "retriever":
            continue
        variant = row.get("variant") or row["model_id"]
        label = (row.get("family") or row["method"]) if across_data else row["method"]
        if across_data:
            variant = f"{row['method']}|{variant}"
        method = f"{label}, ε = {format_epsilon(float(row.get('model_epsilon', row['epsilon'])))}"
        by_method.setdefault(method, {}).setdefault(variant, []).append(row)
    choices = {}
    for method, variants in by_method.items():
        candidates = [
            Candidate(
                variant,
                members,
                sum(r["metrics"][metric] for r in members) / len(members),
                ({"synthetic set": members[0]["method"]} if across_data else {})
                | (members[0].get("settings") or {}),
            )
            for variant, members in variants.items()
        ]
        choices[method] = Choice(method, max(candidates, key=lambda c: c.score), candidates)
    if total_epsilon is not None:
        _noisy_choices(choices, total_epsilon, rng, metric)
    return choices


def _noisy_choices(choices: dict[str, Choice], total_epsilon: float, rng, metric: str = "ndcg@10") -> None:
    """Report-noisy-max (the exponential mechanism through the Gumbel-max trick): each method
    with more than one configuration picks ``argmax utility + Gumbel(1/ε_m)``, ε_m = total / (those
    methods). For a monotone utility of sensitivity 1 that is ε_m-DP per method (McSherry &
    Talwar 2007; Liu & Talwar 2019 for noisy selection in tuning); the methods read the same dev
    queries, so they compose to ``total``. Gumbel noise comes from the OS's secure randomness."""
    import math
    import random

    rng = rng or random.SystemRandom()
    spending = [c for c in choices.values() if len(c.candidates) > 1]
    scale = len(spending) / total_epsilon

    def noisy(candidate: Candidate) -> float:
        uniform = min(max(rng.random(), 1e-300), 1 - 1e-16)
        return selection_utility(candidate, metric) - scale * math.log(-math.log(uniform))

    for choice in spending:
        choice.best = max(choice.candidates, key=noisy)


def selection_guarantee(choices: dict[str, Choice], total_epsilon: float):
    """The guarantee of :func:`select_best`'s noisy choices: pure ε (δ = 0) over the dev queries,
    recomputed on open from the per-selection ε and the number of selections."""
    from synthq.privacy.guarantee import Guarantee

    spending = sum(1 for c in choices.values() if len(c.candidates) > 1)
    per = total_epsilon / max(spending, 1)
    return Guarantee(
        epsilon=per * spending,
        delta=0.0,
        unit="query",
        mechanism="report-noisy-max",
        accountant="pure-composition",
        details={
            "epsilon_per_selection": per,
            "selections": spending,
            "sensitivity": 1.0,
            "utility": "sum over every dev query (pooled over sub-datasets) of NDCG@10, "
            "mean over seeds; monotone",
        },
        note="hyper-parameters chosen on private dev queries by report-noisy-max",
    )


def varying_settings(choice: Choice) -> list[str]:
    """The settings that differ between a method's candidates (the swept ones; run flags, seeds
    and the data path, :data:`NOT_SETTINGS`, are not settings: ``--select-data`` shows the set
    as ``synthetic set``)."""
    keys = sorted({k for c in choice.candidates for k in c.settings if k not in NOT_SETTINGS})
    return [k for k in keys if len({repr(c.settings.get(k)) for c in choice.candidates}) > 1]


def selection_markdown(
    choices: dict[str, Choice],
    metric: str = "ndcg@10",
    source: str = "dev",
    scores: bool = True,
    guarantee=None,
    private: bool = False,
    nothing_chosen: bool = False,
) -> str:
    """A table per method of every candidate (the chosen one in bold) and what choosing cost.

    ``scores=False`` leaves the dev scores out: on a private dev split they are statistics of
    private queries without noise (ε = ∞), so only the choice itself is released. ``private``
    with scores: the private diagnostics' copy, which says what its scores are."""
    if private and scores:
        cost = (
            "PRIVATE DIAGNOSTICS: the dev scores below are statistics of private dev queries without "
            "noise (ε = ∞); never release this file."
        )
    elif nothing_chosen:
        cost = (
            "Every method had one configuration: nothing was chosen, the private dev queries "
            "decided nothing, and --select-epsilon was not spent (no ε)."
        )
    elif guarantee is not None:
        cost = (
            f"Chosen by report-noisy-max on private dev queries: ε = {format_epsilon(guarantee.epsilon)} "
            "(pure DP). The choice is a function of every candidate, so each chosen row also carries "
            "every candidate's releases; all compose per unit with the rest of its guarantee."
        )
    elif scores:
        cost = (
            "The dev queries are public, or synthetic queries from a released generator: choosing "
            "on them is post-processing and costs no ε."
        )
    else:
        cost = (
            "Chosen on private dev queries without noise: an **unaccounted release** (selection ε = ∞, "
            "shown in every row); the dev scores stay in the private diagnostics. Use --select-epsilon."
        )
    lines = [
        f"Hyper-parameters chosen per method by mean {metric} over seeds on `{source}` "
        f"(bold = chosen; only the chosen configuration is evaluated on test). {cost}\n",
        "| method | setting | seeds |" + (f" dev {metric} |" if scores else ""),
        "|---|---|---|" + ("---|" if scores else ""),
    ]
    for method, choice in choices.items():
        keys = varying_settings(choice) or ["(single configuration)"]
        ordered = sorted(choice.candidates, key=lambda c: -c.score) if scores else choice.candidates
        for candidate in ordered:
            setting = ", ".join(f"{k}={candidate.settings.get(k)}" for k in keys if k in candidate.settings)
            cells = [method, setting or keys[0], str(len(candidate.rows))]
            cells += [f"{candidate.score:.4f}"] if scores else []
            if candidate is choice.best:
                cells = [f"**{c}**" for c in cells]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


@dataclass
class Selection:
    """What ``--select-on`` kept, and what choosing cost."""

    retrievers: list[Artifact]
    markdown: str
    private_markdown: str | None  # candidates' dev scores of a private split (diagnostics only)
    guarantee: Guarantee | None  # report-noisy-max's, or None
    dev: Artifact
    private: bool
    candidates: list[dict] = field(default_factory=list)  # the releases behind every candidate
    chosen: set[str] = field(default_factory=set)  # model ids kept *by* the choice (all scored on dev)
    nothing_chosen: bool = False  # --select-epsilon, but every method had one configuration


def select_retrievers(
    retrievers: list[Artifact],
    dev: Artifact,
    rows: list[dict],
    select_epsilon: float | None,
    across_data: bool = False,
) -> Selection:
    """The retrievers :func:`select_best` picks on the dev evaluation ``dev`` (its ``rows``:
    every seed of each method's best configuration); retrievers the dev evaluation did not score
    are kept. On a dev evaluation that read private queries, ``select_epsilon`` makes the choice
    report-noisy-max; without it the choice is an unaccounted release (ε = ∞)."""
    private = dev.manifest.get("own_release") is not None
    noisy = select_epsilon is not None and private
    choices = select_best(rows, total_epsilon=select_epsilon if noisy else None, across_data=across_data)
    on_dev = {r["model_id"] for r in rows}
    chosen = set().union(*(c.model_ids for c in choices.values())) if choices else set()
    kept = [
        r
        for r in retrievers
        if f"artifact:{r.manifest_hash}" in chosen or f"artifact:{r.manifest_hash}" not in on_dev
    ]
    if not kept:
        raise DataError(f"{dev.path}: selection kept none of the retrievers")
    info(f"selected on {dev.path.name}: {', '.join(r.path.name for r in kept)}")
    source = f"{dev.path.name} ({rows[0].get('split')})"
    # With one configuration per method the kept set follows from the retrievers' metadata alone:
    # the dev queries decide nothing, and noisy-max has nothing to spend ε on.
    nothing_chosen = noisy and not any(len(c.candidates) > 1 for c in choices.values())
    guarantee = selection_guarantee(choices, select_epsilon) if noisy and not nothing_chosen else None
    public_text = selection_markdown(
        choices, source=source, scores=not private, guarantee=guarantee, nothing_chosen=nothing_chosen
    )
    private_text = selection_markdown(choices, source=source, private=True) if private else None
    return Selection(
        kept, public_text, private_text, guarantee, dev, private, candidate_releases(dev), chosen,
        nothing_chosen,
    )  # fmt: skip


def candidate_releases(dev: Artifact) -> list[dict]:
    """Every release behind the dev evaluation except its own reads of the dev split: the
    candidates' releases (and a synthetic dev set's). A choice among the candidates is a function
    of all of them, so whatever it picks carries all of these, plus what reading the dev queries
    cost (report-noisy-max's ε, or the read itself: ε = ∞ when unaccounted)."""
    own = next((r for r in dev.releases if r["id"] == dev.manifest.get("own_release")), None)
    if own is None:
        return list(dev.releases)
    return [r for r in dev.releases if not (r.get("stage") == "eval" and r.get("path") == own.get("path"))]


def selection_label(selection: Selection) -> dict:
    """How a row's configuration was chosen, for every table beside its ε."""
    if selection.nothing_chosen:
        return {"how": "one candidate per method: nothing chosen on private dev (no ε)", "epsilon": 0.0}
    if selection.guarantee is not None:
        return {"how": "report-noisy-max on private dev", "epsilon": selection.guarantee.epsilon}
    if selection.private:
        return {"how": "on private dev, unaccounted", "epsilon": "inf"}
    return {"how": "on dev data that is public or synthetic (no ε)", "epsilon": 0.0}
