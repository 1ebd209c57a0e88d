"""Where synthq keeps caches (downloaded datasets, converted models, embeddings)."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """``$SYNTHQ_CACHE`` (default ``~/.cache/synthq``), not created."""
    return Path(os.environ.get("SYNTHQ_CACHE") or Path.home() / ".cache" / "synthq")


def cache_dir(*parts: str) -> Path:
    """``$SYNTHQ_CACHE`` (default ``~/.cache/synthq``) joined with ``parts``, created on demand."""
    path = cache_root().joinpath(*parts)
    path.mkdir(parents=True, exist_ok=True)
    return path


def recorded_path(path: str | Path) -> str:
    """How a manifest records a path it read or wrote: absolute when it exists, so that the ledger
    and the freshness checks find it again from any working directory; as given otherwise (a hub
    id is not a path). Symbolic links are kept, not resolved: a link's target is not what the user
    named, and may name more than they meant to publish."""
    candidate = Path(path).expanduser()
    return os.path.abspath(candidate) if candidate.exists() else str(path)


def recorded_location(recorded: str | Path, artifact_dir: str | Path, out: str | Path | None = None) -> Path:
    """Where a path recorded in the manifest of ``artifact_dir`` is now. New manifests record
    absolute paths. Older ones recorded them as given, relative to the directory the command ran
    in: that directory is recovered from the artifact's own recorded ``out`` when it is a suffix
    of where the artifact is now (``runs/demo/gen`` in ``/repo/runs/demo/gen`` ran in ``/repo``),
    else it is taken to be the current directory, as before."""
    path = Path(recorded).expanduser()
    if path.is_absolute():
        return path
    if out is not None and str(out).strip() and not Path(out).is_absolute():
        here, given = Path(artifact_dir).absolute(), Path(os.path.normpath(out))
        if given.parts and here.parts[-len(given.parts) :] == given.parts:
            return Path(*here.parts[: -len(given.parts)]) / path
    return path
