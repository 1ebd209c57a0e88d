"""BM25 via bm25s against the Lucene formula computed by hand."""

from __future__ import annotations

import math

import pytest

from synthq.retrieval.bm25 import K1, B, bm25_search
from synthq.runtime.errors import DataError

CORPUS = {
    "d1": {"title": "", "text": "cats chase mice and cats sleep"},
    "d2": {"title": "", "text": "dogs chase cats"},
    "d3": {"title": "", "text": "birds sing songs in spring mornings"},
    "d4": {"title": "Mice", "text": "field mice eat seeds"},
}


def _lucene(query: list[str]) -> dict[str, float]:
    # Tokens as bm25s makes them: lowercase words, English stopwords ("and", "in") removed.
    docs = {
        "d1": ["cats", "chase", "mice", "cats", "sleep"],
        "d2": ["dogs", "chase", "cats"],
        "d3": ["birds", "sing", "songs", "spring", "mornings"],
        "d4": ["mice", "field", "mice", "eat", "seeds"],
    }
    n, avgdl = len(docs), sum(len(t) for t in docs.values()) / len(docs)
    scores = {}
    for doc_id, tokens in docs.items():
        score = 0.0
        for term in query:
            df = sum(term in t for t in docs.values())
            tf = tokens.count(term)
            idf = math.log(1 + (n - df + 0.5) / (df + 0.5))
            score += idf * tf / (tf + K1 * (1 - B + B * len(tokens) / avgdl))
        if score > 0:
            scores[doc_id] = score
    return dict(sorted(scores.items(), key=lambda x: -x[1]))


def test_scores_equal_the_lucene_formula():
    results = bm25_search(CORPUS, {"q1": "cats and mice", "q2": "mice"}, top_k=10)
    for query_id, terms in (("q1", ["cats", "mice"]), ("q2", ["mice"])):
        expected = _lucene(terms)
        assert list(results[query_id]) == list(expected)
        assert list(results[query_id].values()) == pytest.approx(list(expected.values()), rel=1e-5)


def test_no_match_returns_nothing_and_identical_ids_are_dropped():
    results = bm25_search(CORPUS, {"q": "the and of", "d2": "dogs chase cats"}, top_k=2)
    assert results["q"] == {}  # stopwords only: no document shares a term
    kept = bm25_search(CORPUS, {"d2": "dogs chase cats"}, top_k=2)
    assert next(iter(kept["d2"])) == "d2"
    dropped = bm25_search(CORPUS, {"d2": "dogs chase cats"}, top_k=2, ignore_identical_ids=True)
    assert list(dropped["d2"]) == ["d1"]  # the one other document sharing a term
    with pytest.raises(DataError, match="corpus is empty"):
        bm25_search({}, {"q": "x"}, top_k=2)
