"""How tables and plots show a row's ε: public reference rows, unaccounted selections, close values.

Every number is printed with the ε of the retriever it belongs to. Rows that never saw private
data (BM25, untrained public encoders) carry :meth:`Guarantee.public` and show ``0 (public)``.
"""

from __future__ import annotations

import math

from synthq.privacy.guarantee import format_epsilon


def epsilon_value(value) -> float:
    """A row's ε as a number: ``"inf"`` strings from JSON come back as ``math.inf``."""
    return float(value)


def same_epsilon(a: float, b: float) -> bool:
    """Both ∞, or finite and within 5 % of each other (7.99 and 8.00 are one privacy level)."""
    return (math.isinf(a) and math.isinf(b)) or (
        math.isfinite(a) and math.isfinite(b) and math.isclose(a, b, rel_tol=0.05)
    )


def is_public(row: dict) -> bool:
    """A reference row that never saw private data: a public guarantee, or BM25 / an untrained
    public encoder on public queries (on a private split their scores are ε = ∞ like any row's)."""
    privacy = row.get("privacy") or {}
    reference = row.get("kind") in ("bm25", "untrained") and epsilon_value(row["epsilon"]) == 0
    return privacy.get("mechanism") == "public" or reference


def shown_epsilon(row: dict) -> tuple[float, str | None, bool]:
    """``(ε, unit, unaccounted)`` as tables and plots show a row: a row whose configuration was
    chosen on private dev queries without noise is ∞, and is shown at the ε it has without that
    choice, with ``unaccounted`` set so the choice is printed beside it."""
    selection = row.get("selection") or {}
    epsilon, unit = epsilon_value(row["epsilon"]), (row.get("privacy") or {}).get("unit")
    unaccounted = math.isinf(epsilon_value(selection.get("epsilon", 0.0))) and math.isinf(epsilon)
    if unaccounted and "row_epsilon_without" in selection:
        epsilon, unit = epsilon_value(selection["row_epsilon_without"]), selection.get("row_unit_without")
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
