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
    select_on: a dev ``eval`` artifact; only each method's dev-best configuration (every seed of
        it) is evaluated (:mod:`synthq.retrieval.selection`).

Outputs:
    ``results.json`` (one row per retriever × dataset: every metric, the retriever's ε, δ and
    full guarantee, its seed and training settings), ``per_query.json`` (dataset -> retriever ->
    metric -> query -> score), ``runs/DATASET/[SUB-DATASET/]RETRIEVER.trec`` (the ranked lists,
    TREC run format: ``trec_eval``, ``ir_measures``, ``ranx`` recompute every number from them,
    :mod:`synthq.retrieval.trec`), ``results.md`` (Tables 3-5 layout, ε beside every number, 95 %
    intervals, mean ± std over seeds, and every pair's paired test with Holm's correction, see
    :mod:`synthq.retrieval.significance`; with ``select_on`` also the candidates' dev scores,
    ``selection.md``) and ``privacy_utility.png`` (NDCG@10 against ε with intervals). Encoding
    and search throughput (documents/s, queries/s) and cache hits are in the manifest's
    ``timings``.

Privacy unit and sensitivity:
    Every number is a release about the private data behind it, and every row's ε is recomputed
    from those releases (:func:`synthq.privacy.guarantee.compose_releases`, per unit):

    * the retriever's releases (post-processing: a row of a retriever trained on a synthetic set
      carries the generator's ε); BM25 and untrained public encoders carry none;
    * a dataset that is a synthq artifact (a synthetic set) brings its releases to every row on it;
    * **a private split** — any split of a dataset this installation has read as private, or
      that the dataset's ``privacy.json`` declares private, unless it declares it public — is a
      read of private queries without noise: ε = ∞ for its rows, whatever the retriever;
    * ``select_on``: choosing configurations on a dev evaluation of a private split is a release
      about those dev queries. Without ``select_epsilon`` it is unaccounted (ε = ∞, shown in the
      rows); with it, report-noisy-max (:func:`synthq.retrieval.selection.select_best`) spends
      that ε over the dev queries, which composes per unit with the rest.

    The artifact's own guarantee composes every row's releases.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from synthq.artifacts import (
    Artifact,
    artifact_on_main,
    existing_result,
    is_artifact,
    json_safe,
    open_artifact,
    sha256_tree,
)
from synthq.config import EvalConfig
from synthq.data.beir_io import load_beir_dir
from synthq.data.sources import (
    IDENTICAL_ID_DATASETS,
    dataset_parts,
    declared_splits,
    default_eval_split,
    resolve_dataset,
    source_name,
)
from synthq.privacy.guarantee import Guarantee, compose_releases
from synthq.privacy.keys import private_data_digest
from synthq.privacy.ledger import model_input
from synthq.privacy.units import registered_private_data, sharing_groups
from synthq.reporting.tables import (
    PER_QUERY_FILE,
    RESULTS_FILE,
    SELECTION_FILE,
    attach_per_query,
    privacy_utility_plot,
    results_markdown,
    results_table,
)
from synthq.retrieval.bm25 import bm25_search
from synthq.retrieval.cache import corpus_embeddings, encode_texts, weights_key
from synthq.retrieval.metrics import judged_queries, mean_metrics, per_query, query_means
from synthq.retrieval.search import exact_search
from synthq.retrieval.selection import select_best, selection_guarantee, selection_markdown
from synthq.retrieval.trec import RUN_SUFFIX, run_tag, write_run
from synthq.runtime import distributed
from synthq.runtime.console import info, result, verbosity, warn
from synthq.runtime.errors import ArtifactError, DataError

STAGE = "eval"
RUNS_DIR = "runs"  # the ranked lists, one TREC run file per retriever per (sub-)dataset


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
    releases: list[dict] = field(default_factory=list)  # the private-data releases behind it
    seed: int | None = None
    settings: dict | None = None  # the training options (tables show the swept ones)
    variant: str | None = None  # training config without seed and output: one system over seeds
    replicate: str | None = None  # the synthetic set (generator draw) it was trained on
    family: str | None = None  # the method without the synthetic set's details (--select-data)


def _synthetic_origin(synthetic_path: str) -> tuple[str | None, int, list[str]]:
    """For table labels, read off the set's recipe (:func:`synthetic_recipe`): the generator's
    model name (``, per user`` for a user-level generator), the queries per document, and the
    filters applied on the way (``filter`` artifacts over a ``generate`` one)."""
    recipe, filters = synthetic_recipe(synthetic_path), []
    kept_per_document = math.inf  # a likelihood filter keeps at most --keep per document
    while recipe is not None and "filter" in recipe:
        own = recipe["filter"]
        method = own.get("method")
        if method and method != "none":
            filters.insert(0, f"{method}-filtered")
        if method == "likelihood":
            kept_per_document = min(kept_per_document, int(own.get("keep") or 1))
        if own.get("holdout_documents"):
            filters.insert(0, f"{own['holdout_documents']} docs held out")
        recipe = recipe["of"]
    if recipe is None:
        return None, 1, filters
    if "evolve" in recipe:  # Private Evolution: a public model, its queries chosen by noisy votes
        own = recipe["evolve"]
        per_document = int(min(int(own.get("queries_per_document") or 1), kept_per_document))
        per_user = ", per user" if own.get("privacy_unit") == "user" else ""
        return f"PE {Path(str(own.get('model'))).name}{per_user}", per_document, filters
    per_document = int(min(int(recipe["generate"].get("num_queries") or 1), kept_per_document))
    generator = recipe["generator"]
    if not generator or "model" not in generator:
        return None, per_document, filters
    per_user = ", per user" if generator.get("privacy_unit") == "user" else ""
    return Path(str(generator["model"])).name + per_user, per_document, filters


def describe_method(artifact: Artifact, family: bool = False) -> str:
    """A method label for tables and plots: synthetic (generator, queries per document when
    more than one, filters) / original / direct DP (mode), then the encoder. Rows with the same
    label form one line in the privacy-utility plot and one group in dev selection.

    ``family=True`` leaves out what tells one synthetic set of a generator from another (queries
    per document, filters, held-out documents): the label under which ``eval --select-data``
    chooses among those sets."""
    config = artifact.config
    encoder = Path(str(config.get("encoder", "?"))).name
    if config.get("dp"):
        per_user = ", per user" if config.get("privacy_unit") == "user" else ""
        return f"direct DP ({config['dp']}{per_user}), {encoder}"
    data = str(config.get("data", ""))
    if (Path(data) / "manifest.json").is_file():
        generator, generated, filters = _synthetic_origin(data)
        per_document = min(generated, config.get("queries_per_document") or math.inf)
        per_document_text = f"{per_document} queries/doc" if per_document > 1 else None
        details = (generator,) if family else (generator, per_document_text, *filters)
        detail = ", ".join(x for x in details if x)
        return f"synthetic ({detail}), {encoder}" if detail else f"synthetic, {encoder}"
    return f"original (non-private), {encoder}"


_RUN_FLAGS = {"out", "force", "resume", "device", "generation_batch_size", "batch_size", "encode_batch_size"}


def synthetic_recipe(path: str) -> dict | None:
    """What a synthetic set is one draw of: its generate (and filter) settings and its generator's
    training settings, without outputs, run flags and seeds. Two sets from independently trained
    generators with the same recipe are replicates, as two training seeds are (``None`` when
    ``path`` is not a synthetic artifact)."""
    try:
        artifact = open_artifact(path, verify=False)
        if artifact.stage == "filter":
            own = {k: v for k, v in artifact.config.items() if k not in _RUN_FLAGS | {"synthetic"}}
            return {"filter": own, "of": synthetic_recipe(artifact.config["synthetic"])}
        if artifact.stage == "evolve":
            return {"evolve": {k: v for k, v in artifact.config.items() if k not in _RUN_FLAGS}}
        if artifact.stage == "generate":
            return {
                "generate": {k: v for k, v in artifact.config.items() if k not in _RUN_FLAGS | {"generator"}},
                "generator": _generator_recipe(artifact.config.get("generator")),
            }
    except (ArtifactError, KeyError, OSError, TypeError):
        return None
    return None


def _generator_recipe(path: str | None) -> dict | None:
    """A generator's training settings without outputs, run flags and seed (``None`` when the set
    records no generator that can be opened)."""
    try:
        generator = open_artifact(path, verify=False) if path else None
    except (ArtifactError, OSError, TypeError):
        return None
    return (
        None
        if generator is None
        else {k: v for k, v in generator.config.items() if k not in _RUN_FLAGS | {"seed"}}
    )


def training_settings(artifact: Artifact) -> tuple[dict, str | None, str | None]:
    """A retriever's training options (without output path and run flags), its ``variant`` — a
    hash of those options without the seed, with a synthetic set replaced by its recipe
    (:func:`synthetic_recipe`), so retrievers that differ only by seed or by the generator
    replicate they were trained on share it (``None`` when the config records no seed: such a
    retriever is its own system) — and its ``replicate``: the manifest hash of the synthetic set
    it was trained on (``None`` for other data)."""
    skip = {"out", "force", "resume", "device"}
    settings = {k: v for k, v in artifact.config.items() if k not in skip}
    data = str(settings.get("data", ""))
    recipe = synthetic_recipe(data) if (Path(data) / "manifest.json").is_file() else None
    replicate = None
    if recipe is not None:
        replicate = open_artifact(data, verify=False).manifest_hash[:12]
    if "seed" not in settings:
        return settings, None, replicate
    identity = {k: v for k, v in settings.items() if k != "seed"}
    if recipe is not None:
        identity["data"] = recipe
    variant = json.dumps(identity, sort_keys=True, default=str)
    return settings, hashlib.sha256(variant.encode()).hexdigest()[:16], replicate


def _dense_models(config: EvalConfig, retrievers: list[Artifact], untrained: dict, device: str):
    from sentence_transformers import SentenceTransformer

    from synthq.models.encoder import load_encoder

    models = [
        DenseModel(
            label=r.path.name,
            method=describe_method(r),
            family=describe_method(r, family=True),
            kind="retriever",
            key=weights_key(r.manifest),
            identity=f"artifact:{r.manifest_hash}",
            privacy=r.privacy,
            load=lambda r=r: SentenceTransformer(str(r.path), device=device),
            releases=r.releases,
            seed=r.config.get("seed"),
            settings=settings,
            variant=variant,
            replicate=replicate,
        )
        for r in retrievers
        for settings, variant, replicate in [training_settings(r)]  # once per retriever
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
                releases=start.artifact.releases if start.artifact is not None else [],
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
) -> tuple[dict[str, dict[str, float]], dict, dict[str, dict[str, float]]]:
    """Per-query metrics, throughput and the ranked lists of one dense model on one (sub-)dataset."""
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
    return per_query(qrels, results), timing, results


def _by_metric(parts: dict[str, dict[str, dict[str, float]]]) -> dict[str, dict[str, float]]:
    """``{part: {query: {metric: v}}}`` -> ``{metric: {query: v}}``; a sub-dataset's query ids
    are prefixed ``part/`` so that sub-forums never collide."""
    table: dict[str, dict[str, float]] = {}
    for part, queries in parts.items():
        for query_id, metrics in queries.items():
            for metric, value in metrics.items():
                table.setdefault(metric, {})[f"{part}/{query_id}" if part else query_id] = value
    return table


@dataclass
class EvalData:
    """An evaluation dataset and what reading its split costs."""

    spec: str
    root: Path
    record: dict
    private: bool  # the evaluated split holds private queries
    artifact: Artifact | None = None  # a synthetic set evaluated as data: its releases come along
    assumption: str | None = None


def eval_data(spec: str, root: Path, split: str, known_private: set[str]) -> EvalData:
    """Classify one dataset's split: a synthq artifact (inherits), a private split (ε = ∞ to read
    without noise), or public (a declared-public split of a private dataset says so)."""
    if is_artifact(root):
        artifact = open_artifact(root)
        return EvalData(spec, root, artifact.input_record(), False, artifact)
    plain = sha256_tree(root)
    keyed = private_data_digest(plain)
    declared = declared_splits(root)
    state = declared.get(split)
    has_private = keyed in known_private or "private" in declared.values()
    private = state == "private" or (state is None and keyed in known_private)
    record = {"path": str(root), "kind": "data", "name": spec, "sha256": keyed if has_private else plain}
    if private:
        record["private"] = True
    assumption = (
        f"split {split!r} of {spec} is public: declared so in its {root / 'privacy.json'}"
        if state == "public" and has_private
        else None
    )
    return EvalData(spec, root, record, private, assumption=assumption)


@dataclass
class Selection:
    """What ``--select-on`` kept, and what choosing cost."""

    retrievers: list[Artifact]
    markdown: str
    private_markdown: str | None  # candidates' dev scores of a private split (diagnostics only)
    guarantee: Guarantee | None  # report-noisy-max's, or None
    dev: Artifact
    private: bool


def _select(
    retrievers: list[Artifact], dev: Artifact, select_epsilon: float | None, across_data: bool = False
) -> Selection:
    """The retrievers :func:`select_best` picks on the dev evaluation ``dev`` (every seed of
    each method's best configuration); retrievers the dev evaluation did not score are kept.
    On a dev evaluation that read private queries, ``select_epsilon`` makes the choice
    report-noisy-max; without it the choice is an unaccounted release (ε = ∞)."""
    rows = json.loads((dev.path / RESULTS_FILE).read_text(encoding="utf-8"))
    private = dev.manifest.get("own_release") is not None
    noisy = select_epsilon is not None and private
    choices = select_best(rows, total_epsilon=select_epsilon if noisy else None, across_data=across_data)
    on_dev = {r["model_id"] for r in rows}
    chosen = set().union(*(c.model_ids for c in choices.values())) if choices else set()
    kept = [
        r
        for r in retrievers
        if f"artifact:{r.manifest_hash}" in chosen or f"artifact:{r.manifest_hash}" not in on_dev
    ]
    if not kept:
        raise DataError(f"{dev.path}: selection kept none of the retrievers")
    info(f"selected on {dev.path.name}: {', '.join(r.path.name for r in kept)}")
    source = f"{dev.path.name} ({rows[0].get('split')})"
    guarantee = selection_guarantee(choices, select_epsilon) if noisy else None
    public_text = selection_markdown(choices, source=source, scores=not private, guarantee=guarantee)
    private_text = selection_markdown(choices, source=source) if private else None
    return Selection(kept, public_text, private_text, guarantee, dev, private)


def _row_privacy(releases: list[dict], assumptions: list[str]) -> Guarantee:
    unique = list({r["id"]: r for r in releases}.values())
    return compose_releases(unique, sharing_groups(unique), assumptions)


def run(config: EvalConfig) -> Artifact:
    distributed.setup(config.device)
    if not config.retrievers and not config.untrained and not config.bm25:
        raise DataError("nothing to evaluate: give --retriever, --untrained or --bm25")
    if not config.datasets:
        raise DataError("no datasets given (--datasets embedded,msmarco,beir:NAME or a BEIR directory)")
    retrievers = [open_artifact(path, stage="train-retriever") for path in config.retrievers]
    selection = None
    if config.select_on is not None:
        dev = open_artifact(config.select_on, stage="eval")
        selection = _select(retrievers, dev, config.select_epsilon, across_data=config.select_data)
        retrievers = selection.retrievers
    roots = {spec: resolve_dataset(spec) for spec in dict.fromkeys(config.datasets)}
    names = [source_name(spec) for spec in roots]
    if len(set(names)) != len(names):
        raise DataError(f"two datasets share the name {names!r}: tables would mix them up")
    untrained = {spec: model_input(spec, stage="train-retriever") for spec in config.untrained}
    known_private = {r["data"]["sha256"] for a in retrievers for r in a.releases} | set(
        registered_private_data()
    )
    datasets = {
        spec: eval_data(spec, root, config.split or default_eval_split(spec), known_private)
        for spec, root in roots.items()
    }
    inputs = (
        ([selection.dev.input_record()] if selection else [])
        + [r.input_record() for r in retrievers]
        + [start.record for start in untrained.values()]
        + [data.record for data in datasets.values()]
    )
    if (done := distributed.on_main(existing_result, STAGE, config, inputs)) is not None:
        return done
    device = distributed.device_for(config.device)
    models = _dense_models(config, retrievers, untrained, device)
    rows, timings, per_query_out = [], {"per_run": {}}, {}
    row_releases: list[tuple[list[dict], list[dict], list[str]]] = []  # aligned with rows
    totals = {"documents_encoded": 0, "encode_seconds": 0.0, "queries": 0, "query_seconds": 0.0}
    cache = {"hits": 0, "misses": 0}
    with artifact_on_main(config.out, STAGE, config, inputs) as writer:
        writer.public()
        for model in [*retrievers, *(s.artifact for s in untrained.values() if s.artifact is not None)]:
            writer.inherit(model)
        for start in untrained.values():
            writer.assume(*start.guarantee.assumptions)
        chosen_by: list[dict] = []  # the releases every row carries for the selection
        if selection is not None:
            if selection.guarantee is not None:
                dev_release = next(
                    r for r in selection.dev.releases if r["id"] == selection.dev.manifest["own_release"]
                )
                chosen_by = [
                    writer.release(selection.guarantee, dev_release["data"], units=dev_release["units"])
                ]
            else:
                writer.inherit(selection.dev)
                chosen_by = selection.dev.releases
        for spec, data in datasets.items():
            name = source_name(spec)
            split = config.split or default_eval_split(spec)
            ignore_identical = name in IDENTICAL_ID_DATASETS
            part_metrics: dict[str, dict[str, dict]] = {}
            counts = {"documents": 0, "queries": 0}
            evaluated_queries: list[str] = []
            for part, part_root in dataset_parts(data.root):
                dataset = load_beir_dir(part_root, splits=[split])
                qrels = judged_queries(dataset.require_split(split))
                if not qrels:
                    raise DataError(
                        f"split {split!r} has no query with a relevant document", part_root / "qrels"
                    )
                queries = {q: dataset.queries[q] for q in qrels}
                evaluated_queries += [f"{part}/{q}" if part else q for q in queries]
                counts["documents"] += len(dataset.corpus)
                counts["queries"] += len(queries)
                runs = writer.dir / RUNS_DIR / name / part
                if config.bm25:
                    run_bm25 = bm25_search(dataset.corpus, queries, config.top_k, ignore_identical)
                    part_metrics.setdefault("BM25", {})[part] = per_query(qrels, run_bm25)
                    write_run(runs / f"{run_tag('BM25')}{RUN_SUFFIX}", run_bm25, run_tag("BM25"))
                for model_spec in models:
                    metrics, timing, ranked = _score_dense(
                        model_spec, dataset.corpus, queries, qrels, config, device, ignore_identical
                    )
                    tag = run_tag(model_spec.label)
                    write_run(runs / f"{tag}{RUN_SUFFIX}", ranked, tag)
                    part_metrics.setdefault(model_spec.label, {})[part] = metrics
                    timings["per_run"][f"{name}{'/' + part if part else ''}/{model_spec.label}"] = timing
                    cache["hits" if timing["cache_hit"] else "misses"] += 1
                    if not timing["cache_hit"]:
                        totals["documents_encoded"] += timing["documents"]
                        totals["encode_seconds"] += timing["encode_seconds"]
                    totals["queries"] += timing["queries"]
                    totals["query_seconds"] += timing["query_seconds"]
            data_releases = list(data.artifact.releases) if data.artifact is not None else []
            if data.artifact is not None:
                writer.inherit(data.artifact)
            writer.assume(data.assumption)
            if data.private:
                reason = (
                    f"scores of the private queries of split {split!r} of {spec}, without noise (ε = ∞); "
                    "evaluate on a public split, or declare the split public in the dataset's privacy.json"
                )
                warn(f"{spec} split {split!r} is private: its scores are ε = ∞")
                data_releases.append(
                    writer.release(
                        Guarantee.non_private(reason, unit="query"), data.record, evaluated_queries
                    )
                )
            entries = [("BM25", "bm25", "bm25", [], "bm25s", None)] if config.bm25 else []
            entries += [(m.label, m.method, m.kind, m.releases, m.identity, m) for m in models]
            for label, method, kind, model_releases, identity, model_spec in entries:
                assumptions = [*(model_spec.privacy.assumptions if model_spec else []), data.assumption or ""]
                own = [] if kind == "bm25" or kind == "untrained" else chosen_by
                releases = [*model_releases, *data_releases, *own]
                privacy = _row_privacy(releases, [a for a in assumptions if a])
                model_privacy = (
                    model_spec.privacy
                    if model_spec
                    else Guarantee.public("BM25 statistics of the evaluation corpus only")
                )
                row = _row(name, split, label, method, kind, privacy, identity)
                row["model_epsilon"] = model_privacy.epsilon
                if own and selection is not None:
                    before = _row_privacy([*model_releases, *data_releases], [a for a in assumptions if a])
                    row["selection"] = {
                        **_selection_label(selection),
                        "row_epsilon_without": json_safe(before.epsilon),
                        "row_unit_without": before.unit,
                    }
                if model_spec is not None and model_spec.settings is not None:
                    row.update(
                        seed=model_spec.seed,
                        settings=model_spec.settings,
                        variant=model_spec.variant,
                        replicate=model_spec.replicate,
                        family=model_spec.family,
                    )
                parts = part_metrics[label]
                means = {part: query_means(table) for part, table in parts.items()}
                row["metrics"] = means[""] if "" in means else mean_metrics(list(means.values()))
                if "" not in parts:
                    row["parts"] = means
                rows.append({**row, **counts})
                row_releases.append(
                    (releases, [*model_releases, *data_releases], [a for a in assumptions if a])
                )
                per_query_out.setdefault(name, {})[label] = _by_metric(parts)
        _compose_replicates(rows, row_releases)
        (writer.dir / RESULTS_FILE).write_text(json.dumps(json_safe(rows), indent=2), encoding="utf-8")
        (writer.dir / PER_QUERY_FILE).write_text(json.dumps(per_query_out), encoding="utf-8")
        with_scores = attach_per_query(rows, per_query_out)
        text = results_markdown(with_scores)
        if selection is not None:
            text += "\n## Hyper-parameters chosen on dev\n\n" + selection.markdown
            (writer.dir / SELECTION_FILE).write_text(selection.markdown, encoding="utf-8")
            if selection.private_markdown:
                (writer.diagnostics_dir / SELECTION_FILE).write_text(
                    selection.private_markdown, encoding="utf-8"
                )
        (writer.dir / "results.md").write_text(text, encoding="utf-8")
        privacy_utility_plot(with_scores, writer.dir / "privacy_utility.png")
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
    if verbosity() >= 1:  # rank 0 only under torchrun
        result(results_table(rows))
    return distributed.on_main(open_artifact, config.out, STAGE)


def _compose_replicates(
    rows: list[dict], row_releases: list[tuple[list[dict], list[dict], list[str]]]
) -> None:
    """Rows that tables merge into one system (same variant: other seeds, or other generator
    replicates of the same recipe) but that rest on different releases — two independently
    trained ε = 8 generators — get ``system_privacy``: the composition of all their releases, the
    guarantee of anything computed from them together (a mean over replicates of two ε = 8
    generators is ε = 16 on the queries both read), and ``system_privacy_without_selection`` (the
    same without an unaccounted choice on private dev queries, which tables print beside it).
    ``row_releases`` holds, per row, its releases with and without the selection and its
    assumptions. Rows over one release set get nothing."""
    groups: dict[tuple, list[int]] = {}
    for index, row in enumerate(rows):
        if row.get("variant"):
            key = (row["dataset"], row.get("split"), row["variant"], str(row["epsilon"]))
            groups.setdefault(key, []).append(index)
    for members in groups.values():
        # Decided on the releases without the selection: an unaccounted choice brings every
        # release behind the dev evaluation into every row it chose, replicates' included.
        if len({frozenset(r["id"] for r in row_releases[i][1]) for i in members}) < 2:
            continue
        assumptions = list(dict.fromkeys(a for i in members for a in row_releases[i][2]))
        composed = []
        for part in (0, 1):
            union = list({r["id"]: r for i in members for r in row_releases[i][part]}.values())
            composed.append(_row_privacy(union, assumptions).model_dump(mode="json"))
        for i in members:
            rows[i]["system_privacy"], rows[i]["system_privacy_without_selection"] = composed


def _selection_label(selection: Selection) -> dict:
    """How a row's configuration was chosen, for every table beside its ε."""
    if selection.guarantee is not None:
        return {"how": "report-noisy-max on private dev", "epsilon": selection.guarantee.epsilon}
    if selection.private:
        return {"how": "on private dev, unaccounted", "epsilon": "inf"}
    return {"how": "on dev data that is public or synthetic (no ε)", "epsilon": 0.0}
