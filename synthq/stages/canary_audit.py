"""``synthq canary-audit``: how much a fine-tuned query generator actually leaks.

For every ε in ``--epsilons`` the stage trains a generator on the private pairs plus canaries
(each inserted ``r`` times for every ``r`` in ``--repetitions``) by calling ``finetune-lm``'s
public ``run`` — the audit measures the real training code — and then measures, per ε ×
repetition × shape (held-out canaries, never inserted, are the control with repetition 0):

* **rank** of the true canary query among ``--references`` candidates differing only in the
  secret, by the generator's log-likelihood given the canary document (Table 7's "k/100");
* **exposure** by rank interpolation and by skew-normal extrapolation (:mod:`synthq.audit.exposure`);
* **leaked**: the share of canaries whose secret appears verbatim in ``--leak-samples`` sampled
  queries for the canary document (nucleus sampling, as ``generate`` samples);
* an **empirical ε lower bound** from inserted vs held-out canaries (Clopper–Pearson), printed
  next to the proven ε.

Privacy of the audit artifact itself: its numbers are computed from generators trained on the
private data, one per ε; by composition the artifact is (Σε, Σδ)-DP, and ε = ∞ as soon as one
generator is non-private.
"""

from __future__ import annotations

import json
import math
import shutil
import statistics
import time
from pathlib import Path

import torch

from synthq.artifacts import Artifact, create_artifact, data_input_record, existing_result, open_artifact
from synthq.audit.canaries import Canary, inserted_pair_count, make_canaries
from synthq.audit.exposure import (
    SECRET_SPACE,
    epsilon_lower_bound,
    exposure_extrapolated,
    exposure_from_rank,
    rank_of,
)
from synthq.config import CanaryAuditConfig, FinetuneConfig
from synthq.console import info, progress
from synthq.data.beir_io import write_beir_dir
from synthq.data.sources import load_source, resolve_source
from synthq.errors import SynthqError
from synthq.models.resolve import resolve_device
from synthq.privacy import Guarantee, format_epsilon

STAGE = "canary-audit"


def _augmented_dataset(config: CanaryAuditConfig, canaries: list[Canary], root: Path) -> Path:
    """The private training split plus every inserted canary, repeated, as a BEIR directory."""
    dataset = load_source(config.data, splits=[config.split])
    qrels = dataset.require_split(config.split)
    corpus = dict(dataset.corpus)
    queries = {q: dataset.queries[q] for q in qrels}
    train = {q: dict(docs) for q, docs in qrels.items()}
    for canary in canaries:
        if canary.repetitions == 0:
            continue
        corpus[canary.canary_id] = {"title": "", "text": canary.document}
        for copy in range(canary.repetitions):
            query_id = f"{canary.canary_id}-copy{copy}"
            queries[query_id] = canary.query
            train[query_id] = {canary.canary_id: 1}
    return write_beir_dir(root, corpus, queries, {config.split: train})


def _score_canaries(generator, canaries: list[Canary], batch_size: int) -> list[dict]:
    """Rank and exposure of every canary under one generator (log-perplexity = −log-likelihood).

    A canary's candidates share the document and the query up to the secret, so they are scored
    with that shared part computed once (:meth:`QueryGenerator.candidate_log_likelihoods`)."""
    results = []
    for canary in canaries:
        candidates = [canary.query_with(secret) for secret in [canary.secret, *canary.reference_secrets]]
        log_likelihoods = generator.candidate_log_likelihoods(canary.document, candidates, batch_size)
        count = len(candidates)
        scores = [-value for value in log_likelihoods.tolist()]
        rank = rank_of(scores[0], scores[1:])
        results.append(
            {
                "canary": canary.canary_id,
                "shape": canary.shape,
                "repetitions": canary.repetitions,
                "rank": rank,
                "candidates": count,
                "exposure": exposure_from_rank(rank, count),
                "exposure_extrapolated": exposure_extrapolated(scores[0], scores[1:]),
            }
        )
    return results


@torch.no_grad()
def _leaks(
    generator, canaries: list[Canary], samples: int, top_p: float, max_new_tokens: int, seed: int
) -> list[bool]:
    """Whether sampling queries for each canary document ever reproduces its secret verbatim."""
    leaked = []
    torch.manual_seed(seed)
    for canary in canaries:
        batch = generator.generation_batch([canary.document]).to(generator.model.device)
        output = generator.model.generate(
            **batch,
            do_sample=True,
            top_p=top_p,
            max_new_tokens=max_new_tokens,
            num_return_sequences=samples,
            pad_token_id=generator.tokenizer.pad_token_id,
        )
        expanded = {k: v.repeat_interleave(samples, dim=0) for k, v in batch.items()}
        texts = generator.decode_new_tokens(output, expanded)
        leaked.append(any(canary.secret in text.replace(" ", "") for text in texts))
    return leaked


def _mean(values: list[float]) -> float:
    return float(statistics.fmean(values)) if values else math.nan


def summarize(rows: list[dict], epsilons: list[float], proven: dict[str, float], delta: float) -> list[dict]:
    """Table 7 rows: one per ε × repetition (0 = held-out control) × shape, plus "all" shapes."""
    table = []
    for epsilon in epsilons:
        key = format_epsilon(epsilon)
        at_epsilon = [r for r in rows if r["epsilon"] == key]
        controls = [r["exposure_extrapolated"] for r in at_epsilon if r["repetitions"] == 0]
        for repetition in sorted({r["repetitions"] for r in at_epsilon}):
            for shape in [*sorted({r["shape"] for r in at_epsilon}), "all"]:
                group = [
                    r for r in at_epsilon if r["repetitions"] == repetition and shape in (r["shape"], "all")
                ]
                if not group:
                    continue
                members = [r["exposure_extrapolated"] for r in group]
                bound = (
                    epsilon_lower_bound(members, controls, delta=delta)["epsilon_lower_bound"]
                    if repetition > 0 and controls
                    else None
                )
                table.append(
                    {
                        "epsilon": key,
                        "proven_epsilon": proven[key],
                        "repetitions": repetition,
                        "shape": shape,
                        "canaries": len(group),
                        "mean_rank": _mean([r["rank"] for r in group]),
                        "candidates": group[0]["candidates"],
                        "leaked": _mean([float(r["leaked"]) for r in group]),
                        "exposure": _mean([r["exposure"] for r in group]),
                        "exposure_extrapolated": _mean(members),
                        "epsilon_lower_bound": bound,
                    }
                )
    return table


def to_markdown(table: list[dict]) -> str:
    lines = [
        "| ε (proven) | repetitions | shape | canaries | rank | leaked | exposure (rank) "
        "| exposure (extrapolated) | ε lower bound |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in table:
        repetitions = "held out" if row["repetitions"] == 0 else str(row["repetitions"])
        bound = "—" if row["epsilon_lower_bound"] is None else f"{row['epsilon_lower_bound']:.3f}"
        lines.append(
            f"| {row['epsilon']} ({format_epsilon(row['proven_epsilon'])}) | {repetitions} | {row['shape']} "
            f"| {row['canaries']} | {row['mean_rank']:.1f}/{row['candidates']} | {100 * row['leaked']:.0f}% "
            f"| {row['exposure']:.2f} | {row['exposure_extrapolated']:.2f} | {bound} |"
        )
    return "\n".join(lines) + "\n"


def plot(table: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(6, 4))
    for epsilon in dict.fromkeys(r["epsilon"] for r in table):
        rows = sorted(
            (r for r in table if r["epsilon"] == epsilon and r["shape"] == "all"),
            key=lambda r: r["repetitions"],
        )
        axis.plot(
            [max(r["repetitions"], 0.5) for r in rows],
            [r["exposure_extrapolated"] for r in rows],
            marker="o",
            label=f"ε = {epsilon}",
        )
    axis.set_xscale("log")
    axis.set_xlabel("canary repetitions (0.5 = held-out control)")
    axis.set_ylabel("exposure (bits, skew-normal extrapolation)")
    axis.axhline(math.log2(SECRET_SPACE), color="grey", linestyle=":", linewidth=1)
    axis.set_title("Canary exposure of the query generator")
    axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def run(config: CanaryAuditConfig) -> Artifact:
    from synthq.models.generator import QueryGenerator
    from synthq.stages import finetune_lm

    source = resolve_source(config.data)
    inputs = [data_input_record(source, name=config.data)]
    if (done := existing_result(STAGE, config, inputs)) is not None:
        return done
    dataset = load_source(config.data, splits=[config.split])
    canaries = make_canaries(
        dataset,
        config.split,
        config.shapes,
        config.canaries_per_shape,
        config.repetitions,
        config.references,
        config.seed,
    )
    private_pairs = sum(len(d) for d in dataset.require_split(config.split).values())
    inserted = inserted_pair_count(canaries)
    if inserted > private_pairs:
        raise SynthqError(
            f"the canaries would add {inserted} pairs to {private_pairs} private pairs: lower --repetitions "
            "or --canaries-per-shape (canaries must not outnumber the data, or the audit measures a "
            "different training set)"
        )
    with create_artifact(
        config.out, STAGE, config, inputs, resume=config.resume, keep_partial_on_error=True
    ) as writer:
        scratch = writer.checkpoint_dir
        augmented = _augmented_dataset(config, canaries, scratch / "data")
        (writer.dir / "canaries.jsonl").write_text(
            "".join(
                json.dumps({k: v for k, v in vars(c).items() if k != "reference_secrets"}) + "\n"
                for c in canaries
            ),
            encoding="utf-8",
        )
        rows, proven, guarantees, phases = [], {}, [], {}
        for epsilon in config.epsilons:
            key = format_epsilon(epsilon)
            info(f"[bold]canary audit[/]: fine-tuning at ε = {key} on {private_pairs} + {inserted} canaries")
            name = "inf" if math.isinf(epsilon) else f"{epsilon:g}"
            options = {
                **config.finetune,
                "data": str(augmented),
                "split": config.split,
                "model": config.model,
            }
            options.update(epsilon=epsilon, seed=config.seed, out=scratch / f"generator-eps{name}")
            options["resume"] = config.resume
            started = time.perf_counter()
            generator_artifact = finetune_lm.run(FinetuneConfig(**options))
            phases[f"train_seconds[eps={key}]"] = round(time.perf_counter() - started, 1)
            guarantee = generator_artifact.privacy
            guarantees.append(guarantee)
            proven[key] = guarantee.epsilon
            generator = QueryGenerator.load(generator_artifact.path, device=resolve_device())
            generator.model.eval()
            started = time.perf_counter()
            with progress() as bar:
                task = bar.add_task(f"scoring canaries (ε = {key})", total=len(canaries))
                scored = []
                for start in range(0, len(canaries), 4):
                    chunk = canaries[start : start + 4]
                    scored.extend(_score_canaries(generator, chunk, batch_size=config.batch_size))
                    bar.advance(task, len(chunk))
            phases[f"score_seconds[eps={key}]"] = round(time.perf_counter() - started, 1)
            started = time.perf_counter()
            leaks = _leaks(
                generator, canaries, config.leak_samples, config.top_p, config.max_new_tokens, config.seed
            )
            phases[f"leak_sampling_seconds[eps={key}]"] = round(time.perf_counter() - started, 1)
            for row, leaked in zip(scored, leaks, strict=True):
                rows.append({**row, "epsilon": key, "leaked": leaked})
            del generator
        delta = max((g.delta for g in guarantees), default=0.0)
        table = summarize(rows, config.epsilons, proven, delta)
        (writer.dir / "audit.json").write_text(
            json.dumps({"summary": table, "canaries": rows}, indent=2, default=str), encoding="utf-8"
        )
        (writer.dir / "audit.md").write_text(to_markdown(table), encoding="utf-8")
        plot(table, writer.dir / "exposure.png")
        if all(g.is_private for g in guarantees):
            writer.privacy = Guarantee(
                epsilon=sum(g.epsilon for g in guarantees),
                delta=sum(g.delta for g in guarantees),
                unit="example",
                mechanism="composition of audited generators",
                accountant="basic composition",
                details={"per_generator": [g.epsilon for g in guarantees]},
            )
        else:
            writer.privacy = Guarantee.non_private("the audit includes a generator trained without DP")
        writer.timings.update(phases)
        writer.metrics.update(
            {
                f"eps={r['epsilon']}/rep={r['repetitions']}/{r['shape']}": {
                    "rank": r["mean_rank"],
                    "leaked": r["leaked"],
                    "exposure": r["exposure_extrapolated"],
                    "epsilon_lower_bound": r["epsilon_lower_bound"],
                }
                for r in table
                if r["shape"] == "all"
            }
        )
        shutil.rmtree(scratch / "data", ignore_errors=True)
    info((Path(config.out) / "audit.md").read_text(encoding="utf-8"))
    return open_artifact(config.out, STAGE)
