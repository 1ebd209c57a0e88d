"""Hyper-parameter selection on a dev evaluation: the best configuration of every method.

A pipeline trains each method with several settings (a sweep over ``lr``, ``clip_norm``, ...)
and seeds, evaluates all of them on the dev split, then evaluates on test only what
:func:`select_best` picks: per method (``eval``'s method label: original / synthetic / direct DP
mode, and encoder), the configuration (``variant``: the training config without seed and output
path) with the highest dev score averaged over its seeds. Every seed of the chosen
configuration goes on to test.

Privacy: the dev queries are private data, and choosing among configurations by their dev
score is a release that no accountant here counts (the paper tunes the same way). Tuning on a
public dataset instead (e.g. a BEIR set, ``--select-on`` an evaluation of it) keeps the
guarantee exact.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from synthq.errors import DataError
from synthq.privacy import format_epsilon

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


def select_best(rows: list[dict], metric: str = "ndcg@10") -> dict[str, Choice]:
    """Per method and ε, the configuration with the highest ``metric`` averaged over its seeds
    (rows at different ε are different methods: each privacy level gets its own best).

    Args:
        rows: ``results.json`` rows of a dev evaluation (one dataset); only trained retrievers
            (``kind == "retriever"``) are candidates. Ties go to the configuration listed first.
        metric: the selection score.

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
        method = f"{row['method']}, ε = {format_epsilon(float(row['epsilon']))}"
        by_method.setdefault(method, {}).setdefault(variant, []).append(row)
    choices = {}
    for method, variants in by_method.items():
        candidates = [
            Candidate(
                variant,
                members,
                sum(r["metrics"][metric] for r in members) / len(members),
                members[0].get("settings") or {},
            )
            for variant, members in variants.items()
        ]
        best = max(candidates, key=lambda c: c.score)  # max keeps the first of equal scores
        choices[method] = Choice(method, best, candidates)
    return choices


def varying_settings(choice: Choice) -> list[str]:
    """The settings that differ between a method's candidates (the swept ones)."""
    keys = sorted({k for c in choice.candidates for k in c.settings})
    return [k for k in keys if len({repr(c.settings.get(k)) for c in choice.candidates}) > 1]


def selection_markdown(choices: dict[str, Choice], metric: str = "ndcg@10", source: str = "dev") -> str:
    """A table per method of every candidate's dev score, the chosen one in bold, and the note
    that the selection itself is not privacy-accounted."""
    lines = [
        f"Hyper-parameters chosen per method by mean {metric} over seeds on `{source}` "
        "(bold = chosen; only the chosen configuration is evaluated on test). Choosing on private "
        "dev queries is a release that is **not** counted in any ε here (the paper tunes the same "
        "way); tune on a public dataset instead to keep the guarantee exact.\n",
        f"| method | setting | seeds | dev {metric} |",
        "|---|---|---|---|",
    ]
    for method, choice in choices.items():
        keys = varying_settings(choice) or ["(single configuration)"]
        for candidate in sorted(choice.candidates, key=lambda c: -c.score):
            setting = ", ".join(f"{k}={candidate.settings.get(k)}" for k in keys if k in candidate.settings)
            cells = [method, setting or keys[0], str(len(candidate.rows)), f"{candidate.score:.4f}"]
            if candidate is choice.best:
                cells = [f"**{c}**" for c in cells]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
