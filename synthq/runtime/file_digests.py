"""File digests remembered the way git's index remembers them: the full sha256 of a file's bytes,
recomputed only when its stat changes.

Re-reading gigabytes at every stage start is avoided by remembering the digest together with the
file's device, inode, size, mtime and ctime, and recomputing it whenever any of them differs.
ctime cannot be set back by user tools, so an edit anywhere in the file (even one that restores
the size and mtime) forces a new digest; a file changed within :data:`RACY_SECONDS` of being
hashed is never remembered (the "racy git" rule: a second write in the same clock tick would
leave the stat unchanged). The Arrow cache (:mod:`synthq.data.store`) keys its tables by these
digests and artifact hashing (:mod:`synthq.runtime.hashing`) reads large files through them:
one memo for both, under ``$SYNTHQ_CACHE/arrow/digests/``.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

from synthq.runtime.errors import DataError
from synthq.runtime.paths import cache_dir

# A file whose mtime or ctime is this recent when hashed gets no remembered digest.
RACY_SECONDS = 2.0
HASH_CHUNK = 1 << 20


def file_sha256(path: Path) -> str:
    """sha256 of every byte of ``path``, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _stat_key(stat: os.stat_result) -> list[int]:
    return [stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns]


def _memo_path(path: Path) -> Path:
    name = hashlib.sha256(str(path.resolve()).encode()).hexdigest()
    return cache_dir("arrow", "digests") / f"{name}.json"


def content_digest(path: Path) -> str:
    """The full sha256 of ``path``, remembered while its stat (size, inode, mtime, ctime) is unchanged."""
    path = Path(path)
    if not path.is_file():
        raise DataError("file not found", path)
    memo = _memo_path(path)
    stat = path.stat()
    try:
        remembered = json.loads(memo.read_text(encoding="utf-8"))
        if remembered["stat"] == _stat_key(stat):
            return remembered["sha256"]
    except (OSError, ValueError, KeyError, TypeError):
        pass
    digest = file_sha256(path)
    remember_digest(path, stat, digest)
    return digest


def remember_digest(path: Path, stat: os.stat_result, digest: str) -> None:
    """Store ``digest`` for ``path`` unless the file changed too recently to trust its stat."""
    racy = time.time() - max(stat.st_mtime, stat.st_ctime) < RACY_SECONDS
    if racy or _stat_key(path.stat()) != _stat_key(stat):
        return
    memo = _memo_path(path)
    tmp = memo.with_name(f"{memo.name}.{os.getpid()}.tmp")
    tmp.write_text(
        json.dumps({"path": str(path), "stat": _stat_key(stat), "sha256": digest}), encoding="utf-8"
    )
    os.replace(tmp, memo)
