"""BEIR-format datasets on disk: ``corpus.jsonl``, ``queries.jsonl``, ``qrels/<split>.tsv``.

Reading validates as it goes and raises :class:`~synthq.errors.DataError` with the file and line
of the first problem: non-UTF-8 bytes, malformed JSON, a missing or duplicate ``_id``, empty
text, a malformed qrels row, or qrels naming unknown query or document ids.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from synthq.errors import DataError

Corpus = dict[str, dict[str, str]]  # doc id -> {"title": ..., "text": ...}
Queries = dict[str, str]  # query id -> text
Qrels = dict[str, dict[str, int]]  # query id -> {doc id: relevance}


@dataclass
class BeirDataset:
    """A BEIR directory held in memory."""

    root: Path
    corpus: Corpus
    queries: Queries
    qrels: dict[str, Qrels] = field(default_factory=dict)

    @property
    def splits(self) -> list[str]:
        return sorted(self.qrels)

    def split_queries(self, split: str) -> Queries:
        """The queries that have judgements in ``split``."""
        qrels = self.require_split(split)
        return {qid: self.queries[qid] for qid in qrels}

    def require_split(self, split: str) -> Qrels:
        if split not in self.qrels:
            available = ", ".join(self.splits) or "none"
            raise DataError(f"no qrels for split {split!r} (available: {available})", self.root / "qrels")
        return self.qrels[split]


def _iter_jsonl(path: Path) -> Iterator[tuple[int, dict]]:
    if not path.is_file():
        raise DataError("file not found", path)
    with open(path, "rb") as handle:
        for number, raw in enumerate(handle, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as error:
                raise DataError(
                    f"not valid UTF-8 ({error.reason} at byte {error.start})", path, number
                ) from None
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                raise DataError(
                    f"malformed JSON ({error.msg} at column {error.colno})", path, number
                ) from None
            if not isinstance(record, dict):
                raise DataError("expected a JSON object", path, number)
            yield number, record


def _record_id(record: dict, path: Path, number: int, seen: set[str]) -> str:
    if "_id" not in record:
        raise DataError("missing '_id'", path, number)
    record_id = str(record["_id"]).strip()
    if not record_id:
        raise DataError("empty '_id'", path, number)
    if record_id in seen:
        raise DataError(f"duplicate id {record_id!r}", path, number)
    seen.add(record_id)
    return record_id


def read_corpus(path: str | Path) -> Corpus:
    path = Path(path)
    corpus: Corpus = {}
    seen: set[str] = set()
    for number, record in _iter_jsonl(path):
        doc_id = _record_id(record, path, number, seen)
        text = str(record.get("text") or "").strip()
        title = str(record.get("title") or "").strip()
        if not text and not title:
            raise DataError(f"document {doc_id!r} has empty text", path, number)
        corpus[doc_id] = {"title": title, "text": text}
    if not corpus:
        raise DataError("corpus is empty", path)
    return corpus


def read_queries(path: str | Path) -> Queries:
    path = Path(path)
    queries: Queries = {}
    seen: set[str] = set()
    for number, record in _iter_jsonl(path):
        query_id = _record_id(record, path, number, seen)
        text = str(record.get("text") or "").strip()
        if not text:
            raise DataError(f"query {query_id!r} has empty text", path, number)
        queries[query_id] = text
    return queries


def read_qrels(path: str | Path) -> Qrels:
    """Read a BEIR qrels TSV (``query-id  corpus-id  score``, with an optional header row)."""
    path = Path(path)
    if not path.is_file():
        raise DataError("file not found", path)
    qrels: Qrels = {}
    with open(path, "rb") as handle:
        for number, raw in enumerate(handle, 1):
            try:
                line = raw.decode("utf-8").rstrip("\r\n")
            except UnicodeDecodeError as error:
                raise DataError(f"not valid UTF-8 ({error.reason})", path, number) from None
            if not line.strip():
                continue
            columns = line.split("\t")
            if number == 1 and columns[0].strip().lower() in ("query-id", "query_id", "qid"):
                continue
            if len(columns) != 3:
                raise DataError(f"expected 3 tab-separated columns, found {len(columns)}", path, number)
            query_id, doc_id, score = (c.strip() for c in columns)
            try:
                relevance = int(float(score))
            except ValueError:
                raise DataError(f"relevance {score!r} is not a number", path, number) from None
            qrels.setdefault(query_id, {})[doc_id] = relevance
    return qrels


def validate(dataset: BeirDataset) -> None:
    """Check that qrels name only known queries and documents."""
    for split, qrels in dataset.qrels.items():
        path = dataset.root / "qrels" / f"{split}.tsv"
        for query_id, docs in qrels.items():
            if query_id not in dataset.queries:
                raise DataError(f"split {split!r} names unknown query id {query_id!r}", path)
            for doc_id in docs:
                if doc_id not in dataset.corpus:
                    raise DataError(f"split {split!r} names unknown document id {doc_id!r}", path)


def load_beir_dir(root: str | Path, splits: Iterable[str] | None = None) -> BeirDataset:
    """Load and validate a BEIR directory; ``splits`` = None loads every ``qrels/*.tsv``."""
    root = Path(root)
    if not root.is_dir():
        raise DataError("dataset directory not found", root)
    corpus = read_corpus(root / "corpus.jsonl")
    queries = read_queries(root / "queries.jsonl")
    qrels_dir = root / "qrels"
    if splits is None:
        splits = sorted(p.stem for p in qrels_dir.glob("*.tsv")) if qrels_dir.is_dir() else []
    available = sorted(p.stem for p in qrels_dir.glob("*.tsv")) if qrels_dir.is_dir() else []
    for split in splits:
        if split not in available:
            names = ", ".join(available) or "none"
            raise DataError(f"no qrels for split {split!r} (available: {names})", qrels_dir)
    qrels = {split: read_qrels(qrels_dir / f"{split}.tsv") for split in splits}
    dataset = BeirDataset(root=root, corpus=corpus, queries=queries, qrels=qrels)
    validate(dataset)
    return dataset


def _write_jsonl(path: Path, records: Iterable[dict]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as handle:
        for record in records:
            handle.write(json.dumps(record, ensure_ascii=False) + "\n")
    os.replace(tmp, path)


def write_corpus(path: Path, corpus: Corpus) -> None:
    _write_jsonl(
        path, ({"_id": i, "title": d.get("title", ""), "text": d["text"]} for i, d in corpus.items())
    )


def write_queries(path: Path, queries: Queries) -> None:
    _write_jsonl(path, ({"_id": i, "text": t} for i, t in queries.items()))


def write_qrels(path: Path, qrels: Qrels) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as handle:
        handle.write("query-id\tcorpus-id\tscore\n")
        for query_id, docs in qrels.items():
            for doc_id, relevance in docs.items():
                handle.write(f"{query_id}\t{doc_id}\t{relevance}\n")
    os.replace(tmp, path)


def write_beir_dir(
    root: str | Path, corpus: Corpus | None, queries: Queries, qrels: dict[str, Qrels]
) -> Path:
    """Write a BEIR directory that ``beir.datasets.data_loader.GenericDataLoader`` reads.

    ``corpus=None`` writes no corpus file (callers that reference a corpus elsewhere)."""
    root = Path(root)
    (root / "qrels").mkdir(parents=True, exist_ok=True)
    if corpus is not None:
        write_corpus(root / "corpus.jsonl", corpus)
    write_queries(root / "queries.jsonl", queries)
    for split, split_qrels in qrels.items():
        write_qrels(root / "qrels" / f"{split}.tsv", split_qrels)
    return root
