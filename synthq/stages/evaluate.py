"""``synthq eval``: NDCG@10, Recall@10 and more for retrievers on embedded, MS MARCO and BEIR.

For every dataset (``msmarco`` on its dev split, the others on test unless ``--split``) each
retriever encodes the corpus once (cached on disk by content hash, :mod:`synthq.retrieval.cache`),
searches exactly by chunked matrix products (or FAISS), and is scored with pytrec_eval
(:mod:`synthq.retrieval.metrics`). BM25 and untrained public encoders are reference rows, so
every table shows what training added. ``arguana`` and ``quora`` drop a query's own id from its
results, as BEIR does. A directory of sub-datasets (CQADupStack's twelve sub-forums) is scored
per sub-dataset and reported as their mean, BEIR's convention.

Args (:class:`synthq.config.EvalConfig`):
    retrievers: ``train-retriever`` artifacts (sentence-transformers directories + manifest).
    datasets: ``embedded``, ``msmarco``, ``beir:NAME`` (or a bare BEIR name) or BEIR directories.
    untrained: encoder specs (``minilm-l6``, a hub id, a local directory) evaluated as they are.
    bm25: add the BM25 row. ``faiss``: search with FAISS instead of torch chunks.

Outputs:
    ``results.json`` (one row per retriever × dataset: every metric, the retriever's ε, δ and
    full guarantee), ``results.md`` (Tables 3-5 layout, ε beside every number) and
    ``privacy_utility.png`` (NDCG@10 against ε). Encoding and search throughput (documents/s,
    queries/s) and cache hits are in the manifest's ``timings``.

Privacy unit and sensitivity:
    The evaluation adds no mechanism: it reads the retrievers and public evaluation data only, so
    every row carries its retriever's guarantee unchanged (post-processing) and BM25 and untrained
    encoders carry :meth:`Guarantee.public`. The artifact as a whole publishes results of all its
    retrievers, so its guarantee is :func:`synthq.report.combined_guarantee` of them, with
    ``derived_from`` listing every retriever: when all retrievers post-process one DP release
    (e.g. synthetic data from one generator) that is exactly the largest ε among them; retrievers
    from independent DP releases of the same private data compose (ε and δ add), because
    publishing the largest ε alone would understate what the combined results reveal; any
    non-private retriever makes it ε = ∞.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from synthq import distributed
from synthq.artifacts import (
    Artifact,
    artifact_on_main,
    data_input_record,
    existing_result,
    json_safe,
    open_artifact,
)
from synthq.config import EvalConfig
from synthq.console import console, verbosity
from synthq.data.beir_io import load_beir_dir
from synthq.data.sources import IDENTICAL_ID_DATASETS, default_eval_split, resolve_source, source_name
from synthq.errors import ArtifactError, DataError
from synthq.ledger import model_input
from synthq.paths import cache_dir
from synthq.privacy import Guarantee
from synthq.report import combined_guarantee, privacy_utility_plot, results_markdown, results_table
from synthq.retrieval.bm25 import bm25_search
from synthq.retrieval.cache import corpus_embeddings, encode_texts
from synthq.retrieval.metrics import evaluate as score_run
from synthq.retrieval.metrics import judged_queries, mean_metrics
from synthq.retrieval.search import exact_search

STAGE = "eval"


@dataclass
class DenseModel:
    """A dense encoder to evaluate: a trained retriever or an untrained reference."""

    label: str
    method: str
    kind: str  # "retriever" | "untrained"
    key: str  # content hash of the weights: the embedding-cache key
    identity: str  # which model this is in tables and merges: the artifact's manifest hash
    privacy: Guarantee
    load: Callable


def _generator_name(synthetic_path: str) -> str | None:
    """The model name of the generator behind a synthetic-data artifact (for table labels)."""
    try:
        synthetic = open_artifact(synthetic_path, verify=False)
        generator = open_artifact(synthetic.config["generator"], verify=False)
        return Path(str(generator.config["model"])).name
    except (ArtifactError, KeyError, OSError, TypeError):
        return None


def describe_method(artifact: Artifact) -> str:
    """A method label for tables and plots: synthetic (generator) / original / direct DP (mode),
    then the encoder. Rows with the same label form one line in the privacy-utility plot."""
    config = artifact.config
    encoder = Path(str(config.get("encoder", "?"))).name
    if config.get("dp"):
        return f"direct DP ({config['dp']}), {encoder}"
    data = str(config.get("data", ""))
    if (Path(data) / "manifest.json").is_file():
        generator = _generator_name(data)
        return f"synthetic ({generator}), {encoder}" if generator else f"synthetic, {encoder}"
    return f"original (non-private), {encoder}"


def _subsets(root: Path) -> list[Path]:
    """Sub-dataset directories (each with a corpus) of a directory that has no corpus itself."""
    if not root.is_dir() or (root / "corpus.jsonl").is_file():
        return []
    return sorted(p for p in root.iterdir() if (p / "corpus.jsonl").is_file())


def resolve_dataset(spec: str) -> Path:
    """The directory ``spec`` names. CQADupStack by name is the directory of its sub-forums
    (downloaded into the BEIR cache on first use), which :func:`dataset_parts` splits."""
    if source_name(spec) == "cqadupstack" and not Path(spec).expanduser().is_dir():
        cached = cache_dir("beir") / "cqadupstack"
        if not _subsets(cached):
            try:
                resolve_source(spec)
            except DataError:  # the download lands sub-forums, which resolve_source refuses
                if not _subsets(cached):
                    raise
        return cached
    return resolve_source(spec)


def dataset_parts(root: Path) -> list[tuple[str, Path]]:
    """``[("", root)]`` for a BEIR directory, ``[(name, dir), ...]`` for a set of sub-datasets."""
    if (root / "corpus.jsonl").is_file():
        return [("", root)]
    if subsets := _subsets(root):
        return [(p.name, p) for p in subsets]
    raise DataError("not a BEIR directory: no corpus.jsonl here nor in any sub-directory", root)


def _payload_hash(artifact: Artifact) -> str:
    """A content hash of a retriever's files (weights, tokenizer, pooling), from the sha256s its
    manifest records and :func:`open_artifact` verified: retraining to identical weights, or
    rewriting the manifest alone, still hits the embedding cache. The model card (``README.md``)
    states the guarantee, not the weights, so it is left out."""
    files = sorted((k, v) for k, v in artifact.manifest.get("files", {}).items() if k != "README.md")
    return hashlib.sha256(json.dumps(files).encode()).hexdigest()


def _dense_models(config: EvalConfig, retrievers: list[Artifact], untrained: dict[str, dict], device: str):
    from sentence_transformers import SentenceTransformer

    from synthq.models.encoder import load_encoder

    models = [
        DenseModel(
            label=r.path.name,
            method=describe_method(r),
            kind="retriever",
            key=f"weights:{_payload_hash(r)}",
            identity=f"artifact:{r.manifest_hash}",
            privacy=r.privacy,
            load=lambda r=r: SentenceTransformer(str(r.path), device=device),
        )
        for r in retrievers
    ]
    for spec, start in untrained.items():
        # Only a model that is public by construction (alias) or by stated assumption (plain
        # directory, hub id) is a reference row; a synthq artifact keeps its own guarantee.
        models.append(
            DenseModel(
                label=f"untrained {Path(spec).name}",
                method=f"untrained, {Path(spec).name}",
                kind="untrained" if start.guarantee.mechanism == "public" else "retriever",
                key=f"encoder:{start.record['sha256']}",
                identity=f"encoder:{start.record['sha256']}",
                privacy=start.guarantee,
                load=lambda path=start.path: load_encoder(path, device=device),
            )
        )
    labels = [m.label for m in models]
    if len(set(labels)) != len(labels):
        duplicates = sorted({label for label in labels if labels.count(label) > 1})
        raise DataError(f"two retrievers share the name {duplicates[0]!r}; give each its own directory name")
    return models


def _row(
    dataset: str, split: str, label: str, method: str, kind: str, privacy: Guarantee, identity: str
) -> dict:
    return {
        "dataset": dataset,
        "split": split,
        "retriever": label,
        "method": method,
        "kind": kind,
        "epsilon": privacy.epsilon,
        "delta": privacy.delta,
        "privacy": privacy.model_dump(mode="json"),
        "model_id": identity,
    }


def _score_dense(
    model_spec: DenseModel,
    corpus: dict[str, dict[str, str]],
    queries: dict[str, str],
    qrels: dict[str, dict[str, int]],
    config: EvalConfig,
    device: str,
    ignore_identical: bool,
) -> tuple[dict[str, float], dict]:
    """Metrics and throughput of one dense model on one (sub-)dataset."""
    # One model in memory at a time (the paper's tables hold many T5-Base retrievers);
    # reloading per dataset costs seconds, encoding a corpus costs far more.
    model = model_spec.load()
    embedded = corpus_embeddings(model, model_spec.key, corpus, config.encode_batch_size)
    query_ids = sorted(queries)
    started = time.perf_counter()
    query_embeddings = encode_texts(
        model, [queries[q] for q in query_ids], config.encode_batch_size, "encoding queries"
    )
    encoded = time.perf_counter()
    results = exact_search(
        query_embeddings,
        embedded.embeddings,
        query_ids,
        embedded.doc_ids,
        config.top_k,
        ignore_identical,
        chunk_size=config.search_chunk_size,
        use_faiss=config.faiss,
        device=device,
    )
    searched = time.perf_counter()
    timing = {
        "documents": len(embedded.doc_ids),
        "queries": len(query_ids),
        "cache_hit": embedded.cache_hit,
        "encode_seconds": round(embedded.encode_seconds, 6),
        "encode_docs_per_second": None
        if embedded.cache_hit
        else round(len(embedded.doc_ids) / max(embedded.encode_seconds, 1e-9), 2),
        "query_seconds": round(searched - started, 6),
        "encode_queries_per_second": round(len(query_ids) / max(encoded - started, 1e-9), 2),
        "search_queries_per_second": round(len(query_ids) / max(searched - encoded, 1e-9), 2),
    }
    return score_run(qrels, results), timing


def run(config: EvalConfig) -> Artifact:
    distributed.setup(config.device)
    if not config.retrievers and not config.untrained and not config.bm25:
        raise DataError("nothing to evaluate: give --retriever, --untrained or --bm25")
    if not config.datasets:
        raise DataError("no datasets given (--datasets embedded,msmarco,beir:NAME or a BEIR directory)")
    retrievers = [open_artifact(path, stage="train-retriever") for path in config.retrievers]
    roots = {spec: resolve_dataset(spec) for spec in dict.fromkeys(config.datasets)}
    names = [source_name(spec) for spec in roots]
    if len(set(names)) != len(names):
        raise DataError(f"two datasets share the name {names!r}: tables would mix them up")
    untrained = {spec: model_input(spec) for spec in config.untrained}
    inputs = (
        [r.input_record() for r in retrievers]
        + [start.record for start in untrained.values()]
        + [data_input_record(root, name=spec) for spec, root in roots.items()]
    )
    if (done := distributed.on_main(existing_result, STAGE, config, inputs)) is not None:
        return done
    device = distributed.device_for(config.device)
    models = _dense_models(config, retrievers, untrained, device)
    bm25_privacy = Guarantee.public("BM25 statistics of the public evaluation corpus only")
    rows, timings = [], {"per_run": {}}
    totals = {"documents_encoded": 0, "encode_seconds": 0.0, "queries": 0, "query_seconds": 0.0}
    cache = {"hits": 0, "misses": 0}
    with artifact_on_main(config.out, STAGE, config, inputs) as writer:
        for spec, root in roots.items():
            name = source_name(spec)
            split = config.split or default_eval_split(spec)
            ignore_identical = name in IDENTICAL_ID_DATASETS
            part_metrics: dict[str, dict[str, dict]] = {}
            counts = {"documents": 0, "queries": 0}
            for part, part_root in dataset_parts(root):
                dataset = load_beir_dir(part_root, splits=[split])
                qrels = judged_queries(dataset.require_split(split))
                if not qrels:
                    raise DataError(
                        f"split {split!r} has no query with a relevant document", part_root / "qrels"
                    )
                queries = {q: dataset.queries[q] for q in qrels}
                counts["documents"] += len(dataset.corpus)
                counts["queries"] += len(queries)
                if config.bm25:
                    run_bm25 = bm25_search(dataset.corpus, queries, config.top_k, ignore_identical)
                    part_metrics.setdefault("BM25", {})[part] = score_run(qrels, run_bm25)
                for model_spec in models:
                    metrics, timing = _score_dense(
                        model_spec, dataset.corpus, queries, qrels, config, device, ignore_identical
                    )
                    part_metrics.setdefault(model_spec.label, {})[part] = metrics
                    timings["per_run"][f"{name}{'/' + part if part else ''}/{model_spec.label}"] = timing
                    cache["hits" if timing["cache_hit"] else "misses"] += 1
                    if not timing["cache_hit"]:
                        totals["documents_encoded"] += timing["documents"]
                        totals["encode_seconds"] += timing["encode_seconds"]
                    totals["queries"] += timing["queries"]
                    totals["query_seconds"] += timing["query_seconds"]
            entries = [("BM25", "bm25", "bm25", bm25_privacy, "bm25s")] if config.bm25 else []
            entries += [(m.label, m.method, m.kind, m.privacy, m.identity) for m in models]
            for label, method, kind, privacy, identity in entries:
                row = _row(name, split, label, method, kind, privacy, identity)
                parts = part_metrics[label]
                row["metrics"] = parts[""] if "" in parts else mean_metrics(list(parts.values()))
                if "" not in parts:
                    row["parts"] = parts
                rows.append({**row, **counts})
        (writer.dir / "results.json").write_text(json.dumps(json_safe(rows), indent=2), encoding="utf-8")
        (writer.dir / "results.md").write_text(results_markdown(rows), encoding="utf-8")
        privacy_utility_plot(rows, writer.dir / "privacy_utility.png")
        writer.metrics.update(
            {f"{r['dataset']}/{r['retriever']}": {"epsilon": r["epsilon"], **r["metrics"]} for r in rows}
        )
        timings.update(
            {
                "cache_hits": cache["hits"],
                "cache_misses": cache["misses"],
                "encode_docs_per_second": round(totals["documents_encoded"] / totals["encode_seconds"], 2)
                if totals["encode_seconds"]
                else None,
                "queries_per_second": round(totals["queries"] / totals["query_seconds"], 2)
                if totals["query_seconds"]
                else None,
                "device": device,
            }
        )
        writer.timings.update(timings)
        sources = [(r.manifest_hash, r.privacy) for r in retrievers]
        sources += [(start.record["sha256"], start.guarantee) for start in untrained.values()]
        writer.privacy = combined_guarantee(sources).assuming(*(a for _, g in sources for a in g.assumptions))
    if verbosity() >= 1:  # rank 0 only under torchrun
        console.print(results_table(rows))
    return distributed.on_main(open_artifact, config.out, STAGE)
