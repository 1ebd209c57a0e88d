"""Content digests of files and directory trees, and the JSON form of configs and manifests.

Every byte of an input counts: :func:`sha256_tree` hashes the full content of every file (an edit
in the middle of a 20 GB corpus is seen), and a large file's digest is remembered while its stat is
unchanged, so an unchanged corpus is read once. :func:`json_safe` and :func:`config_to_dict` give
the standard-JSON form in which configs are fingerprinted and manifests written.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from synthq.runtime.file_digests import content_digest


def sha256_file(path: Path, chunk_size: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(chunk_size):
            digest.update(chunk)
    return digest.hexdigest()


LARGE_FILE_BYTES = 16 << 20


def file_digest(path: Path) -> str:
    """sha256 of a file's whole content. A large file's digest is remembered while its stat
    (device, inode, size, mtime, ctime) is unchanged (:func:`synthq.runtime.file_digests.content_digest`,
    the memo the Arrow cache keys its tables by) — so an unchanged multi-GB corpus is read once, not
    on every up-to-date check."""
    path = Path(path)
    if path.stat().st_size <= LARGE_FILE_BYTES:
        return sha256_file(path)
    return content_digest(path)


def sha256_tree(root: Path, exclude: Iterable[str] = ()) -> str:
    """One digest for a directory: relative paths and full contents of all files, sorted.

    Every byte counts (an edit in the middle of a 20 GB corpus is seen); files over 16 MiB
    have their digest remembered (see :func:`file_digest`)."""
    excluded = set(exclude)
    digest = hashlib.sha256()
    for path in sorted(p for p in Path(root).rglob("*") if p.is_file()):
        rel = path.relative_to(root).as_posix()
        if rel in excluded or rel.startswith(".") or "/." in rel:
            continue
        digest.update(rel.encode())
        digest.update(file_digest(path).encode())
    return digest.hexdigest()


def json_default(value: Any) -> Any:
    """``default=`` for :func:`json.dumps`: a path as its string, a pydantic model as its JSON dump."""
    if isinstance(value, Path):
        return str(value)
    if hasattr(value, "model_dump"):
        return value.model_dump(mode="json")
    raise TypeError(f"cannot serialise {type(value).__name__} into a manifest")


def json_safe(value: Any) -> Any:
    """Replace non-finite floats by the strings "inf", "-inf", "nan" so manifests are standard
    JSON (ε = ∞ is common); synthq's readers turn them back into floats."""
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    return value


def config_to_dict(config: Any) -> dict:
    if config is None:
        return {}
    if hasattr(config, "model_dump"):
        return json_safe(config.model_dump(mode="json"))
    return json_safe(json.loads(json.dumps(dict(config), default=json_default)))
