"""A stage's private, resumable checkpoint: written atomically beside the partial artifact, refused
on resume when the settings or the inputs changed.

A checkpoint holds what only the interrupted run knew (weights and optimizer, a population, the
secret randomness), the config and the identifiers of the inputs it read; it lives in the
artifact's ``.partial/checkpoints/`` and is never part of the released artifact.
:func:`save_checkpoint` writes through a temporary file renamed into place, so a crash or a full
disk leaves either the previous checkpoint or the new one, never a cut-off copy (the cut-off
temporary is removed: it is no checkpoint, and a full disk needs the space).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from synthq.artifacts.freshness import check_resumable
from synthq.runtime.hashing import config_to_dict


def save_checkpoint(path: Path, state: dict, config: Any, inputs: list[dict]) -> None:
    """Write ``state`` with the config and the inputs' identifiers to ``path``, atomically."""
    import torch

    state = {
        **state,
        "config": json.dumps(config_to_dict(config), sort_keys=True),
        "inputs": json.dumps(inputs, sort_keys=True),
    }
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "wb") as handle:  # through a Python file: a full disk stays an OSError in the chain
            torch.save(state, handle)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, path)


def load_checkpoint(path: Path, config: Any, inputs: list[dict]) -> dict | None:
    """The checkpoint at ``path`` if there is one, refusing one written with another config or on
    inputs (data, starting model) whose content has changed since: the accounting of the work
    already done was for the data it read."""
    import torch

    if not path.is_file():
        return None
    state = torch.load(path, map_location="cpu", weights_only=True)
    check_resumable(path, state, config, inputs)
    return state
