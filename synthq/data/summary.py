"""Counts and consistency warnings for a dataset (``synthq data info``)."""

from __future__ import annotations

import numpy as np

from synthq.data.beir_io import BeirDataset, link
from synthq.data.store import int64_values
from synthq.data.users import has_user_ids, queries_per_user, query_users


def whitespace_ids(mapping) -> tuple[int, str | None]:
    """How many ids of ``mapping`` (a corpus or the queries) hold whitespace, and the first: a TREC
    run, which ``eval`` writes, separates its columns by spaces and cannot hold them."""
    table = getattr(mapping, "key_table", None)
    if table is not None:
        import pyarrow.compute as pc

        ids = table.column("_id")
        hits = pc.match_substring_regex(ids, r"\s")
        count = int(pc.sum(hits).as_py() or 0)
        first = ids.filter(hits)[0].as_py() if count else None
        return count, first
    bad = [key for key in mapping if any(c.isspace() for c in key)]
    return len(bad), (bad[0] if bad else None)


def whitespace_id_message(kind: str, count: int, first: str) -> str:
    more = f" (and {count - 1} more)" if count > 1 else ""
    return (
        f"{kind} id {first!r}{more} holds whitespace: eval's TREC run files separate columns by spaces "
        "and refuse it; rename such ids (in corpus.jsonl or queries.jsonl, and the qrels)"
    )


def summarize(dataset: BeirDataset) -> dict:
    """Per-split counts plus warnings that do not make the dataset unreadable: queries without
    judgements, the same query text in two splits, and splits with no relevant pair. Where the
    dataset gives user ids (:mod:`synthq.data.users`), each split also counts users and queries
    per user, and warns about queries without one.

    Counts come from the cached qrels -> row links (numpy over row numbers), so only the judged
    queries' texts are decoded, once each."""
    splits, query_rows = {}, []
    texts_by_split: dict[str, set[str]] = {}
    relevant: dict[str, bool] = {}
    with_users, user_warnings = has_user_ids(dataset.root, dataset.queries), []
    for split, qrels in sorted(dataset.qrels.items()):
        rows = link(qrels, dataset.queries, dataset.corpus, split, dataset.root / "qrels" / f"{split}.tsv")
        splits[split] = {
            "queries": len(qrels),
            "judgements": len(rows.doc_rows),
            "documents": len(np.unique(rows.doc_rows)),
        }
        if with_users:  # a split with no user id at all (e.g. separately written test queries) says nothing
            users = query_users(dataset.root, dataset.queries, np.unique(rows.query_rows), strict=False)
            counted = queries_per_user(users)
            if counted["users"]:
                splits[split]["users"] = counted
            if counted["users"] and counted["queries_without_user"]:
                missing = counted["queries_without_user"]
                user_warnings.append(f"{missing} queries of split {split} have no user id")
        query_rows.append(np.asarray(rows.query_rows))
        texts_by_split[split] = {dataset.queries.text_at(int(r)).strip().lower() for r in rows.query_rows}
        relevant[split] = bool((int64_values(qrels.judgements().column("score")) > 0).any())
    warnings = user_warnings
    judged = len(np.unique(np.concatenate(query_rows))) if query_rows else 0
    unjudged = len(dataset.queries) - judged
    if unjudged:
        warnings.append(f"{unjudged} queries have no judgement in any split")
    names = sorted(texts_by_split)
    for i, first in enumerate(names):
        for second in names[i + 1 :]:
            shared = texts_by_split[first] & texts_by_split[second]
            if shared:
                warnings.append(f"{len(shared)} query texts appear in both {first} and {second}")
    for split in dataset.qrels:
        if not relevant[split]:
            warnings.append(f"split {split} has no relevant (score > 0) judgement")
    for kind, mapping in (("document", dataset.corpus), ("query", dataset.queries)):
        count, first = whitespace_ids(mapping)
        if count:
            warnings.append(whitespace_id_message(kind, count, first))
    return {
        "root": str(dataset.root),
        "documents": len(dataset.corpus),
        "queries": len(dataset.queries),
        "splits": splits,
        "warnings": warnings,
    }
