"""How tables and plots show a row's ε: the model's guarantee and the scores' guarantee.

A row makes two statements (:mod:`synthq.reporting.row_privacy`): what releasing its retriever
costs (**the model's ε**: ``0 (public)`` for BM25 and public encoders, the DP ε of a DP or
synthetic-trained model, ∞ for a model trained on private data without DP, ``+ selection ∞`` where
an unaccounted choice on private dev queries picked it) and what releasing its scores costs (**the
scores' ε**: ∞ when they were computed on private queries without noise, otherwise the model's).
Tables print the model's ε in a column and the scores' ε, with its reason, where it differs.
"""

from __future__ import annotations

import math

from synthq.privacy.guarantee import Guarantee, format_epsilon
from synthq.reporting.row_privacy import RowPrivacy, row_privacy


def epsilon_value(value) -> float:
    """A row's ε as a number: ``"inf"`` strings from JSON come back as ``math.inf``."""
    return float(value)


def same_epsilon(a: float, b: float) -> bool:
    """Both ∞, or finite and within 5 % of each other (7.99 and 8.00 are one privacy level)."""
    return (math.isinf(a) and math.isinf(b)) or (
        math.isfinite(a) and math.isfinite(b) and math.isclose(a, b, rel_tol=0.05)
    )


def privacy_of(row: dict) -> RowPrivacy:
    """The row's guarantees: a merged system's (set by :func:`synthq.reporting.systems.systems`)
    or the row's own, recomputed from its releases."""
    return row.get("row_privacy") or row_privacy([row])


def is_public(row: dict) -> bool:
    """A reference row whose model never saw private data (BM25, an untrained public encoder):
    model ε = 0, whatever its scores' ε."""
    return privacy_of(row).public_model


def shown_epsilon(row: dict) -> tuple[float, str | None, bool]:
    """``(ε, unit, unaccounted)`` of the model as tables and plots show it: a model chosen on
    private dev queries without noise is ∞, and is shown at the ε it has without that choice, with
    ``unaccounted`` set so the choice is printed beside it."""
    privacy = privacy_of(row)
    if privacy.unaccounted_selection:
        return privacy.model_without_selection.epsilon, privacy.model_without_selection.unit, True
    return privacy.model.epsilon, privacy.model.unit, False


def _text(guarantee: Guarantee, epsilon: float, unit: str | None) -> str:
    return format_epsilon(epsilon) + (" per user" if unit == "user" and math.isfinite(epsilon) else "")


def epsilon_cell(row: dict) -> str:
    """The model's ε: ``∞``, ``8.00``, ``8.00 per user`` (a user-level guarantee), ``0 (public)``
    for a model that never saw private data, ``8.00 + selection ∞`` for one chosen on private dev
    queries without noise (its ε is ∞; the reader sees why)."""
    privacy = privacy_of(row)
    if privacy.public_model:
        return "0 (public)"
    epsilon, unit, unaccounted = shown_epsilon(row)
    text = _text(privacy.model, epsilon, unit)
    return f"{text} + selection ∞" if unaccounted else text


def scores_cell(row: dict) -> str:
    """The scores' ε: ``∞`` for scores of private queries read without noise, else as the model's."""
    scores = privacy_of(row).scores
    if scores.mechanism == "public" and scores.epsilon == 0:
        return "0 (public)"
    return _text(scores, scores.epsilon, scores.unit)


def scores_differ(row: dict) -> bool:
    """The scores cost more than the model as the table prints them: publishing them is another
    statement. Exact to the printed digits, not within a tolerance — a table of one ε column
    shows the model's, which must then be what the scores cost too (10.00 for scores of 10.50
    would understate them)."""
    privacy = privacy_of(row)
    return _text(privacy.scores, privacy.scores.epsilon, privacy.scores.unit) != _text(
        privacy.model, privacy.model.epsilon, privacy.model.unit
    )


def scores_statement(rows: list[dict]) -> str:
    """One plain sentence for a table whose scores' ε differs from its models': the scores' ε and
    why (the reasons recorded by the releases that make the difference). Empty when every row's
    scores cost what its model costs."""
    differing = [r for r in rows if scores_differ(r)]
    if not differing:
        return ""
    values = {format_epsilon(privacy_of(r).scores.epsilon) for r in differing}
    reasons = list(dict.fromkeys(privacy_of(r).scores.note for r in differing if privacy_of(r).scores.note))
    private = all(math.isinf(privacy_of(r).scores.epsilon) for r in differing)
    head = (
        f"**The scores themselves are ε = {values.pop()}**"
        if len(values) == 1
        else "**The scores themselves cost more than their models** (the scores ε column)"
    )
    text = (
        head
        + (" (scores of private queries computed without noise: keep them inside)" if private else "")
        + ". The model ε column is what releasing each retriever costs; the scores ε column is what "
        "releasing these numbers costs."
    )
    return text + (f" Why: {'; '.join(reasons)}." if reasons else "")
