"""Lineage records: how an artifact names each input it read, and what that input's hash is now.

An input is another artifact (identified by the sha256 of its manifest,
:meth:`synthq.artifacts.manifest.Artifact.input_record`), a data directory (the digest of its
whole tree), a read of one public split of a dataset (the digest of what that read reads: corpus,
that split's qrels and queries, :func:`synthq.privacy.digests.public_split_record`), a single public
file, or the judged-document set of a split. Every digest comes from
:func:`synthq.privacy.digests.artifact_digest`: private data is identified by a keyed digest, never
by its plain sha256.
"""

from __future__ import annotations

from pathlib import Path

from synthq.artifacts.manifest import MANIFEST
from synthq.privacy.digests import current_digest, data_record, file_record
from synthq.runtime.errors import DataError
from synthq.runtime.hashing import sha256_file


def data_input_record(path: Path, name: str | None = None, private: bool = False) -> dict:
    """Lineage entry for a plain data directory (a BEIR dir that is not an artifact).

    Private data is identified by a keyed digest (:func:`synthq.privacy.digests.artifact_digest`),
    never by its plain sha256, which anyone holding candidate datasets could test."""
    path = Path(path)
    return data_record(path, name or path.name, private)


def public_file_record(path: Path, name: str) -> dict:
    """Lineage entry for a public file a stage reads (a corpus, a document list)."""
    if not Path(path).is_file():
        raise DataError("no such file", Path(path))
    return file_record(Path(path), name, private=False)


def current_input_hash(record: dict) -> str | None:
    """The sha256 an input recorded in a manifest has *now* (None if it is gone)."""
    path = Path(record["path"])
    if record.get("kind") == "artifact":
        return sha256_file(path / MANIFEST) if (path / MANIFEST).is_file() else None
    # a file, a directory, a public split (by its recorded split) or a judged set, digested as
    # recorded; records written before public-split records existed (a whole directory) still read
    return current_digest(record)
