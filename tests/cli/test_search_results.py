"""`synthq search` prints the top k documents with their scores."""

from __future__ import annotations

import json

from tests.helpers import run_main


def test_search_prints_top_k_with_scores(tiny_encoder_dir, tiny_beir, capsys, monkeypatch):
    import numpy as np

    from synthq.models.encoder import load_encoder
    from tests.helpers import corpus_records

    query = "how long to boil an egg"
    argv = ["search", "--retriever", str(tiny_encoder_dir), "--corpus", str(tiny_beir), "--top-k", "3",
            "--json", "--device", "cpu", query]  # fmt: skip
    status, output = run_main(argv, capsys, monkeypatch)
    assert status == 0, output
    hits = [json.loads(line) for line in output.splitlines() if line.startswith("{")]
    # independent: cosine similarity of the encoder's own embeddings over the whole corpus
    records = corpus_records()
    ids = sorted(records)
    model = load_encoder(str(tiny_encoder_dir), device="cpu")
    docs = model.encode(
        [f"{records[i]['title']} {records[i]['text']}" for i in ids], normalize_embeddings=True
    )
    q = model.encode([query], normalize_embeddings=True)[0]
    scores = docs @ q
    best = [ids[i] for i in np.argsort(-scores)[:3]]
    assert [h["doc_id"] for h in hits] == best and [h["rank"] for h in hits] == [1, 2, 3]
    assert np.allclose([h["score"] for h in hits], np.sort(scores)[::-1][:3], atol=1e-4)
