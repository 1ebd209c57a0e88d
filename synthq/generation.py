"""Batched nucleus sampling whose result for a document does not depend on the batch plan.

Hugging Face ``generate`` draws every row's token from one global random stream, so a
document's sample changes with its batch neighbours, the batch size and the shard it lands in.
Here each row owns a ``torch.Generator`` seeded from ``(seed, document id, query index,
attempt)``: :class:`PerRowSampler` applies temperature and top-p, draws the row's token from
its own generator and hands ``generate`` a one-hot score, so ``generate`` keeps doing what it is
good at (KV cache, padding, EOS handling, both model kinds) while sampling stays reproducible
under any batching or sharding.
"""

from __future__ import annotations

import hashlib
import string
from dataclasses import dataclass

import torch
from transformers import LogitsProcessor, LogitsProcessorList

from synthq.models.generator import QueryGenerator


def row_seed(seed: int, doc_id: str, index: int, attempt: int) -> int:
    digest = hashlib.sha256(f"{seed}\x00{doc_id}\x00{index}\x00{attempt}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def top_p_filter(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest set of tokens whose probability mass reaches ``top_p`` (Holtzman et al.)."""
    if top_p >= 1.0:
        return logits
    sorted_logits, order = torch.sort(logits, descending=True, dim=-1)
    cumulative = sorted_logits.softmax(-1).cumsum(-1)
    remove_sorted = cumulative - sorted_logits.softmax(-1) >= top_p  # the first token always stays
    remove = remove_sorted.scatter(-1, order, remove_sorted)
    return logits.masked_fill(remove, float("-inf"))


class PerRowSampler(LogitsProcessor):
    """Samples each row from its own generator and returns scores that make greedy search pick it."""

    def __init__(self, seeds: list[int], top_p: float, temperature: float, greedy: bool = False):
        self.generators = [torch.Generator().manual_seed(s) for s in seeds]
        self.top_p = top_p
        self.temperature = temperature
        self.greedy = greedy

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if self.greedy:
            return scores
        logits = top_p_filter(scores.float() / max(self.temperature, 1e-6), self.top_p)
        probabilities = logits.softmax(-1).cpu()
        chosen = torch.stack(
            [
                torch.multinomial(probabilities[row], 1, generator=g)[0]
                for row, g in enumerate(self.generators)
            ]
        ).to(scores.device)
        forced = torch.full_like(scores, float("-inf"))
        forced.scatter_(1, chosen.unsqueeze(1), 0.0)
        return forced


@dataclass(frozen=True)
class Request:
    doc_id: str
    document: str
    index: int  # which of the document's queries
    attempt: int = 0


def is_degenerate(query: str, document: str) -> bool:
    """Empty, punctuation/digits only, or a copy of (a long stretch of) the prompt document."""
    stripped = query.strip()
    if not stripped or all(ch in string.punctuation + string.whitespace for ch in stripped):
        return True
    return len(stripped) > 40 and stripped.lower() in document.lower()


def sample_queries(
    generator: QueryGenerator,
    requests: list[Request],
    seed: int,
    top_p: float,
    temperature: float,
    max_new_tokens: int,
    greedy: bool = False,
) -> list[str]:
    """One query per request, in request order, for one batch."""
    batch = generator.generation_batch([r.document for r in requests]).to(generator.model.device)
    seeds = [row_seed(seed, r.doc_id, r.index, r.attempt) for r in requests]
    processors = LogitsProcessorList([PerRowSampler(seeds, top_p, temperature, greedy=greedy)])
    with torch.no_grad():
        output = generator.model.generate(
            **batch,
            do_sample=False,
            num_beams=1,
            max_new_tokens=max_new_tokens,
            logits_processor=processors,
            pad_token_id=generator.tokenizer.pad_token_id,
            eos_token_id=generator.tokenizer.eos_token_id,
            top_p=None,
            top_k=None,
            temperature=None,
        )
    return generator.decode_new_tokens(output, batch)


def length_sorted_batches(
    requests: list[Request], generator: QueryGenerator, batch_size: int
) -> list[list[Request]]:
    """Batches of similar prompt length (little padding), longest first so memory peaks early."""
    lengths = [len(generator.tokenizer(r.document, add_special_tokens=False)["input_ids"]) for r in requests]
    order = sorted(range(len(requests)), key=lambda i: (-lengths[i], requests[i].doc_id, requests[i].index))
    ordered = [requests[i] for i in order]
    return [ordered[i : i + batch_size] for i in range(0, len(ordered), batch_size)]
