"""Who wrote each query: user ids for the user privacy unit.

A query log is written by people; under ``--privacy-unit user`` every private query needs the id
of the user who typed it. Two places may hold it, as BEIR-style logs do:

* ``metadata.user_id`` of the query's record in ``queries.jsonl`` (BEIR's own metadata field);
* ``users.tsv`` beside ``queries.jsonl``: ``query-id <TAB> user-id`` rows (an optional header
  row), for logs that keep the mapping apart. When it exists it is the source, and a query whose
  metadata names a different user is an error (the two files disagree).

A query without a user id is an error naming the file and line, never silently "one user per
query": that would turn a user-level claim into a query-level one without saying so.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from synthq.data.arrow_views import Queries
from synthq.data.beir_io import tsv_rows
from synthq.runtime.errors import DataError

USERS_FILE = "users.tsv"


def read_users_file(path: Path) -> dict[str, tuple[str, int]]:
    """``users.tsv`` as ``query id -> (user id, line)``; malformed rows name their line."""
    users: dict[str, tuple[str, int]] = {}
    with open(path, "rb") as handle:
        for number, row in tsv_rows(handle, path):
            columns = [c.strip() for c in row]
            if len(columns) != 2 or not all(columns):
                raise DataError("expected 'query-id<TAB>user-id'", path, number)
            query_id, user_id = columns
            if query_id in users and users[query_id][0] != user_id:
                first = users[query_id][1]
                raise DataError(f"query {query_id!r} is given two users (also on line {first})", path, number)
            users[query_id] = (user_id, number)
    return users


def query_users(
    root: Path, queries: Queries, query_rows: Sequence[int] | np.ndarray, strict: bool = True
) -> list[str]:
    """The user id of each query row (rows of ``queries``), from ``users.tsv`` when the dataset
    has one, else from ``metadata.user_id``; raises :class:`DataError` at the first query
    without one (file and line), or where the two sources disagree. ``strict=False`` gives ""
    for a query without a user instead (for counting)."""
    queries_file = Path(root) / "queries.jsonl"
    mapping_file = Path(root) / USERS_FILE
    mapping = read_users_file(mapping_file) if mapping_file.is_file() else None
    users: list[str] = []
    for row in map(int, query_rows):
        in_metadata = queries.user_at(row)
        if mapping is None:
            if not in_metadata and strict:
                raise DataError(
                    f"query {queries.id_at(row)!r} has no metadata.user_id (the user privacy unit needs "
                    f"every query's user; or give a {USERS_FILE})",
                    queries_file,
                    queries.line_at(row),
                )
            users.append(in_metadata)
            continue
        query_id = queries.id_at(row)
        if query_id not in mapping:
            if not strict:
                users.append("")
                continue
            where = f"{queries_file}:{queries.line_at(row)}"
            raise DataError(f"no user for query {query_id!r} (defined at {where})", mapping_file)
        user, line = mapping[query_id]
        if in_metadata and in_metadata != user:
            raise DataError(
                f"query {query_id!r}: metadata.user_id {in_metadata!r} but {mapping_file.name}:{line} "
                f"says {user!r}",
                queries_file,
                queries.line_at(row),
            )
        users.append(user)
    return users


def has_user_ids(root: Path, queries: Queries) -> bool:
    """Whether the dataset gives user ids at all (a ``users.tsv``, or any query's metadata)."""
    if (Path(root) / USERS_FILE).is_file():
        return True
    column = queries.table.column("user_id")
    return any(value for chunk in column.chunks for value in chunk.to_pylist())


def queries_per_user(users: Sequence[str]) -> dict:
    """Users and how many queries each wrote (min / median / p99 / max), for ``users`` given one
    entry per query ("" = no user id). Statistics of private data: for the data owner, never for
    a release."""
    known = [u for u in users if u]
    counts = np.array(sorted(Counter(known).values()) or [0])
    return {
        "users": len(set(known)),
        "queries_without_user": len(users) - len(known),
        "queries_per_user": {
            "min": int(counts.min()),
            "median": float(np.median(counts)),
            "p99": float(np.percentile(counts, 99)),
            "max": int(counts.max()),
        },
    }
