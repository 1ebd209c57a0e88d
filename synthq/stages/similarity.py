"""``synthq similarity``: how close synthetic queries are to the originals (Table 6).

* **BLEU** (sacrebleu), one-to-one: each synthetic query against the original queries of the
  same document; the exact sacrebleu signature is recorded.
* **MAUVE** (mauve-text) between the original and synthetic query distributions, on features
  from a local sentence encoder (default ``minilm-l6``; mauve's own featurizer would download
  GPT-2), mean ± std over several k-means seeds. Refused below ``min_samples`` per side.
* distinct-1/2, mean length, and the share of synthetic queries that copy an original
  verbatim — a privacy smell worth surfacing.

Privacy: these scores are computed *from the private queries*, so the similarity artifact is
not post-processing of the DP generator: its own guarantee is ε = ∞. The synthetic set's ε is
recorded beside the scores (``synthetic_epsilon``) because that is what the scores describe.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

from synthq.artifacts.create import create_artifact
from synthq.artifacts.freshness import existing_result
from synthq.artifacts.manifest import Artifact, open_artifact
from synthq.artifacts.records import data_input_record
from synthq.bookkeeping.inputs import artifact_input
from synthq.config.evaluation import SimilarityConfig
from synthq.config.registry import SYNTHETIC_STAGES
from synthq.data.beir_io import read_qrels, read_queries
from synthq.data.sources import load_source, resolve_source
from synthq.privacy.guarantee import Guarantee, format_epsilon
from synthq.runtime import precision
from synthq.runtime.console import result
from synthq.runtime.distributed import resolve_device
from synthq.runtime.errors import DataError

STAGE = "similarity"


def aligned_pairs(
    synthetic: Artifact, original_queries: dict, original_qrels: dict
) -> tuple[list[str], list[list[str]]]:
    """Each synthetic query with the original queries of its document (documents without an
    original query are skipped)."""
    by_document: dict[str, list[str]] = {}
    for query_id, docs in original_qrels.items():
        for doc_id, relevance in docs.items():
            if relevance > 0:
                by_document.setdefault(doc_id, []).append(original_queries[query_id])
    synthetic_queries = read_queries(synthetic.path / "queries.jsonl")
    hypotheses, references = [], []
    for query_id, docs in sorted(read_qrels(synthetic.path / "qrels" / "train.tsv").items()):
        for doc_id in docs:
            if doc_id in by_document:
                hypotheses.append(synthetic_queries[query_id])
                references.append(by_document[doc_id])
    return hypotheses, references


def bleu(hypotheses: list[str], references: list[list[str]]) -> tuple[float, str]:
    """Corpus BLEU with every hypothesis scored against its own references. Documents have
    different numbers of original queries; sacrebleu takes that as ``None`` in the shorter
    reference streams (its signature then reads ``nrefs:var``)."""
    import sacrebleu

    width = max(len(r) for r in references)
    streams = [[refs[k] if k < len(refs) else None for refs in references] for k in range(width)]
    metric = sacrebleu.BLEU()
    score = metric.corpus_score(hypotheses, streams)
    return score.score, str(metric.get_signature())


def distinct_n(texts: list[str], n: int) -> float:
    grams = [
        tuple(words[i : i + n])
        for words in (t.lower().split() for t in texts)
        for i in range(len(words) - n + 1)
    ]
    return len(set(grams)) / max(len(grams), 1)


def mauve_scores(
    original: list[str],
    synthetic: list[str],
    encoder_spec: str,
    seeds: int,
    scaling: float,
    seed: int,
    device: str,
) -> list[float]:
    import mauve

    from synthq.models.encoder import load_encoder

    encoder = load_encoder(encoder_spec, device=device)
    encode = precision.autocast_forward(encoder.encode)
    p_features = encode(original, batch_size=64, normalize_embeddings=True)
    q_features = encode(synthetic, batch_size=64, normalize_embeddings=True)
    return [
        float(
            mauve.compute_mauve(
                p_features=p_features,
                q_features=q_features,
                seed=seed + k,
                mauve_scaling_factor=scaling,
                verbose=False,
            ).mauve
        )
        for k in range(seeds)
    ]


@dataclass(frozen=True)
class _Pairs:
    """The synthetic queries aligned with the original queries of the same documents."""

    hypotheses: list[str]
    references: list[list[str]]
    originals: list[str]
    read: list[str]  # the original query ids read (the release's units)
    original_queries: dict[str, str]


def _aligned(config: SimilarityConfig, synthetic: Artifact, root: Path) -> _Pairs:
    original = load_source(config.original, splits=[config.split])
    qrels = original.require_split(config.split)
    hypotheses, references = aligned_pairs(synthetic, original.queries, qrels)
    if not hypotheses:
        raise DataError("no synthetic query shares a document with the original split", root)
    originals = [original.queries[q] for q in qrels]
    for name, count in (("synthetic", len(hypotheses)), ("original", len(originals))):
        if count < config.min_samples:
            raise DataError(
                f"only {count} {name} queries: MAUVE needs at least {config.min_samples} per side to mean "
                "anything (lower --min-samples only for smoke tests)"
            )
    return _Pairs(hypotheses, references, originals, list(qrels), original.queries)


def _scores(config: SimilarityConfig, pairs: _Pairs, synthetic: Artifact) -> dict:
    """BLEU against the same document's originals, MAUVE over ``mauve_seeds`` runs, diversity."""
    hypotheses, originals = pairs.hypotheses, pairs.originals
    bleu_score, signature = bleu(hypotheses, pairs.references)
    mauve_values = mauve_scores(
        originals, hypotheses, config.encoder, config.mauve_seeds, config.mauve_scaling_factor, config.seed,
        resolve_device(config.device),
    )  # fmt: skip
    original_set = {q.strip().lower() for q in originals}
    copies = sum(h.strip().lower() in original_set for h in hypotheses)
    epsilon = synthetic.privacy.epsilon
    return {
        "pairs": len(hypotheses),
        "bleu": bleu_score,
        "bleu_signature": signature,
        "mauve_mean": statistics.fmean(mauve_values),
        "mauve_std": statistics.pstdev(mauve_values),
        "mauve_runs": mauve_values,
        "mauve_features": config.encoder,
        "distinct_1": distinct_n(hypotheses, 1),
        "distinct_2": distinct_n(hypotheses, 2),
        "original_distinct_2": distinct_n(originals, 2),
        "mean_words_synthetic": statistics.fmean(len(h.split()) for h in hypotheses),
        "mean_words_original": statistics.fmean(len(o.split()) for o in originals),
        "verbatim_copy_rate": copies / len(hypotheses),
        "synthetic_epsilon": epsilon if math.isfinite(epsilon) else "inf",
    }


def _table(synthetic: Artifact, metrics: dict) -> str:
    return (
        "These scores read the private queries: this table is ε = ∞ (for the data owner); the "
        "second column is the synthetic set's own ε.\n\n"
        "| synthetic set | synthetic set's ε | BLEU | MAUVE | distinct-2 | verbatim copies |\n"
        "|---|---|---|---|---|---|\n"
        f"| {synthetic.path.name} | {format_epsilon(synthetic.privacy.epsilon)} | {metrics['bleu']:.2f} "
        f"| {metrics['mauve_mean']:.3f} ± {metrics['mauve_std']:.3f} "
        f"| {metrics['distinct_2']:.3f} | {100 * metrics['verbatim_copy_rate']:.1f}% |\n"
    )


@precision.stage
def run(config: SimilarityConfig) -> Artifact:
    """Align the synthetic queries with the original split's, score them, and write the scores
    with their release: they read the private queries without noise (ε = ∞)."""
    synthetic = artifact_input(config.synthetic, stage=SYNTHETIC_STAGES)
    root = resolve_source(config.original)
    inputs = [synthetic.input_record(), data_input_record(root, name=config.original, private=True)]
    if (done := existing_result(STAGE, config, inputs)) is not None:
        return done
    started = time.perf_counter()
    pairs = _aligned(config, synthetic, root)
    metrics = _scores(config, pairs, synthetic)
    with create_artifact(config.out, STAGE, config, inputs) as writer:
        writer.metrics.update(metrics)
        (writer.dir / "similarity.md").write_text(_table(synthetic, metrics), encoding="utf-8")
        writer.inherit(synthetic)
        reason = "similarity scores are computed from the original private queries without noise (ε = ∞)"
        texts = [pairs.original_queries[q] for q in pairs.read]
        writer.release(Guarantee.non_private(reason, unit="query"), inputs[1], pairs.read, texts=texts)
        writer.timings["wall_seconds"] = round(time.perf_counter() - started, 3)
    result((config.out / "similarity.md").read_text(encoding="utf-8"), markup=False)
    return open_artifact(config.out, STAGE)
