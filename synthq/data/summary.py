"""Counts and consistency warnings for a dataset (``synthq data info``)."""

from __future__ import annotations

from synthq.data.beir_io import BeirDataset


def summarize(dataset: BeirDataset) -> dict:
    """Per-split counts plus warnings that do not make the dataset unreadable: queries without
    judgements, the same query text in two splits, and splits with no relevant pair."""
    splits = {}
    judged_queries: set[str] = set()
    texts_by_split: dict[str, set[str]] = {}
    for split, qrels in sorted(dataset.qrels.items()):
        judgements = sum(len(docs) for docs in qrels.values())
        documents = {doc for docs in qrels.values() for doc in docs}
        splits[split] = {"queries": len(qrels), "judgements": judgements, "documents": len(documents)}
        judged_queries.update(qrels)
        texts_by_split[split] = {dataset.queries[q].strip().lower() for q in qrels}
    warnings = []
    # loading checked that every judged query exists, so no set of all query ids is needed
    unjudged = len(dataset.queries) - len(judged_queries)
    if unjudged:
        warnings.append(f"{unjudged} queries have no judgement in any split")
    names = sorted(texts_by_split)
    for i, first in enumerate(names):
        for second in names[i + 1 :]:
            shared = texts_by_split[first] & texts_by_split[second]
            if shared:
                warnings.append(f"{len(shared)} query texts appear in both {first} and {second}")
    for split, qrels in dataset.qrels.items():
        if not any(rel > 0 for docs in qrels.values() for rel in docs.values()):
            warnings.append(f"split {split} has no relevant (score > 0) judgement")
    return {
        "root": str(dataset.root),
        "documents": len(dataset.corpus),
        "queries": len(dataset.queries),
        "splits": splits,
        "warnings": warnings,
    }
