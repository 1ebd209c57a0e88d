"""Systems: result rows merged over training seeds and generator replicates, and their guarantee.

Rows on one dataset and split with the same ``variant`` (the training configuration without seed
and output path, a synthetic set replaced by its recipe: :func:`synthq.reporting.labels.training_settings`)
are one system. When they rest on different releases (two independently trained ε = 8
generators), anything computed from them together composes those releases.
"""

from __future__ import annotations

import re

import numpy as np

from synthq.privacy.splits import score_guarantee


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


def compose_replicates(
    rows: list[dict], row_releases: list[tuple[list[dict], list[dict], list[str]]]
) -> None:
    """Rows that tables merge into one system (same variant: other seeds, or other generator
    replicates of the same recipe) but that rest on different releases — two independently
    trained ε = 8 generators — get ``system_privacy``: the composition of all their releases, the
    guarantee of anything computed from them together (a mean over replicates of two ε = 8
    generators is ε = 16 on the queries both read), and ``system_privacy_without_selection`` (the
    same without an unaccounted choice on private dev queries, which tables print beside it).
    ``row_releases`` holds, per row, its releases with and without the selection and its
    assumptions. Rows over one release set get nothing."""
    groups: dict[tuple, list[int]] = {}
    for index, row in enumerate(rows):
        if row.get("variant"):
            key = (row["dataset"], row.get("split"), row["variant"], str(row["epsilon"]))
            groups.setdefault(key, []).append(index)
    for members in groups.values():
        # Decided on the releases without the selection: an unaccounted choice brings every
        # release behind the dev evaluation into every row it chose, replicates' included.
        if len({frozenset(r["id"] for r in row_releases[i][1]) for i in members}) < 2:
            continue
        assumptions = list(dict.fromkeys(a for i in members for a in row_releases[i][2]))
        composed = []
        for part in (0, 1):
            union = list({r["id"]: r for i in members for r in row_releases[i][part]}.values())
            composed.append(score_guarantee(union, assumptions).model_dump(mode="json"))
        for i in members:
            rows[i]["system_privacy"], rows[i]["system_privacy_without_selection"] = composed
