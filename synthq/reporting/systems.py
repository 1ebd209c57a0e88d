"""Systems: result rows merged over training seeds and generator replicates, and their guarantee.

Rows on one dataset and split with the same ``variant`` (the training configuration without seed
and output path, a synthetic set replaced by its recipe: :func:`synthq.reporting.labels.training_settings`)
are one system. Anything computed from them together rests on the union of their releases (two
independently trained ε = 8 generators: ε ≈ 16 per query both read), recomputed here from the
releases each row carries (:func:`synthq.reporting.row_privacy.row_privacy`), whichever evaluations
the rows come from.
"""

from __future__ import annotations

import re

import numpy as np

from synthq.reporting.row_privacy import row_privacy


def datasets_of(rows: list[dict]) -> list[str]:
    """The datasets of ``rows``, in the order they first appear."""
    return list(dict.fromkeys(r["dataset"] for r in rows))


def _seedless(label: str) -> str:
    """``ret-orig-seed1`` -> ``ret-orig``: the name of a system trained with several seeds."""
    return _SEED_SUFFIX.sub("", label) or label


_SEED_SUFFIX = re.compile(r"[-_.]?s(?:eed)?\d+$")


def systems(rows: list[dict]) -> list[dict]:
    """Rows merged over training seeds and generator replicates: rows on one dataset and split
    whose ``variant`` (the training configuration without seed and output path, a synthetic set
    replaced by its recipe; set by ``eval``) is the same are one system; when they rest on
    different releases (replicates, seeds of a DP run), the system's guarantee is the per-unit
    composition of the union of their releases (``row_privacy``, ``privacy``, ``epsilon``). A
    system has the first row's fields, ``seeds``, ``metrics`` (mean over seeds), ``metrics_std``
    (sample std over seeds, 0 for one seed) and, when every member has per-query scores,
    ``per_query`` (metric -> ``[seeds, queries]`` array) and ``query_ids``."""
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
            seeds = len({r.get("seed") for r in members})
            runs = ", ".join(
                [f"{seeds} seeds"] * (seeds > 1) + [f"{replicates} synthetic sets"] * (replicates > 1)
            )
            system["retriever"] = f"{_seedless(first['retriever'])} ({runs or f'{len(members)} runs'})"
        # Every number of the system rests on every member's releases: recomputed from their
        # union (per unit), never a member's pre-composed ε.
        privacy = row_privacy(members)
        system["row_privacy"] = privacy
        system["privacy"] = privacy.scores.model_dump(mode="json")
        system["epsilon"] = privacy.scores.epsilon
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
