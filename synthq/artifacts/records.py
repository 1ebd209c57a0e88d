"""Lineage records: how an artifact names each input it read, and what that input's hash is now.

An input is another artifact (identified by the sha256 of its manifest,
:meth:`synthq.artifacts.manifest.Artifact.input_record`), a data directory (the sha256 of its
whole tree) or a single public file. Private data is identified by a keyed digest, never by its
plain sha256.
"""

from __future__ import annotations

from pathlib import Path

from synthq.artifacts.hashing import file_digest, sha256_file, sha256_tree
from synthq.artifacts.manifest import MANIFEST
from synthq.privacy.keys import private_data_digest
from synthq.runtime.errors import DataError


def data_input_record(path: Path, name: str | None = None, private: bool = False) -> dict:
    """Lineage entry for a plain data directory (a BEIR dir that is not an artifact).

    Private data is identified by a keyed digest (:func:`synthq.privacy.keys.private_data_digest`), never
    by its plain sha256, which anyone holding candidate datasets could test."""
    path = Path(path)
    digest = sha256_tree(path)
    record = {"path": str(path), "kind": "data", "name": name or path.name, "sha256": digest}
    if private:
        record.update(sha256=private_data_digest(digest), private=True)
    return record


def public_file_record(path: Path, name: str) -> dict:
    """Lineage entry for a public file a stage reads (a corpus, a document list)."""
    if not Path(path).is_file():
        raise DataError("no such file", Path(path))
    return {"path": str(path), "kind": "data", "name": name, "sha256": file_digest(Path(path))}


def current_input_hash(record: dict) -> str | None:
    """The sha256 an input recorded in a manifest has *now* (None if it is gone)."""
    path = Path(record["path"])
    if record.get("kind") == "artifact":
        return sha256_file(path / MANIFEST) if (path / MANIFEST).is_file() else None
    if path.is_file():  # a single input file, e.g. a public corpus or document list
        return file_digest(path)
    if not path.is_dir():
        return None
    keyed = record.get("private") or str(record.get("sha256", "")).startswith("hmac:")
    return private_data_digest(sha256_tree(path)) if keyed else sha256_tree(path)
