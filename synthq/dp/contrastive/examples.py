"""What the direct-DP retriever mechanisms read: the examples of a Poisson-sampled batch, the
encoder as a function of texts, and the augmentation group clipping draws its extra negatives
with. The family, its privacy unit and each mechanism's sensitivity: :mod:`synthq.dp.contrastive`."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

import torch

Encode = Callable[[list[str], str], torch.Tensor]  # (texts, "query"|"doc") -> normalised embeddings


@dataclass(frozen=True)
class Example:
    """One training pair as the mechanisms see it.

    ``unit_id`` is the stable id of the example's privacy unit (its query id, or its user id under
    the user unit): it keys the example's secret random draws (group assignment), so no other
    unit's presence can change them and all rows of one unit share them. ``weight`` is ``1/k``
    for a unit with ``k`` pairs."""

    query: str
    document: str
    doc_id: str
    unit_id: str = ""
    weight: float = 1.0


def on_cpu(model: torch.nn.Module) -> bool:
    return next(model.parameters()).device.type == "cpu"


def augment(text: str, rng: random.Random, drop: float = 0.2) -> str:
    """A meaning-preserving perturbation: drop ~20% of words and swap one adjacent pair."""
    words = text.split()
    kept = [w for w in words if rng.random() >= drop] or words[:1]
    if len(kept) > 2:
        i = rng.randrange(len(kept) - 1)
        kept[i], kept[i + 1] = kept[i + 1], kept[i]
    return " ".join(kept)
