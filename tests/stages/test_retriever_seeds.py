"""Seeds in a retriever sweep: a seed changes training, is recorded, and eval merges rows that
differ only by seed into one system (mean ± std over seeds)."""

from __future__ import annotations

import json

import torch
from sentence_transformers import SentenceTransformer

from synthq.config.evaluation import EvalConfig
from synthq.config.retriever import TrainRetrieverConfig
from synthq.reporting.systems import systems
from synthq.stages import evaluate, train_retriever


def _weights(path) -> torch.Tensor:
    model = SentenceTransformer(str(path), device="cpu")
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def test_seeds_change_training_are_recorded_and_merge(tmp_path, tiny_beir, tiny_encoder_dir):
    def train(name, seed):
        return train_retriever.run(
            TrainRetrieverConfig(
                data=str(tiny_beir),
                encoder=str(tiny_encoder_dir),
                out=tmp_path / name,
                batch_size=8,
                epochs=1,
                lr=1e-3,
                max_doc_length=64,
                max_query_length=32,
                seed=seed,
            )  # fmt: skip
        )

    first, again, other = train("ret-s0", 0), train("ret-again-s0", 0), train("ret-s1", 1)
    assert (first.config["seed"], other.config["seed"]) == (0, 1)
    assert torch.equal(_weights(first.path), _weights(again.path))  # a seed reproduces its run
    assert not torch.allclose(_weights(first.path), _weights(other.path))  # and another seed differs
    result = evaluate.run(
        EvalConfig(
            retrievers=[str(first.path), str(other.path)],
            datasets=[str(tiny_beir)],
            bm25=False,
            out=tmp_path / "e",
        )  # fmt: skip
    )
    rows = json.loads((result.path / "results.json").read_text())
    assert [r["seed"] for r in rows] == [0, 1] and rows[0]["variant"] == rows[1]["variant"]
    (system,) = systems(rows)
    assert system["retriever"] == "ret (2 seeds)" and system["seeds"] == [0, 1]
    assert "ret (2 seeds)" in (result.path / "results.md").read_text()
