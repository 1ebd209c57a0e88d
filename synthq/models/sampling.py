"""Batched nucleus sampling whose result for a document does not depend on the batch plan.

Hugging Face ``generate`` draws every row's token from one global random stream, so a
document's sample changes with its batch neighbours, the batch size and the shard it lands in.
Here each row owns a ``torch.Generator`` seeded from ``(seed, document id, query index,
attempt)`` and draws exactly one uniform number per step from it; :func:`nucleus_draw` turns
that number into a token of the row's nucleus by inverse-CDF sampling, vectorised over the
batch. The decoding loop (:func:`decode`) is synthq's own, over the model's forward pass and its
KV cache, for both model kinds, so sampling stays reproducible under any batching or sharding.

Speed (see ``benchmarks/generate_throughput.py``):

* the nucleus is found with ``topk`` over a few hundred candidates instead of sorting the
  whole vocabulary; rows whose nucleus is wider fall back to a full sort (same result);
* rows stop at the first token that contains a newline, since the query is cut there anyway,
  and a row that has stopped leaves the batch (its KV-cache rows are dropped), so each step
  costs what the rows still writing cost and a batch ends when its last query does;
* a batch's prompts run through the model once per distinct prompt, and a long common prefix
  once (:func:`shared_prompt_state`);
* batches group prompts of similar length (little padding), longest first.
"""

from __future__ import annotations

import hashlib
import weakref
from dataclasses import dataclass

import torch
from transformers.cache_utils import DynamicCache, EncoderDecoderCache
from transformers.modeling_outputs import BaseModelOutput

from synthq.data.synthetic import is_degenerate
from synthq.models.generator import QueryGenerator
from synthq.models.query_only import PREFIX_DTYPES, activated, adapters_off, round_through
from synthq.runtime.precision import autocast_forward

# topk sizes tried in turn for a row's nucleus before sorting the whole vocabulary: topk of 4,096
# of SmolLM2's 49,152 tokens costs a fifth of a full sort (a fine-tuned generator's first query
# token often has a nucleus wider than 256 tokens).
NUCLEUS_CANDIDATES = (256, 4096)
# A batch's prompts that begin with at least this many identical tokens (Private Evolution's
# few-shot prompts: 108 / 130 tokens of instructions and examples before the document) prefill
# that prefix once; below it, a shared prefix saves less than the extra model call costs.
SHARED_PREFIX_MIN_TOKENS = 16
# Rows that have stopped are dropped from the decoding batch once they are this share of it
# (dropping copies the KV cache; a stopped row left in costs its share of a step).
DROP_FRACTION = 1 / 8


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
    logits: torch.Tensor,
    uniforms: torch.Tensor,
    top_p: float,
    candidates: tuple[int, ...] = NUCLEUS_CANDIDATES,
) -> torch.Tensor:
    """One token id per row from the top-``top_p`` nucleus of ``softmax(logits)``, by inverse CDF
    with the row's uniform number in ``[0, 1)``.

    Exactly the distribution of ``top_p_filter`` followed by ``multinomial``, but a row's draw
    depends only on its own logits and uniform (never on the other rows), and it needs no sort of
    the vocabulary when the nucleus lies within the most likely tokens: each row is drawn from the
    first of the ``candidates`` tiers (``topk`` of that many tokens) that holds ``top_p`` of its
    mass, and only a row that none holds is sorted whole."""
    probabilities = logits.float().softmax(-1)
    uniforms = uniforms.to(probabilities.device, probabilities.dtype)
    if top_p >= 1.0:
        return _inverse_cdf(probabilities, uniforms, 2.0)
    chosen = torch.empty(len(probabilities), dtype=torch.long, device=probabilities.device)
    pending = torch.arange(len(probabilities), device=probabilities.device)
    for k in candidates:
        rows = probabilities if len(pending) == len(probabilities) else probabilities[pending]
        top, ids = rows.topk(min(k, rows.shape[-1]), dim=-1)
        held = top.sum(-1) >= top_p
        positions = _inverse_cdf(top[held], uniforms[pending[held]], top_p)
        chosen[pending[held]] = ids[held].gather(1, positions.unsqueeze(1)).squeeze(1)
        pending = pending[~held]
        if not len(pending):
            return chosen
    full, order = probabilities[pending].sort(descending=True, dim=-1)
    positions = _inverse_cdf(full, uniforms[pending], top_p)
    chosen[pending] = order.gather(1, positions.unsqueeze(1)).squeeze(1)
    return chosen


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


@autocast_forward
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
    """One query per request, in request order, for one batch (the cut at the first newline,
    stripped).

    Rows of the same document (``--num-queries k``) share one pass over its prompt
    (:func:`shared_prompt_state`). ``stop_at_newline=False`` runs every row to EOS or
    ``max_new_tokens`` and ``share_prompts=False`` encodes every row's prompt on its own (the same
    queries, more work); they exist for the throughput benchmark."""
    documents = [r.document for r in requests]
    batch = generator.generation_batch(documents).to(generator.model.device)
    seeds = [row_seed(seed, r.doc_id, r.index, r.attempt) for r in requests]
    stop = stop_token_ids(generator) if stop_at_newline else [generator.tokenizer.eos_token_id]
    with torch.inference_mode():
        shared = {}
        if generator.query_only and generator.kind == "causal":  # frozen prefix, adapted invocation
            shared = query_only_prompt_state(generator, documents, batch)
        elif share_prompts:
            batch, shared = shared_prompt_state(generator, documents, batch)
        steps = (_CausalSteps if generator.kind == "causal" else _Seq2SeqSteps)(generator, batch, shared)
        pad = generator.tokenizer.pad_token_id
        new_tokens = decode(steps, seeds, top_p, temperature, max_new_tokens, stop, pad, greedy)
    texts = generator.tokenizer.batch_decode(new_tokens, skip_special_tokens=True)
    return [text.split("\n")[0].strip() for text in texts]


def decode(
    steps: _CausalSteps | _Seq2SeqSteps,
    seeds: list[int],
    top_p: float,
    temperature: float,
    max_new_tokens: int,
    stop: list[int],
    pad: int,
    greedy: bool = False,
) -> torch.Tensor:
    """The new tokens of every row, ``[rows, max_new_tokens]``, ``pad`` after a row's stop token.

    Row ``i`` draws its token at each step from its own stream (``seeds[i]``, one uniform number
    a step, :func:`nucleus_draw`; the arg-max under ``greedy``), so its tokens depend on nothing
    but its prompt and its seed. A row that has drawn a stop token leaves the batch: its cache
    rows are dropped and later steps run on the rows still writing. Hugging Face ``generate``
    keeps every row to the end of the batch, so a batch of 96 queries whose lengths run from 2 to
    20 tokens paid 20 full steps; here each step costs about what its live rows cost. Dropping
    rows copies the cache, so stopped rows are dropped in groups of at least
    :data:`DROP_FRACTION` of the batch; until then they ride along and their tokens are ignored."""
    rows = len(seeds)
    streams = [torch.Generator().manual_seed(s) for s in seeds]
    stop_ids = torch.tensor(sorted(set(stop)), device=steps.device)
    new = torch.full((rows, max_new_tokens), pad, dtype=torch.long, device=steps.device)
    live = torch.arange(rows, device=steps.device)  # each batch row's place in ``new``
    writing = torch.ones(rows, dtype=torch.bool, device=steps.device)
    logits = steps.first()
    for step in range(max_new_tokens):
        active = writing.nonzero().squeeze(1)
        tokens = torch.full_like(live, pad)
        if greedy:
            tokens[active] = logits[active].argmax(-1)
        else:
            drawing = live[active].tolist()
            uniforms = torch.cat([torch.rand(1, generator=streams[i], dtype=torch.float64) for i in drawing])
            tokens[active] = nucleus_draw(logits[active] / max(temperature, 1e-6), uniforms, top_p)
        new[live[active], step] = tokens[active]
        writing &= ~torch.isin(tokens, stop_ids)
        if step == max_new_tokens - 1 or not writing.any():
            break
        if (~writing).sum() >= max(1.0, DROP_FRACTION * len(live)):
            keep = writing.nonzero().squeeze(1)
            steps.keep(keep)
            live, tokens, writing = live[keep], tokens[keep], writing[keep]
        logits = steps.next(tokens)
    return new


class _CausalSteps:
    """Decoder-only model steps over a left-padded batch (whose KV cache ``shared`` may hold all
    but each prompt's last token), positions counted over unmasked tokens as ``generate`` counts
    them."""

    def __init__(self, generator: QueryGenerator, batch, shared: dict):
        self.model = generator.model
        self.device = batch["input_ids"].device
        self.mask = batch["attention_mask"]
        self.cache = shared.get("past_key_values")
        positions = (self.mask.long().cumsum(-1) - 1).clamp(min=0)
        done = self.cache.get_seq_length() if self.cache is not None else 0
        self.prompt = batch["input_ids"][:, done:], positions[:, done:]
        self.position = positions[:, -1:]

    def first(self) -> torch.Tensor:
        return self._forward(*self.prompt)

    def keep(self, rows: torch.Tensor) -> None:
        self.cache.batch_select_indices(rows)
        self.mask, self.position = self.mask[rows], self.position[rows]

    def next(self, tokens: torch.Tensor) -> torch.Tensor:
        self.mask = torch.cat([self.mask, self.mask.new_ones(len(tokens), 1)], dim=1)
        self.position = self.position + 1
        return self._forward(tokens.unsqueeze(1), self.position)

    def _forward(self, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        output = self.model(
            input_ids=ids, attention_mask=self.mask, position_ids=positions,
            past_key_values=self.cache, use_cache=True, logits_to_keep=1, **activated(self.model, ids),
        )  # fmt: skip
        self.cache = output.past_key_values
        return output.logits[:, -1].float()


class _Seq2SeqSteps:
    """Encoder-decoder model steps: the encoder's states (``shared``'s, or computed here) and its
    padding mask are kept per row; the decoder starts from the model's start token."""

    def __init__(self, generator: QueryGenerator, batch, shared: dict):
        self.model = generator.model
        self.device = batch["input_ids"].device
        self.mask = batch["attention_mask"]
        encoded = shared.get("encoder_outputs") or self.model.get_encoder()(
            input_ids=batch["input_ids"], attention_mask=self.mask
        )
        self.states = encoded.last_hidden_state
        self.cache = EncoderDecoderCache(DynamicCache(), DynamicCache())
        start = self.model.generation_config.decoder_start_token_id
        if start is None:
            start = self.model.config.decoder_start_token_id
        self.start = torch.full((len(self.mask), 1), start, dtype=torch.long, device=self.device)

    def first(self) -> torch.Tensor:
        return self._forward(self.start)

    def keep(self, rows: torch.Tensor) -> None:
        self.cache.batch_select_indices(rows)
        self.mask, self.states = self.mask[rows], self.states[rows]

    def next(self, tokens: torch.Tensor) -> torch.Tensor:
        return self._forward(tokens.unsqueeze(1))

    def _forward(self, ids: torch.Tensor) -> torch.Tensor:
        output = self.model(
            encoder_outputs=BaseModelOutput(last_hidden_state=self.states), attention_mask=self.mask,
            decoder_input_ids=ids, past_key_values=self.cache, use_cache=True,
        )  # fmt: skip
        self.cache = output.past_key_values
        return output.logits[:, -1].float()


def shared_prompt_state(generator: QueryGenerator, documents: list[str], batch) -> tuple[dict, dict]:
    """The batch to decode and the state that runs what its prompts share through the model
    once: ``(batch, {})`` when they share nothing worth it.

    Two things are shared. Rows of one document (``--num-queries k`` puts them side by side) run
    their prompt once and the result is repeated for each row. Causal prompts that begin with the
    same :data:`SHARED_PREFIX_MIN_TOKENS` or more tokens (Private Evolution's few-shot prompts,
    two thirds of every prompt) run that prefix once, at batch size one, and every row continues
    from its KV cache; the batch is then laid out ``[prefix | left padding | rest of the
    prompt]``, the padding masked and positions counted over unmasked tokens, as ``generate``
    counts them, so each row sees the positions and attention it would see alone.

    Causal models: everything but each prompt's last token is prefilled into the KV cache;
    decoding feeds the last token and continues from the cache. Seq2seq models: the encoder
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
        ids, mask = batch["input_ids"][distinct], batch["attention_mask"][distinct]
        states = model.get_encoder()(input_ids=ids, attention_mask=mask).last_hidden_state
        return batch, {"encoder_outputs": BaseModelOutput(last_hidden_state=states[expand])}
    batch, prefix = _common_prefix_first(batch)
    if (len(distinct) == len(documents) and not prefix) or batch["input_ids"].shape[1] < 2:
        return batch, {}
    ids, mask = batch["input_ids"][distinct], batch["attention_mask"][distinct]
    positions = (mask.long().cumsum(-1) - 1).clamp(min=0)  # over unmasked tokens, as generate counts them
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


def query_only_prompt_state(generator: QueryGenerator, documents: list[str], batch) -> dict:
    """A query-only generator's decoding state (:mod:`synthq.models.query_only`): each distinct
    document's prefix run once through the frozen base model, its keys and values rounded through
    the generator's prefix dtype as training stored them; decoding then feeds the invocation (the
    batch's last columns, the same tokens in every row) and the new tokens to the adapted model."""
    invocation = len(generator.invocation_ids())
    first: dict[str, int] = {}
    rows = [first.setdefault(document, i) for i, document in enumerate(documents)]
    distinct = sorted(first.values())
    position = {row: n for n, row in enumerate(distinct)}
    ids = batch["input_ids"][distinct, :-invocation]
    mask = batch["attention_mask"][distinct, :-invocation]
    positions = (mask.long().cumsum(-1) - 1).clamp(min=0)
    with adapters_off(generator.model):
        cache = generator.model(
            input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True, logits_to_keep=1
        ).past_key_values
    dtype = PREFIX_DTYPES[generator.prefix_dtype]
    for layer in cache.layers:
        layer.keys, layer.values = round_through(layer.keys, dtype), round_through(layer.values, dtype)
    if len(distinct) < len(documents):
        cache.batch_select_indices(torch.tensor([position[row] for row in rows], device=ids.device))
    return {"past_key_values": cache}


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
    requests: list[Request], generator: QueryGenerator, batch_size: int, mixed: bool = False
) -> list[list[Request]]:
    """Batches of similar prompt length (little padding), longest first so memory peaks early.

    ``mixed``: the longest batch still first, the others in a fixed pseudo-random order (public,
    seeded), so the rate of a progress bar — and its ETA — is representative from the start
    instead of growing as the prompts shorten (sampling is per document: no query changes)."""
    length_of: dict[str, int] = {}
    for request in requests:  # a document's k queries share one tokenisation
        if request.document not in length_of:
            length_of[request.document] = len(
                generator.tokenizer(request.document, add_special_tokens=False)["input_ids"]
            )
    lengths = [length_of[r.document] for r in requests]
    order = sorted(range(len(requests)), key=lambda i: (-lengths[i], requests[i].doc_id, requests[i].index))
    ordered = [requests[i] for i in order]
    batches = [ordered[i : i + batch_size] for i in range(0, len(ordered), batch_size)]
    if mixed and len(batches) > 2:
        import random

        rest = batches[1:]
        random.Random(len(rest)).shuffle(rest)
        batches = [batches[0], *rest]
    return batches
