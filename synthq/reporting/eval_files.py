"""The files an evaluation writes that other stages read: their names, its rows and per-query scores.

``eval`` writes them; ``report`` and ``eval --select-on`` read them back. ``results.json`` holds
one row per retriever × dataset (:func:`result_row`, :func:`row_metrics`); per-query scores are
kept as ``{dataset: {retriever: {metric: {query: value}}}}``, a sub-dataset's query ids prefixed
``part/``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from synthq.artifacts.writer import DIAGNOSTICS
from synthq.reporting.row_privacy import row_privacy
from synthq.retrieval.metrics import mean_metrics, query_means
from synthq.runtime.errors import ArtifactError

if TYPE_CHECKING:
    from synthq.artifacts.manifest import Artifact
    from synthq.privacy.guarantee import Guarantee

# The files an eval writes that other stages read (report, eval --select-on): one name each.
RESULTS_FILE = "results.json"  # one row per retriever × dataset: metrics, ε, settings
PER_QUERY_FILE = "per_query.json"  # dataset -> retriever -> metric -> query -> score
SELECTION_FILE = "selection.md"  # the candidates' dev scores behind --select-on


def result_row(
    dataset: str, split: str, label: str, method: str, kind: str, privacy: Guarantee, identity: str
) -> dict:
    """The first fields of a ``results.json`` row: where, which retriever (``kind``: ``bm25``,
    ``untrained`` or ``retriever``; ``identity``: its manifest hash) and the guarantee of its
    scores."""
    return {
        "dataset": dataset,
        "split": split,
        "retriever": label,
        "method": method,
        "kind": kind,
        "epsilon": privacy.epsilon,
        "delta": privacy.delta,
        "privacy": privacy.model_dump(mode="json"),
        "model_id": identity,
    }


def row_metrics(parts: dict[str, dict[str, dict[str, float]]]) -> dict:
    """A row's ``metrics`` from its per-query scores by sub-dataset (``{part: {query: {metric:
    v}}}``, part ``""`` for a plain dataset): the mean over queries, over sub-datasets the mean of
    their means (BEIR's convention for CQADupStack), with each one's means as ``parts``."""
    means = {part: query_means(table) for part, table in parts.items()}
    fields = {"metrics": means[""] if "" in means else mean_metrics(list(means.values()))}
    if "" not in parts:
        fields["parts"] = means
    return fields


def read_per_query(directory: Path) -> dict:
    """An evaluation's per-query scores (``{dataset: {retriever: {metric: {query: v}}}}``): the
    released ``per_query.json`` of public splits merged with the private ``diagnostics/`` copy of
    private splits (present only in the owner's artifact, not in an export); empty for
    evaluations written before per-query scores were kept."""
    scores: dict = {}
    for path in (Path(directory) / PER_QUERY_FILE, Path(directory) / DIAGNOSTICS / PER_QUERY_FILE):
        if not path.is_file():
            continue
        try:
            scores.update(json.loads(path.read_text(encoding="utf-8")))
        except (OSError, json.JSONDecodeError) as error:
            raise ArtifactError(f"{path}: unreadable per-query scores ({error})") from error
    return scores


def attach_per_query(rows: list[dict], scores: dict) -> list[dict]:
    """Copies of ``rows`` with ``per_query`` (metric -> {query: value}) where ``scores`` has it."""
    out = []
    for row in rows:
        mine = scores.get(row["dataset"], {}).get(row["retriever"])
        out.append({**row, "per_query": mine} if mine else dict(row))
    return out


def read_rows(directory: Path) -> list[dict]:
    """An evaluation's rows (``results.json``), each with its per-query scores when the evaluation
    kept them, and its ε as a float (``"inf"`` from JSON comes back as ``math.inf``)."""
    path = Path(directory) / RESULTS_FILE
    try:
        rows = json.loads(path.read_text(encoding="utf-8"))
        rows = attach_per_query(rows, read_per_query(directory))
        return [{**r, "epsilon": float(r["epsilon"])} for r in rows]
    except (OSError, json.JSONDecodeError, AttributeError, KeyError, TypeError, ValueError) as error:
        why = f"{type(error).__name__}: {error}"
        raise ArtifactError(f"{path}: unreadable evaluation results ({why})") from error


def by_metric(parts: dict[str, dict[str, dict[str, float]]]) -> dict[str, dict[str, float]]:
    """``{part: {query: {metric: v}}}`` -> ``{metric: {query: v}}``; a sub-dataset's query ids
    are prefixed ``part/`` so that sub-forums never collide."""
    table: dict[str, dict[str, float]] = {}
    for part, queries in parts.items():
        for query_id, metrics in queries.items():
            for metric, value in metrics.items():
                table.setdefault(metric, {})[f"{part}/{query_id}" if part else query_id] = value
    return table


def read_checked_rows(artifact: Artifact) -> list[dict]:
    """An evaluation's rows (:func:`read_rows`); where its seal is not this installation's, each
    published at the evaluation's whole guarantee, under the assumption that its manifest is
    unedited. ``results.json`` is a payload whose digest a foreign manifest's editor can rewrite,
    and the releases, unit sets and ε a row carries are fields they control: every foreign row
    carries the one stand-in for all of the evaluation's releases
    (:meth:`~synthq.artifacts.manifest.Artifact.vouched_releases`), its ε (of the scores and of
    the model) is recomputed from it, never read, and the row keeps no account of how it was
    chosen."""
    rows = read_rows(artifact.path)
    if artifact.verified:
        return rows
    releases = {"model": artifact.vouched_releases(), "data": [], "selection": []}
    checked = []
    for row in rows:
        assumptions = [*(row.get("assumptions") or []), artifact.unverified_assumption]
        stood_in = {**row, "releases": releases, "assumptions": list(dict.fromkeys(assumptions))}
        stood_in.pop("selection", None)  # how it was chosen: the editor's words, with their ε
        privacy = row_privacy([stood_in])
        recomputed = {
            "privacy": privacy.scores.model_dump(mode="json"),
            "epsilon": privacy.scores.epsilon,
            "delta": privacy.scores.delta,
            "model_epsilon": privacy.model.epsilon,
        }
        checked.append({**stood_in, **recomputed})
    return checked
