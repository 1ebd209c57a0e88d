"""Hard negatives mined by the starting encoder: what is mined (never a positive, never a near-tie,
best first, the same in any chunking), and the in-batch softmax that uses them, against
:func:`synthq.models.encoder.in_batch_softmax_loss` computed independently."""

from __future__ import annotations

import pytest
import torch
from pydantic import ValidationError

from synthq.dp.contrastive.examples import Example
from synthq.models.encoder import embed, in_batch_softmax_loss, load_encoder, training_loss
from synthq.retrieval.hard_negatives import mine_hard_negatives
from synthq.stages import train_retriever
from synthq.stages.train_retriever import _in_batch_loss
from tests.helpers import retriever_config

# Unit vectors at known angles: the query "q" scores cos(angle) against each document.
ANGLES = {"pos": 0.10, "tie": 0.12, "near": 0.50, "mid": 0.90, "far": 1.40, "other-pos": 0.40}


def _vector(angle: float) -> torch.Tensor:
    return torch.tensor([[float(torch.cos(torch.tensor(angle))), float(torch.sin(torch.tensor(angle)))]])


def encode_documents(texts: list[str]) -> torch.Tensor:
    return torch.cat([_vector(ANGLES[t]) for t in texts])


def encode_queries(texts: list[str]) -> torch.Tensor:
    return torch.cat([_vector(0.0) for _ in texts])


CORPUS = {name: name for name in ANGLES}  # id == text


@pytest.mark.parametrize("chunk", [1, 2, 100])
def test_mined_negatives_skip_positives_and_near_ties_best_first(chunk):
    negatives = mine_hard_negatives(
        encode_queries, encode_documents, ["q", "q"], [{"pos"}, {"pos", "other-pos"}], CORPUS, count=2,
        relative_margin=0.95, chunk=chunk,
    )  # fmt: skip
    # cos(0.12) ≥ 0.95 cos(0.10): "tie" is a likely false negative and is skipped
    assert negatives[0] == ["other-pos", "near"]  # a document judged for another query is fair game
    assert negatives[1] == ["near", "mid"]


def test_depth_bounds_the_candidates_and_count_zero_mines_nothing():
    shallow = mine_hard_negatives(
        encode_queries, encode_documents, ["q"], [{"pos"}], CORPUS, count=5, relative_margin=0.95, depth=2
    )
    assert shallow == [["other-pos"]]  # the top 2 + 1 candidates: pos, tie (skipped), other-pos
    assert mine_hard_negatives(encode_queries, encode_documents, ["q"], [{"pos"}], CORPUS, count=0) == [[]]


@pytest.mark.parametrize("chunk", [1, 4, 100])
def test_every_document_is_encoded_once(chunk):
    """The positives' scores reuse the mining pass's embeddings: on MS MARCO a second encoding of
    the judged documents costs as much as training on them."""
    seen: list[str] = []

    def counting(texts: list[str]) -> torch.Tensor:
        seen.extend(texts)
        return encode_documents(texts)

    mine_hard_negatives(
        encode_queries, counting, ["q", "q"], [{"pos"}, {"pos", "other-pos"}], CORPUS, 2, chunk=chunk
    )
    assert sorted(seen) == sorted(CORPUS)


def test_the_loss_with_negatives_is_the_in_batch_softmax_over_positives_and_negatives(tiny_encoder_dir):
    encoder = load_encoder(tiny_encoder_dir)
    encoder.eval()
    batch = [
        Example("boil an egg", "Boil eggs for nine minutes.", "d1"),
        Example("rebase", "Git rebase replays commits.", "d2"),
        Example("sleep hours", "Adults need seven hours of sleep.", "d3"),
    ]
    negatives = [["Fry an egg in butter."], ["Git merge joins histories."], ["Cats sleep all day."]]
    config = retriever_config("x", "unused", tiny_encoder_dir, max_query_length=16, max_doc_length=16)
    loss = _in_batch_loss(encoder, training_loss(encoder, 0.05), batch, config, negatives)
    with torch.no_grad():
        queries = embed(encoder, [e.query for e in batch], 16)
        documents = embed(encoder, [e.document for e in batch] + [n[0] for n in negatives], 16)
    expected = in_batch_softmax_loss(queries, documents, 0.05)
    torch.testing.assert_close(loss.detach(), expected, atol=1e-5, rtol=1e-4)
    without = _in_batch_loss(encoder, training_loss(encoder, 0.05), batch, config, [[], [], []])
    assert float(without) < float(loss)  # more candidates, a harder softmax


def test_training_with_hard_negatives_runs_and_is_refused_with_dp(
    tmp_path, tiny_beir, tiny_encoder_dir, capsys, monkeypatch
):
    from synthq.runtime import console

    monkeypatch.setenv("SYNTHQ_PROGRESS_INTERVAL", "0")
    monkeypatch.setattr(console.console, "_force_terminal", False)
    artifact = train_retriever.run(
        retriever_config(tmp_path / "ret", tiny_beir, tiny_encoder_dir, hard_negatives=2, max_steps=2)
    )
    assert artifact.config["hard_negatives"] == 2 and artifact.manifest["metrics"]["steps"] == 2
    # mining shows its progress: every document of the corpus encoded once
    documents = sum(1 for line in (tiny_beir / "corpus.jsonl").read_text().splitlines() if line.strip())
    mining = [
        line for line in capsys.readouterr().err.splitlines() if line.startswith("mining hard negatives (")
    ]
    assert mining and mining[-1].split(": ")[1].startswith(f"{documents}/{documents} (100%)")
    with pytest.raises(ValidationError, match="--hard-negatives is for non-private training"):
        retriever_config(tmp_path / "dp", tiny_beir, tiny_encoder_dir, hard_negatives=1, dp="group")
