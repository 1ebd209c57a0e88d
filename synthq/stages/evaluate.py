"""``synthq eval``: NDCG@10, Recall@10 and more for retrievers on embedded, MS MARCO and BEIR.

For every dataset (``msmarco`` on its dev split, the others on test unless ``--split``) the
corpus is encoded once per retriever (cached on disk by content hash), searched exactly (or
with FAISS), and scored with pytrec_eval. BM25 and untrained encoders are reference rows, so
every table shows what training added. ``arguana`` and ``quora`` drop a query's own id from its
results, as BEIR does.

Privacy of the evaluation artifact: its numbers are functions of the retrievers and public
evaluation data. Retrievers that post-process the same DP artifact share one guarantee; others
compose, so the artifact's ε is the sum over distinct sources (∞ if any retriever is
non-private). Each table row shows its own retriever's ε.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

from synthq.artifacts import (
    Artifact,
    create_artifact,
    data_input_record,
    existing_result,
    open_artifact,
    sha256_tree,
)
from synthq.config import EvalConfig
from synthq.console import console, info
from synthq.data.sources import (
    IDENTICAL_ID_DATASETS,
    default_eval_split,
    load_source,
    resolve_source,
    source_name,
)
from synthq.errors import DataError
from synthq.models.resolve import resolve_device
from synthq.privacy import Guarantee
from synthq.report import privacy_utility_plot, results_table
from synthq.retrieval.metrics import evaluate
from synthq.retrieval.search import bm25_search, corpus_embeddings, encode_texts, exact_search

STAGE = "eval"


def describe_method(artifact: Artifact) -> str:
    """A method label for tables and plots: synthetic / original / dp-<mode>, plus encoder."""
    config = artifact.config
    encoder = Path(str(config.get("encoder", "?"))).name
    if config.get("dp"):
        return f"direct DP ({config['dp']}), {encoder}"
    data = str(config.get("data", ""))
    if (Path(data) / "manifest.json").is_file():
        return f"synthetic, {encoder}"
    return f"original (non-private), {encoder}"


def _combined_guarantee(guarantees: list[Guarantee]) -> Guarantee:
    if not guarantees or all(g.epsilon == 0 for g in guarantees):
        return Guarantee.public("evaluated public models only")
    if any(not g.is_private for g in guarantees):
        return Guarantee.non_private("includes a retriever trained on private data without DP")
    distinct = {}
    for g in guarantees:
        distinct.setdefault(tuple(g.derived_from[:1]) or (g.model_dump_json(),), g)
    return Guarantee(
        epsilon=sum(g.epsilon for g in distinct.values()),
        delta=sum(g.delta for g in distinct.values()),
        unit="example",
        mechanism="composition of evaluated retrievers",
        accountant="basic composition",
        derived_from=sorted({h for g in guarantees for h in g.derived_from}),
    )


def run(config: EvalConfig) -> Artifact:
    from sentence_transformers import SentenceTransformer

    from synthq.models.encoder import load_encoder

    if not config.retrievers and not config.untrained and not config.bm25:
        raise DataError("nothing to evaluate: give --retriever, --untrained or --bm25")
    retrievers = [open_artifact(path, stage="train-retriever") for path in config.retrievers]
    roots = {spec: resolve_source(spec) for spec in config.datasets}
    inputs = [r.input_record() for r in retrievers] + [
        data_input_record(root, name=spec) for spec, root in roots.items()
    ]
    if (done := existing_result(STAGE, config, inputs)) is not None:
        return done
    device = resolve_device(config.device)
    models = [
        (
            r.path.name,
            describe_method(r),
            r.privacy.epsilon,
            lambda r=r: SentenceTransformer(str(r.path), device=device),
            r.manifest_hash,
        )
        for r in retrievers
    ]
    for spec in config.untrained:
        key = sha256_tree(Path(str(_resolve(spec))))
        models.append(
            (
                f"untrained {spec}",
                f"untrained, {spec}",
                0.0,
                lambda spec=spec: load_encoder(spec, device=device),
                key,
            )
        )
    rows, timings = [], {"encode_docs_per_second": [], "search_queries_per_second": [], "cache_hits": 0}
    with create_artifact(config.out, STAGE, config, inputs) as writer:
        for spec, root in roots.items():
            name = source_name(spec)
            split = config.split or default_eval_split(spec)
            dataset = load_source(str(root), splits=[split])
            queries = dataset.split_queries(split)
            if not queries:
                raise DataError(f"split {split!r} has no queries", root)
            qrels = dataset.qrels[split]
            ignore_identical = name in IDENTICAL_ID_DATASETS
            query_ids = sorted(queries)
            if config.bm25:
                run_bm25 = bm25_search(dataset.corpus, queries, config.top_k, ignore_identical)
                rows.append(
                    {"dataset": name, "split": split, "retriever": "BM25", "method": "bm25", "epsilon": 0.0,
                     "metrics": evaluate(qrels, run_bm25)}
                )  # fmt: skip
            for label, method, epsilon, load, key in models:
                model = load()
                started = time.perf_counter()
                doc_ids, doc_embeddings, hit = corpus_embeddings(
                    model, key, dataset.corpus, config.batch_size
                )
                encode_seconds = time.perf_counter() - started
                timings["cache_hits"] += int(hit)
                if not hit:
                    timings["encode_docs_per_second"].append(
                        round(len(doc_ids) / max(encode_seconds, 1e-9), 2)
                    )
                started = time.perf_counter()
                query_embeddings = encode_texts(
                    model, [queries[q] for q in query_ids], config.batch_size, "encoding queries"
                )
                results = exact_search(
                    query_embeddings,
                    doc_embeddings,
                    query_ids,
                    doc_ids,
                    config.top_k,
                    ignore_identical,
                    use_faiss=config.faiss,
                )
                timings["search_queries_per_second"].append(
                    round(len(query_ids) / max(time.perf_counter() - started, 1e-9), 2)
                )
                row = {"dataset": name, "split": split, "retriever": label, "method": method}
                rows.append({**row, "epsilon": epsilon, "metrics": evaluate(qrels, results)})
                del model
        serialisable = [
            {**r, "epsilon": r["epsilon"] if math.isfinite(r["epsilon"]) else "inf"} for r in rows
        ]
        (writer.dir / "results.json").write_text(json.dumps(serialisable, indent=2), encoding="utf-8")
        table = results_table(rows)
        (writer.dir / "results.md").write_text(f"# Retrieval results\n\n{table}", encoding="utf-8")
        privacy_utility_plot(rows, writer.dir / "privacy_utility.png")
        writer.metrics.update({f"{r['dataset']}/{r['retriever']}": r["metrics"] for r in rows})
        writer.timings.update(timings)
        writer.privacy = _combined_guarantee([r.privacy for r in retrievers])
    console.print(table)
    info(f"evaluation written to {config.out}")
    return open_artifact(config.out, STAGE)


def _resolve(spec: str) -> Path:
    from synthq.models.resolve import resolve_model

    return resolve_model(spec)
