"""Batched nucleus sampling whose result for a document does not depend on the batch plan.

Hugging Face ``generate`` draws every row's token from one global random stream, so a
document's sample changes with its batch neighbours, the batch size and the shard it lands in.
Here each row owns a ``torch.Generator`` seeded from ``(seed, document id, query index,
attempt)`` and draws exactly one uniform number per step from it; :class:`PerRowSampler` turns
that number into a token of the row's nucleus by inverse-CDF sampling, vectorised over the
batch, and hands ``generate`` a one-hot score. ``generate`` keeps doing what it is good at (KV
cache, padding, stopping, both model kinds) while sampling stays reproducible under any
batching or sharding.

Speed (see ``benchmarks/generate_throughput.py``):

* the nucleus is found with ``topk`` over a few hundred candidates instead of sorting the
  whole vocabulary; rows whose nucleus is wider fall back to a full sort (same result);
* rows stop at the first token that contains a newline, since the query is cut there anyway
  (:meth:`QueryGenerator.decode_new_tokens`), so a batch ends as soon as every row has its
  query instead of running to ``max_new_tokens``;
* batches group prompts of similar length (little padding), longest first.
"""

from __future__ import annotations

import hashlib
import weakref
from dataclasses import dataclass

import torch
from transformers import LogitsProcessor, LogitsProcessorList

from synthq.data.synthetic import is_degenerate
from synthq.models.generator import QueryGenerator

NUCLEUS_CANDIDATES = 256
# A batch's prompts that begin with at least this many identical tokens (Private Evolution's
# few-shot prompts: 108 / 130 tokens of instructions and examples before the document) prefill
# that prefix once; below it, a shared prefix saves less than the extra model call costs.
SHARED_PREFIX_MIN_TOKENS = 16


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


def _inverse_cdf(probabilities: torch.Tensor, uniforms: torch.Tensor, top_p: float) -> torch.Tensor:
    """Position drawn in each row of descending ``probabilities`` restricted to the nucleus."""
    cumulative = probabilities.cumsum(-1)
    keep = (cumulative - probabilities) < top_p  # same rule as top_p_filter: the first token stays
    kept = probabilities * keep
    mass = kept.cumsum(-1)
    target = (uniforms * mass[:, -1]).unsqueeze(1)
    position = torch.searchsorted(mass, target, right=True).squeeze(1)
    return torch.minimum(position, keep.sum(-1) - 1)  # u * mass rounding up to the total


def nucleus_draw(
    logits: torch.Tensor, uniforms: torch.Tensor, top_p: float, candidates: int = NUCLEUS_CANDIDATES
) -> torch.Tensor:
    """One token id per row from the top-``top_p`` nucleus of ``softmax(logits)``, by inverse CDF
    with the row's uniform number in ``[0, 1)``.

    Exactly the distribution of ``top_p_filter`` followed by ``multinomial``, but a row's draw
    depends only on its own logits and uniform (never on the other rows), and it needs no sort of
    the vocabulary when the nucleus lies within the ``candidates`` most likely tokens."""
    probabilities = logits.float().softmax(-1)
    uniforms = uniforms.to(probabilities.device, probabilities.dtype)
    if top_p >= 1.0:
        return _inverse_cdf(probabilities, uniforms, 2.0)
    k = min(candidates, probabilities.shape[-1])
    top, ids = probabilities.topk(k, dim=-1)
    chosen = ids.gather(1, _inverse_cdf(top, uniforms, top_p).unsqueeze(1)).squeeze(1)
    # When the k candidates hold less than top_p, the nucleus reaches further: sort those rows fully.
    wide = (top.sum(-1) < top_p).nonzero().squeeze(1)
    if wide.numel():
        full, order = probabilities[wide].sort(descending=True, dim=-1)
        positions = _inverse_cdf(full, uniforms[wide], top_p)
        chosen[wide] = order.gather(1, positions.unsqueeze(1)).squeeze(1)
    return chosen


class PerRowSampler(LogitsProcessor):
    """Samples each row from its own generator and returns scores that make greedy search pick it.

    Each row consumes exactly one number of its generator per step, so its tokens depend only on
    its seed and its own logits, not on its batch neighbours."""

    def __init__(self, seeds: list[int], top_p: float, temperature: float, greedy: bool = False):
        self.generators = [torch.Generator().manual_seed(s) for s in seeds]
        self.top_p = top_p
        self.temperature = temperature
        self.greedy = greedy

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if self.greedy:
            return scores
        uniforms = torch.cat([torch.rand(1, generator=g, dtype=torch.float64) for g in self.generators])
        chosen = nucleus_draw(scores / max(self.temperature, 1e-6), uniforms, self.top_p)
        forced = torch.full_like(scores, float("-inf"))
        forced.scatter_(1, chosen.unsqueeze(1), 0.0)
        return forced


_STOP_IDS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def stop_token_ids(generator: QueryGenerator) -> list[int]:
    """End of sequence plus every token whose text contains a newline (cached per tokenizer).

    Stopping a row there changes no output: the decoded query is cut at the first newline, and
    the text before it is fixed once the newline token is out."""
    tokenizer = generator.tokenizer
    if tokenizer not in _STOP_IDS:
        vocabulary = len(tokenizer)
        texts = tokenizer.batch_decode([[i] for i in range(vocabulary)], skip_special_tokens=False)
        newline = [i for i, text in enumerate(texts) if "\n" in text]
        _STOP_IDS[tokenizer] = sorted({tokenizer.eos_token_id, *newline})
    return _STOP_IDS[tokenizer]


@dataclass(frozen=True)
class Request:
    doc_id: str
    document: str
    index: int  # which of the document's queries
    attempt: int = 0


def sample_queries(
    generator: QueryGenerator,
    requests: list[Request],
    seed: int,
    top_p: float,
    temperature: float,
    max_new_tokens: int,
    greedy: bool = False,
    stop_at_newline: bool = True,
    share_prompts: bool = True,
) -> list[str]:
    """One query per request, in request order, for one batch (KV cache on, as ``generate`` does).

    Rows of the same document (``--num-queries k``) share one pass over its prompt
    (:func:`shared_prompt_state`). ``stop_at_newline=False`` runs every row to EOS or
    ``max_new_tokens`` and ``share_prompts=False`` encodes every row's prompt on its own (the same
    queries, more work); they exist for the throughput benchmark."""
    documents = [r.document for r in requests]
    batch = generator.generation_batch(documents).to(generator.model.device)
    seeds = [row_seed(seed, r.doc_id, r.index, r.attempt) for r in requests]
    processors = LogitsProcessorList([PerRowSampler(seeds, top_p, temperature, greedy=greedy)])
    stop = stop_token_ids(generator) if stop_at_newline else generator.tokenizer.eos_token_id
    with torch.inference_mode():
        shared = {}
        if share_prompts:
            batch, shared = shared_prompt_state(generator, documents, batch)
        output = generator.model.generate(
            **batch,
            **shared,
            do_sample=False,
            num_beams=1,
            use_cache=True,
            max_new_tokens=max_new_tokens,
            logits_processor=processors,
            pad_token_id=generator.tokenizer.pad_token_id,
            eos_token_id=stop,
            top_p=None,
            top_k=None,
            temperature=None,
        )
    return generator.decode_new_tokens(output, batch)


def shared_prompt_state(generator: QueryGenerator, documents: list[str], batch) -> tuple[dict, dict]:
    """The batch to hand ``generate`` and keyword arguments that run what its prompts share
    through the model once: ``(batch, {})`` when they share nothing worth it.

    Two things are shared. Rows of one document (``--num-queries k`` puts them side by side) run
    their prompt once and the result is repeated for each row. Causal prompts that begin with the
    same :data:`SHARED_PREFIX_MIN_TOKENS` or more tokens (Private Evolution's few-shot prompts,
    two thirds of every prompt) run that prefix once, at batch size one, and every row continues
    from its KV cache; the batch is then laid out ``[prefix | left padding | rest of the
    prompt]``, the padding masked and positions counted over unmasked tokens, as ``generate``
    counts them, so each row sees the positions and attention it would see alone.

    Causal models: everything but each prompt's last token is prefilled into the KV cache;
    ``generate`` feeds the last token and continues from the cache. Seq2seq models: the encoder
    runs once per distinct document and its states are repeated. The same logits as encoding
    every row on its own, up to floating-point rounding (a row's numbers never depend on its
    neighbours), for a fraction of the prompt flops."""
    first: dict[str, int] = {}
    rows = [first.setdefault(document, i) for i, document in enumerate(documents)]
    distinct = sorted(first.values())
    position = {row: n for n, row in enumerate(distinct)}
    expand = torch.tensor([position[row] for row in rows], device=batch["input_ids"].device)
    model = generator.model
    if generator.kind == "seq2seq":
        if len(distinct) == len(documents):
            return batch, {}
        from transformers.modeling_outputs import BaseModelOutput

        ids, mask = batch["input_ids"][distinct], batch["attention_mask"][distinct]
        states = model.get_encoder()(input_ids=ids, attention_mask=mask).last_hidden_state
        return batch, {"encoder_outputs": BaseModelOutput(last_hidden_state=states[expand])}
    batch, prefix = _common_prefix_first(batch)
    if (len(distinct) == len(documents) and not prefix) or batch["input_ids"].shape[1] < 2:
        return batch, {}
    ids, mask = batch["input_ids"][distinct], batch["attention_mask"][distinct]
    positions = (mask.long().cumsum(-1) - 1).clamp(min=0)  # as generate derives them
    cache = None
    if prefix:
        cache = model(
            input_ids=ids[:1, :prefix], attention_mask=mask[:1, :prefix], position_ids=positions[:1, :prefix],
            use_cache=True, logits_to_keep=1,
        ).past_key_values  # fmt: skip
        cache.batch_repeat_interleave(len(distinct))
    if ids.shape[1] - 1 > prefix:
        # the cache is what is wanted; one position of logits skips the vocabulary projection
        cache = model(
            input_ids=ids[:, prefix:-1], attention_mask=mask[:, :-1], position_ids=positions[:, prefix:-1],
            past_key_values=cache, use_cache=True, logits_to_keep=1,
        ).past_key_values  # fmt: skip
    if len(distinct) < len(documents):
        cache.batch_select_indices(expand)
    return batch, {"past_key_values": cache}


def _common_prefix_first(batch) -> tuple[dict, int]:
    """A left-padded causal batch re-laid out ``[common prefix | padding | rest]`` when its prompts
    begin with :data:`SHARED_PREFIX_MIN_TOKENS` or more identical tokens; the prefix's length
    (0, and the batch unchanged, otherwise). Every row keeps at least its last token after it."""
    ids, mask = batch["input_ids"], batch["attention_mask"]
    prompts = [row[keep.bool()] for row, keep in zip(ids, mask, strict=True)]
    shortest = min(len(p) for p in prompts)
    stacked = torch.stack([p[: shortest - 1] for p in prompts])
    differs = (stacked != stacked[:1]).any(0).nonzero()
    prefix = int(differs[0]) if len(differs) else shortest - 1
    if prefix < SHARED_PREFIX_MIN_TOKENS:
        return batch, 0
    width = ids.shape[1]
    new_ids, new_mask = ids.clone(), torch.zeros_like(mask)
    for row, prompt in enumerate(prompts):
        new_ids[row, :prefix] = prompt[:prefix]
        new_ids[row, prefix : width - len(prompt) + prefix] = ids[row, 0]  # padding (masked)
        new_ids[row, width - len(prompt) + prefix :] = prompt[prefix:]
        new_mask[row, :prefix] = 1
        new_mask[row, width - len(prompt) + prefix :] = 1
    return {**batch, "input_ids": new_ids, "attention_mask": new_mask}, prefix


def sample_with_retries(
    generator: QueryGenerator,
    requests: list[Request],
    seed: int,
    top_p: float,
    temperature: float,
    max_new_tokens: int,
    max_resample: int,
) -> dict[tuple[str, int], dict]:
    """One query per request, ``(doc_id, index) -> {"query", "attempts"}``; degenerate ones
    (:func:`synthq.data.synthetic.is_degenerate`) are sampled again up to ``max_resample`` times,
    each attempt from a stream of its own."""
    current, results = list(requests), {}
    for attempt in range(max_resample + 1):
        texts = sample_queries(generator, current, seed, top_p, temperature, max_new_tokens)
        retry = []
        for request, text in zip(current, texts, strict=True):
            if is_degenerate(text, request.document) and attempt < max_resample:
                retry.append(Request(request.doc_id, request.document, request.index, attempt + 1))
            else:
                results[(request.doc_id, request.index)] = {"query": text, "attempts": attempt + 1}
        if not retry:
            break
        current = retry
    return results


def length_sorted_batches(
    requests: list[Request], generator: QueryGenerator, batch_size: int
) -> list[list[Request]]:
    """Batches of similar prompt length (little padding), longest first so memory peaks early."""
    length_of: dict[str, int] = {}
    for request in requests:  # a document's k queries share one tokenisation
        if request.document not in length_of:
            length_of[request.document] = len(
                generator.tokenizer(request.document, add_special_tokens=False)["input_ids"]
            )
    lengths = [length_of[r.document] for r in requests]
    order = sorted(range(len(requests)), key=lambda i: (-lengths[i], requests[i].doc_id, requests[i].index))
    ordered = [requests[i] for i in order]
    return [ordered[i : i + batch_size] for i in range(0, len(ordered), batch_size)]
