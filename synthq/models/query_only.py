"""Query-only training and generation of a causal generator: activated LoRA over a cached document.

A training row of a causal generator is ``[document prompt | invocation | query + EOS]``: 150–400
document tokens and about 24 query tokens. With ``--query-only`` the adapters act on the
invocation and the query only, as activated LoRA (aLoRA, Greenewald et al., 2025; PEFT's
``alora_invocation_tokens``) does: every token from the invocation on runs through the adapted
model, every token before it through the frozen base model. The document part's keys and values
(the *prefix cache*) therefore never depend on a trainable weight: they are computed once,
without gradient, by the frozen model (:class:`PrefixStore`), and every DP step runs only the
invocation and query tokens against them (:class:`PrefixCachedLM`), forward and backward. Nothing
else changes: the loss is the same per-sequence loss over the query tokens and EOS, and the
per-example clipping engines see an ordinary batch whose rows are each one example's own
computation (each row's prefix cache comes from its own document alone).

The prompt splits at the template's ``{document}``: ``Document: {document}`` is the prefix,
``\\nSearch query:`` the invocation. The two are tokenized apart (so a document's last token never
merges with the invocation's first), by training, scoring and generation alike.

Prefix caches are kept in ``prefix_dtype`` (bf16 by default: half of fp32's memory) and every
path that reads one — DP steps, held-out losses, scoring, :mod:`synthq.models.sampling` — rounds
through the same dtype, so generation computes the function that was trained. Memory per token of
prefix: ``2 (K, V) × layers × KV heads × head dim`` values; SmolLM2-135M (30 layers, 3 KV heads of
64): 11,520 values, 22.5 KiB in bf16, so 2.8 MiB per 128-token document and 8.4 MiB per 384.

The prefix cache of a training run is private intermediate state (it is computed from the
documents of private pairs): :class:`PrefixStore` keeps it in memory, or past
``memory_limit`` bytes in a memory-mapped file in the directory it is given (``finetune-lm``:
the partial artifact's private ``checkpoints/``, removed when the artifact is finished), and
deletes that file when closed. It is never part of an artifact's payload.
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from torch import nn
from transformers.cache_utils import DynamicCache
from transformers.modeling_outputs import BaseModelOutput

PREFIX_DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}
DEFAULT_PREFIX_DTYPE = "bfloat16"
# A run's prefix cache stays in memory up to this size; past it, a memory-mapped private file.
MEMORY_LIMIT_BYTES = 2 << 30
PREFIX_FILE = "prefix_cache.bin"


# CPU micro-batches hold at most this many adapted tokens (finetune-lm's budget, models.defaults);
# a query-only row's adapted tokens are its invocation and query, at most this many rows
QUERY_ONLY_MICRO_BATCH = {"cpu": 32, "gpu": 64}
INVOCATION_TOKENS = 16  # room for the invocation and EOS


def query_only_micro_batch(profile: str, target_tokens: int) -> int:
    """finetune-lm's micro-batch for query-only rows (``--physical-batch-size`` unset): on a CPU as
    many rows as hold 1,024 invocation and query tokens, at most 32; on a GPU 64. The prefix
    cache a micro-batch reads (fp32 while it runs) is what bounds it past that: 32 rows of 384
    SmolLM2 prefix tokens hold 0.6 GB."""
    if profile == "gpu":
        return QUERY_ONLY_MICRO_BATCH["gpu"]
    return max(1, min(QUERY_ONLY_MICRO_BATCH["cpu"], 1024 // (target_tokens + INVOCATION_TOKENS)))


def activated(model: nn.Module, input_ids: torch.Tensor) -> dict:
    """The extra forward arguments that make every token of ``input_ids`` adapted: for a PEFT
    activated LoRA (a loaded query-only generator) offsets covering the whole input, which
    starts at or after the invocation; nothing for plain LoRA, which adapts every token anyway."""
    config = getattr(model, "peft_config", {}).get("default")
    if getattr(config, "alora_invocation_tokens", None):
        return {"alora_offsets": [input_ids.shape[1]] * input_ids.shape[0]}
    return {}


def adapters_off(model: nn.Module):
    """The frozen base model: PEFT's ``disable_adapter()`` context, or nothing to disable."""
    disable = getattr(model, "disable_adapter", None)
    return disable() if callable(disable) else contextlib.nullcontext()


def is_seq2seq(model: nn.Module) -> bool:
    return bool(getattr(model.config, "is_encoder_decoder", False))


def token_shape(model: nn.Module) -> tuple[int, ...]:
    """What the cache holds per prefix token: keys and values ``(2, layers, KV heads, head dim)`` of
    a causal model, the encoder's output ``(d_model,)`` of a seq2seq one."""
    return (model.config.d_model,) if is_seq2seq(model) else (2, *kv_shape(model))


def kv_shape(model: nn.Module) -> tuple[int, int, int]:
    """``(layers, KV heads, head dim)`` of a causal model's cache."""
    config = model.config
    layers = config.num_hidden_layers
    heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return layers, heads, dim


def round_through(tensor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``tensor`` as stored in ``dtype`` and read back (the rounding every path shares)."""
    return tensor if dtype == tensor.dtype else tensor.to(dtype).to(tensor.dtype)


@torch.no_grad()
def base_prefix_states(
    model: nn.Module, prefixes: Sequence[Sequence[int]], pad_id: int, batch_size: int = 8
) -> list[torch.Tensor]:
    """Each prefix's cache under the frozen base model, computed without gradient in batches of
    similar length, in the model's dtype: a causal model's keys and values
    ``[2, layers, heads, P_i, dim]`` (left padding, positions counted over each row's own tokens),
    a seq2seq model's encoder output ``[P_i, d_model]`` (right padding, masked): a row's numbers
    are those it has alone."""
    if is_seq2seq(model):
        return encoder_states(model, prefixes, pad_id, batch_size)
    device = next(model.parameters()).device
    order = sorted(range(len(prefixes)), key=lambda i: -len(prefixes[i]))
    states: list[torch.Tensor | None] = [None] * len(prefixes)
    training = model.training
    model.eval()
    try:
        with adapters_off(model):
            for start in range(0, len(order), batch_size):
                chosen = order[start : start + batch_size]
                width = max(len(prefixes[i]) for i in chosen)
                ids = torch.tensor(
                    [[pad_id] * (width - len(prefixes[i])) + list(prefixes[i]) for i in chosen], device=device
                )
                mask = torch.tensor(
                    [[0] * (width - len(prefixes[i])) + [1] * len(prefixes[i]) for i in chosen], device=device
                )
                positions = (mask.cumsum(-1) - 1).clamp(min=0)
                cache = model(
                    input_ids=ids,
                    attention_mask=mask,
                    position_ids=positions,
                    use_cache=True,
                    logits_to_keep=1,
                ).past_key_values
                keys = torch.stack([layer.keys for layer in cache.layers], 1)  # [b, L, H, W, d]
                values = torch.stack([layer.values for layer in cache.layers], 1)
                for row, index in enumerate(chosen):
                    own = len(prefixes[index])
                    states[index] = torch.stack(
                        [keys[row, :, :, width - own :], values[row, :, :, width - own :]]
                    )
    finally:
        model.train(training)
    return [s.cpu() for s in states]


@torch.no_grad()
def encoder_states(
    model: nn.Module, sources: Sequence[Sequence[int]], pad_id: int, batch_size: int = 8
) -> list[torch.Tensor]:
    """Each source's encoder output ``[P_i, d_model]`` (the frozen encoder: adapters off)."""
    device = next(model.parameters()).device
    order = sorted(range(len(sources)), key=lambda i: -len(sources[i]))
    states: list[torch.Tensor | None] = [None] * len(sources)
    training = model.training
    model.eval()
    try:
        with adapters_off(model):
            encoder = model.get_encoder()
            for start in range(0, len(order), batch_size):
                chosen = order[start : start + batch_size]
                width = max(len(sources[i]) for i in chosen)
                ids = torch.tensor([list(sources[i]) + [pad_id] * (width - len(sources[i])) for i in chosen])
                mask = torch.tensor([[1] * len(sources[i]) + [0] * (width - len(sources[i])) for i in chosen])
                hidden = encoder(input_ids=ids.to(device), attention_mask=mask.to(device)).last_hidden_state
                for row, index in enumerate(chosen):
                    states[index] = hidden[row, : len(sources[index])].cpu()
    finally:
        model.train(training)
    return states


def state_length(state: torch.Tensor) -> int:
    """Prefix tokens of one cache (``[2, L, H, P, d]`` keys and values, or ``[P, d_model]``)."""
    return state.shape[3] if state.dim() == 5 else state.shape[0]


class PrefixStore:
    """The prefix caches of a training run's distinct prompts, computed once by the frozen base model
    (:func:`base_prefix_states`) and read by every step of every epoch.

    Stored token-major in one flat buffer of ``dtype`` (``[tokens, *``:func:`token_shape```]``),
    each prompt's tokens contiguous. In memory up to ``memory_limit`` bytes; past it a memory-mapped file
    ``prefix_cache.bin`` in ``directory`` (a private directory: the store holds what the documents of
    private pairs computed), deleted by :meth:`close`.

    Args:
        model: the generator's model (PEFT adapters are switched off while the prefixes run).
        prefixes: token ids of each distinct prompt prefix.
        pad_id: the padding token.
        dtype: storage dtype (``torch.bfloat16`` halves fp32's memory).
        directory: where a store past ``memory_limit`` is memory-mapped (refused when ``None``).
        memory_limit: the largest store kept in memory, in bytes (default :data:`MEMORY_LIMIT_BYTES`).
        batch_size: prefixes per forward pass while building.
    """

    def __init__(
        self,
        model: nn.Module,
        prefixes: Sequence[Sequence[int]],
        pad_id: int,
        dtype: torch.dtype = torch.bfloat16,
        directory: Path | None = None,
        memory_limit: int | None = None,
        batch_size: int = 8,
    ):
        memory_limit = MEMORY_LIMIT_BYTES if memory_limit is None else memory_limit
        self.dtype = dtype
        self.token_shape = token_shape(model)
        self.seq2seq = is_seq2seq(model)
        self.lengths = [len(p) for p in prefixes]
        self.offsets = np.concatenate([[0], np.cumsum(self.lengths)]).astype(np.int64)
        per_token = math.prod(self.token_shape)
        total = int(self.offsets[-1]) * per_token
        self.nbytes = total * torch.empty(0, dtype=dtype).element_size()
        self.path: Path | None = None
        if self.nbytes <= memory_limit:
            self.buffer = torch.empty(total, dtype=dtype)
        else:
            if directory is None:
                raise MemoryError(
                    f"the prefix cache needs {self.nbytes / 2**30:.1f} GiB, over the in-memory limit, "
                    "and no private directory was given for its memory-mapped file"
                )
            self.path = Path(directory) / PREFIX_FILE
            storage = torch.uint16 if dtype == torch.bfloat16 else dtype
            mapped = np.memmap(self.path, dtype=_numpy_dtype(storage), mode="w+", shape=(total,))
            self.buffer = torch.from_numpy(mapped).view(dtype)
        self.buffer = self.buffer.view(-1, *self.token_shape)
        chunk = max(batch_size * 16, 1)
        for start in range(0, len(prefixes), chunk):
            states = base_prefix_states(model, prefixes[start : start + chunk], pad_id, batch_size)
            for index, state in enumerate(states, start):
                low, high = self.offsets[index], self.offsets[index + 1]
                tokens = state if self.seq2seq else state.permute(3, 0, 1, 2, 4)
                self.buffer[low:high] = tokens.to(dtype)

    def __len__(self) -> int:
        return len(self.lengths)

    def state(self, index: int) -> torch.Tensor:
        """Prefix ``index``'s cache in fp32, as :func:`base_prefix_states` gives it."""
        low, high = self.offsets[index], self.offsets[index + 1]
        tokens = self.buffer[low:high].float()
        return tokens if self.seq2seq else tokens.permute(1, 2, 3, 0, 4)

    def close(self) -> None:
        """Drop the cache; a memory-mapped file is deleted."""
        self.buffer = torch.empty(0)
        if self.path is not None and self.path.exists():
            os.unlink(self.path)
        self.path = None


def _numpy_dtype(dtype: torch.dtype):
    return {torch.uint16: np.uint16, torch.float32: np.float32, torch.float16: np.float16}[dtype]


def segment_batch(
    states: Sequence[torch.Tensor], invocation: Sequence[int], targets: Sequence[Sequence[int]], pad_id: int
) -> dict[str, torch.Tensor]:
    """A query-only training batch: each row's prefix cache (``states[i]``: ``[2, L, H, P_i, d]``)
    left-padded into ``prefix_keys`` / ``prefix_values`` ``[b, L, H, P, d]``; ``input_ids`` the
    invocation then the target (query + EOS), right-padded; ``labels`` the target (−100 on the
    invocation and padding); ``attention_mask`` over ``[prefix | segment]``; ``position_ids``
    continuing each row's own prefix (``P_i, P_i + 1, …``): a row computes what it computes alone."""
    width = max(s.shape[3] for s in states)
    layers, heads, _, dim = states[0].shape[1:]
    rows = len(states)
    keys = torch.zeros(rows, layers, heads, width, dim)
    values = torch.zeros(rows, layers, heads, width, dim)
    segments = [list(invocation) + list(t) for t in targets]
    length = max(len(s) for s in segments)
    ids, labels, mask, positions = [], [], [], []
    for row, (state, segment, target) in enumerate(zip(states, segments, targets, strict=True)):
        own = state.shape[3]
        keys[row, :, :, width - own :] = state[0]
        values[row, :, :, width - own :] = state[1]
        padding = length - len(segment)
        ids.append(segment + [pad_id] * padding)
        labels.append([-100] * len(invocation) + list(target) + [-100] * padding)
        mask.append([0] * (width - own) + [1] * own + [1] * len(segment) + [0] * padding)
        positions.append(list(range(own, own + length)))
    return {
        "input_ids": torch.tensor(ids),
        "attention_mask": torch.tensor(mask),
        "position_ids": torch.tensor(positions),
        "labels": torch.tensor(labels),
        "prefix_keys": keys,
        "prefix_values": values,
    }


def encoded_batch(
    states: Sequence[torch.Tensor], targets: Sequence[Sequence[int]]
) -> dict[str, torch.Tensor]:
    """A query-only seq2seq batch: each row's cached encoder output (``[P_i, d_model]``)
    right-padded into ``encoder_states`` ``[b, P, d_model]`` with its ``attention_mask``, and the
    ``labels`` (query + EOS, −100 after): the decoder is all that runs."""
    width = max(s.shape[0] for s in states)
    hidden = torch.zeros(len(states), width, states[0].shape[1])
    mask = torch.zeros(len(states), width, dtype=torch.long)
    for row, state in enumerate(states):
        hidden[row, : state.shape[0]] = state
        mask[row, : state.shape[0]] = 1
    length = max(len(t) for t in targets)
    labels = torch.tensor([list(t) + [-100] * (length - len(t)) for t in targets])
    return {"encoder_states": hidden, "attention_mask": mask, "labels": labels}


class _CachedLM(nn.Module):
    """A language model run on a cached part of its input: the wrapped model's config and
    attention implementation are its own (what the clipping engines read)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    @property
    def config(self):
        return self.model.config

    def set_attn_implementation(self, implementation: str) -> None:
        self.model.set_attn_implementation(implementation)


class EncodedLM(_CachedLM):
    """A seq2seq model whose forward reads each row's cached encoder output from
    ``encoder_states`` and runs the decoder only (adapters on the decoder alone, so the frozen
    encoder's output is what a full forward would compute).

    Args:
        model: the seq2seq LM (a PEFT LoRA model with adapters on decoder layers only).
    """

    def forward(self, attention_mask: torch.Tensor, labels: torch.Tensor, encoder_states: torch.Tensor):
        dtype = self.model.get_input_embeddings().weight.dtype
        return self.model(
            encoder_outputs=BaseModelOutput(last_hidden_state=encoder_states.to(dtype)),
            attention_mask=attention_mask,
            labels=labels,
        )


class PrefixCachedLM(_CachedLM):
    """A causal LM whose forward reads each row's prefix from ``prefix_keys`` / ``prefix_values``
    (tensors, so a batch moves, slices and ``vmap``\\ s like any other) and runs only the tokens
    after it: the frozen prefix's keys and values, and the adapted invocation and query tokens
    that attend to them. A fresh cache is built at every call, so a batch can be run twice.

    Args:
        model: the causal LM (a PEFT LoRA model whose adapters act on every token it is given).
    """

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        prefix_keys: torch.Tensor,
        prefix_values: torch.Tensor,
        logits_to_keep: int = 0,
    ):
        dtype = self.model.get_input_embeddings().weight.dtype
        cache = DynamicCache(
            ddp_cache_data=[
                (prefix_keys[:, layer].to(dtype), prefix_values[:, layer].to(dtype))
                for layer in range(prefix_keys.shape[1])
            ]
        )
        return self.model(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
            past_key_values=cache, use_cache=True, logits_to_keep=logits_to_keep,
            **activated(self.model, input_ids),
        )  # fmt: skip


class QueryOnlyView:
    """A query-only generator as the training code sees it: ``model`` (:class:`PrefixCachedLM`
    for a causal model, :class:`EncodedLM` for a seq2seq one), ``kind`` and ``training_batch``,
    what :class:`~synthq.dp.lm.step.DPStep`, its clipping engines and the learning check read of a
    generator.

    Args:
        generator: a :class:`~synthq.models.generator.QueryGenerator` with ``query_only`` set and
            LoRA adapters applied (on the decoder only, for a seq2seq model).
    """

    def __init__(self, generator):
        if not generator.query_only:
            raise ValueError("a query-only view needs a generator in query-only mode")
        self.generator = generator
        self.kind = generator.kind
        self.tokenizer = generator.tokenizer
        self.model = (EncodedLM if self.kind == "seq2seq" else PrefixCachedLM)(generator.model)

    @property
    def dtype(self) -> torch.dtype:
        return PREFIX_DTYPES[self.generator.prefix_dtype]

    def states(self, documents: list[str]) -> list[torch.Tensor]:
        """The documents' prefix caches, computed now and rounded through the stored dtype."""
        prefixes = self.generator.prefix_ids(documents)
        computed = base_prefix_states(self.generator.model, prefixes, self.tokenizer.pad_token_id)
        return [round_through(s, self.dtype) for s in computed]

    def batch(self, states: Sequence[torch.Tensor], queries: list[str], max_target_length: int) -> dict:
        targets = self.generator.target_ids(queries, max_target_length)
        if self.kind == "seq2seq":
            return encoded_batch(states, targets)
        return segment_batch(states, self.generator.invocation_ids(), targets, self.tokenizer.pad_token_id)

    def training_batch(self, documents: list[str], queries: list[str], max_target_length: int = 128) -> dict:
        """A query-only batch whose prefix caches are computed now (held-out pairs, scoring)."""
        return self.batch(self.states(documents), queries, max_target_length)

    def store(
        self, documents: list[str], directory: Path | None = None, **options
    ) -> tuple[PrefixStore, list[int]]:
        """The prefix caches of ``documents``' distinct prompts (:class:`PrefixStore`) and each
        document's index into it."""
        prefixes = self.generator.prefix_ids(documents)
        index: dict[tuple[int, ...], int] = {}
        rows = [index.setdefault(tuple(p), len(index)) for p in prefixes]
        distinct = [list(p) for p in index]
        store = PrefixStore(
            self.generator.model, distinct, self.tokenizer.pad_token_id, self.dtype, directory, **options
        )
        return store, rows


class CachedRows:
    """``make_batch`` for a query-only training run: rows of (document, query) pairs -> a
    :func:`segment_batch` whose prefix caches are read from a :class:`PrefixStore` of the
    documents, built once by :meth:`build` (before the first step) and dropped by :meth:`close`.

    Args:
        view: the :class:`QueryOnlyView` being trained.
        documents, queries: the rows' pairs.
        max_target_length: query tokens kept (EOS included).
    """

    def __init__(self, view: QueryOnlyView, documents: list[str], queries: list[str], max_target_length: int):
        self.view, self.documents, self.queries = view, documents, queries
        self.max_target_length = max_target_length
        self.store: PrefixStore | None = None
        self.rows: list[int] = []
        # each row's adapted tokens: DPStep puts rows of similar length in one micro-batch
        invocation = len(view.generator.invocation_ids()) if view.kind == "causal" else 0
        self.lengths = [invocation + len(t) for t in view.generator.target_ids(queries, max_target_length)]

    def build(self, directory: Path | None) -> PrefixStore:
        """Compute every document's prefix cache (memory-mapped under ``directory``, a private
        directory, when it is large)."""
        self.store, self.rows = self.view.store(self.documents, directory)
        return self.store

    def __call__(self, rows: list[int]) -> dict[str, torch.Tensor]:
        if self.store is None:
            raise RuntimeError("the prefix cache is not built: call build() before the first step")
        states = [self.store.state(self.rows[i]) for i in rows]
        return self.view.batch(states, [self.queries[i] for i in rows], self.max_target_length)

    def close(self) -> None:
        if self.store is not None:
            self.store.close()
        self.store = None
