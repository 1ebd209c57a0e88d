"""``synthq eval``: NDCG@10, Recall@10 and more for retrievers on embedded, MS MARCO and BEIR.

For every dataset (``msmarco`` on its dev split, the others on test unless ``--split``) each
retriever encodes the corpus once (cached on disk by content hash, :mod:`synthq.retrieval.cache`),
searches exactly by chunked matrix products (or FAISS), and is scored with pytrec_eval
(:mod:`synthq.retrieval.metrics`). BM25 and untrained public encoders are reference rows, so
every table shows what training added. ``arguana`` and ``quora`` drop a query's own id from its
results, as BEIR does. A directory of sub-datasets (CQADupStack's twelve sub-forums) is scored
per sub-dataset and reported as their mean, BEIR's convention.

Args (:class:`synthq.config.evaluation.EvalConfig`):
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
    :mod:`synthq.retrieval.trec`) — for a private split both go to the private ``diagnostics/``
    instead, since they name private queries one by one — ``results.md`` (Tables 3-5 layout, ε
    beside every number, 95 % intervals, mean ± std over seeds, and every pair's paired test with
    Holm's correction, see :mod:`synthq.retrieval.significance`; with ``select_on`` also the
    candidates' dev scores, ``selection.md``) and ``privacy_utility.png`` (NDCG@10 against ε with
    intervals). Encoding and search throughput (documents/s, queries/s) and cache hits are in the manifest's
    ``timings``.

Privacy unit and sensitivity:
    Every number is a release about the private data behind it, and every row's ε is recomputed
    from those releases, per unit (:mod:`synthq.bookkeeping.splits`, which also says which splits
    are private):

    * the retriever's releases (post-processing); BM25 and untrained public encoders carry none;
    * a dataset that is a synthq artifact (a synthetic set) brings its releases to every row on it;
    * **a private split** is a read of private queries without noise: ε = ∞ for its rows,
      whatever the retriever;
    * ``select_on``: the choice is a function of every candidate, so a chosen row carries every
      candidate's releases (:func:`synthq.retrieval.selection.candidate_releases`) plus what
      reading the dev queries cost: nothing on public or synthetic dev data; on a private split,
      without ``select_epsilon`` the noiseless read (ε = ∞, shown in the rows); with it,
      report-noisy-max (:func:`synthq.retrieval.selection.select_best`), which spends that ε over
      the dev queries. All compose per unit.

    Every row carries its releases (``releases``: model, data, selection;
    :mod:`synthq.reporting.row_privacy`), so ``report`` recomputes any merge of rows. Tables show
    the model's guarantee (what releasing the retriever costs) in the ε column and, where the
    scores cost more (a private split: ε = ∞), the scores' ε and why. The artifact's own guarantee
    composes every row's releases: it stays the scores'.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from synthq.artifacts.freshness import existing_result, input_location
from synthq.artifacts.manifest import Artifact, is_artifact, open_artifact
from synthq.artifacts.on_main import artifact_on_main
from synthq.bookkeeping.inputs import artifact_input, model_input
from synthq.bookkeeping.splits import (
    EvalData,
    eval_data,
    private_split_guarantee,
    score_guarantee,
    split_is_private,
)
from synthq.config.evaluation import EvalConfig
from synthq.data.beir_io import load_beir_dir
from synthq.data.sources import (
    IDENTICAL_ID_DATASETS,
    dataset_parts,
    default_eval_split,
    resolve_dataset,
    source_name,
)
from synthq.data.summary import whitespace_id_message, whitespace_ids
from synthq.privacy.digests import PUBLIC_SPLIT, public_split_digest
from synthq.privacy.guarantee import Guarantee
from synthq.reporting.eval_files import (
    PER_QUERY_FILE,
    RESULTS_FILE,
    SELECTION_FILE,
    attach_per_query,
    by_metric,
    read_checked_rows,
    result_row,
    row_metrics,
)
from synthq.reporting.labels import describe_method, training_fields
from synthq.reporting.plot import privacy_utility_plot
from synthq.reporting.row_privacy import release_lists
from synthq.reporting.tables import results_markdown, results_table
from synthq.retrieval.bm25 import bm25_search
from synthq.retrieval.cache import weights_key
from synthq.retrieval.dense import Throughput, score_dense
from synthq.retrieval.metrics import judged_queries, per_query
from synthq.retrieval.selection import Selection, select_retrievers, selection_label
from synthq.retrieval.trec import RUN_SUFFIX, run_tag, write_run
from synthq.runtime import distributed, precision
from synthq.runtime.console import result, warn
from synthq.runtime.errors import DataError, SynthqError
from synthq.runtime.hashing import json_safe

STAGE = "eval"
RUNS_DIR = "runs"  # the ranked lists, one TREC run file per retriever per (sub-)dataset
_BM25_PRIVACY = Guarantee.public("BM25 statistics of the evaluation corpus only")


@precision.stage
def run(config: EvalConfig) -> Artifact:
    distributed.setup(config.device)
    _check_request(config)
    retrievers = given = [artifact_input(path, stage="train-retriever") for path in config.retrievers]
    selection = _select_on_dev(config, retrievers) if config.select_on is not None else None
    if selection is not None:
        retrievers = selection.retrievers
    roots = _dataset_roots(config)
    _refuse_scores_on_pairs_they_trained_on(config, given, roots)
    untrained = {spec: model_input(spec, stage="train-retriever") for spec in config.untrained}
    datasets = {spec: eval_data(spec, root, _split(config, spec)) for spec, root in roots.items()}
    inputs = (
        ([selection.dev.input_record()] if selection else [])
        + [r.input_record() for r in retrievers]
        + [start.record for start in untrained.values()]
        + [data.record for data in datasets.values()]
    )
    if (done := distributed.on_main(existing_result, STAGE, config, inputs)) is not None:
        return done
    device = distributed.device_for(config.device)
    models = _dense_models(retrievers, untrained, device)
    tally = Tally()
    with artifact_on_main(config.out, STAGE, config, inputs) as writer:
        chosen_by = _declare_inputs(writer, retrievers, untrained, selection)
        for spec, data in datasets.items():
            scored = _score_dataset(writer, spec, data, _split(config, spec), models, config, device, tally)
            data_releases = _data_releases(writer, spec, scored.split, data, scored)
            _add_rows(tally, scored, data, data_releases, models, config.bm25, selection, chosen_by)
        _write_results(writer, tally, selection)
        writer.timings.update(tally.throughput.summary(device))
    result(results_table(tally.rows))  # the command's result: on stdout under -q too (rank 0 only)
    return distributed.on_main(open_artifact, config.out, STAGE)


def _check_request(config: EvalConfig) -> None:
    if not config.retrievers and not config.untrained and not config.bm25:
        raise DataError("nothing to evaluate: give --retriever, --untrained or --bm25")
    if not config.datasets:
        raise DataError("no datasets given (--datasets embedded,msmarco,beir:NAME or a BEIR directory)")


def _select_on_dev(config: EvalConfig, retrievers: list[Artifact]) -> Selection:
    """``--select-on``: the retrievers the dev evaluation chooses, and what choosing cost."""
    dev = artifact_input(config.select_on, stage="eval")
    rows = read_checked_rows(dev)  # with each query's score: report-noisy-max's utility sums them
    scored = {(row.get("dataset"), row.get("split")) for row in rows}
    for spec in config.datasets:
        if (source_name(spec), _split(config, spec)) in scored:
            raise DataError(
                f"--select-on {dev.path}: it scored {source_name(spec)} ({_split(config, spec)}), the "
                "split this eval reports, so the chosen rows would be scored on the queries that chose "
                "them (biased upward); select on a dev split (filter --holdout-documents gives one, free)"
            )
    return select_retrievers(retrievers, dev, rows, config.select_epsilon, across_data=config.select_data)


# the public-split reads that train (a held-out loss, also recorded as one, only measures)
_TRAINING_ROLES = ("--warm-start", "few-shot examples")


def _training_reads(artifact: Artifact) -> list[tuple[Artifact, dict, str | None]]:
    """Every read of pairs in ``artifact``'s lineage, itself included, with the artifact that
    recorded it and the split it read: training data (``--data`` with its ``--split``) and public
    pairs (a generator's ``--warm-start``, a set's ``--few-shot`` examples). An ancestor that is
    no longer where it was recorded is not followed."""
    found, seen, stack = [], set(), [artifact]
    while stack:
        current = stack.pop()
        for record in current.inputs:
            if record.get("kind") == PUBLIC_SPLIT and record.get("role") in _TRAINING_ROLES:
                found.append((current, record, record.get("split")))
            elif record.get("kind") == "data" or record.get("role") == "data":
                found.append((current, record, current.config.get("split")))
            if record.get("kind") == "artifact" and record.get("sha256") not in seen:
                seen.add(record.get("sha256"))
                location = input_location(current, record)
                if is_artifact(location):
                    try:
                        stack.append(open_artifact(location, verify=False))
                    except SynthqError:
                        continue
    return found


def _refuse_scores_on_pairs_they_trained_on(
    config: EvalConfig, retrievers: list[Artifact], roots: dict[str, Path]
) -> None:
    """A retriever that learnt, or whose generator learnt, from the split this eval scores
    (``finetune-lm --warm-start D:test``, ``generate --few-shot D:test``, ``--data D --split
    test``) would be scored on the queries it was trained on: a score biased upward, which an ε
    of 0 beside it (a warm start's) says nothing about (issue #74). Refused, as ``--select-on``
    on that split is; a read is matched by its directory and split or, for a public split, by
    content (the split's corpus, qrels and queries)."""
    reads = [(r, *read) for r in retrievers for read in _training_reads(r)]
    if not reads:
        return
    for spec, root in roots.items():
        split = _split(config, spec)
        digest = None
        # scores of a private split are the owner's (ε = ∞, kept in diagnostics/): a retriever may
        # be scored on its own training split there (an overfitting check); never on a public one
        private = not is_artifact(root) and split_is_private(spec, root, split)
        for retriever, owner, record, read_split in reads:
            if read_split != split:
                continue
            if private and (record.get("kind") == "data" or record.get("role") == "data"):
                continue
            if record.get("kind") == PUBLIC_SPLIT and digest is None:
                digest = public_split_digest(root, split) or ""
            same_place = input_location(owner, record).resolve() == root.resolve()
            same_content = record.get("kind") == PUBLIC_SPLIT and digest and record.get("sha256") == digest
            if same_place or same_content:
                training_data = record.get("kind") == "data" or record.get("role") == "data"
                how = "its training data" if training_data else record.get("role")
                raise DataError(
                    f"--retriever {retriever.path}: {owner.path} ({owner.stage}) read the pairs of "
                    f"{source_name(spec)} ({split}) as {how}, the split this eval scores: the score "
                    "would count queries it learnt from (biased upward); evaluate on another split, "
                    "or train on a split you do not evaluate"
                )


def _refuse_ids_a_run_cannot_hold(corpus, queries: dict[str, str], where: Path) -> None:
    """Before any scoring (the TREC run files would refuse them only after it): ids with
    whitespace, which ``synthq data info`` reports too."""
    for kind, mapping in (("document", corpus), ("query", queries)):
        count, first = whitespace_ids(mapping)
        if count:
            raise DataError(whitespace_id_message(kind, count, first), where)


def _dataset_roots(config: EvalConfig) -> dict[str, Path]:
    """Each dataset spec (once) and its local directory; two datasets may not share a name."""
    roots = {spec: resolve_dataset(spec) for spec in dict.fromkeys(config.datasets)}
    names = [source_name(spec) for spec in roots]
    if len(set(names)) != len(names):
        raise DataError(f"two datasets share the name {names!r}: tables would mix them up")
    return roots


def _split(config: EvalConfig, spec: str) -> str:
    return config.split or default_eval_split(spec)


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
    training: dict = field(default_factory=dict)  # a retriever's seed, settings, variant, ...


def _dense_models(retrievers: list[Artifact], untrained: dict, device: str) -> list[DenseModel]:
    """The dense encoders to score: every retriever, then every untrained encoder."""
    from sentence_transformers import SentenceTransformer

    from synthq.models.encoder import load_encoder

    models = [
        DenseModel(
            label=r.path.name,
            method=describe_method(r),
            kind="retriever",
            key=weights_key(r.manifest),
            identity=f"artifact:{r.manifest_hash}",
            privacy=r.privacy,
            load=lambda r=r: SentenceTransformer(str(r.path), device=device),
            releases=r.vouched_releases(),
            training=training_fields(r),
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
                releases=start.artifact.vouched_releases() if start.artifact is not None else [],
            )
        )
    labels = [m.label for m in models]
    if len(set(labels)) != len(labels):
        duplicates = sorted({label for label in labels if labels.count(label) > 1})
        raise DataError(f"two retrievers share the name {duplicates[0]!r}; give each its own directory name")
    return models


@dataclass
class ScoredDataset:
    """One dataset's scores: per-query metrics by model label and sub-dataset, and what was read."""

    name: str
    split: str
    metrics: dict[str, dict[str, dict]]  # label -> part ("" for a plain dataset) -> query -> metric
    counts: dict[str, int]  # documents and queries, over its sub-datasets
    # the evaluated query ids as each (sub-)dataset's own directory names them, the units of the
    # read: a sub-dataset's query is the same unit whether the whole set or the part alone is read
    # (two parts' equal ids then count as one unit, which only adds their releases up)
    queries: list[str]
    query_texts: list[str] = field(default_factory=list)  # their texts, for the read's link sets


@dataclass
class Tally:
    """What the scoring loop accumulates: rows and the releases behind each, per-query scores,
    throughput."""

    rows: list[dict] = field(default_factory=list)  # each carries its releases (row_privacy)
    per_query: dict[str, dict] = field(default_factory=dict)  # dataset -> label -> metric -> query
    private_per_query: dict[str, dict] = field(default_factory=dict)  # the same, of private splits
    throughput: Throughput = field(default_factory=Throughput)


def _declare_inputs(
    writer, retrievers: list[Artifact], untrained: dict, selection: Selection | None
) -> list[dict]:
    """Record in the artifact what every row rests on (the models' releases and assumptions, the
    dev selection's cost) and return the releases each chosen row carries for the selection."""
    writer.public()
    for model in [*retrievers, *(s.artifact for s in untrained.values() if s.artifact is not None)]:
        writer.inherit(model)
    for start in untrained.values():
        writer.assume(*start.guarantee.assumptions)
    if selection is None:
        return []
    if selection.nothing_chosen:
        # Every method had one candidate: nothing was chosen and the dev queries decided nothing.
        # Nothing of the dev evaluation is taken (not its records, which a foreign manifest could
        # forge, nor its assumptions, computed over its own read of the dev split): each row
        # rests on its own model's releases, inherited above.
        return []
    if selection.guarantee is not None:
        # Report-noisy-max replaces the noiseless read of the dev queries; the choice is still a
        # function of every candidate, so every candidate's releases come along (not only the
        # chosen one's): the rows it picks carry them all, composed per unit.
        selection.dev.require_sealed_here("selected on with report-noisy-max")  # its units, its records
        dev_release = next(
            r for r in selection.dev.releases if r["id"] == selection.dev.manifest["own_release"]
        )
        writer.take_releases(selection.candidates)
        writer.take_public_reads(selection.dev.public_reads)  # the candidates' reads of public splits
        writer.assume(*selection.dev.privacy.assumptions)  # the candidates' (starting models, ...)
        noisy = writer.release(selection.guarantee, dev_release["data"], units=dev_release["units"])
        return [noisy, *selection.candidates]
    writer.inherit(selection.dev)
    return selection.dev.vouched_releases()


def _score_dataset(
    writer,
    spec: str,
    data: EvalData,
    split: str,
    models: list[DenseModel],
    config: EvalConfig,
    device: str,
    tally: Tally,
) -> ScoredDataset:
    """BM25 and every dense model on each (sub-)dataset of one dataset; the ranked lists go to
    ``runs/`` (the private ``diagnostics/runs/`` for a private split: a ranked list per private
    query), the throughput to ``tally``."""
    name = source_name(spec)
    ignore_identical = name in IDENTICAL_ID_DATASETS
    scored = ScoredDataset(name, split, {}, {"documents": 0, "queries": 0}, [])
    for part, part_root in dataset_parts(data.root):
        dataset = load_beir_dir(part_root, splits=[split])
        qrels = judged_queries(dataset.require_split(split))
        if not qrels:
            raise DataError(f"split {split!r} has no query with a relevant document", part_root / "qrels")
        queries = {q: dataset.queries[q] for q in qrels}
        _refuse_ids_a_run_cannot_hold(dataset.corpus, queries, part_root)
        scored.queries += list(queries)
        scored.query_texts += list(queries.values())
        scored.counts["documents"] += len(dataset.corpus)
        scored.counts["queries"] += len(queries)
        runs = (writer.diagnostics_dir if data.private else writer.dir) / RUNS_DIR / name / part
        if config.bm25:
            run_bm25 = bm25_search(dataset.corpus, queries, config.top_k, ignore_identical)
            scored.metrics.setdefault("BM25", {})[part] = per_query(qrels, run_bm25)
            write_run(runs / f"{run_tag('BM25')}{RUN_SUFFIX}", run_bm25, run_tag("BM25"))
        for model_spec in models:
            metrics, timing, ranked = score_dense(
                model_spec.load,
                model_spec.key,
                dataset.corpus,
                queries,
                qrels,
                batch_size=config.encode_batch_size,
                top_k=config.top_k,
                ignore_identical=ignore_identical,
                chunk_size=config.search_chunk_size,
                use_faiss=config.faiss,
                device=device,
            )
            tag = run_tag(model_spec.label)
            write_run(runs / f"{tag}{RUN_SUFFIX}", ranked, tag)
            scored.metrics.setdefault(model_spec.label, {})[part] = metrics
            tally.throughput.add(f"{name}{'/' + part if part else ''}/{model_spec.label}", timing)
    return scored


def _data_releases(writer, spec: str, split: str, data: EvalData, scored: ScoredDataset) -> list[dict]:
    """The releases every row on one dataset carries: a synthetic set's own, and the noiseless
    read of a private split (ε = ∞, :func:`synthq.bookkeeping.splits.private_split_guarantee`)."""
    data_releases = list(data.artifact.vouched_releases()) if data.artifact is not None else []
    if data.artifact is not None:
        writer.inherit(data.artifact)
    writer.assume(data.assumption)
    if data.private:
        warn(f"{spec} split {split!r} is private: its scores are ε = ∞")
        data_releases.append(
            writer.release(
                private_split_guarantee(spec, split),
                data.record,
                scored.queries,
                texts=scored.query_texts,
            )  # fmt: skip
        )
    return data_releases


def _add_rows(
    tally: Tally,
    scored: ScoredDataset,
    data: EvalData,
    data_releases: list[dict],
    models: list[DenseModel],
    bm25: bool,
    selection: Selection | None,
    chosen_by: list[dict],
) -> None:
    """One row per model on one dataset: its metrics, the guarantee of its scores (the model's,
    the data's and, for a chosen retriever, the selection's releases) and its training settings."""
    entries = [("BM25", "bm25", "bm25", [], "bm25s", None)] if bm25 else []
    entries += [(m.label, m.method, m.kind, m.releases, m.identity, m) for m in models]
    for label, method, kind, model_releases, identity, model_spec in entries:
        assumptions = [*(model_spec.privacy.assumptions if model_spec else []), data.assumption or ""]
        assumptions = [a for a in assumptions if a]
        # only a row the dev choice kept carries it; one the dev eval never scored is passed through
        chosen = selection is not None and kind == "retriever" and identity in selection.chosen
        own = chosen_by if chosen else []
        releases = release_lists(model_releases, data_releases, own)
        row = result_row(
            scored.name,
            scored.split,
            label,
            method,
            kind,
            score_guarantee([r for part in releases.values() for r in part], assumptions),
            identity,
        )
        row["model_epsilon"] = (model_spec.privacy if model_spec else _BM25_PRIVACY).epsilon
        # what every number of the row rests on: recomputed wherever the row is shown or merged
        row["releases"], row["assumptions"] = releases, assumptions
        if chosen and selection is not None:
            row["selection"] = selection_label(selection)
        row.update(model_spec.training if model_spec else {})
        row.update(row_metrics(scored.metrics[label]))
        tally.rows.append({**row, **scored.counts})
        per_query_scores = tally.private_per_query if data.private else tally.per_query
        per_query_scores.setdefault(scored.name, {})[label] = by_metric(scored.metrics[label])


def _write_results(writer, tally: Tally, selection: Selection | None) -> None:
    """``results.json``, ``per_query.json``, ``results.md`` (with the dev selection), ``selection.md``,
    the privacy-utility plot and the manifest's metrics."""
    rows = tally.rows
    (writer.dir / RESULTS_FILE).write_text(json.dumps(json_safe(rows), indent=2), encoding="utf-8")
    (writer.dir / PER_QUERY_FILE).write_text(json.dumps(tally.per_query), encoding="utf-8")
    if tally.private_per_query:  # scores of private queries one by one: never released
        private_scores = json.dumps(tally.private_per_query)
        (writer.diagnostics_dir / PER_QUERY_FILE).write_text(private_scores, encoding="utf-8")
    with_scores = attach_per_query(rows, {**tally.per_query, **tally.private_per_query})
    text = results_markdown(with_scores)
    if selection is not None:
        text += "\n## Hyper-parameters chosen on dev\n\n" + selection.markdown
        (writer.dir / SELECTION_FILE).write_text(selection.markdown, encoding="utf-8")
        if selection.private_markdown:
            (writer.diagnostics_dir / SELECTION_FILE).write_text(selection.private_markdown, encoding="utf-8")
    (writer.dir / "results.md").write_text(text, encoding="utf-8")
    privacy_utility_plot(with_scores, writer.dir / "privacy_utility.png")
    writer.metrics.update(
        {f"{r['dataset']}/{r['retriever']}": {"epsilon": r["epsilon"], **r["metrics"]} for r in rows}
    )
