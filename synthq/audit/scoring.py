"""Scoring canaries under a trained generator: what the audit measures of each model.

* :func:`score_canaries` — the exposure method: each canary's rank among the other secrets of its
  form, and its exposure (Carlini et al. 2019), :func:`score_canaries_in_chunks` with a progress bar;
* :func:`secret_scores` — the one-run audit's membership score: log p(secret | document) against
  random secrets of the same form (Steinke et al. 2023 needs only a score per canary);
* :func:`verbatim_leaks` — whether sampling ever writes a secret out (extraction).
"""

from __future__ import annotations

import numpy as np
import torch

from synthq.audit.canaries import Canary, OneRunCanary
from synthq.audit.exposure import exposure_extrapolated, exposure_from_rank, rank_of
from synthq.runtime.console import progress


def secret_scores(
    generator, canaries: list[OneRunCanary], references: int, batch_size: int, label: str
) -> np.ndarray:
    """Per canary, log p(secret | document) minus the mean of log p(reference | document) over
    ``references`` random secrets of the same form (:meth:`OneRunCanary.reference_secrets`), under
    the same model; the raw log-likelihood when ``references`` is 0.

    Fine-tuning teaches the generator the canaries' format (ten digits after a few random words),
    which raises included and excluded secrets alike and buries the membership signal in that
    shared gain; the references take it out. The candidates share the document, which is
    computed once (:meth:`QueryGenerator.candidate_log_likelihoods`)."""
    if references == 0:
        documents = [c.document for c in canaries]
        return generator.query_log_likelihood(documents, [c.query for c in canaries], batch_size).numpy()
    scores = np.empty(len(canaries))
    with progress() as bar:
        task = bar.add_task(f"scoring one-run canaries ({label})", total=len(canaries))
        for index, canary in enumerate(canaries):
            candidates = [canary.secret, *canary.reference_secrets(references)]
            values = generator.candidate_log_likelihoods(canary.document, candidates, batch_size)
            scores[index] = float(values[0] - values[1:].mean())
            bar.advance(task)
    return scores


def score_canaries(generator, canaries: list[Canary], batch_size: int) -> list[dict]:
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


def score_canaries_in_chunks(
    generator, canaries: list[Canary], batch_size: int, description: str
) -> list[dict]:
    """:func:`score_canaries` four canaries at a time, with a progress bar."""
    scored = []
    with progress() as bar:
        task = bar.add_task(description, total=len(canaries))
        for start in range(0, len(canaries), 4):
            chunk = canaries[start : start + 4]
            scored.extend(score_canaries(generator, chunk, batch_size=batch_size))
            bar.advance(task, len(chunk))
    return scored


@torch.no_grad()
def verbatim_leaks(
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
