"""Progress inside a logical step: a DP step (and a non-private one) reports each micro-batch, so a
step that takes minutes on a CPU still moves the progress bar and its ETA."""

from __future__ import annotations

import torch

from synthq.dp.engine import PrivacyPlan
from synthq.dp.lm.step import DPStep
from synthq.dp.noise import SecretRandomness
from synthq.models.generator import QueryGenerator
from synthq.models.training_step import non_private_step
from tests.helpers import TRAIN_QUERIES, corpus_records

CORPUS = corpus_records()
PAIRS = [(CORPUS[doc]["text"], query) for doc, queries in TRAIN_QUERIES.items() for query in queries]


def setup(path):
    torch.manual_seed(0)
    generator = QueryGenerator.load(path, max_source_length=32)
    generator.model.train()
    optimizer = torch.optim.SGD([p for p in generator.model.parameters() if p.requires_grad], lr=1e-3)

    def make_batch(rows):
        return generator.training_batch([PAIRS[i][0] for i in rows], [PAIRS[i][1] for i in rows], 16)

    return generator, optimizer, make_batch


def test_a_dp_step_reports_every_micro_batch(tiny_causal_dir):
    generator, optimizer, make_batch = setup(tiny_causal_dir)
    plan = PrivacyPlan.with_noise(1.0, 0.1, expected_batch_size=5)
    step = DPStep(generator, optimizer, plan, physical_batch_size=2, grad_sample_mode="ghost")
    calls = []
    step.step(make_batch, [0, 1, 2, 3, 4], [1.0] * 5, SecretRandomness(seed=0), lambda *a: calls.append(a))
    assert calls == [(2, 5), (4, 5), (5, 5)]


def test_a_non_private_step_reports_every_micro_batch(tiny_causal_dir):
    generator, optimizer, make_batch = setup(tiny_causal_dir)
    calls = []
    non_private_step(generator, optimizer, make_batch, [0, 1, 2, 3, 4, 5, 6], 3, lambda *a: calls.append(a))
    assert calls == [(3, 7), (6, 7), (7, 7)]
