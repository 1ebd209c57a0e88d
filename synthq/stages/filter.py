"""``synthq filter``: keep the better synthetic queries, and hold out documents for tuning — at no ε.

Everything here reads a released synthetic set and public things (the public corpus, a public or
already-released model), so the output is post-processing of the DP generator: it inherits the
set's guarantee and spends nothing (a filter model that is itself a private artifact brings its
own releases, which compose). Methods:

* ``consistency`` (round-trip filtering, Promptagator, Dai et al. 2023): a retriever searches the
  set's public corpus with each synthetic query; the query is kept when its own document ranks in
  the top ``--top-k``. The retriever is an encoder (alias, directory, hub id), a
  ``train-retriever`` artifact, or ``bm25``.
* ``likelihood`` (InPars, Bonifacio et al. 2022): every query is scored by the set's own
  generator — its mean log-likelihood per target token given the document — and each document
  keeps its ``--keep`` most likely queries (generate several with ``generate --num-queries N``).
* ``none``: keep every query (to only hold documents out).

``--corpus SPEC`` (consistency) ranks each query among the documents of a public corpus that
holds the set's, instead of the set's own: a set written for a subset (``generate --documents``)
is otherwise ranked among that subset only, a far easier test than among the whole corpus
(measured on pylibs: 65 % of a 1,000-document set kept, 39 % of the whole corpus's set).

``--holdout-documents N`` moves the queries of N documents, chosen by a public hash of their ids
(never by their queries), to a ``dev`` split: a synthetic dev set for ``eval --select-on`` that
costs no private query and no ε. Training reads the ``train`` split, so the held-out documents'
queries are never trained on. Without it, each query keeps the split it had.

Outputs: a synthetic set in the same BEIR layout as ``generate`` (the whole public corpus of the
input, so held-out documents keep their distractors), and in the manifest's metrics the method,
queries before and after, the kept fraction and the held-out counts.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from synthq.artifacts.create import create_artifact
from synthq.artifacts.freshness import existing_result, input_location
from synthq.artifacts.manifest import Artifact, open_artifact
from synthq.artifacts.records import current_input_hash, public_file_record
from synthq.bookkeeping.inputs import artifact_input, artifact_inside, model_input
from synthq.config.generator import FilterConfig
from synthq.config.registry import SYNTHETIC_STAGES
from synthq.data.beir_io import load_beir_dir, read_corpus, write_beir_dir
from synthq.data.pairs import document_text
from synthq.data.sources import resolve_source
from synthq.runtime import precision
from synthq.runtime.distributed import resolve_device
from synthq.runtime.errors import ArtifactError, DataError, PrivacyError, SettingError

STAGE = "filter"
HOLDOUT_SPLIT = "dev"


def holdout_documents(doc_ids: list[str], count: int) -> set[str]:
    """The ``count`` documents with the smallest SHA-256 of their id: public, fixed, and
    independent of every query."""
    ordered = sorted(doc_ids, key=lambda d: hashlib.sha256(d.encode()).hexdigest())
    return set(ordered[:count])


def round_trip_kept(
    ranked: dict[str, dict[str, float]], own_document: dict[str, str], top_k: int
) -> set[str]:
    """Queries whose own document is among the ``top_k`` best of ``ranked`` (ties by id)."""
    kept = set()
    for query_id, scores in ranked.items():
        best = sorted(scores.items(), key=lambda item: (-item[1], item[0]))[:top_k]
        if own_document[query_id] in {doc_id for doc_id, _ in best}:
            kept.add(query_id)
    return kept


def most_likely_kept(scores: dict[str, float], own_document: dict[str, str], keep: int) -> set[str]:
    """Per document, the ``keep`` queries with the highest score (ties by query id)."""
    by_document: dict[str, list[str]] = {}
    for query_id, doc_id in own_document.items():
        by_document.setdefault(doc_id, []).append(query_id)
    kept = set()
    for queries in by_document.values():
        kept.update(sorted(queries, key=lambda q: (-scores[q], q))[:keep])
    return kept


def _dense_ranking(retriever, corpus, queries: dict[str, str], config: FilterConfig, device: str) -> dict:
    from sentence_transformers import SentenceTransformer

    from synthq.models.encoder import load_encoder
    from synthq.retrieval.cache import search_corpus, weights_key

    if retriever.artifact is not None:
        model = SentenceTransformer(str(retriever.path), device=device)
        key = weights_key(retriever.artifact.manifest)
    else:
        model = load_encoder(retriever.path, device=device)
        key = f"encoder:{retriever.record['sha256']}"
    return search_corpus(model, key, corpus, queries, config.top_k, config.encode_batch_size, device)


def _ranking_corpus(root: Path, own_document: dict[str, str]):
    """The public corpus at ``root`` that ``--corpus`` ranks the queries in: it must hold every
    document the set wrote a query for (else a query could never find its own)."""
    corpus = read_corpus(root / "corpus.jsonl")
    missing = sorted({doc_id for doc_id in own_document.values() if doc_id not in corpus})
    if missing:
        raise DataError(
            f"--corpus lacks {len(missing)} of the set's documents (first: {missing[0]!r}); give the "
            "corpus the set was written from",
            root / "corpus.jsonl",
        )
    return corpus


def _mean_log_likelihoods(generator_path: Path, corpus, queries, own_document, config, device) -> dict:
    """Each query's log p(query | document) under the generator, per target token (EOS included).
    A document's queries are scored together, its prompt computed once
    (:meth:`QueryGenerator.candidate_log_likelihoods`)."""
    from synthq.models.generator import QueryGenerator
    from synthq.runtime.console import progress

    generator = QueryGenerator.load(generator_path, device=device)
    generator.model.eval()
    by_document: dict[str, list[str]] = {}
    for query_id in sorted(queries):
        by_document.setdefault(own_document[query_id], []).append(query_id)
    scores = {}
    with progress() as bar:
        task = bar.add_task("scoring queries under the generator", total=len(queries))
        for doc_id, query_ids in by_document.items():
            texts = [queries[q] for q in query_ids]
            totals = generator.candidate_log_likelihoods(
                document_text(corpus[doc_id]), texts, batch_size=config.scoring_batch_size
            )
            lengths = [
                len(ids) + 1 for ids in generator.tokenizer(texts, add_special_tokens=False)["input_ids"]
            ]
            scores.update(
                {q: float(t) / n for q, t, n in zip(query_ids, totals.tolist(), lengths, strict=True)}
            )
            bar.advance(task, len(query_ids))
    return scores


def _generator_record(synthetic: Artifact) -> dict:
    """The generator the set was sampled from, as the set recorded it; refused when the directory
    there no longer holds that generator (the lineage is the record, not the path)."""
    records = [r for r in synthetic.inputs if r.get("stage") == "finetune-lm"]
    if not records:
        raise ArtifactError(f"{synthetic.path}: records no generator; likelihood filtering needs one")
    record = {**records[0], "path": str(input_location(synthetic, records[0]))}  # from any directory
    if current_input_hash(record) != record["sha256"]:
        raise ArtifactError(
            f"{record['path']}: is not the generator {synthetic.path} was sampled from any more "
            "(rewritten since); likelihood filtering needs that generator"
        )
    return record


@dataclass(frozen=True)
class _Sources:
    """What a filter reads: the synthetic set, the scoring retriever or generator, the ranking corpus."""

    synthetic: Artifact
    retriever: Any | None  # a ModelInput (consistency with a dense retriever)
    generator_record: dict | None  # likelihood: the set's generator
    ranking_root: Path | None  # --corpus: the corpus its queries are ranked in
    records: list[dict]


@dataclass(frozen=True)
class _SyntheticSet:
    """The set's queries, each with its split and its own document, and the set's corpus."""

    queries: dict[str, str]
    splits: dict[str, str]
    own_document: dict[str, str]
    corpus: Any


def _resolve_sources(config: FilterConfig) -> _Sources:
    synthetic = artifact_input(config.synthetic, stage=SYNTHETIC_STAGES)
    records = [synthetic.input_record()]
    retriever = generator_record = ranking_root = None
    if config.method == "consistency" and config.retriever != "bm25":
        retriever = model_input(config.retriever, stage="train-retriever")
        records.append(retriever.record)
    if config.method == "likelihood":
        generator_record = _generator_record(synthetic)
        records.append({**generator_record, "role": "model"})
    if config.corpus is not None:
        if config.method != "consistency":
            raise SettingError(
                "--corpus applies to --method consistency (the corpus its queries are ranked in)"
            )
        ranking_root = resolve_source(config.corpus)
        if (inside := artifact_inside(ranking_root)) is not None:  # its documents are those DP kept
            raise PrivacyError(
                f"--corpus {config.corpus}: {inside} is a synthq artifact, whose documents come from a "
                "release of private data; rank among the public corpus itself"
            )
        records.append({**public_file_record(ranking_root / "corpus.jsonl", config.corpus), "role": "corpus"})
    return _Sources(synthetic, retriever, generator_record, ranking_root, records)


def _read_set(synthetic: Artifact) -> _SyntheticSet:
    data = load_beir_dir(synthetic.path)
    splits = {q: split for split, qrels in data.qrels.items() for q in qrels}
    own_document = {q: next(iter(data.qrels[split][q])) for q, split in splits.items()}
    queries = {q: data.queries[q] for q in splits}
    if not queries:
        raise DataError("the synthetic set holds no queries", synthetic.path)
    return _SyntheticSet(queries, splits, own_document, data.corpus)


def _kept_queries(config: FilterConfig, sources: _Sources, written: _SyntheticSet) -> set[str]:
    """The ids the method keeps: round-trip consistent, most likely, or all (``none``)."""
    device = resolve_device(config.device)
    queries, own_document = written.queries, written.own_document
    if config.method == "consistency":
        searched = (
            written.corpus
            if sources.ranking_root is None
            else _ranking_corpus(sources.ranking_root, own_document)
        )
        if sources.retriever is None:
            from synthq.retrieval.bm25 import bm25_search

            ranked = bm25_search(searched, queries, config.top_k)
        else:
            ranked = _dense_ranking(sources.retriever, searched, queries, config, device)
        kept = round_trip_kept(ranked, own_document, config.top_k)
    elif config.method == "likelihood":
        path = Path(sources.generator_record["path"])
        scores = _mean_log_likelihoods(path, written.corpus, queries, own_document, config, device)
        kept = most_likely_kept(scores, own_document, config.keep)
    else:
        kept = set(queries)
    if not kept:
        raise DataError(
            f"{config.method} filtering kept no query; loosen it (--top-k, --keep)", sources.synthetic.path
        )
    return kept


def _kept_qrels(
    config: FilterConfig, written: _SyntheticSet, kept: set[str], where: Path
) -> tuple[dict, set]:
    """The kept queries' qrels by split: with ``--holdout-documents N`` the queries of N documents
    drawn by a public rule form the synthetic dev split; the held-out documents."""
    corpus = written.corpus
    held_out = (
        holdout_documents(sorted(corpus), config.holdout_documents) if config.holdout_documents else set()
    )
    qrels: dict[str, dict[str, dict[str, int]]] = {}
    for query_id in sorted(kept):
        doc_id = written.own_document[query_id]
        split = (
            HOLDOUT_SPLIT if doc_id in held_out else (written.splits[query_id] if not held_out else "train")
        )
        qrels.setdefault(split, {})[query_id] = {doc_id: 1}
    if "train" not in qrels:
        raise DataError("no training query left outside the held-out documents", where)
    return qrels, held_out


def _write(
    config: FilterConfig, sources: _Sources, written: _SyntheticSet, kept, qrels, held_out, started
) -> None:
    """The filtered set, its counts, and what it inherits (the set's releases; a retriever's)."""
    queries, own_document = written.queries, written.own_document
    with create_artifact(config.out, STAGE, config, sources.records) as writer:
        write_beir_dir(writer.dir, written.corpus, {q: queries[q] for q in kept}, qrels)
        writer.metrics.update(
            {
                "method": config.method,
                "queries_before": len(queries),
                "queries_kept": len(kept),
                "kept_fraction": len(kept) / len(queries),
                "documents_with_a_query": len({own_document[q] for q in kept}),
                "train_queries": len(qrels.get("train", {})),
                "dev_queries": len(qrels.get(HOLDOUT_SPLIT, {})),
                "dev_documents": len(held_out),
            }
        )
        writer.inherit(sources.synthetic)
        writer.timings["wall_seconds"] = round(time.perf_counter() - started, 3)
        if sources.retriever is not None:
            if sources.retriever.artifact is not None:
                writer.inherit(sources.retriever.artifact)
            writer.assume(*sources.retriever.guarantee.assumptions)


@precision.stage
def run(config: FilterConfig) -> Artifact:
    """Resolve the set and what scores it, score and keep its queries, split off the held-out
    documents' queries, and write the filtered set (post-processing: it inherits the set's ε)."""
    sources = _resolve_sources(config)
    if (done := existing_result(STAGE, config, sources.records)) is not None:
        return done
    started = time.perf_counter()  # the scoring runs before the artifact is opened
    written = _read_set(sources.synthetic)
    kept = _kept_queries(config, sources, written)
    qrels, held_out = _kept_qrels(config, written, kept, sources.synthetic.path)
    _write(config, sources, written, kept, qrels, held_out, started)
    return open_artifact(config.out, STAGE)
