"""Shared by the contrastive DP tests: the tiny training pairs and a dropout-free tiny encoder."""

from __future__ import annotations

import pytest
import torch

from synthq.dp.contrastive.examples import Example
from synthq.models.encoder import load_encoder
from tests.helpers import TRAIN_QUERIES, corpus_records

CORPUS = corpus_records()
EXAMPLES = [
    Example(query, CORPUS[doc]["text"], doc, f"q{index}")
    for index, (doc, query) in enumerate((d, q) for d, qs in TRAIN_QUERIES.items() for q in qs)
]


@pytest.fixture(scope="module")
def encoder(tiny_encoder_dir):
    torch.manual_seed(0)
    model = load_encoder(tiny_encoder_dir)
    model.eval()  # no dropout: neighbouring batches must see the same function
    return model
