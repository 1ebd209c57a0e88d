"""Where synthq keeps caches (downloaded datasets, converted models, embeddings)."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir(*parts: str) -> Path:
    """``$SYNTHQ_CACHE`` (default ``~/.cache/synthq``) joined with ``parts``, created on demand."""
    root = Path(os.environ.get("SYNTHQ_CACHE") or Path.home() / ".cache" / "synthq")
    path = root.joinpath(*parts)
    path.mkdir(parents=True, exist_ok=True)
    return path
