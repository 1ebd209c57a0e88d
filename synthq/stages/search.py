"""``synthq search``: try a retriever on a corpus, so a user can see what they trained.

Not a stage that writes an artifact: it loads a ``train-retriever`` artifact (or an untrained
encoder), embeds the corpus through the same on-disk cache as ``eval``
(:func:`synthq.retrieval.cache.corpus_embeddings`, same cache key, so a corpus ``eval`` encoded
is not encoded again), embeds the queries and prints the ``top_k`` documents by cosine score.
"""

from __future__ import annotations

from pathlib import Path

from synthq.artifacts import data_input_record, is_artifact, open_artifact
from synthq.data.beir_io import read_corpus
from synthq.errors import DataError
from synthq.models.resolve import resolve_device
from synthq.retrieval.cache import search_corpus, weights_key

QUERY_BATCH = 64


def _model(spec: str, device: str):
    """(a SentenceTransformer, the cache key ``eval`` uses for it)."""
    from sentence_transformers import SentenceTransformer

    from synthq.models.encoder import load_encoder
    from synthq.models.resolve import resolve_model

    if is_artifact(spec):
        artifact = open_artifact(spec, stage="train-retriever")
        return SentenceTransformer(str(artifact.path), device=device), weights_key(artifact.manifest)
    record = data_input_record(resolve_model(spec), name=spec)
    return load_encoder(spec, device=device), f"encoder:{record['sha256']}"


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
        device: ``auto``, ``cpu``, ``cuda``, ...

    Returns:
        per query, a list of ``{"doc_id", "score", "title", "text"}``.
    """
    from synthq.data.sources import dataset_parts, resolve_dataset

    if not queries or not all(q.strip() for q in queries):
        raise DataError("give a non-empty query")
    parts = dataset_parts(resolve_dataset(corpus))
    if len(parts) != 1:
        names = ", ".join(name for name, _ in parts[:5])
        raise DataError(f"{corpus} holds several corpora ({names}, ...); search one of their directories")
    documents = read_corpus(Path(parts[0][1]) / "corpus.jsonl")
    device = resolve_device(device)
    model, key = _model(retriever, device)
    query_ids = [str(i) for i in range(len(queries))]
    run = search_corpus(
        model, key, documents, dict(zip(query_ids, queries, strict=True)), top_k, QUERY_BATCH, device
    )
    return [
        [
            {"doc_id": doc_id, "score": score, **{k: documents[doc_id].get(k, "") for k in ("title", "text")}}
            for doc_id, score in sorted(run[qid].items(), key=lambda item: -item[1])
        ]
        for qid in query_ids
    ]
