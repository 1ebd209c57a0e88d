"""Synthetic sets on disk: which public documents get queries, and the BEIR payload that
``generate`` and ``evolve`` write.

A synthetic set is a BEIR directory: ``corpus.jsonl`` (the public documents that received a
query), ``queries.jsonl`` (ids ``syn-<docid>-<k>``) and ``qrels/train.tsv``; empty,
punctuation-only or copied-from-the-document queries are dropped (:func:`is_degenerate`).
"""

from __future__ import annotations

import re
import string
from collections.abc import Iterator, Mapping
from pathlib import Path

from synthq.data.arrow_views import Corpus
from synthq.data.beir_io import read_corpus, read_qrels, write_beir_dir
from synthq.data.pairs import document_text
from synthq.runtime.errors import DataError, SynthqError

# The ids a synthetic set gives its queries (``syn-<docid>-<k>``, :func:`write_synthetic`).
SYNTHETIC_QUERY_ID = re.compile(r"syn-.+-\d+")


def judged_set_assumption(split: str) -> str:
    return (
        f"the set of documents judged in split {split!r} is public (documents were selected by it; "
        "its queries, and which query judged which document, were never read nor recorded)"
    )


def judged_documents(qrels_path: Path) -> list[str]:
    """The documents a qrels file judges relevant (score > 0), sorted: the set ``--split`` reads
    (only this set is assumed public, never the pairing of queries and documents)."""
    qrels = read_qrels(Path(qrels_path))
    return sorted({d for docs in qrels.values() for d, rel in docs.items() if rel > 0})


def document_list_assumption(record: dict) -> str:
    return (
        f"the document list {record['path']} (sha256 {record['sha256'][:12]}) is public: it was not "
        "chosen by looking at the private queries"
    )


def read_document_list(path: Path) -> list[str]:
    """Document ids, one per line (blank lines and ``#`` comments ignored)."""
    if not Path(path).is_file():
        raise DataError("no such document list", Path(path))
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    return [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]


def public_documents(root: Path, documents: Path | None, split: str | None) -> tuple[Corpus, list[str]]:
    """The public documents that get synthetic queries: the whole corpus at ``root``, a public id
    list (``documents``), or (under :func:`judged_set_assumption`) a split's judged documents.
    Only ``corpus.jsonl`` and, with ``split``, the qrels file are read, never ``queries.jsonl``.
    Returns the memory-mapped corpus and the ids."""
    corpus = read_corpus(root / "corpus.jsonl")
    if documents is not None and split is not None:
        raise SynthqError("give either --documents or --split, not both")
    if documents is not None:
        ids = read_document_list(documents)
        unknown = [d for d in ids if d not in corpus]
        if unknown:
            raise DataError(f"document id {unknown[0]!r} is not in the corpus", documents)
        return corpus, ids
    if split is None:
        return corpus, sorted(corpus)
    qrels_path = root / "qrels" / f"{split}.tsv"
    if not qrels_path.is_file():
        raise DataError(f"no qrels for split {split!r}", qrels_path)
    ids = judged_documents(qrels_path)
    missing = [d for d in ids if d not in corpus]
    if missing:
        raise DataError(f"split {split!r} names unknown document id {missing[0]!r}", qrels_path)
    return corpus, ids


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
