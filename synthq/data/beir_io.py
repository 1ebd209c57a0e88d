"""BEIR-format datasets on disk: ``corpus.jsonl``, ``queries.jsonl``, ``qrels/<split>.tsv``.

BEIR directories are the exchange format; reading one parses each file once, in one streaming
pass, into an Arrow cache keyed by the file's sha256 (:mod:`synthq.data.store`) and returns
lazy mappings over it (:mod:`synthq.data.arrow_views`). The pass validates as it goes and raises
:class:`~synthq.runtime.errors.DataError` with the file and line of the first problem: non-UTF-8 bytes,
malformed JSON, a missing or duplicate ``_id``, a non-string ``_id``/``title``/``text`` (its JSON
type named), empty text, a malformed qrels row; loading a
directory then checks that the qrels name only known query and document ids.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa

from synthq.data.arrow_views import DATA_FILE, Corpus, Qrels, Queries
from synthq.data.store import (
    HashingReader,
    IdIndex,
    TableWriter,
    cached_build,
    open_table,
    write_table,
)
from synthq.runtime.errors import DataError
from synthq.runtime.file_digests import content_digest


@dataclass
class BeirDataset:
    """A BEIR directory, memory-mapped from its Arrow cache (see :mod:`synthq.data.arrow_views`)."""

    root: Path
    corpus: Mapping[str, dict[str, str]]
    queries: Mapping[str, str]
    qrels: dict[str, Mapping[str, dict[str, int]]] = field(default_factory=dict)

    @property
    def splits(self) -> list[str]:
        return sorted(self.qrels)

    def split_queries(self, split: str) -> dict[str, str]:
        """The queries that have judgements in ``split``."""
        qrels = self.require_split(split)
        return {qid: self.queries[qid] for qid in qrels}

    def require_split(self, split: str) -> Mapping[str, dict[str, int]]:
        if split not in self.qrels:
            available = ", ".join(self.splits) or "none"
            raise DataError(f"no qrels for split {split!r} (available: {available})", self.root / "qrels")
        return self.qrels[split]


def _iter_jsonl(lines: Iterable[bytes], path: Path) -> Iterator[tuple[int, dict]]:
    for number, raw in enumerate(lines, 1):
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as error:
            raise DataError(f"not valid UTF-8 ({error.reason} at byte {error.start})", path, number) from None
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise DataError(f"malformed JSON ({error.msg} at column {error.colno})", path, number) from None
        if not isinstance(record, dict):
            raise DataError("expected a JSON object", path, number)
        yield number, record


_JSON_TYPES = {bool: "true/false", int: "a number", float: "a number", list: "a list", dict: "an object"}


def _string_field(record: dict, name: str, path: Path, number: int) -> str:
    """``record[name]`` as a string: absent or null is "", any other non-string JSON value is
    refused (never stored as its Python repr, never called empty)."""
    value = record.get(name)
    if value is None or isinstance(value, str):
        return value or ""
    kind = _JSON_TYPES.get(type(value), type(value).__name__)
    # the type only, never the value: a private query's words do not belong in a log
    raise DataError(f"{name!r} is {kind}, expected a JSON string", path, number)


def _record_id(record: dict, path: Path, number: int, seen: set[str]) -> str:
    if "_id" not in record:
        raise DataError("missing '_id'", path, number)
    record_id = _string_field(record, "_id", path, number).strip()
    if not record_id:
        raise DataError("empty '_id'", path, number)
    if record_id in seen:
        raise DataError(f"duplicate id {record_id!r}", path, number)
    seen.add(record_id)
    return record_id


CORPUS_SCHEMA = pa.schema(
    [("_id", pa.large_string()), ("title", pa.large_string()), ("text", pa.large_string())]
)
# ``user_id``: BEIR's ``metadata.user_id`` ("" when absent); ``line``: the record's line in the file,
# so that a query without a user id can be named by file:line when the user unit needs one.
QUERIES_SCHEMA = pa.schema(
    [
        ("_id", pa.large_string()),
        ("text", pa.large_string()),
        ("user_id", pa.large_string()),
        ("line", pa.int64()),
    ]
)
QRELS_SCHEMA = pa.schema(
    [("query-id", pa.large_string()), ("corpus-id", pa.large_string()), ("score", pa.int64())]
)


def _build(kind: str, path: Path, parse) -> Path:
    """The cache directory for ``path`` parsed by ``parse(lines, out_dir)`` (built on first use)."""
    path = Path(path)
    digest = content_digest(path)

    def build(out: Path) -> None:
        lines = HashingReader(path)
        parse(lines, out)
        lines.check_unchanged(digest)

    return cached_build(kind, digest, build)


def _parse_jsonl(lines: HashingReader, out: Path, schema: pa.Schema, values) -> int:
    """Write every record's ``values(record, id, line)`` (a tuple after the id, or a raised
    :class:`DataError`) as one row, then the id index; the number of rows."""
    path, seen = lines.path, set()
    with TableWriter(out / DATA_FILE, schema) as writer:
        for number, record in _iter_jsonl(lines, path):
            record_id = _record_id(record, path, number, seen)
            writer.add(record_id, *values(record, record_id, number))
    IdIndex.write(out, open_table(out / DATA_FILE).column("_id"))
    return writer.rows


def _parse_corpus(lines: HashingReader, out: Path) -> None:
    def values(record: dict, doc_id: str, number: int) -> tuple[str, str]:
        text = _string_field(record, "text", lines.path, number).strip()
        title = _string_field(record, "title", lines.path, number).strip()
        if not text and not title:
            raise DataError(f"document {doc_id!r} has empty text", lines.path, number)
        return title, text

    if not _parse_jsonl(lines, out, CORPUS_SCHEMA, values):
        raise DataError("corpus is empty", lines.path)


def _parse_queries(lines: HashingReader, out: Path) -> None:
    def values(record: dict, query_id: str, number: int) -> tuple[str]:
        text = _string_field(record, "text", lines.path, number).strip()
        if not text:
            raise DataError(f"query {query_id!r} has empty text", lines.path, number)
        metadata = record.get("metadata") or {}
        if not isinstance(metadata, dict):
            raise DataError(f"query {query_id!r}: 'metadata' is not a JSON object", lines.path, number)
        user = metadata.get("user_id")
        if isinstance(user, int | float) and not isinstance(user, bool):
            user = str(user)  # numeric user ids are common and unambiguous
        user = _string_field({"metadata.user_id": user}, "metadata.user_id", lines.path, number).strip()
        return text, user, number

    _parse_jsonl(lines, out, QUERIES_SCHEMA, values)


HEADER_FIRST_COLUMNS = ("query-id", "query_id", "qid")


def tsv_rows(raw_lines: Iterable[bytes], path: Path) -> Iterator[tuple[int, list[str]]]:
    """``(line number, tab-separated columns)`` of a query-keyed TSV (qrels, ``users.tsv``): UTF-8
    (an error names its line), blank lines skipped, a byte-order mark and a header line (first
    column ``query-id``, ``query_id`` or ``qid``) dropped."""
    for number, raw in enumerate(raw_lines, 1):
        try:
            line = raw.decode("utf-8").rstrip("\r\n")
        except UnicodeDecodeError as error:
            raise DataError(f"not valid UTF-8 ({error.reason})", path, number) from None
        if number == 1:
            line = line.removeprefix("\ufeff")  # a byte-order mark before the header or first row
        if not line.strip():
            continue
        columns = line.split("\t")
        if number == 1 and columns[0].strip().lower() in HEADER_FIRST_COLUMNS:
            continue
        yield number, columns


def _parse_qrels(lines: HashingReader, out: Path) -> None:
    path = lines.path
    qrels: dict[str, dict[str, int]] = {}
    first_line: dict[tuple[str, str], int] = {}
    for number, columns in tsv_rows(lines, path):
        if len(columns) != 3:
            raise DataError(f"expected 3 tab-separated columns, found {len(columns)}", path, number)
        query_id, doc_id, score = (c.strip() for c in columns)
        try:
            value = float(score)
        except ValueError:
            raise DataError(f"relevance {score!r} is not a number", path, number) from None
        if not value.is_integer():  # int() would truncate 0.5 to 0 and drop the judgement silently
            raise DataError(
                f"relevance {score!r} is not a whole grade (TREC qrels grade relevance 0, 1, 2, …)",
                path,
                number,
            )
        relevance = int(value)
        judged = qrels.setdefault(query_id, {})
        if doc_id in judged and judged[doc_id] != relevance:  # which one is meant? not ours to guess
            raise DataError(
                f"pair ({query_id!r}, {doc_id!r}) is judged {judged[doc_id]} on line "
                f"{first_line[query_id, doc_id]} and {relevance} here: keep one grade per pair",
                path,
                number,
            )
        if doc_id not in judged:
            first_line[query_id, doc_id] = number
        judged[doc_id] = relevance
    starts = []
    with TableWriter(out / DATA_FILE, QRELS_SCHEMA) as writer:
        for query_id, docs in qrels.items():
            starts.append(writer.rows)
            for doc_id, relevance in docs.items():
                writer.add(query_id, doc_id, relevance)
    groups = pa.table(
        {"_id": pa.array(list(qrels), pa.large_string()), "start": pa.array(starts, pa.int64())}
    )
    write_table(out / Qrels.GROUPS_FILE, groups)
    IdIndex.write(out, groups.column("_id"))


def read_corpus(path: str | Path) -> Corpus:
    """``corpus.jsonl`` as a lazy :class:`~synthq.data.arrow_views.Corpus` (validated and cached on
    first use)."""
    return Corpus(_build("corpus", Path(path), _parse_corpus))


def read_queries(path: str | Path) -> Queries:
    """``queries.jsonl`` as a lazy :class:`~synthq.data.arrow_views.Queries` (validated, cached on
    first use)."""
    return Queries(_build("queries", Path(path), _parse_queries))


def read_qrels(path: str | Path) -> Qrels:
    """A BEIR qrels TSV (``query-id  corpus-id  score``, optional header row) as a lazy
    :class:`~synthq.data.arrow_views.Qrels`; a (query, document) pair given twice with the same grade
    counts once, with two different grades it is refused (line numbers of both)."""
    return Qrels(_build("qrels", Path(path), _parse_qrels))


@dataclass(frozen=True)
class Links:
    """Rows of a qrels split's queries (one per group) and documents (one per judgement)."""

    query_rows: np.ndarray
    doc_rows: np.ndarray


def _unknown_ids_error(qrels: Qrels, links: Links, split: str, path: Path) -> DataError | None:
    """The first problem in the order the dict-based validation met them: queries in order,
    each query's own id before its documents."""
    bad_queries = np.flatnonzero(links.query_rows < 0)
    bad_docs = np.flatnonzero(links.doc_rows < 0)
    first_query = int(bad_queries[0]) if len(bad_queries) else len(qrels)
    doc_group = (
        int(np.searchsorted(qrels.starts, bad_docs[0], side="right") - 1) if len(bad_docs) else len(qrels)
    )
    if first_query < len(qrels) and first_query <= doc_group:
        return DataError(f"split {split!r} names unknown query id {qrels.id_at(first_query)!r}", path)
    if doc_group < len(qrels):
        doc_id = qrels.table.column("corpus-id")[int(bad_docs[0])].as_py()
        return DataError(f"split {split!r} names unknown document id {doc_id!r}", path)
    return None


def link(qrels: Qrels, queries: Queries, corpus: Corpus, split: str, path: Path) -> Links:
    """Resolve a split's ids to query and corpus rows, raising on unknown ids; cached per
    (qrels, queries, corpus) so that only the first load of a dataset pays for the join."""
    key = hashlib.sha256(
        "|".join(str(t.directory.name) for t in (qrels, queries, corpus)).encode()
    ).hexdigest()

    def build(out: Path) -> None:
        found = Links(
            queries.index.find_many(qrels.groups.column("_id")),
            corpus.index.find_many(qrels.table.column("corpus-id")),
        )
        if (error := _unknown_ids_error(qrels, found, split, path)) is not None:
            raise error
        np.save(out / "query_rows.npy", found.query_rows)
        np.save(out / "doc_rows.npy", found.doc_rows)

    directory = cached_build("links", key, build)
    return Links(
        np.load(directory / "query_rows.npy", mmap_mode="r"),
        np.load(directory / "doc_rows.npy", mmap_mode="r"),
    )


def validate(dataset: BeirDataset) -> None:
    """Check that qrels name only known queries and documents."""
    for split, qrels in dataset.qrels.items():
        link(qrels, dataset.queries, dataset.corpus, split, dataset.root / "qrels" / f"{split}.tsv")


def load_beir_dir(root: str | Path, splits: Iterable[str] | None = None) -> BeirDataset:
    """Load and validate a BEIR directory; ``splits`` = None loads every ``qrels/*.tsv``.

    Each file is parsed once into the Arrow cache (see :mod:`synthq.data.store`); later loads
    only check its digest and map it."""
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


CorpusLike = Mapping[str, Mapping[str, str]]
QueriesLike = Mapping[str, str]
QrelsLike = Mapping[str, Mapping[str, int]]


def write_corpus(path: Path, corpus: CorpusLike) -> None:
    _write_jsonl(
        path, ({"_id": i, "title": d.get("title", ""), "text": d["text"]} for i, d in corpus.items())
    )


def write_queries(path: Path, queries: QueriesLike) -> None:
    _write_jsonl(path, ({"_id": i, "text": t} for i, t in queries.items()))


def write_qrels(path: Path, qrels: QrelsLike) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as handle:
        handle.write("query-id\tcorpus-id\tscore\n")
        for query_id, docs in qrels.items():
            for doc_id, relevance in docs.items():
                handle.write(f"{query_id}\t{doc_id}\t{relevance}\n")
    os.replace(tmp, path)


def write_beir_dir(
    root: str | Path, corpus: CorpusLike | None, queries: QueriesLike, qrels: Mapping[str, QrelsLike]
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
