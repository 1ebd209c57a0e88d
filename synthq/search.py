"""``synthq search``: try a retriever on a corpus, so a user can see what they trained.

Not a stage that writes an artifact: it loads a ``train-retriever`` artifact (or an untrained
encoder), embeds the corpus through the same on-disk cache as ``eval``
(:func:`synthq.retrieval.cache.corpus_embeddings`, same cache key, so a corpus ``eval`` encoded
is not encoded again), embeds the queries and prints the ``top_k`` documents by cosine score.

From the second search on, nothing imports torch: the corpus embeddings come from the cache and
the queries are encoded by the model's ONNX bundle (:mod:`synthq.models.onnx_encoder`), which
the first search on the CPU writes and checks against the model. Corpus embeddings are always
computed by the model itself, so ``eval`` and ``search`` share one cache whoever filled it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path

from synthq.artifacts.manifest import is_artifact, open_artifact
from synthq.artifacts.records import data_input_record
from synthq.data.beir_io import read_corpus
from synthq.models import onnx_encoder
from synthq.retrieval.cache import cached_corpus_embeddings, search_corpus, weights_key
from synthq.runtime.console import info
from synthq.runtime.errors import DataError
from synthq.runtime.paths import cache_dir

QUERY_BATCH = 64


def _model(spec: str) -> tuple[str, Callable]:
    """The cache identity of the model ``spec`` names (as ``eval`` keys it), found without loading
    the model, and a function that loads it as a ``SentenceTransformer`` on a device. An artifact
    is opened (and verified) once for both."""
    from synthq.models.resolve import resolve_model

    if is_artifact(spec):
        artifact = open_artifact(spec, stage="train-retriever")

        def load_artifact(device: str):
            from sentence_transformers import SentenceTransformer

            return SentenceTransformer(str(artifact.path), device=device)

        return weights_key(artifact.manifest), load_artifact

    def load_encoder_spec(device: str):
        from synthq.models.encoder import load_encoder

        return load_encoder(spec, device=device)

    return f"encoder:{data_input_record(resolve_model(spec), name=spec)['sha256']}", load_encoder_spec


def bundle_directory(model_key: str) -> Path:
    """Where the ONNX bundle of the model ``model_key`` lives in the cache."""
    return cache_dir("onnx") / hashlib.sha256(model_key.encode()).hexdigest()[:32]


def _search_without_torch(
    model_key: str, documents, queries: dict[str, str], top_k: int
) -> dict[str, dict[str, float]] | None:
    """The run from the model's ONNX bundle and the cached corpus embeddings, or None when
    either is missing (then the model itself is loaded)."""
    from synthq.retrieval.topk import exact_search

    bundle = onnx_encoder.load_bundle(bundle_directory(model_key))
    if bundle is None:
        return None
    embedded = cached_corpus_embeddings(
        model_key, documents, bundle.max_seq_length, bundle.get_embedding_dimension()
    )
    if embedded is None:
        return None
    query_ids = list(queries)
    vectors = bundle.encode([queries[q] for q in query_ids], batch_size=QUERY_BATCH)
    return exact_search(vectors, embedded.embeddings, query_ids, embedded.doc_ids, top_k)


def search(
    retriever: str, corpus: str, queries: list[str], top_k: int = 10, device: str = "auto"
) -> list[list[dict]]:
    """The ``top_k`` documents of ``corpus`` for each query, best first.

    Args:
        retriever: a ``train-retriever`` artifact directory, or an encoder spec (alias, local
            directory, hub id) searched as-is.
        corpus: a BEIR directory or source name (``embedded``, ``beir:NAME``, ...).
        queries: query texts.
        top_k: documents returned per query.
        device: ``auto``, ``cpu``, ``cuda``, ...: where the model runs when it is loaded (a
            search the ONNX bundle answers runs on the CPU whatever ``auto`` would pick).

    Returns:
        per query, a list of ``{"doc_id", "score", "title", "text"}``.
    """
    from synthq.data.sources import dataset_parts, resolve_dataset
    from synthq.runtime.distributed import resolve_device

    if not queries or not all(q.strip() for q in queries):
        raise DataError("give a non-empty query")
    parts = dataset_parts(resolve_dataset(corpus))
    if len(parts) != 1:
        names = ", ".join(name for name, _ in parts[:5])
        raise DataError(f"{corpus} holds several corpora ({names}, ...); search one of their directories")
    documents = read_corpus(Path(parts[0][1]) / "corpus.jsonl")
    key, load = _model(retriever)
    by_id = {str(i): text for i, text in enumerate(queries)}
    run = _search_without_torch(key, documents, by_id, top_k) if device in ("auto", "cpu") else None
    if run is None:
        device = resolve_device(device)
        model = load(device)
        run = search_corpus(model, key, documents, by_id, top_k, QUERY_BATCH, device)
        _write_bundle_for_next_time(model, key, device, queries)
    return [
        [
            {"doc_id": doc_id, "score": score, **{k: documents[doc_id].get(k, "") for k in ("title", "text")}}
            for doc_id, score in sorted(run[qid].items(), key=lambda item: -item[1])
        ]
        for qid in by_id
    ]


def _write_bundle_for_next_time(model, model_key: str, device: str, queries: list[str]) -> None:
    """Export the model's ONNX bundle once (on the CPU, where the export runs), so the next
    search starts without torch; a model the export cannot reproduce is remembered and not
    tried again."""
    directory = bundle_directory(model_key)
    if device != "cpu" or onnx_encoder.was_refused(directory) or onnx_encoder.has_bundle(directory):
        return
    info("writing this model's ONNX query encoder, once, so later searches start without torch")
    if onnx_encoder.export_bundle(model, directory, extra_probes=queries) is None:
        info("the ONNX export did not reproduce this model: later searches load it with torch")
