"""Synthetic sets on disk: the BEIR payload that ``generate`` and ``evolve`` write.

A synthetic set is a BEIR directory: ``corpus.jsonl`` (the public documents that received a
query), ``queries.jsonl`` (ids ``syn-<docid>-<k>``) and ``qrels/train.tsv``; empty,
punctuation-only or copied-from-the-document queries are dropped (:func:`is_degenerate`).
"""

from __future__ import annotations

import string
from collections.abc import Iterator, Mapping
from pathlib import Path

from synthq.data.beir_io import write_beir_dir
from synthq.data.pairs import document_text
from synthq.errors import SynthqError


def is_degenerate(query: str, document: str) -> bool:
    """Empty, punctuation only, or a copy of (a long stretch of) the prompt document."""
    stripped = query.strip()
    if not stripped or all(ch in string.punctuation + string.whitespace for ch in stripped):
        return True
    return len(stripped) > 40 and stripped.lower() in document.lower()


class SyntheticDocuments(Mapping):
    """The documents ``ids`` of a corpus, read on demand (what ``write_corpus`` streams out)."""

    def __init__(self, corpus: Mapping[str, dict], ids: list[str]):
        self.corpus, self.ids = corpus, ids

    def __getitem__(self, doc_id: str) -> dict:
        return self.corpus[doc_id]

    def __iter__(self) -> Iterator[str]:
        return iter(self.ids)

    def __len__(self) -> int:
        return len(self.ids)


def write_synthetic(directory: Path, corpus: Mapping[str, dict], done: dict) -> dict:
    """The BEIR payload plus generation statistics; degenerate final outputs are dropped.

    ``corpus`` may be the memory-mapped source corpus: the kept documents are streamed from it
    into the artifact's ``corpus.jsonl``."""
    queries, qrels, kept_docs, degenerate, resampled = {}, {}, {}, 0, 0
    for (doc_id, index), result in sorted(done.items()):
        resampled += result["attempts"] > 1
        if is_degenerate(result["query"], document_text(corpus[doc_id])):
            degenerate += 1
            continue
        query_id = f"syn-{doc_id}-{index}"
        queries[query_id] = result["query"]
        qrels[query_id] = {doc_id: 1}
        kept_docs[doc_id] = None
    if not queries:
        raise SynthqError("every generated query was degenerate; is the generator trained?")
    write_beir_dir(directory, SyntheticDocuments(corpus, list(kept_docs)), queries, {"train": qrels})
    lengths = [len(q.split()) for q in queries.values()]
    return {
        "documents": len(kept_docs),
        "queries": len(queries),
        "resampled": resampled,
        "dropped_degenerate": degenerate,
        "mean_query_words": sum(lengths) / len(lengths),
    }
