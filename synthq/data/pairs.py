"""Training pairs (query, positive document) from a qrels split."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import overload

import numpy as np

from synthq.data.arrow_views import Corpus, Queries
from synthq.data.beir_io import BeirDataset, link
from synthq.data.store import int64_values
from synthq.runtime.errors import DataError


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


class PairList(Sequence[Pair]):
    """A qrels split's relevant (query, document) pairs, decoded from the Arrow cache on access.

    Holds two integer arrays (query row, document row per pair) over the memory-mapped tables,
    so ``len``, ``pairs[i]``, ``pairs[a:b]`` and sampling by index cost nothing up front; a
    batch of pairs drawn by index (e.g. a Poisson sample) decodes only its own texts."""

    def __init__(self, queries: Queries, corpus: Corpus, query_rows: np.ndarray, doc_rows: np.ndarray):
        self.queries, self.corpus = queries, corpus
        self.query_rows, self.doc_rows = query_rows, doc_rows

    def __len__(self) -> int:
        return len(self.doc_rows)

    @overload
    def __getitem__(self, index: int) -> Pair: ...
    @overload
    def __getitem__(self, index: slice) -> PairList: ...
    def __getitem__(self, index):
        if isinstance(index, slice):
            return self.select(index)
        query_row, doc_row = int(self.query_rows[index]), int(self.doc_rows[index])
        return Pair(
            self.queries.id_at(query_row),
            self.queries.text_at(query_row),
            self.corpus.id_at(doc_row),
            document_text(self.corpus.document(doc_row)),
        )

    def select(self, indices: np.ndarray | slice) -> PairList:
        """The pairs at ``indices`` (an integer array or a slice), as a lazy list in that order."""
        return PairList(self.queries, self.corpus, self.query_rows[indices], self.doc_rows[indices])

    def take(self, indices) -> list[Pair]:
        """The pairs at ``indices`` (any iterable of ints), e.g. one sampled batch."""
        return [self[int(i)] for i in indices]

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"PairList({len(self)} pairs)"


def training_pairs(dataset: BeirDataset, split: str = "train", min_relevance: int = 1) -> PairList:
    """Every (query, document) with relevance ≥ ``min_relevance`` in ``split``, in file order.

    Returns a lazy :class:`PairList`; ``list(...)`` of it is the list of :class:`Pair` that this
    function returned before the Arrow cache."""
    qrels = dataset.require_split(split)
    path = dataset.root / "qrels" / f"{split}.tsv"
    links = link(qrels, dataset.queries, dataset.corpus, split, path)
    scores = int64_values(qrels.judgements().column("score"))
    keep = np.flatnonzero(scores >= min_relevance)
    if not len(keep):
        raise DataError(f"split {split!r} has no relevant (query, document) pairs", dataset.root)
    group_of_row = np.searchsorted(qrels.starts, keep, side="right") - 1
    return PairList(dataset.queries, dataset.corpus, links.query_rows[group_of_row], links.doc_rows[keep])


def first_pairs_per_document(pairs: PairList, k: int) -> PairList:
    """The first ``k`` pairs of every document, in file order: one query per document of a
    synthetic set generated with ``--num-queries 3`` is the set generated with one (each of a
    document's queries is an independent sample). Which pairs are kept depends on the other
    pairs of the same document, so this is a selection for public or already-private
    (synthetic) data, never inside a DP mechanism over private pairs."""
    order = np.argsort(pairs.doc_rows, kind="stable")
    documents = pairs.doc_rows[order]
    starts = np.flatnonzero(np.r_[True, documents[1:] != documents[:-1]])
    rank = np.arange(len(order)) - np.repeat(starts, np.diff(np.r_[starts, len(order)]))
    return pairs.select(np.sort(order[rank < k]))
