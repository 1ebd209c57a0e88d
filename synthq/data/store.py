"""The Arrow cache behind BEIR files: atomic builds, memory-mapped tables, id index.

Every BEIR file (``corpus.jsonl``, ``queries.jsonl``, ``qrels/<split>.tsv``) is parsed and
validated once into a directory under ``$SYNTHQ_CACHE/arrow/`` named after the sha256 of the
file's bytes. The directory holds Arrow IPC stream files -- the format of the Hugging Face
``datasets`` cache, so ``datasets.Dataset.from_file`` opens them as they are -- which every
process (every torchrun rank) memory-maps instead of holding its own copy of the text.

The cache key is the full sha256 of the file, never a sample, remembered while the file's stat is
unchanged (:mod:`synthq.runtime.file_digests`).

Builds run under an exclusive ``flock`` in a private temporary directory that is renamed into
place when complete, so concurrent processes either build once and share, or find the finished
directory; a reader never sees a half-written cache.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np
import pyarrow as pa

from synthq.runtime.errors import DataError
from synthq.runtime.paths import cache_dir

# Bump when the layout or the parsing rules of the cached tables change.
# 2: queries carry user_id and line; 3: non-string JSON fields refused; 4: whole grades;
# 5: a qrels pair judged twice with two grades refused
CACHE_FORMAT = 5
# Every stored table is written in record batches of exactly this many rows (the last one
# shorter), so row r lives in chunk r // BATCH_ROWS at offset r % BATCH_ROWS.
BATCH_ROWS = 4096


class HashingReader:
    """Lines of a binary file, hashing the bytes as they go by (the build's single pass)."""

    def __init__(self, path: Path):
        self.path = path
        self.sha256 = hashlib.sha256()

    def __iter__(self):
        with open(self.path, "rb") as handle:
            for raw in handle:
                self.sha256.update(raw)
                yield raw

    def check_unchanged(self, expected: str) -> None:
        if self.sha256.hexdigest() != expected:
            raise DataError("changed while it was being read; run the command again", self.path)


def cached_build(kind: str, key: str, build: Callable[[Path], None]) -> Path:
    """The cache directory ``<kind>-v<format>-<key>``, calling ``build(tmp_dir)`` once if it is missing.

    ``build`` writes into an empty private directory, renamed into place when it returns; an
    exception removes it. Concurrent callers serialise on a lock file and the later ones reuse
    the first one's result."""
    root = cache_dir("arrow")
    final = root / f"{kind}-v{CACHE_FORMAT}-{key}"
    if final.is_dir():
        return final
    with open(root / f".{final.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if final.is_dir():
            return final
        tmp = root / f".{final.name}.tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        try:
            build(tmp)
            os.rename(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return final


class TableWriter:
    """Rows appended one at a time, written as an Arrow IPC stream in :data:`BATCH_ROWS` batches."""

    def __init__(self, path: Path, schema: pa.Schema):
        self.schema = schema
        self.rows = 0
        self._columns: list[list] = [[] for _ in schema.names]
        self._sink = pa.OSFile(str(path), "wb")
        self._writer = pa.ipc.new_stream(self._sink, schema)

    def add(self, *values) -> None:
        for column, value in zip(self._columns, values, strict=True):
            column.append(value)
        self.rows += 1
        if len(self._columns[0]) == BATCH_ROWS:
            self._flush()

    def _flush(self) -> None:
        if self._columns[0]:
            self._writer.write_batch(pa.record_batch(self._columns, schema=self.schema))
            self._columns = [[] for _ in self.schema.names]

    def close(self) -> None:
        self._flush()
        self._writer.close()
        self._sink.close()

    def __enter__(self) -> TableWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def write_table(path: Path, table: pa.Table) -> None:
    """Write ``table`` as one IPC stream, re-chunked to :data:`BATCH_ROWS` rows per batch."""
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
        for batch in table.to_batches(max_chunksize=BATCH_ROWS):
            writer.write_batch(batch)


def open_table(path: Path) -> pa.Table:
    """A memory-mapped, zero-copy view of an IPC stream file written by this module."""
    return pa.ipc.open_stream(pa.memory_map(str(path), "r")).read_all()


def string_buffers(array: pa.Array) -> tuple[np.ndarray, memoryview]:
    """Offsets (int64) and the data bytes of a ``large_string`` array, without copying."""
    if len(array) == 0:
        return np.zeros(1, dtype=np.int64), memoryview(b"")
    _, offsets, data = array.buffers()[:3]
    offsets = np.frombuffer(offsets, dtype=np.int64)[array.offset : array.offset + len(array) + 1]
    return offsets, memoryview(data) if data is not None else memoryview(b"")


def int64_values(column: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """The values of a null-free int64 column as numpy, zero-copy for one chunk (Arrow's own
    ``to_numpy`` imports pandas: ~0.5 s and ~30 MB that a stage need not pay)."""
    chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
    parts = [
        np.frombuffer(c.buffers()[1], dtype=np.int64)[c.offset : c.offset + len(c)] for c in chunks if len(c)
    ]
    if not parts:
        return np.zeros(0, dtype=np.int64)
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


class StringColumn:
    """Random access to one ``large_string`` column of a mapped table, decoding one value at a
    time straight from the buffers (a Python ``int`` per offset via ``memoryview``, no Arrow
    scalar objects); each chunk's views are made on its first use."""

    def __init__(self, column: pa.ChunkedArray):
        self._chunks = column.chunks
        if any(len(chunk) != BATCH_ROWS for chunk in self._chunks[:-1]):
            raise ValueError(f"not a cache column: chunks must hold {BATCH_ROWS} rows each")
        self._views: list[tuple[memoryview, memoryview] | None] = [None] * len(self._chunks)

    def _view(self, chunk: int) -> tuple[memoryview, memoryview]:
        view = self._views[chunk]
        if view is None:
            offsets, data = string_buffers(self._chunks[chunk])
            view = self._views[chunk] = (memoryview(offsets).cast("B").cast("q"), data)
        return view

    def bytes_at(self, row: int) -> bytes:
        chunk, position = divmod(row, BATCH_ROWS)
        offsets, data = self._view(chunk)
        return bytes(data[offsets[position] : offsets[position + 1]])

    def __getitem__(self, row: int) -> str:
        return self.bytes_at(row).decode("utf-8")


class IdIndex:
    """id -> row by binary search over a sorted, memory-mapped copy of the id column.

    The index file holds the ids sorted by their UTF-8 bytes (``_id``, one contiguous chunk)
    and the row each came from (``row``). A lookup compares ~log2(n) byte strings read straight
    from the mapped file; nothing is loaded up front."""

    FILE = "index.arrow"

    def __init__(self, directory: Path):
        table = open_table(directory / self.FILE)
        ids = table.column("_id")
        self._ids = ids.chunk(0) if ids.num_chunks else pa.nulls(0, pa.large_string())
        offsets, self._data = string_buffers(self._ids)
        self._offsets = memoryview(np.ascontiguousarray(offsets)).cast("B").cast("q")
        rows = table.column("row")
        self._rows = int64_values(rows)
        self._row_view = memoryview(self._rows).cast("B").cast("q")

    @staticmethod
    def write(directory: Path, ids: pa.ChunkedArray | pa.Array) -> None:
        import pyarrow.compute as pc

        order = pc.sort_indices(ids)
        sorted_ids = pc.take(ids, order)
        if isinstance(sorted_ids, pa.ChunkedArray):
            sorted_ids = sorted_ids.combine_chunks()
        table = pa.table({"_id": sorted_ids.cast(pa.large_string()), "row": order.cast(pa.int64())})
        with (
            pa.OSFile(str(directory / IdIndex.FILE), "wb") as sink,
            pa.ipc.new_stream(sink, table.schema) as w,
        ):
            w.write_table(table, max_chunksize=max(len(table), 1))

    @property
    def rows(self) -> np.ndarray:
        """The row of each id in sorted-id order (memory-mapped)."""
        return self._rows

    def find(self, key: str) -> int:
        """The row of ``key``, or -1."""
        target = key.encode("utf-8")
        offsets, data = self._offsets, self._data
        low, high = 0, len(self._rows)
        while low < high:
            middle = (low + high) // 2
            if bytes(data[offsets[middle] : offsets[middle + 1]]) < target:
                low = middle + 1
            else:
                high = middle
        if low < len(self._rows) and bytes(data[offsets[low] : offsets[low + 1]]) == target:
            return self._row_view[low]
        return -1

    def find_many(self, keys: pa.Array | pa.ChunkedArray | Iterable[str]) -> np.ndarray:
        """Rows of many keys at once (-1 where absent), vectorised in Arrow's C++ hash join."""
        import pyarrow.compute as pc

        if not isinstance(keys, pa.Array | pa.ChunkedArray):
            keys = pa.array(list(keys), pa.large_string())
        if len(keys) == 0:
            return np.zeros(0, dtype=np.int64)
        positions = pc.index_in(keys.cast(pa.large_string()), value_set=self._ids)
        if isinstance(positions, pa.ChunkedArray):
            positions = positions.combine_chunks()
        found = int64_values(positions.fill_null(-1).cast(pa.int64()))
        return np.where(found >= 0, self._rows[np.maximum(found, 0)] if len(self._rows) else -1, -1)
