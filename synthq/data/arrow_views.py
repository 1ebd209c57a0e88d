"""Read-only mappings over the memory-mapped Arrow cache: corpus, queries and qrels.

They behave like the dictionaries the stages used before (``corpus[doc_id] -> {"title", "text"}``,
``queries[query_id] -> text``, ``qrels[query_id] -> {doc_id: relevance}``; iteration in file
order, ``len``, ``in``, ``==`` with a dict) but hold no Python copy of the text: each value is
decoded from the mapped file when asked for. Pickling one pickles its cache path only, so a
worker process maps the same pages instead of receiving a copy.
"""

from __future__ import annotations

from collections.abc import ItemsView, Iterator, Mapping, ValuesView
from pathlib import Path

import numpy as np
import pyarrow as pa

from synthq.data.store import IdIndex, StringColumn, int64_values, open_table

DATA_FILE = "data.arrow"


class ArrowMapping(Mapping):
    """Common part: the table in file order, the keys (its ``_id`` column, or another table's),
    the id index over the keys, iteration and pickling."""

    def __init__(self, directory: str | Path, keys: pa.Table | None = None):
        self.directory = Path(directory)
        self.table = open_table(self.directory / DATA_FILE)
        self.key_table = self.table if keys is None else keys
        self.index = IdIndex(self.directory)
        self.key_column = StringColumn(self.key_table.column("_id"))
        self.columns = {
            name: StringColumn(self.table.column(name))
            for name, kind in zip(self.table.column_names, self.table.schema.types, strict=True)
            if kind == pa.large_string()
        }

    def __reduce__(self):
        return (type(self), (str(self.directory),))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({len(self)} rows from {self.directory})"

    def __len__(self) -> int:
        return self.key_table.num_rows

    def __iter__(self) -> Iterator[str]:
        for chunk in self.key_table.column("_id").chunks:
            yield from chunk.to_pylist()

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and self.index.find(key) >= 0

    @property
    def content_key(self) -> str | None:
        """The cache directory's name, which is derived from the source file's content hash, when
        this mapping covers the whole file; ``None`` for a mapping over other keys. Equal keys
        mean equal records, so it can stand for a hash over every record."""
        return self.directory.name if self.key_table is self.table else None

    def row(self, key: str) -> int:
        """The row of ``key`` in file order; :class:`KeyError` when absent."""
        row = self.index.find(key) if isinstance(key, str) else -1
        if row < 0:
            raise KeyError(key)
        return row

    def id_at(self, row: int) -> str:
        """The key at ``row`` (a document or query id; a qrels group's query id)."""
        return self.key_column[row]

    def dataset(self):
        """The same rows as a Hugging Face ``datasets.Dataset``, memory-mapped from the cache file."""
        import datasets

        return datasets.Dataset.from_file(str(self.directory / DATA_FILE), in_memory=False)

    def _rows(self) -> Iterator[dict]:
        for batch in self.table.to_batches():
            yield from batch.to_pylist()


class _FastItems(ItemsView):
    def __iter__(self):
        yield from self._mapping._items()


class _FastValues(ValuesView):
    def __iter__(self):
        for _, value in self._mapping._items():
            yield value


class Corpus(ArrowMapping):
    """doc id -> ``{"title": ..., "text": ...}``, lazily decoded from the Arrow cache."""

    def __getitem__(self, key: str) -> dict[str, str]:
        return self.document(self.row(key))

    def document(self, row: int) -> dict[str, str]:
        """The document at ``row`` (file order)."""
        return {"title": self.columns["title"][row], "text": self.columns["text"][row]}

    def _items(self) -> Iterator[tuple[str, dict[str, str]]]:
        for record in self._rows():
            yield record["_id"], {"title": record["title"], "text": record["text"]}

    def items(self) -> ItemsView:
        return _FastItems(self)

    def values(self) -> ValuesView:
        return _FastValues(self)

    def sorted_rows(self) -> np.ndarray:
        """Rows in the order of ``sorted(corpus)`` (the index's order: UTF-8 byte order equals code
        point order), memory-mapped; ``sorted_rows()[:k]`` selects like ``sorted(corpus)[:k]``."""
        return self.index.rows

    def batches(self, size: int = 10_000) -> Iterator[tuple[list[str], list[dict[str, str]]]]:
        """``(ids, documents)`` of ``size`` consecutive rows at a time, in file order (e.g. to
        encode a corpus chunk by chunk straight into a memory-mapped embedding file)."""
        for batch in self.table.to_batches(max_chunksize=size):
            columns = batch.to_pydict()
            yield (
                columns["_id"],
                [
                    {"title": title, "text": text}
                    for title, text in zip(columns["title"], columns["text"], strict=True)
                ],
            )


class Queries(ArrowMapping):
    """query id -> text, lazily decoded from the Arrow cache."""

    def __getitem__(self, key: str) -> str:
        return self.text_at(self.row(key))

    def text_at(self, row: int) -> str:
        return self.columns["text"][row]

    def user_at(self, row: int) -> str:
        """The query's ``metadata.user_id`` ("" when it has none)."""
        return self.columns["user_id"][row]

    def line_at(self, row: int) -> int:
        """The line of ``queries.jsonl`` the query was read from."""
        return int(self.table.column("line")[row].as_py())

    def _items(self) -> Iterator[tuple[str, str]]:
        for record in self._rows():
            yield record["_id"], record["text"]

    def items(self) -> ItemsView:
        return _FastItems(self)

    def values(self) -> ValuesView:
        return _FastValues(self)


class Qrels(ArrowMapping):
    """query id -> ``{doc id: relevance}``, in the file's order of first appearance.

    ``data.arrow`` holds one row per judgement, grouped by query; ``groups.arrow`` the distinct
    query ids in order with the first row of each group (``start``); the index maps a query id
    to its group."""

    GROUPS_FILE = "groups.arrow"

    def __init__(self, directory: str | Path):
        groups = open_table(Path(directory) / self.GROUPS_FILE)
        super().__init__(directory, keys=groups)
        self.groups = groups
        self.starts = np.concatenate(
            [int64_values(groups.column("start")), np.array([self.table.num_rows], dtype=np.int64)]
        )

    def __getitem__(self, key: str) -> dict[str, int]:
        return self.group(self.row(key))

    def group(self, group: int) -> dict[str, int]:
        rows = self.table.slice(self.starts[group], self.starts[group + 1] - self.starts[group])
        return dict(zip(rows.column("corpus-id").to_pylist(), rows.column("score").to_pylist(), strict=True))

    def judgements(self) -> pa.Table:
        """Every judgement row (``query-id``, ``corpus-id``, ``score``), grouped by query."""
        return self.table

    def _items(self) -> Iterator[tuple[str, dict[str, int]]]:
        current, docs = None, {}
        for record in self._rows():
            if record["query-id"] != current:
                if current is not None:
                    yield current, docs
                current, docs = record["query-id"], {}
            docs[record["corpus-id"]] = record["score"]
        if current is not None:
            yield current, docs

    def items(self) -> ItemsView:
        return _FastItems(self)

    def values(self) -> ValuesView:
        return _FastValues(self)
