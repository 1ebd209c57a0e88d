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
import shutil
import time
from pathlib import Path

import numpy as np

from synthq.artifacts import Artifact, create_artifact, data_input_record, existing_result, open_artifact
from synthq.audit.canaries import (
    Canary,
    OneRunCanary,
    inserted_pair_count,
    make_canaries,
    make_one_run_canaries,
    per_user,
)
from synthq.audit.one_run import one_run_audit, score_summary
from synthq.audit.retriever import retriever_scores
from synthq.audit.scoring import score_canaries, secret_scores, verbatim_leaks
from synthq.audit.tables import one_run_markdown, plot_exposure, plot_scores, summarize, to_markdown
from synthq.config import CanaryAuditConfig
from synthq.config.registry import stage_entry
from synthq.data.beir_io import BeirDataset, read_qrels, write_beir_dir
from synthq.data.sources import load_source, resolve_source
from synthq.data.users import USERS_FILE, query_users, read_users_file
from synthq.models.resolve import resolve_device
from synthq.privacy.guarantee import Guarantee, default_delta, format_epsilon
from synthq.runtime.console import info, progress
from synthq.runtime.errors import SynthqError

STAGE = "canary-audit"
AUDIT_DATA = "data"  # scratch BEIR directory with the private pairs; removed at the end


def _private_pairs(dataset: BeirDataset, config: CanaryAuditConfig) -> list[tuple[str, str]]:
    """The private (query id, document id) pairs the audited generators train on.

    ``private_pairs`` keeps a fixed subset: the pairs with the smallest SHA-256 of their ids, a
    choice that depends on no seed and no coin."""
    qrels = dataset.require_split(config.split)
    pairs = sorted((q, d) for q, docs in qrels.items() for d, rel in docs.items() if rel > 0)
    if config.private_pairs is not None and config.private_pairs < len(pairs):
        pairs = sorted(pairs, key=lambda p: hashlib.sha256(f"{p[0]}\t{p[1]}".encode()).hexdigest())
        pairs = sorted(pairs[: config.private_pairs])
    return pairs


def _augmented_dataset(
    dataset: BeirDataset,
    config: CanaryAuditConfig,
    private: list[tuple[str, str]],
    one_run: list[OneRunCanary],
    exposure: list[Canary],
    root: Path,
) -> Path:
    """The private pairs plus every included one-run canary (once) and every exposure canary
    (``repetitions`` times), as a scratch BEIR directory."""
    corpus = {d: dataset.corpus[d] for _, d in private}
    queries = {q: dataset.queries[q] for q, _ in private}
    train: dict[str, dict[str, int]] = {}
    for query_id, doc_id in private:
        train.setdefault(query_id, {})[doc_id] = 1
    for canary in one_run:
        if canary.included:
            corpus[canary.canary_id] = {"title": "", "text": canary.document}
            queries[canary.canary_id] = canary.query
            train[canary.canary_id] = {canary.canary_id: 1}
    for canary in exposure:
        if canary.repetitions == 0:
            continue
        corpus[canary.canary_id] = {"title": "", "text": canary.document}
        for copy in range(canary.repetitions):
            query_id = f"{canary.canary_id}-copy{copy}"
            queries[query_id] = canary.query
            train[query_id] = {canary.canary_id: 1}
    write_beir_dir(root, corpus, queries, {config.split: train})
    if config.privacy_unit == "user":  # who wrote what: the private users, and one user per canary
        private_queries = list(dict.fromkeys(q for q, _ in private))
        rows = [dataset.queries.row(q) for q in private_queries]
        owners = dict(zip(private_queries, query_users(dataset.root, dataset.queries, rows), strict=True))
        owners |= {c.canary_id: c.user for c in one_run if c.included}
        lines = "".join(f"{query}\t{user}\n" for query, user in owners.items())
        (root / USERS_FILE).write_text("query-id\tuser-id\n" + lines, encoding="utf-8")
    return root


def _one_run_row(
    audited: str, proven: float, scores: np.ndarray, coins: np.ndarray, delta: float, config
) -> dict:
    result = one_run_audit(scores, coins, delta=delta, confidence=config.confidence)
    summary = score_summary(scores[coins], scores[~coins])
    return {"audited": audited, "proven_epsilon": proven, **result.to_dict(), **summary}


def _retriever_documents(dataset: BeirDataset, count: int) -> dict[str, dict]:
    """``count`` corpus documents for the retriever audit (public), by smallest SHA-256 of their ids."""
    ids = sorted(dataset.corpus, key=lambda d: hashlib.sha256(d.encode()).hexdigest())[:count]
    return {d: dataset.corpus[d] for d in ids}


def audit_delta(config: CanaryAuditConfig, training_pairs: int) -> float:
    """The δ the bounds are tested at: the audited generators' δ (``--finetune delta``, which
    arrives as text from the command line, or finetune-lm's default 1/(2n))."""
    value = config.finetune.get("delta")
    return default_delta(training_pairs) if value is None else float(value)


def _train_stage(name: str, options: dict):
    entry = stage_entry(name)
    return entry.run_function()(entry.config_type()(**options))


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


def run(config: CanaryAuditConfig) -> Artifact:
    from synthq.models.generator import QueryGenerator

    source = resolve_source(config.data)
    inputs = [data_input_record(source, name=config.data, private=True)]
    if (done := existing_result(STAGE, config, inputs)) is not None:
        return done
    dataset = load_source(config.data, splits=[config.split])
    use_one_run = config.method in ("one-run", "both")
    use_exposure = config.method in ("exposure", "both")
    by_user = config.privacy_unit == "user"
    per_canary_user = config.canary_queries_per_user if by_user else 0
    one_run = (
        make_one_run_canaries(dataset, config.canaries, config.canary_seed, per_canary_user)
        if use_one_run
        else []
    )
    exposure = (
        make_canaries(
            dataset,
            config.split,
            config.shapes,
            config.canaries_per_shape,
            config.repetitions,
            config.references,
            config.canary_seed,
        )  # fmt: skip
        if use_exposure
        else []
    )
    private = _private_pairs(dataset, config)
    # the expected count, not the coins: whether the audit is refused must not depend on them
    expected = len(one_run) / 2 + inserted_pair_count(exposure)
    if expected > len(private):
        raise SynthqError(
            f"the canaries would add ~{expected:.0f} pairs to {len(private)} private pairs: lower "
            "--canaries, --repetitions or --canaries-per-shape (canaries must not outnumber the data, "
            "or the audit measures a different training set)"
        )
    inserted = sum(c.included for c in one_run) + inserted_pair_count(exposure)

    def unit_scores(scores: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Scores and coins per audited unit: each canary, or each canary user (mean score)."""
        if not by_user:
            return scores, np.array([c.included for c in one_run], dtype=bool)
        _, means, user_coins = per_user(one_run, scores)
        return np.array(means), np.array(user_coins, dtype=bool)

    with create_artifact(
        config.out, STAGE, config, inputs, resume=config.resume, keep_partial_on_error=True
    ) as writer:
        scratch = writer.checkpoint_dir
        augmented = _augmented_dataset(dataset, config, private, one_run, exposure, scratch / AUDIT_DATA)
        (writer.dir / "canaries.jsonl").write_text(
            "".join(json.dumps(c.record()) + "\n" for c in [*one_run, *exposure]), encoding="utf-8"
        )
        finetune = {
            **config.finetune, "data": str(augmented), "split": config.split, "model": config.model,
            "privacy_unit": config.privacy_unit, "max_queries_per_user": config.max_queries_per_user,
        }  # fmt: skip
        # δ = 1/(2n) over privacy units, as finetune-lm counts them: the queries (or the users) of
        # the training set
        trained = read_qrels(Path(augmented) / "qrels" / f"{config.split}.tsv")
        owners = read_users_file(Path(augmented) / USERS_FILE) if by_user else {}
        units = len({user for user, _ in owners.values()}) if by_user else len(trained)
        delta = audit_delta(config, units)
        phases: dict[str, float] = {}
        reference = None
        if use_one_run:
            started = time.perf_counter()
            base = QueryGenerator.load(
                config.model, device=resolve_device(), max_source_length=finetune.get("max_source_length")
            )
            base.model.eval()
            reference = secret_scores(
                base, one_run, config.secret_references, config.scoring_batch_size, "base model"
            )
            del base
            phases["reference_seconds"] = round(time.perf_counter() - started, 1)
        public_docs = _retriever_documents(dataset, config.retriever_documents)
        exposure_rows, one_run_rows, panels, per_canary, proven = [], [], [], {}, {}
        for epsilon in config.epsilons:
            key = format_epsilon(epsilon)
            name = "inf" if math.isinf(epsilon) else f"{epsilon:g}"
            info(
                f"[bold]canary audit[/]: fine-tuning at ε = {key} on {len(private)} + {inserted} canary pairs"
            )
            started = time.perf_counter()
            generator_artifact = _train_stage(
                "finetune-lm",
                {**finetune, "epsilon": epsilon, "seed": config.seed, "out": scratch / f"generator-eps{name}",
                 "resume": config.resume},
            )  # fmt: skip
            phases[f"train_seconds[eps={key}]"] = round(time.perf_counter() - started, 1)
            proven[key] = generator_artifact.privacy.epsilon
            generator = QueryGenerator.load(generator_artifact.path, device=resolve_device())
            generator.model.eval()
            if use_one_run:
                started = time.perf_counter()
                scores = (
                    secret_scores(
                        generator, one_run, config.secret_references, config.scoring_batch_size, f"ε = {key}"
                    )
                    - reference
                )
                phases[f"one_run_score_seconds[eps={key}]"] = round(time.perf_counter() - started, 1)
                row = _one_run_row("generator", proven[key], *unit_scores(scores), delta, config)
                one_run_rows.append(row)
                panels.append((f"generator, ε = {key}", *unit_scores(scores)))
                per_canary[f"generator[eps={key}]"] = scores.round(4).tolist()
            if use_exposure:
                started = time.perf_counter()
                with progress() as bar:
                    task = bar.add_task(f"scoring canaries (ε = {key})", total=len(exposure))
                    scored = []
                    for start in range(0, len(exposure), 4):
                        chunk = exposure[start : start + 4]
                        scored.extend(score_canaries(generator, chunk, batch_size=config.scoring_batch_size))
                        bar.advance(task, len(chunk))
                phases[f"score_seconds[eps={key}]"] = round(time.perf_counter() - started, 1)
                started = time.perf_counter()
                leaks = verbatim_leaks(
                    generator, exposure, config.leak_samples, config.top_p, config.max_new_tokens, config.seed
                )
                phases[f"leak_sampling_seconds[eps={key}]"] = round(time.perf_counter() - started, 1)
                for row, leaked in zip(scored, leaks, strict=True):
                    exposure_rows.append({**row, "epsilon": key, "leaked": leaked})
            del generator
            if use_one_run and config.retriever_audit:
                started = time.perf_counter()
                scores = _audit_retriever_through(
                    generator_artifact, one_run, public_docs, config, scratch, name
                )
                phases[f"retriever_seconds[eps={key}]"] = round(time.perf_counter() - started, 1)
                one_run_rows.append(
                    _one_run_row("retriever (synthetic)", proven[key], *unit_scores(scores), delta, config)
                )
                panels.append((f"retriever on synthetic, ε = {key}", *unit_scores(scores)))
                per_canary[f"retriever[eps={key}]"] = scores.round(4).tolist()
        if use_one_run and config.retriever_audit:
            started = time.perf_counter()
            retriever = _train_stage(
                "train-retriever", _retriever_options(config, str(augmented), scratch / "retriever-original")
            )
            scores = _score_retriever(retriever, one_run, config)
            phases["retriever_seconds[original]"] = round(time.perf_counter() - started, 1)
            one_run_rows.append(
                _one_run_row("retriever (private pairs)", math.inf, *unit_scores(scores), delta, config)
            )
            panels.append(("retriever on private pairs, ε = ∞", *unit_scores(scores)))
            per_canary["retriever[original]"] = scores.round(4).tolist()
        table = summarize(exposure_rows, config.epsilons, proven, delta) if use_exposure else []
        report = {
            "delta": delta,
            "privacy_unit": config.privacy_unit,
            **({"canary_users": list(dict.fromkeys(c.user for c in one_run))} if by_user else {}),
            "one_run": one_run_rows,
            "one_run_scores": {"canaries": [c.canary_id for c in one_run], **per_canary},
            "exposure": {"summary": table, "canaries": exposure_rows},
        }
        (writer.dir / "audit.json").write_text(json.dumps(report, indent=2, default=str), encoding="utf-8")
        markdown = []
        if one_run_rows:
            markdown.append("## One-run audit\n\n" + one_run_markdown(one_run_rows))
            plot_scores(panels, writer.dir / "scores.png")
        if table:
            markdown.append("## Exposure audit (Table 7)\n\n" + to_markdown(table))
            plot_exposure(table, writer.dir / "exposure.png")
        (writer.dir / "audit.md").write_text("\n".join(markdown), encoding="utf-8")
        reason = (
            "the audit reads the private data and the canary coins without noise (the audited "
            f"generators' ε: {', '.join(format_epsilon(v) for v in proven.values())})"
        )
        writer.release(
            Guarantee.non_private(reason, unit="query"), inputs[0], list(dataset.require_split(config.split))
        )
        writer.timings.update(phases)
        writer.metrics.update(
            {f"one-run/{r['audited']}/eps={format_epsilon(r['proven_epsilon'])}": {
                "epsilon_lower_bound": r["epsilon_lower_bound"],
                "gdp_epsilon_lower_bound": r["gdp_epsilon_lower_bound"],
                "auroc": r["auroc"],
            } for r in one_run_rows}
            | {f"exposure/eps={r['epsilon']}/rep={r['repetitions']}": {
                "rank": r["mean_rank"], "leaked": r["leaked"], "exposure": r["exposure_extrapolated"],
                "group_epsilon_lower_bound": r["group_epsilon_lower_bound"],
                "pair_epsilon_lower_bound": r["pair_epsilon_lower_bound"],
            } for r in table if r["shape"] == "all"}
        )  # fmt: skip
        shutil.rmtree(scratch, ignore_errors=True)
    info((Path(config.out) / "audit.md").read_text(encoding="utf-8"))
    return open_artifact(config.out, STAGE)
