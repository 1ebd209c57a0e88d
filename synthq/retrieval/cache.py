"""Encoding with an on-disk corpus-embedding cache keyed by content hashes.

A corpus is encoded once per (model, corpus): the embeddings live in
``$SYNTHQ_CACHE/embeddings/<key>.npy`` where ``key`` is the sha256 of the model's identity (a
retriever's manifest hash, which covers every weight file, or the tree hash of an encoder
directory), the corpus content (ids, titles and texts, in id order), the encoder's maximum
sequence length and the cache format. A second evaluation of the same retriever on the same
corpus therefore encodes only the queries, and any change to the model, the corpus or the
truncation length misses the cache.

Embeddings are written straight into a memory-mapped ``.npy`` (renamed into place when
complete, so an interrupted encoding never looks like a cache hit) and read back memory-mapped,
so a corpus larger than RAM can be encoded and searched in chunks. Each file's sha256 is written
beside it (``<key>.sha256``) and checked on every hit: a cached file that was altered, cut short
by a full disk or written without a digest is encoded again, never searched (hashing reads the
file once, about a second per GB).
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from synthq.data.pairs import document_text
from synthq.runtime import distributed
from synthq.runtime.console import progress, warn
from synthq.runtime.errors import DataError
from synthq.runtime.paths import cache_dir
from synthq.runtime.precision import autocast_forward, current


def weights_key(manifest: dict) -> str:
    """The cache identity of a retriever artifact: a hash of the sha256s its manifest records
    for its files (weights, tokenizer, pooling), which :func:`synthq.artifacts.manifest.open_artifact`
    verified. Retraining to identical weights, or rewriting the manifest alone, still hits the
    cache. The model card (``README.md``) states the guarantee, not the weights, so it is left out."""
    files = sorted((k, v) for k, v in manifest.get("files", {}).items() if k != "README.md")
    return "weights:" + hashlib.sha256(json.dumps(files).encode()).hexdigest()


# Bump when what is stored changes meaning (e.g. normalisation, or how a document is joined into
# the text the encoder sees: a file-backed corpus is keyed by its bytes), so old files are not reused.
CACHE_FORMAT = 1
# Texts handed to one ``model.encode`` call: large enough that per-call overhead vanishes,
# small enough that the progress bar moves.
TEXTS_PER_CALL = 1024


def corpus_fingerprint(corpus: dict[str, dict[str, str]]) -> str:
    """A key that changes whenever a document's id or text changes: for a corpus read from a file
    (an Arrow-backed :class:`~synthq.data.arrow_views.Corpus`) the content key of its cache, derived
    from the file's bytes, which is instant at any size (hashing every text took ~20 s at 1 M
    passages); otherwise sha256 over every document's id and the exact text the encoder sees,
    in id order. The two kinds never collide; the file key may miss where the text hash would
    hit (same documents in another order), which costs an encoding, never a wrong embedding."""
    content_key = getattr(corpus, "content_key", None)
    if content_key is not None:
        return f"file:{content_key}"
    digest = hashlib.sha256()
    for doc_id in sorted(corpus):
        digest.update(doc_id.encode() + b"\x00" + document_text(corpus[doc_id]).encode() + b"\x01")
    return digest.hexdigest()


def embedding_dimension(model) -> int:
    getter = getattr(model, "get_embedding_dimension", None) or model.get_sentence_embedding_dimension
    return int(getter())


def encode_texts(
    model, texts: list[str], batch_size: int, description: str, out: np.ndarray | None = None
) -> np.ndarray:
    """L2-normalised embeddings of ``texts`` (row i = text i), written into ``out`` if given.

    Texts are encoded longest first, as BEIR does, so batches hold texts of similar length and
    little padding; ``model.encode`` is called on blocks of :data:`TEXTS_PER_CALL` texts so the
    progress bar advances while the call overhead stays negligible."""
    if out is None:
        out = np.zeros((len(texts), embedding_dimension(model)), dtype=np.float32)
    order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
    ranks = distributed.topology().world_size
    block = max(TEXTS_PER_CALL, batch_size) * ranks
    encode = autocast_forward(model.encode)  # at the stage's precision
    with progress() as bar:
        task = bar.add_task(description, total=len(texts))
        for start in range(0, len(order), block):
            chunk = order[start : start + block]
            # Under torchrun each rank encodes every N-th text of the block (similar lengths on
            # every rank) and the vectors are gathered, so every rank holds the whole result.
            mine = distributed.shard(chunk)
            vectors = (
                encode(
                    [texts[i] for i in mine],
                    batch_size=batch_size,
                    normalize_embeddings=True,
                    convert_to_numpy=True,
                    show_progress_bar=False,
                )
                if mine
                else np.zeros((0, out.shape[1]), dtype=np.float32)
            )
            if ranks > 1:
                import torch

                vectors = distributed.gather_rows(
                    torch.from_numpy(np.ascontiguousarray(vectors, np.float32))
                ).numpy()
            out[[i for rank in range(ranks) for i in chunk[rank::ranks]]] = vectors
            bar.advance(task, len(chunk))
    return out


@dataclass
class CorpusEmbeddings:
    """Embeddings of a corpus in sorted-id order (row i = ``doc_ids[i]``)."""

    doc_ids: list[str]
    embeddings: np.ndarray  # float32, memory-mapped from the cache file
    cache_hit: bool
    path: Path
    encode_seconds: float  # 0 on a cache hit


def cache_key(model_key: str, corpus: dict[str, dict[str, str]], max_seq_length: int | None) -> str:
    payload = [CACHE_FORMAT, model_key, corpus_fingerprint(corpus), max_seq_length, "l2-normalised"]
    if current() == "bf16":  # bf16 embeddings are other numbers; fp32 keys stay as they were
        payload.append("bf16")
    return hashlib.sha256(json.dumps(payload).encode()).hexdigest()


def embeddings_path(model_key: str, corpus: dict[str, dict[str, str]], max_seq_length: int | None) -> Path:
    """Where the cache keeps (or would keep) these corpus embeddings."""
    return cache_dir("embeddings") / f"{cache_key(model_key, corpus, max_seq_length)}.npy"


def cached_corpus_embeddings(
    model_key: str, corpus: dict[str, dict[str, str]], max_seq_length: int | None, dimension: int
) -> CorpusEmbeddings | None:
    """The cached embeddings of ``corpus`` by the model ``model_key`` (truncated at
    ``max_seq_length``, ``dimension`` wide), or None when the cache has none: the lookup half of
    :func:`corpus_embeddings`, which needs no model (``synthq search`` uses it before deciding
    whether to load one). A file of the wrong shape cannot be this corpus and is removed."""
    path = embeddings_path(model_key, corpus, max_seq_length)
    if not path.is_file():
        return None
    recorded = _recorded_digest(path)
    if recorded is None or _file_digest(path) != recorded:
        warn(
            f"{path}: cached corpus embeddings that do not match the digest written with them "
            "(altered, cut short or from an older synthq): encoding again"
        )
        _remove(path)
        return None
    cached = np.load(path, mmap_mode="r")
    if cached.shape == (len(corpus), dimension):
        return CorpusEmbeddings(sorted(corpus), cached, True, path, 0.0)
    _remove(path)
    return None


def _reserve(path: Path) -> None:
    """Allocate the whole of a freshly created memory-mapped file on disk now, so that a full disk
    is an error here and not a SIGBUS in the middle of encoding (a write to a sparse page that the
    file system cannot back kills the process). Where the file system cannot preallocate, its free
    space is checked instead.

    Raises:
        DataError: not enough free space for the file, naming it and the cache variable.
    """
    size = path.stat().st_size
    try:
        with open(path, "r+b") as handle:
            os.posix_fallocate(handle.fileno(), 0, size)
        return
    except OSError as error:
        if error.errno == errno.ENOSPC:
            free = None
        elif error.errno in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
            free = shutil.disk_usage(path.parent).free
        else:
            raise
    except AttributeError:  # no posix_fallocate on this platform
        free = shutil.disk_usage(path.parent).free
    if free is not None and free >= size:
        return
    raise DataError(
        f"not enough free disk space here for the cached corpus embeddings ({size / 2**20:,.1f} MiB); "
        "free some space or point SYNTHQ_CACHE at a larger disk",
        path.parent,
    )


def _digest_path(path: Path) -> Path:
    return path.with_suffix(".sha256")


def _file_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


def _recorded_digest(path: Path) -> str | None:
    try:
        return _digest_path(path).read_text(encoding="utf-8").strip() or None
    except OSError:
        return None


def _remove(path: Path) -> None:
    path.unlink(missing_ok=True)
    _digest_path(path).unlink(missing_ok=True)


def corpus_embeddings(
    model, model_key: str, corpus: dict[str, dict[str, str]], batch_size: int
) -> CorpusEmbeddings:
    """The corpus embeddings of ``model``, from the cache when present, else encoded and cached.

    Args:
        model: a ``SentenceTransformer``.
        model_key: a content hash identifying the model's weights (see the module docstring).
        corpus: ``{doc_id: {"title", "text"}}``; documents are encoded as ``title. text``.
        batch_size: encoding batch size.
    """
    if not corpus:
        raise DataError("the corpus is empty: nothing to encode")
    max_seq_length = getattr(model, "max_seq_length", None)
    cached = cached_corpus_embeddings(model_key, corpus, max_seq_length, embedding_dimension(model))
    if cached is not None:
        return cached
    doc_ids = sorted(corpus)
    path = embeddings_path(model_key, corpus, max_seq_length)
    started = time.perf_counter()
    tmp = path.with_name(f"{path.stem}.tmp{os.getpid()}.npy")
    shape = (len(doc_ids), embedding_dimension(model))
    target = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.float32, shape=shape)
    try:
        _reserve(tmp)
        encode_texts(
            model, [document_text(corpus[d]) for d in doc_ids], batch_size, "encoding corpus", target
        )
        target.flush()
        del target
        # the digest first: a file without its digest (or with another) is never read as a hit
        digest = _digest_path(path)
        written = digest.with_name(f"{digest.name}.tmp{os.getpid()}")
        written.write_text(_file_digest(tmp) + "\n", encoding="utf-8")
        os.replace(written, digest)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    seconds = time.perf_counter() - started
    return CorpusEmbeddings(doc_ids, np.load(path, mmap_mode="r"), False, path, seconds)


def search_corpus(
    model, model_key: str, corpus: dict[str, dict[str, str]], queries: dict[str, str], top_k: int,
    batch_size: int, device: str = "cpu",
) -> dict[str, dict[str, float]]:  # fmt: skip
    """The ``top_k`` documents of ``corpus`` for each of ``queries`` (id -> text), best first: the
    corpus embeddings from the cache (encoded on a miss, :func:`corpus_embeddings`), the queries
    encoded, exact search (:func:`synthq.retrieval.topk.exact_search`). What ``synthq search``
    and the consistency filter run; ``eval`` times the same steps one by one."""
    from synthq.retrieval.topk import exact_search

    embedded = corpus_embeddings(model, model_key, corpus, batch_size)
    query_ids = list(queries)
    vectors = encode_texts(model, [queries[q] for q in query_ids], batch_size, "encoding queries")
    return exact_search(vectors, embedded.embeddings, query_ids, embedded.doc_ids, top_k, device=device)
