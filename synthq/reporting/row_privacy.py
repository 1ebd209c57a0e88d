"""The guarantees of a published number, recomputed from the releases its row carries.

Every ``results.json`` row carries the release records behind it (``releases``: the same records
its evaluation's manifest lists, grouped by where they come from), never only a pre-composed ε:

* ``model`` — the retriever's own releases (a DP run, the generator behind a synthetic set); none
  for BM25 and public encoders;
* ``data`` — what reading the evaluated split cost: a synthetic set's releases, the noiseless read
  of a private split (ε = ∞);
* ``selection`` — how the row's configuration was chosen on dev data: every candidate's releases
  plus the choice's own (report-noisy-max), or the whole dev evaluation's (an unaccounted choice on
  private dev queries is ε = ∞).

:func:`row_privacy` composes them per unit (:func:`synthq.bookkeeping.splits.score_guarantee`) for one
row or for every member of a merged row (seeds, generator replicates, the same model in several
evaluations): the union of the members' releases, each counted once. It gives two statements:
**the model's guarantee** — what releasing the retriever costs (model ∪ selection) —
and **the scores' guarantee** — what releasing these numbers costs (model ∪ data ∪ selection).
Tables, the plot and the headline all read them from here.

Rows written before rows carried their releases fall back to one stand-in release per row and
part, with no unit set: it composes with every other release (a bound, never an understatement).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from synthq.bookkeeping.splits import distinct_records, score_guarantee
from synthq.privacy.guarantee import Guarantee

PARTS = ("model", "data", "selection")


def release_lists(model: list[dict], data: list[dict], selection: list[dict]) -> dict[str, list[dict]]:
    """The ``releases`` field of a row: each part's records, each record once per part."""
    parts = {"model": model, "data": data, "selection": selection}
    distinct_records([*model, *data, *selection])  # one record per id across the parts
    return {part: list(distinct_records(records).values()) for part, records in parts.items()}


def _stand_in(row: dict, part: str, guarantee: Guarantee) -> dict:
    """A release standing for a legacy row's pre-composed ε: no unit set, so it is assumed to share
    units with every other release (each row's stand-in is its own release: members compose)."""
    key = f"{row.get('model_id') or row.get('retriever')}|{row.get('dataset')}|{row.get('split')}"
    return {
        "id": f"row:{part}:{key}|{row.get('seed')}|{row.get('replicate')}",
        "stage": "eval",
        "data": {"name": "results written before rows carried their releases", "sha256": None},
        "unit": guarantee.unit,
        "units": None,
        "guarantee": guarantee.model_dump(mode="json"),
    }


def _legacy_releases(row: dict) -> dict[str, list[dict]]:
    """The parts of a row without ``releases``: its model's ε and, when its scores' ε is larger,
    that ε as the data part."""
    privacy = row.get("privacy") or {}
    epsilon = float(row.get("epsilon", privacy.get("epsilon", math.inf)))
    model_epsilon = float(row.get("model_epsilon", epsilon))
    unit = privacy.get("unit", "query")
    public = privacy.get("mechanism") == "public" or (
        row.get("kind") in ("bm25", "untrained") and model_epsilon == 0
    )
    model = [] if public or model_epsilon == 0 else [_stand_in(row, "model", _guarantee(model_epsilon, unit))]
    data = [_stand_in(row, "data", _guarantee(epsilon, unit))] if epsilon > model_epsilon else []
    return {"model": model, "data": data, "selection": []}


def _guarantee(epsilon: float, unit: str) -> Guarantee:
    if math.isinf(epsilon):
        return Guarantee.non_private("a result recorded without its releases", unit=unit)
    return Guarantee(epsilon=epsilon, unit=unit, mechanism="recorded-epsilon", note="recorded ε of a result")


def releases_of(row: dict) -> dict[str, list[dict]]:
    """A row's releases by part (a legacy row's stand-ins)."""
    recorded = row.get("releases")
    if not isinstance(recorded, dict):
        return _legacy_releases(row)
    return {part: list(recorded.get(part) or []) for part in PARTS}


def merged_releases(members: list[dict]) -> dict[str, list[dict]]:
    """The union, per part, of the releases of every member (each record once)."""
    parts = [releases_of(m) for m in members]
    return release_lists(*([r for p in parts for r in p[part]] for part in PARTS))


@dataclass(frozen=True)
class RowPrivacy:
    """The two statements a published row makes, each with and without its dev selection."""

    model: Guarantee  # releasing the retriever: model ∪ selection
    model_without_selection: Guarantee
    scores: Guarantee  # releasing these scores: model ∪ data ∪ selection
    scores_without_selection: Guarantee

    @property
    def public_model(self) -> bool:
        """The model rests on no release of private data (BM25, a public encoder)."""
        return self.model.mechanism == "public" and self.model.epsilon == 0

    @property
    def unaccounted_selection(self) -> bool:
        """Chosen on private dev queries without noise: ∞ only because of that choice."""
        return math.isinf(self.model.epsilon) and math.isfinite(self.model_without_selection.epsilon)


def row_privacy(members: list[dict]) -> RowPrivacy:
    """The guarantees of a row, or of a merged row over ``members``: per-unit composition of the
    union of their releases (:func:`synthq.bookkeeping.splits.score_guarantee`)."""
    parts = merged_releases(members)
    assumptions = list(dict.fromkeys(a for m in members for a in m.get("assumptions") or []))

    def compose(*names: str) -> Guarantee:
        return score_guarantee([r for name in names for r in parts[name]], assumptions)

    return RowPrivacy(
        model=compose("model", "selection"),
        model_without_selection=compose("model"),
        scores=compose("model", "data", "selection"),
        scores_without_selection=compose("model", "data"),
    )
