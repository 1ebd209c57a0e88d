"""Exact chunked search and FAISS against a brute-force numpy ranking."""

from __future__ import annotations

import numpy as np
import pytest

from synthq.retrieval.topk import exact_search, faiss_search


def _normalised(rows: int, dim: int, seed: int) -> np.ndarray:
    vectors = np.random.default_rng(seed).standard_normal((rows, dim)).astype(np.float32)
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


@pytest.fixture(scope="module")
def data():
    queries, docs = _normalised(13, 16, 0), _normalised(257, 16, 1)
    query_ids = [f"q{i}" for i in range(13)]
    doc_ids = [f"d{i}" for i in range(257)]
    return queries, docs, query_ids, doc_ids


def _brute_force(queries, docs, query_ids, doc_ids, k):
    scores = queries @ docs.T
    return {
        q: {doc_ids[j]: float(scores[i, j]) for j in np.argsort(-scores[i], kind="stable")[:k]}
        for i, q in enumerate(query_ids)
    }


@pytest.mark.parametrize("chunk_size", [1, 10, 100, 10_000])
def test_exact_search_equals_brute_force(data, chunk_size):
    expected = _brute_force(*data, k=20)
    ours = exact_search(*data, top_k=20, chunk_size=chunk_size)
    for q, hits in expected.items():
        assert list(ours[q]) == list(hits)  # same documents, same order
        assert list(ours[q].values()) == pytest.approx(list(hits.values()), abs=1e-5)


def test_faiss_and_memory_mapped_corpus(data, tmp_path):
    queries, docs, query_ids, doc_ids = data
    np.save(tmp_path / "docs.npy", docs)
    mapped = np.load(tmp_path / "docs.npy", mmap_mode="r")
    expected = _brute_force(queries, docs, query_ids, doc_ids, 15)
    for ours in (
        exact_search(queries, mapped, query_ids, doc_ids, 15, chunk_size=50),
        faiss_search(queries, mapped, query_ids, doc_ids, 15, chunk_size=50),
        exact_search(queries, docs, query_ids, doc_ids, 15, use_faiss=True),
    ):
        assert {q: list(h) for q, h in ours.items()} == {q: list(h) for q, h in expected.items()}


def test_identical_ids_are_dropped_and_top_k_still_filled():
    vectors = np.eye(4, dtype=np.float32)
    ids = ["a", "b", "c", "d"]
    for use_faiss in (False, True):
        kept = exact_search(
            vectors, vectors, ids, ids, top_k=3, ignore_identical_ids=True, use_faiss=use_faiss
        )
        assert all(q not in hits and len(hits) == 3 for q, hits in kept.items())
        plain = exact_search(vectors, vectors, ids, ids, top_k=3, use_faiss=use_faiss)
        assert all(next(iter(hits)) == q for q, hits in plain.items())


def test_top_k_larger_than_corpus_and_bad_shapes(data):
    queries, docs, query_ids, doc_ids = data
    small = exact_search(queries, docs[:5], query_ids, doc_ids[:5], top_k=100, chunk_size=2)
    assert all(len(h) == 5 for h in small.values())
    assert all(len(h) == 5 for h in faiss_search(queries, docs[:5], query_ids, doc_ids[:5], 100).values())
    with pytest.raises(ValueError, match="differ in width"):
        exact_search(queries, docs[:, :8], query_ids, doc_ids, 10)
    with pytest.raises(ValueError, match="differ in length"):
        exact_search(queries, docs, query_ids[:3], doc_ids, 10)


def test_accelerator_path_matches_the_cpu_path(data):
    """The torch branch (used on GPUs) picks the same top-k per chunk as the numpy branch."""
    from synthq.retrieval.topk import _numpy_top_k, _torch_top_k

    queries, docs, _, _ = data
    numpy_scores, numpy_indices = _numpy_top_k(queries, docs, 7)
    torch_scores, torch_indices = _torch_top_k(queries, "cpu")(queries, docs, 7)
    assert np.array_equal(numpy_indices, torch_indices)
    assert np.allclose(numpy_scores, torch_scores, atol=1e-6)
