"""The LoRA learning check: a run whose trainable weights did not move fails in one line; the
movement and the public held-out loss are measured, against independent computations."""

from __future__ import annotations

import pytest
import torch

from synthq.dp.lm.learning_check import (
    NotLearningError,
    held_out_loss,
    movement,
    require_movement,
    snapshot,
)
from synthq.models.generator import QueryGenerator, apply_lora
from tests.helpers import corpus_records, tiny_causal


def test_movement_counts_changed_tensors_and_the_relative_change():
    weights = [torch.nn.Parameter(torch.ones(3)), torch.nn.Parameter(torch.zeros(2))]
    before = snapshot(weights)
    assert movement(before, weights).changed == 0
    with torch.no_grad():
        weights[1] += torch.tensor([3.0, 4.0])  # a LoRA B matrix starts at zero
    found = movement(before, weights)
    assert (found.changed, found.tensors) == (1, 2)
    assert found.relative == pytest.approx(5.0 / 3**0.5)  # ‖Δ‖ = 5 over ‖θ₀‖ = √3
    # from all-zero weights the relative change is the norm itself
    zeros = [torch.nn.Parameter(torch.zeros(2))]
    start = snapshot(zeros)
    with torch.no_grad():
        zeros[0] += torch.tensor([0.6, 0.8])
    assert movement(start, zeros).relative == pytest.approx(1.0)


def test_a_run_that_moved_nothing_is_refused_in_one_line():
    weights = [torch.nn.Parameter(torch.ones(3))]
    frozen = movement(snapshot(weights), weights)
    with pytest.raises(NotLearningError) as raised:
        require_movement(frozen, steps=8, what="LoRA adapters")
    message = str(raised.value)
    assert "\n" not in message
    assert "none of the 1 trainable tensors (LoRA adapters) changed in 8 steps" in message
    require_movement(frozen, steps=0, what="LoRA adapters")  # nothing to learn from: not an error


def test_lora_adapters_move_after_one_optimizer_step_and_the_held_out_loss_matches_a_plain_forward(tmp_path):
    generator = QueryGenerator.load(tiny_causal(tmp_path / "lm"), max_source_length=32)
    apply_lora(generator, rank=2)
    trainable = [p for p in generator.model.parameters() if p.requires_grad]
    before = snapshot(trainable)
    documents = [d["text"] for d in list(corpus_records().values())[:4]]
    queries = ["what is it", "where is it", "who made it", "when was it"]
    loss_before = held_out_loss(generator, documents, queries, 16)
    # independent: the model's own mean cross-entropy, one pair at a time (no padding involved)
    expected = []
    generator.model.eval()
    with torch.no_grad():
        for document, query in zip(documents, queries, strict=True):
            batch = generator.training_batch([document], [query], 16)
            expected.append(float(generator.model(**batch).loss))
    assert loss_before == pytest.approx(sum(expected) / len(expected), rel=1e-4)
    assert generator.model.training is False  # restored as it was

    generator.model.train()
    optimizer = torch.optim.SGD(trainable, lr=0.5)
    batch = generator.training_batch(documents, queries, 16)
    generator.model(**batch).loss.backward()
    optimizer.step()
    found = movement(before, trainable)
    assert found.changed > 0 and found.relative > 0
    assert generator.model.training  # held_out_loss keeps the mode it found
    assert held_out_loss(generator, documents, queries, 16) != loss_before
