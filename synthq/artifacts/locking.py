"""Output safety: the lock held on an output while it is written, and what an output may replace.

:func:`output_lock` takes an exclusive ``flock`` beside the output, so two processes never write
the same ``--out``. :func:`check_output_free` refuses an output that is an input of the same
command or lies inside one, and any existing directory that synthq did not write: only artifacts
are ever replaced.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterable, Iterator
from pathlib import Path

from synthq.artifacts.manifest import MANIFEST, SCHEMA_VERSION, STAGES
from synthq.runtime.errors import ArtifactError


def lock_path(out: Path) -> Path:
    out = Path(out)
    return out.parent / f".{out.name}.lock"


@contextlib.contextmanager
def output_lock(out: str | Path) -> Iterator[None]:
    """An exclusive ``flock`` on ``.<name>.lock`` beside the output, held while a stage writes it.

    A second process on the same ``--out`` fails at once with an error naming the holder (pid
    and host, written into the lock file). The lock dies with its process (a SIGKILL frees it);
    the file is removed on release, and a taker re-checks it locked the file still in place."""
    import fcntl
    import socket

    path = lock_path(Path(out))
    while True:
        handle = open(path, "a+", encoding="utf-8")  # noqa: SIM115 (held until the finally below)
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "another process"
            handle.close()
            raise being_written(out, holder) from None
        try:
            same = os.fstat(handle.fileno()).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        handle.close()  # the holder released and removed the file between our open and lock
    try:
        handle.truncate(0)
        handle.write(f"synthq pid {os.getpid()} on {socket.gethostname()}\n")
        handle.flush()
        yield
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)
        handle.close()


def being_written(out: str | Path, holder: str) -> ArtifactError:
    return ArtifactError(
        f"{out}: is being written by {holder}; wait for it to finish or choose another --out"
    )


def lock_holder(out: str | Path) -> str | None:
    """Who holds the lock on ``out`` now (``synthq pid N on HOST``), or ``None`` when no process
    is writing it: a checkpoint beside a running job is not an interrupted run's."""
    import fcntl

    try:
        handle = open(lock_path(Path(out)), encoding="utf-8")  # noqa: SIM115 (closed below)
    except OSError:
        return None
    with handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return handle.read().strip() or "another process"
        fcntl.flock(handle, fcntl.LOCK_UN)
    return None


def _overlaps(out: Path, other: Path) -> bool:
    """Whether replacing ``out`` would delete or replace ``other`` (the same path or inside it)."""
    out, other = out.resolve(), Path(other).resolve()
    return other == out or out in other.parents


def check_output_free(out: str | Path, force: bool, inputs: Iterable[dict] = ()) -> None:
    """Refuse to write ``out`` where that would lose something.

    ``out`` may not be (or contain) an input of the same command, nor lie inside one (an
    artifact or dataset directory would change under its own manifest or digest), even with
    ``--force``; an existing directory is replaced only with ``--force`` and only when it is a
    synthq artifact (its manifest says so): a user's directory or dataset is never deleted."""
    out = Path(out)
    for record in inputs:
        if _overlaps(out, Path(record["path"])):
            raise ArtifactError(
                f"{out}: is an input of this command ({record['path']}); choose another --out"
            )
        inside = Path(record["path"]).resolve()
        if inside.is_dir() and inside in out.resolve().parents:
            raise ArtifactError(
                f"{out}: is inside an input of this command ({record['path']}); choose an --out outside it"
            )
    holder = artifact_holding(out)
    if holder is not None:
        raise ArtifactError(
            f"{out}: is inside the artifact {holder}; a --force of that artifact's stage would delete "
            "it, choose an --out outside it"
        )
    if not out.exists() and not out.is_symlink():
        return
    if not out.is_dir() or out.is_symlink():
        raise ArtifactError(f"{out}: exists and is not an artifact directory; choose another --out")
    if not _is_synthq_manifest(out):
        contents = (
            "an empty directory" if not any(out.iterdir()) else "a directory that is not a synthq artifact"
        )
        raise ArtifactError(
            f"{out}: is {contents}; synthq replaces only its own artifacts, choose another --out"
        )
    if not force:
        raise ArtifactError(
            f"{out}: already holds an artifact made with a different config or inputs; "
            "pass --force to replace it"
        )


def artifact_holding(path: str | Path) -> Path | None:
    """The synthq artifact directory ``path`` lies inside (a parent with a synthq manifest), or
    None: what is written there is deleted with that artifact when its stage runs with --force."""
    for parent in Path(path).resolve().parents:
        if _is_synthq_manifest(parent):
            return parent
    return None


def _is_synthq_manifest(path: Path) -> bool:
    try:
        manifest = json.loads((path / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return (
        isinstance(manifest, dict)
        and manifest.get("schema") == SCHEMA_VERSION
        and manifest.get("stage") in STAGES
    )
