"""The corpus-embedding cache: hits, misses on any content change, and atomic writes."""

from __future__ import annotations

import numpy as np
import pytest

from synthq.data.pairs import document_text
from synthq.retrieval import cache
from synthq.retrieval.cache import corpus_embeddings
from synthq.runtime.errors import DataError
from tests.helpers import corpus_records


@pytest.fixture
def model(tiny_encoder_dir):
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(tiny_encoder_dir), device="cpu")


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SYNTHQ_CACHE", str(tmp_path / "cache"))


def test_hit_returns_what_the_model_encodes(model, tmp_path):
    corpus = corpus_records()
    first = corpus_embeddings(model, "model-a", corpus, batch_size=5)
    second = corpus_embeddings(model, "model-a", corpus, batch_size=5)
    assert (first.cache_hit, second.cache_hit) == (False, True)
    assert first.doc_ids == second.doc_ids == sorted(corpus)
    direct = model.encode([document_text(corpus[d]) for d in first.doc_ids], normalize_embeddings=True)
    np.testing.assert_allclose(second.embeddings, direct, atol=1e-5)
    names = sorted(p.name for p in (tmp_path / "cache" / "embeddings").iterdir())
    assert names == [first.path.name, first.path.with_suffix(".sha256").name]  # the file and its digest


def test_any_change_misses(model):
    corpus = corpus_records()
    base = corpus_embeddings(model, "model-a", corpus, batch_size=8)
    edited = {**corpus, "egg-0": {**corpus["egg-0"], "text": corpus["egg-0"]["text"] + " Or ten."}}
    retitled = {**corpus, "egg-0": {**corpus["egg-0"], "title": "eggs"}}
    smaller = {k: v for k, v in corpus.items() if k != "git-2"}
    for changed in (edited, retitled, smaller):
        result = corpus_embeddings(model, "model-a", changed, batch_size=8)
        assert not result.cache_hit and result.path != base.path
    assert not corpus_embeddings(model, "model-b", corpus, batch_size=8).cache_hit
    model.max_seq_length = 16  # truncation changes the embeddings
    assert not corpus_embeddings(model, "model-a", corpus, batch_size=8).cache_hit


def test_interrupted_encoding_leaves_no_cache_entry(model, monkeypatch, tmp_path):
    corpus = corpus_records()

    def fail(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(cache, "encode_texts", fail)
    with pytest.raises(KeyboardInterrupt):
        corpus_embeddings(model, "model-a", corpus, batch_size=8)
    assert list((tmp_path / "cache" / "embeddings").iterdir()) == []
    monkeypatch.undo()
    monkeypatch.setenv("SYNTHQ_CACHE", str(tmp_path / "cache"))
    assert not corpus_embeddings(model, "model-a", corpus, batch_size=8).cache_hit


def test_an_altered_or_undigested_cache_file_is_encoded_again(model, capsys):
    """A cached file whose bytes changed (the same shape: a search would run on it and score
    wrong), or that has no digest beside it, is never a hit: encoded again, with a warning."""
    corpus = corpus_records()
    first = corpus_embeddings(model, "model-a", corpus, batch_size=8)
    truth = np.array(first.embeddings)
    altered = truth.copy()
    altered[0] = -altered[0]
    np.save(first.path, altered)
    again = corpus_embeddings(model, "model-a", corpus, batch_size=8)
    assert not again.cache_hit and "do not match the digest" in capsys.readouterr().err
    np.testing.assert_allclose(again.embeddings, truth, atol=1e-6)
    again.path.with_suffix(".sha256").unlink()
    assert not corpus_embeddings(model, "model-a", corpus, batch_size=8).cache_hit
    assert corpus_embeddings(model, "model-a", corpus, batch_size=8).cache_hit


def test_wrong_shape_file_is_re_encoded_and_empty_corpus_refused(model):
    corpus = corpus_records()
    first = corpus_embeddings(model, "model-a", corpus, batch_size=8)
    np.save(first.path, np.zeros((3, 2), dtype=np.float32))
    again = corpus_embeddings(model, "model-a", corpus, batch_size=8)
    assert not again.cache_hit and again.embeddings.shape == (len(corpus), 32)
    with pytest.raises(DataError, match="corpus is empty"):
        corpus_embeddings(model, "model-a", {}, batch_size=8)


def test_a_corpus_read_from_a_file_is_keyed_by_its_bytes(tmp_path):
    """No pass over every text for a file-backed corpus: the key is its cache's content key,
    which follows the file's bytes (same file -> same key, one edited text -> another key)."""
    import json

    from synthq.data.beir_io import read_corpus

    records = corpus_records()
    path = tmp_path / "corpus.jsonl"

    def write(records):
        lines = [json.dumps({"_id": d, **doc}) for d, doc in records.items()]
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")

    write(records)
    first = cache.corpus_fingerprint(read_corpus(path))
    assert first.startswith("file:") and cache.corpus_fingerprint(read_corpus(path)) == first
    edited = dict(records)
    some_id = next(iter(edited))
    edited[some_id] = {**edited[some_id], "text": edited[some_id]["text"] + " changed"}
    write(edited)
    assert cache.corpus_fingerprint(read_corpus(path)) not in (first, cache.corpus_fingerprint(records))
    # a plain dict (a subset, or synthetic text) still hashes every text
    assert cache.corpus_fingerprint(records) != cache.corpus_fingerprint(edited)


@pytest.mark.parametrize("file_system", ["full", "no-preallocation"])
def test_a_full_disk_is_a_clear_error_before_encoding_not_a_sigbus(model, monkeypatch, tmp_path, file_system):
    """The memory-mapped file is allocated whole before anything is encoded: a full cache disk
    raises a DataError naming the cache directory and SYNTHQ_CACHE, and leaves nothing behind."""
    import errno
    import os
    import shutil
    from collections import namedtuple

    def full(fd, offset, length):
        raise OSError(errno.ENOSPC, "No space left on device")

    def unsupported(fd, offset, length):
        raise OSError(errno.EOPNOTSUPP, "Operation not supported")

    encoded = []
    monkeypatch.setattr(cache, "encode_texts", lambda *a, **k: encoded.append(1))
    monkeypatch.setattr(os, "posix_fallocate", full if file_system == "full" else unsupported)
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(10**9, 10**9, 16))
    with pytest.raises(DataError, match="not enough free disk space.*SYNTHQ_CACHE") as raised:
        corpus_embeddings(model, "model-a", corpus_records(), batch_size=8)
    assert str(tmp_path / "cache" / "embeddings") in str(raised.value)
    assert encoded == [] and list((tmp_path / "cache" / "embeddings").iterdir()) == []


def test_without_preallocation_enough_free_space_still_caches(model, monkeypatch):
    import errno
    import os

    def unsupported(fd, offset, length):
        raise OSError(errno.EOPNOTSUPP, "Operation not supported")

    monkeypatch.setattr(os, "posix_fallocate", unsupported)
    assert not corpus_embeddings(model, "model-a", corpus_records(), batch_size=8).cache_hit
    assert corpus_embeddings(model, "model-a", corpus_records(), batch_size=8).cache_hit
