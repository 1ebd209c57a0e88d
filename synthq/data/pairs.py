"""Training pairs (query, positive document) from a qrels split."""

from __future__ import annotations

from dataclasses import dataclass

from synthq.data.beir_io import BeirDataset
from synthq.errors import DataError


@dataclass(frozen=True)
class Pair:
    """One (query, relevant document) pair: the privacy unit of every DP stage."""

    query_id: str
    query: str
    doc_id: str
    document: str


def document_text(doc: dict[str, str]) -> str:
    """Title and text joined exactly as BEIR's dense models join them (``SentenceBERT`` with its
    default ``sep=" "``: ``(title + " " + text).strip()``, the text alone without a title), so
    synthq's scores equal BEIR's ``DenseRetrievalExactSearch`` + ``EvaluateRetrieval`` on titled
    corpora. Training (pairs, synthetic data), generation and evaluation all use this one text."""
    return (doc.get("title", "") + " " + doc["text"]).strip()


def training_pairs(dataset: BeirDataset, split: str = "train", min_relevance: int = 1) -> list[Pair]:
    """Every (query, document) with relevance ≥ ``min_relevance`` in ``split``, in file order."""
    qrels = dataset.require_split(split)
    pairs = [
        Pair(query_id, dataset.queries[query_id], doc_id, document_text(dataset.corpus[doc_id]))
        for query_id, docs in qrels.items()
        for doc_id, relevance in docs.items()
        if relevance >= min_relevance
    ]
    if not pairs:
        raise DataError(f"split {split!r} has no relevant (query, document) pairs", dataset.root)
    return pairs
