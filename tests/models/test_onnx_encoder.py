"""The ONNX query encoder of ``synthq search``: same embeddings as the model, checked before use,
and a second search that never imports torch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from synthq.models import onnx_encoder

TEXTS = [
    "how long to boil an egg",
    "  Whitespace AROUND and Capitals  ",
    "ünïcödé and 数字 123",
    "word " * 300,  # longer than the encoder's 64 tokens: truncated the same way
]


@pytest.fixture(scope="module")
def tiny_model(tiny_encoder_dir):
    from synthq.models.encoder import load_encoder

    return load_encoder(str(tiny_encoder_dir), device="cpu")


def test_bundle_reproduces_the_model(tiny_model, tmp_path):
    bundle = onnx_encoder.export_bundle(tiny_model, tmp_path / "bundle")
    assert bundle is not None and not onnx_encoder.was_refused(tmp_path / "bundle")
    expected = tiny_model.encode(TEXTS, normalize_embeddings=True, convert_to_numpy=True)
    got = bundle.encode(TEXTS, batch_size=3)  # batches of unequal lengths: padding must not matter
    assert got.shape == expected.shape and got.dtype == np.float32
    assert np.abs(got - expected).max() < 1e-5
    assert np.allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
    assert not list(tmp_path.glob("bundle.tmp*"))


def test_an_altered_bundle_is_removed_not_used(tiny_model, tmp_path, capsys):
    """A bundle whose model file changed in the cache (a corrupted ONNX file printed NaN scores
    with exit 0) fails its digests on load: removed with a warning, so it is exported again."""
    directory = tmp_path / "bundle"
    assert onnx_encoder.export_bundle(tiny_model, directory) is not None
    assert onnx_encoder.load_bundle(directory) is not None
    model_file = directory / "model.onnx"
    data = bytearray(model_file.read_bytes())
    data[len(data) // 2] ^= 0xFF
    model_file.write_bytes(bytes(data))
    assert onnx_encoder.load_bundle(directory) is None
    assert "do not match their digests" in capsys.readouterr().err and not directory.exists()


def test_a_bundle_that_does_not_reproduce_the_model_is_refused(tiny_model, tmp_path, monkeypatch):
    monkeypatch.setattr(onnx_encoder, "TOLERANCE", -1.0)  # no export can pass
    directory = tmp_path / "bundle"
    assert onnx_encoder.export_bundle(tiny_model, directory) is None
    assert onnx_encoder.was_refused(directory) and onnx_encoder.load_bundle(directory) is None
    assert (
        "differs from the model" in json.loads((directory / onnx_encoder.REFUSED_FILE).read_text())["reason"]
    )


def _search_in_a_fresh_process(retriever: Path, corpus: Path) -> dict:
    script = (
        "import json, sys\n"
        "from synthq.search import search\n"
        f"hits = search({str(retriever)!r}, {str(corpus)!r}, {TEXTS[:2]!r}, top_k=4, device='cpu')\n"
        "print(json.dumps({'torch': 'torch' in sys.modules, 'hits': hits}))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=dict(os.environ)
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_second_search_runs_without_torch_and_finds_the_same(
    tiny_encoder_dir, tiny_beir, tmp_path, monkeypatch
):
    from synthq.privacy.guarantee import Guarantee
    from tests.helpers import tiny_retriever_artifact

    monkeypatch.setenv("SYNTHQ_CACHE", str(tmp_path / "cache"))
    retriever = tiny_retriever_artifact(
        tmp_path / "ret", tiny_encoder_dir, Guarantee.non_private("test retriever")
    ).path
    first = _search_in_a_fresh_process(retriever, tiny_beir)  # encodes the corpus, writes the bundle
    second = _search_in_a_fresh_process(retriever, tiny_beir)
    assert first["torch"] and not second["torch"]
    assert len(list((tmp_path / "cache" / "onnx").glob("*/model.onnx"))) == 1
    for one, two in zip(first["hits"], second["hits"], strict=True):
        assert [hit["doc_id"] for hit in one] == [hit["doc_id"] for hit in two]
        assert np.allclose([hit["score"] for hit in one], [hit["score"] for hit in two], atol=1e-5)


def test_a_refused_model_is_searched_with_torch_and_not_exported_again(
    tiny_encoder_dir, tiny_beir, tmp_path, monkeypatch
):
    from synthq import search

    monkeypatch.setenv("SYNTHQ_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(onnx_encoder, "TOLERANCE", -1.0)
    first = search.search(str(tiny_encoder_dir), str(tiny_beir), ["boil an egg"], top_k=3, device="cpu")
    directory = search.bundle_directory(search._model(str(tiny_encoder_dir))[0])
    assert onnx_encoder.was_refused(directory)
    monkeypatch.setattr(onnx_encoder, "export_bundle", lambda *a, **k: pytest.fail("exported again"))
    assert (
        search.search(str(tiny_encoder_dir), str(tiny_beir), ["boil an egg"], top_k=3, device="cpu") == first
    )
