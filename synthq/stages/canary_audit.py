"""``synthq canary-audit``: how much a fine-tuned query generator — and the retriever trained on
its synthetic queries — actually leaks.

For every ε in ``--epsilons`` the stage trains ONE generator on the private pairs plus the
canaries, through the ``finetune-lm`` stage (the audit measures the real training code), and
then audits it by one or both methods:

* ``one-run`` (default; Steinke, Nasr & Jagielski, NeurIPS 2023): ``--canaries`` m canaries
  (random corpus words → a random 10-digit secret), each included **once** with probability ½
  by a secret coin. Score = log p(secret | document) relative to ``secret_references`` random
  secrets of the same form under the fine-tuned generator, minus the same under the
  un-fine-tuned model (so neither the learnt format nor an easy digit string looks like
  membership). From the k₊ highest / k₋ lowest scores,
  :mod:`synthq.audit.one_run` proves an ε lower bound at 95 % confidence that is per pair
  (each canary is one pair included once) and so directly comparable with the proven ε; also
  its Gaussian-DP version, TPR at FPR 1 % / 10 % and the AUROC with a bootstrap interval.
* ``exposure`` (Table 7 of Carranza et al.): canaries repeated r times; rank among
  ``--references`` candidates, exposure, verbatim leakage in sampled queries, and a
  Clopper–Pearson ε lower bound for the **r-fold group** with its threshold chosen on held-out
  canaries, converted to a per-pair bound by group privacy (:mod:`synthq.audit.exposure`).

**User level** (``--privacy-unit user``, one-run): every canary is a *user* who writes
``canary_queries_per_user`` canary pairs, all included or all left out by one coin; the
generators are fine-tuned at the user unit (private queries keep their users, via a scratch
``users.tsv``), a user's score is the mean of their canaries' scores, and the one-run bound is per
user — the person is the adversary's target, and the bound compares with the per-user ε.

**End-to-end** (``retriever_audit``, with ``one-run``): from each audited generator, one synthetic
query is sampled for every canary document and ``retriever_documents`` public documents
(``generate``), a retriever is trained on them (``train-retriever``), and each canary is scored
by how much closer its secret is to its own document than to the other canary documents
(:mod:`synthq.audit.retriever`); the same one-run bound follows. A retriever trained directly on
the private pairs plus the included canaries (ε = ∞) is the reference row with power.

Privacy of the audit artifact: it reads the private data and the canary coins without noise, so
it is ε = ∞ whatever the generators' ε. It stores canary ids, secrets, coins and scores; never a
private query's text (real-document canaries are stored by query id).
"""

from __future__ import annotations

import hashlib
import json
import math
import secrets
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from synthq.artifacts.create import create_artifact
from synthq.artifacts.freshness import existing_result
from synthq.artifacts.manifest import Artifact, open_artifact, partial_dir
from synthq.artifacts.records import data_input_record
from synthq.artifacts.writer import CHECKPOINTS
from synthq.audit.canaries import OneRunCanary
from synthq.audit.report import AuditReport
from synthq.audit.retriever import retriever_scores
from synthq.audit.scoring import score_canaries_in_chunks, secret_scores, verbatim_leaks
from synthq.audit.training_set import (
    audit_delta,
    augmented_dataset,
    check_canary_count,
    choose_canaries,
    inserted_count,
    private_pairs,
    training_unit_count,
)
from synthq.config.audit import CanaryAuditConfig
from synthq.config.fields import revalidated
from synthq.config.registry import stage_entry
from synthq.data.beir_io import BeirDataset, write_beir_dir
from synthq.data.sources import load_source, resolve_source
from synthq.privacy.guarantee import Guarantee, format_epsilon
from synthq.runtime.console import info
from synthq.runtime.distributed import resolve_device
from synthq.runtime.errors import SynthqError

STAGE = "canary-audit"
AUDIT_DATA = "data"  # scratch BEIR directory with the private pairs; removed at the end
CANARY_SEED = "canary-seed"  # in the private checkpoint: the drawn seed, for --resume


@dataclass(frozen=True)
class _TrainingSet:
    """The scratch BEIR directory the audited generators train on, and what it holds."""

    path: Path
    private_pairs: int
    canary_pairs: int


def run(config: CanaryAuditConfig) -> Artifact:
    """Choose the canaries, fine-tune and audit a generator per ε (and the retrievers trained
    through it), audit a retriever on the private pairs, and write the report (ε = ∞)."""
    config = revalidated(config)  # the audit's checks, however the config was built
    source = resolve_source(config.data)
    inputs = [data_input_record(source, name=config.data, private=True)]
    if (done := existing_result(STAGE, config, inputs)) is not None:
        return done
    dataset = load_source(config.data, splits=[config.split])
    seed = _canary_seed(config)
    one_run, exposure = choose_canaries(dataset, config.model_copy(update={"canary_seed": seed}))
    private = private_pairs(dataset, config)
    check_canary_count(one_run, exposure, private)
    if _uses_one_run(config) and config.retriever_audit:  # refused now, not after the generators
        synthetic = len(one_run) + min(config.retriever_documents, len(dataset.corpus))
        _check_retriever_batch(config, min(synthetic, len(private) + inserted_count(one_run, exposure)))
    with create_artifact(
        config.out, STAGE, config, inputs, resume=config.resume, keep_partial_on_error=True
    ) as writer:
        scratch = writer.checkpoint_dir
        (scratch / CANARY_SEED).write_text(str(seed), encoding="utf-8")  # what --resume redraws from
        path = augmented_dataset(dataset, config, private, one_run, exposure, scratch / AUDIT_DATA)
        training = _TrainingSet(path, len(private), inserted_count(one_run, exposure))
        _write_canaries(writer.dir, one_run, exposure)
        # δ = 1/(2n) over privacy units, as finetune-lm counts them: the queries (or the users)
        delta = audit_delta(config, training_unit_count(path, config))
        report = AuditReport(one_run, config.privacy_unit == "user", delta, config.confidence)
        reference = _reference_scores(config, report) if _uses_one_run(config) else None
        public_docs = _retriever_documents(dataset, config.retriever_documents)
        for epsilon in config.epsilons:
            _audit_at(epsilon, config, training, report, reference, exposure, public_docs, scratch)
        if _uses_one_run(config) and config.retriever_audit:
            _audit_original_retriever(config, training, report, scratch)
        _write_results(writer, config, report, dataset, inputs)
        shutil.rmtree(scratch, ignore_errors=True)
    info((Path(config.out) / "audit.md").read_text(encoding="utf-8"))
    return open_artifact(config.out, STAGE)


# Phases ------------------------------------------------------------------------------------------


def _canary_seed(config: CanaryAuditConfig) -> int:
    """The seed the canaries are drawn from: ``--canary-seed``, else the one an interrupted run
    kept in its private checkpoint (``--resume`` audits the same canaries it trained on), else a
    fresh draw from the OS's secure randomness. Never recorded in a released file."""
    if config.canary_seed is not None:
        return config.canary_seed
    kept = partial_dir(Path(config.out)) / CHECKPOINTS / CANARY_SEED
    if config.resume and kept.is_file():
        return int(kept.read_text(encoding="utf-8"))
    return secrets.randbits(62)


def _write_canaries(directory: Path, one_run, exposure) -> None:
    """``canaries.jsonl``: ids, secrets and coins (never a private query's text)."""
    records = "".join(json.dumps(c.record()) + "\n" for c in [*one_run, *exposure])
    (directory / "canaries.jsonl").write_text(records, encoding="utf-8")


def _reference_scores(config: CanaryAuditConfig, report: AuditReport) -> np.ndarray:
    """The one-run canaries' scores under the un-fine-tuned model, subtracted from every
    generator's scores."""
    from synthq.models.generator import QueryGenerator

    with report.timed("reference_seconds"):
        base = QueryGenerator.load(
            config.model, device=resolve_device(), max_source_length=config.finetune.get("max_source_length")
        )
        base.model.eval()
        reference = secret_scores(
            base, report.one_run, config.secret_references, config.scoring_batch_size, "base model"
        )
        del base
    return reference


def _audit_at(
    epsilon: float,
    config: CanaryAuditConfig,
    training: _TrainingSet,
    report: AuditReport,
    reference: np.ndarray | None,
    exposure: list,
    public_docs: dict[str, dict],
    scratch: Path,
) -> None:
    """Fine-tune a generator at ``epsilon`` and audit it (and the retriever trained through it)."""
    from synthq.models.generator import QueryGenerator

    key = format_epsilon(epsilon)
    name = "inf" if math.isinf(epsilon) else f"{epsilon:g}"
    artifact = _fine_tune(config, training, epsilon, scratch / f"generator-eps{name}", report)
    generator = QueryGenerator.load(artifact.path, device=resolve_device())
    generator.model.eval()
    if _uses_one_run(config):
        _score_one_run(generator, reference, config, key, report)
    if _uses_exposure(config):
        _score_exposure(generator, exposure, config, key, report)
    del generator
    if _uses_one_run(config) and config.retriever_audit:
        with report.timed(f"retriever_seconds[eps={key}]"):
            scores = _audit_retriever_through(artifact, report.one_run, public_docs, config, scratch, name)
        report.add_one_run(
            "retriever (synthetic)", report.proven[key], scores, f"retriever on synthetic, ε = {key}",
            f"retriever[eps={key}]",
        )  # fmt: skip


def _fine_tune(
    config: CanaryAuditConfig, training: _TrainingSet, epsilon: float, out: Path, report: AuditReport
) -> Artifact:
    """The audited generator at ``epsilon``, fine-tuned by the real ``finetune-lm`` stage."""
    key = format_epsilon(epsilon)
    info(
        f"[bold]canary audit[/]: fine-tuning at ε = {key} on {training.private_pairs} + "
        f"{training.canary_pairs} canary pairs"
    )
    options = {
        **config.finetune, "data": str(training.path), "split": config.split, "model": config.model,
        **config.unit_options(), "epsilon": epsilon, "seed": config.seed, "out": out, "resume": config.resume,
    }  # fmt: skip
    with report.timed(f"train_seconds[eps={key}]"):
        artifact = _train_stage("finetune-lm", options)
    report.proven[key] = artifact.privacy.epsilon
    return artifact


def _score_one_run(generator, reference: np.ndarray, config: CanaryAuditConfig, key: str, report) -> None:
    """The one-run canaries' scores under one generator, less their scores under the base model."""
    with report.timed(f"one_run_score_seconds[eps={key}]"):
        scores = secret_scores(
            generator, report.one_run, config.secret_references, config.scoring_batch_size, f"ε = {key}"
        )
        scores = scores - reference
    proven = report.proven[key]
    report.add_one_run("generator", proven, scores, f"generator, ε = {key}", f"generator[eps={key}]")


def _score_exposure(
    generator, exposure: list, config: CanaryAuditConfig, key: str, report: AuditReport
) -> None:
    """Rank, exposure and verbatim leakage of the exposure canaries under one generator."""
    with report.timed(f"score_seconds[eps={key}]"):
        scored = score_canaries_in_chunks(
            generator, exposure, config.scoring_batch_size, f"scoring canaries (ε = {key})"
        )
    with report.timed(f"leak_sampling_seconds[eps={key}]"):
        leaks = verbatim_leaks(
            generator, exposure, config.leak_samples, config.top_p, config.max_new_tokens, config.seed
        )
    report.add_exposure(key, scored, leaks)


def _audit_original_retriever(
    config: CanaryAuditConfig, training: _TrainingSet, report: AuditReport, scratch: Path
) -> None:
    """The reference row with power: a retriever trained on the private pairs and the included
    canaries directly (ε = ∞)."""
    with report.timed("retriever_seconds[original]"):
        options = _retriever_options(config, str(training.path), scratch / "retriever-original")
        scores = _score_retriever(_train_stage("train-retriever", options), report.one_run, config)
    report.add_one_run(
        "retriever (private pairs)",
        math.inf,
        scores,
        "retriever on private pairs, ε = ∞",
        "retriever[original]",
    )


def _write_results(
    writer, config: CanaryAuditConfig, report: AuditReport, dataset: BeirDataset, inputs
) -> None:
    """``audit.json``, ``audit.md``, the plots, the release (ε = ∞), timings and metrics."""
    table = report.exposure_table(config.epsilons) if _uses_exposure(config) else []
    report.write(writer.dir, config.privacy_unit, table)
    reason = (
        "the audit reads the private data and the canary coins without noise (the audited "
        f"generators' ε: {', '.join(format_epsilon(v) for v in report.proven.values())})"
    )
    read = list(dataset.require_split(config.split))
    texts = [dataset.queries.get(q, "") for q in read]  # ids and texts, as eval reads them
    writer.release(Guarantee.non_private(reason, unit="query"), inputs[0], read, texts=texts)
    writer.timings.update(report.timings)
    writer.metrics.update(report.metrics(table))


# The end-to-end retriever audit ------------------------------------------------------------------


def _retriever_documents(dataset: BeirDataset, count: int) -> dict[str, dict]:
    """``count`` corpus documents for the retriever audit (public), by smallest SHA-256 of their ids."""
    ids = sorted(dataset.corpus, key=lambda d: hashlib.sha256(d.encode()).hexdigest())[:count]
    return {d: dataset.corpus[d] for d in ids}


def _check_retriever_batch(config: CanaryAuditConfig, pairs: int) -> None:
    """The retriever audit's batch against the fewest pairs one of its retrievers trains on (the
    synthetic set of the canary and public documents, or the private pairs with the canaries):
    a batch larger than that failed train-retriever only after every generator was fine-tuned."""
    batch = int(_retriever_options(config, "", Path())["batch_size"])
    if batch > pairs:
        raise SynthqError(
            f"the retriever audit trains with batch {batch} on as few as {pairs} pairs: give "
            f"--retriever batch_size={pairs} (or less), or --no-retriever-audit"
        )


def _retriever_options(config: CanaryAuditConfig, data: str, out: Path) -> dict:
    options = {"encoder": "minilm-l6", "epochs": 1, "batch_size": 32, "lr": 3e-5}
    options.update(max_query_length=32, max_doc_length=128)
    options.update(config.retriever)
    options.update(data=data, split="train", out=out, resume=config.resume)
    return options


def _score_retriever(artifact, canaries: list[OneRunCanary], config: CanaryAuditConfig) -> np.ndarray:
    from synthq.models.encoder import load_encoder

    encoder = load_encoder(artifact.path, device=resolve_device())
    max_query = int(config.retriever.get("max_query_length", 32))
    max_doc = int(config.retriever.get("max_doc_length", 128))
    return retriever_scores(
        encoder, [c.query for c in canaries], [c.document for c in canaries], config.scoring_batch_size,
        max_query, max_doc,
    )  # fmt: skip


def _audit_retriever_through(
    generator_artifact, canaries, public_docs, config: CanaryAuditConfig, scratch: Path, name: str
) -> np.ndarray:
    """Synthetic queries for the canary and public documents → a retriever → canary scores."""
    corpus = {c.canary_id: {"title": "", "text": c.document} for c in canaries} | public_docs
    documents = write_beir_dir(scratch / f"documents-{name}", corpus, {}, {})
    options = {
        "num_queries": 1,
        "top_p": config.top_p,
        "max_new_tokens": config.max_new_tokens,
        "batch_size": 32,
    }
    options.update(config.generate)
    options.update(
        generator=generator_artifact.path, corpus=str(documents), split=None, seed=config.seed,
        out=scratch / f"synthetic-{name}", resume=config.resume,
    )  # fmt: skip
    synthetic = _train_stage("generate", options)
    retriever = _train_stage(
        "train-retriever", _retriever_options(config, str(synthetic.path), scratch / f"retriever-{name}")
    )
    return _score_retriever(retriever, canaries, config)


def _train_stage(name: str, options: dict):
    """Run another stage through the registry, as the CLI would."""
    entry = stage_entry(name)
    return entry.run_function()(entry.config_type()(**options))


def _uses_one_run(config: CanaryAuditConfig) -> bool:
    return config.method in ("one-run", "both")


def _uses_exposure(config: CanaryAuditConfig) -> bool:
    return config.method in ("exposure", "both")
