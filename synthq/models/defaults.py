"""Defaults that fit the machine and the data: a generator's document length from the public corpus,
batch sizes from the machine profile.

A stage resolves these once, before it loads its model, and records the values it chose in its
manifest's config (the artifact's fingerprint keeps the options as given — ``None`` = "choose", like
``--device auto`` — so a rerun of the same command, or of a pipeline, stays up to date; the recorded
values make the run reproducible by hand). An explicit value always wins.

* **Document (source) length** (``finetune-lm --max-source-length``): the 95th percentile of the
  corpus's document token lengths under the model's tokenizer (:data:`LENGTH_QUANTILE`; an evenly
  spaced sample of at most :data:`LENGTH_SAMPLE` documents in file order), rounded up to a multiple
  of :data:`LENGTH_MULTIPLE`, at most ``DEFAULT_DOCUMENT_TOKENS`` (384, the paper's). It reads the
  *whole* corpus, never which documents the private qrels judge. The corpus is public in synthq's
  model (only the queries and which documents they judge are private: ``generate`` writes queries
  for every document and records the corpus as a public file), so its length statistics cost
  nothing; :func:`why_corpus_is_public` says why, in the stage's first line.
* **Query (target) length**: a public constant, ``DEFAULT_QUERY_TOKENS`` (32), never read from the
  queries (which are private).
* **Batch sizes** (``--profile cpu|gpu|auto``, auto = gpu when the stage's device is a CUDA GPU):
  finetune-lm's DP micro-batch (:func:`physical_batch`: 32 on a GPU; on a CPU 8, or fewer so that
  a micro-batch holds at most :data:`CPU_TOKEN_BUDGET` tokens: peak memory ≤ 4 GB) and
  generate's documents per batch (:func:`generation_batch`: on a GPU a fixed size; on a CPU as many
  prompts as fit :data:`CPU_GENERATION_TOKENS` tokens of KV cache, at most 96).
* **The retriever's pass size** (``train-retriever --mini-batch-size``, non-private, one process on
  a CPU): when a batch of examples of (a public 32 query tokens + the corpus's p95 document
  tokens) holds more than :data:`CPU_RETRIEVER_TOKENS` tokens, GradCache in chunks that hold at
  most that many (:func:`retriever_defaults`): the same loss and gradient, one chunk's activations.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

LENGTH_QUANTILE = 0.95
LENGTH_MULTIPLE = 16
LENGTH_SAMPLE = 4096
# finetune-lm's DP micro-batch, at most: on a GPU a fixed size; on a CPU also at most
# CPU_TOKEN_BUDGET tokens (documents + queries + the prompt around them) per micro-batch. Peak RSS
# of a ghost-clipped LoRA step of SmolLM2-135M grows ~0.9 GB per example of ~400 tokens over
# ~1.3 GB (measured: 8 × 400 tokens 8.4 GB, 4 × 400 4.9 GB): 1024 tokens keep it under 4 GB.
PHYSICAL_BATCH = {"cpu": 8, "gpu": 32}
CPU_TOKEN_BUDGET = 1024
PROMPT_TOKENS = 16  # the template around a document, and special tokens
# generate's documents per batch: on a GPU a fixed size; on a CPU as many as fit CPU_GENERATION_TOKENS
# tokens (prompt + new tokens), at most CPU_GENERATION_MAX. SmolLM2-135M's KV cache is ~0.14 MB
# per token, so 8,192 tokens hold ~1.1 GB; measured on the embedded corpus (80-token prompts, 32
# new tokens): 16 prompts per batch 3.4 queries/s, 73 about 3× faster.
GENERATION_BATCH = {"cpu": 96, "gpu": 64}
CPU_GENERATION_TOKENS = 8192
# train-retriever's non-private step holds every example's activations at once. Measured alone on
# 2 cores (MiniLM-L6, batch 32, documents of 384 tokens): peak RSS of a 6-step run 9.3 GB, with
# GradCache in chunks of 9 3.9 GB; one step in one process, alternated twice, 38.6 / 32.3 s whole
# against 24.9 / 24.0 s in chunks of 9 (less memory traffic: GradCache is faster here, not slower).
CPU_RETRIEVER_TOKENS = 4096


def hardware_profile(profile: str, device: str) -> str:
    """``cpu`` or ``gpu``: as given, or for ``auto`` whether ``device`` is (or, for ``auto``,
    would be) a CUDA GPU."""
    if profile in ("cpu", "gpu"):
        return profile
    if device.startswith("cuda"):
        return "gpu"
    if device != "auto":
        return "cpu"
    import torch

    return "gpu" if torch.cuda.is_available() else "cpu"


def quantile_length(lengths: Sequence[int], cap: int, quantile: float = LENGTH_QUANTILE) -> int:
    """The ``quantile`` of ``lengths`` (nearest rank), rounded up to a multiple of
    :data:`LENGTH_MULTIPLE`, between :data:`LENGTH_MULTIPLE` and ``cap``."""
    if not lengths:
        return cap
    ordered = sorted(lengths)
    value = ordered[min(len(ordered) - 1, max(0, math.ceil(quantile * len(ordered)) - 1))]
    rounded = max(LENGTH_MULTIPLE, math.ceil(value / LENGTH_MULTIPLE) * LENGTH_MULTIPLE)
    return min(cap, rounded)


def sample_rows(count: int, limit: int = LENGTH_SAMPLE) -> list[int]:
    """At most ``limit`` row numbers spread evenly over ``count`` rows (all of them when fewer)."""
    if count <= limit:
        return list(range(count))
    return sorted({int(i * (count - 1) / (limit - 1)) for i in range(limit)})


def document_token_length(tokenizer, corpus, cap: int) -> int:
    """:func:`quantile_length` of the corpus's document token lengths (title and text joined as
    every stage joins them; no special tokens: the prompt around the document is not counted,
    as ``max_source_length`` does not count it)."""
    from synthq.data.pairs import document_text

    if hasattr(corpus, "document"):  # the memory-mapped corpus: rows in file order
        texts = [document_text(corpus.document(row)) for row in sample_rows(len(corpus))]
    else:
        values = list(corpus.values())
        texts = [document_text(values[row]) for row in sample_rows(len(values))]
    if not texts:
        return cap
    encoded = tokenizer(texts, add_special_tokens=False)["input_ids"]
    return quantile_length([len(ids) for ids in encoded], cap)


def why_corpus_is_public(spec: str, is_artifact: bool = False) -> str:
    """Why the documents of the dataset ``spec`` are public.

    In synthq's model they always are: the private data are the queries and which documents they
    judge (``privacy.json`` declares splits of queries, never the corpus), and ``generate`` writes
    queries for every document of the corpus, recorded as a public file
    (:func:`synthq.bookkeeping.inputs.public_documents_input`). The reason names the case: a synthq
    synthetic set, a published benchmark, or a dataset directory's corpus."""
    from synthq.data.sources import public_benchmark

    if is_artifact:
        return "a synthetic set's public documents"
    if public_benchmark(spec):
        return f"{spec} is a public benchmark"
    return "documents are public in synthq's model; queries are not read"


@dataclass
class Chosen:
    """The values a stage chose for options the user left out, and how (for its first line)."""

    values: dict = field(default_factory=dict)
    reasons: list[str] = field(default_factory=list)

    def add(self, name: str, value, reason: str) -> None:
        self.values[name] = value
        self.reasons.append(reason)

    def line(self) -> str | None:
        return "defaults: " + "; ".join(self.reasons) if self.reasons else None


def finetune_defaults(config, tokenizer, corpus, why_public: str, device: str) -> Chosen:
    """The values ``finetune-lm`` uses for options left unset: the document length (from the
    public corpus, see the module docstring) and the DP micro-batch (by profile)."""
    from synthq.config.fields import CPU_DOCUMENT_TOKENS, DEFAULT_DOCUMENT_TOKENS

    chosen = Chosen()
    profile = hardware_profile(config.profile, device)
    if config.max_source_length is None:
        cap = CPU_DOCUMENT_TOKENS if profile == "cpu" else DEFAULT_DOCUMENT_TOKENS
        length = document_token_length(tokenizer, corpus, cap)
        how = f"p95 of the public corpus's documents ({why_public}), at most {cap} ({profile} profile)"
        queries = "" if "max_target_length" in config.model_fields_set else "; queries: fixed public default"
        lengths = f"lengths {length}/{config.max_target_length} ({how}{queries})"
        chosen.add("max_source_length", length, lengths)
    if config.physical_batch_size is None:
        length = chosen.values.get("max_source_length", config.max_source_length)
        size = physical_batch(profile, length + config.max_target_length + PROMPT_TOKENS)
        budget = f": ≤ {CPU_TOKEN_BUDGET} tokens per micro-batch" if profile == "cpu" else ""
        chosen.add("physical_batch_size", size, f"physical batch {size} ({profile} profile{budget})")
    return chosen


def physical_batch(profile: str, tokens: int) -> int:
    """finetune-lm's micro-batch for examples of up to ``tokens`` tokens (see :data:`PHYSICAL_BATCH`)."""
    if profile == "gpu":
        return PHYSICAL_BATCH["gpu"]
    return max(1, min(PHYSICAL_BATCH["cpu"], CPU_TOKEN_BUDGET // max(tokens, 1)))


def generation_batch(profile: str, prompt_tokens: int, new_tokens: int) -> int:
    """Documents per generation batch: fixed on a GPU; on a CPU at most :data:`CPU_GENERATION_TOKENS`
    tokens of prompts and queries together (and at most ``GENERATION_BATCH["cpu"]``)."""
    if profile == "gpu":
        return GENERATION_BATCH["gpu"]
    tokens = prompt_tokens + PROMPT_TOKENS + new_tokens
    return max(1, min(GENERATION_BATCH["cpu"], CPU_GENERATION_TOKENS // tokens))


def retriever_defaults(
    config, device: str, world_size: int, document_tokens: Callable[[int], int], position_limit: int | None
) -> Chosen:
    """What ``train-retriever`` uses for options left unset: the document length
    (``RETRIEVER_DOCUMENT_TOKENS`` by device, within the encoder's ``position_limit``: a public
    constant, never read from the data), and the pass size: on a CPU, in one process, without DP,
    GradCache in chunks of at most :data:`CPU_RETRIEVER_TOKENS` tokens when the batch holds more
    (``document_tokens(cap)``: the public corpus's p95 within that cap, see
    :func:`document_token_length`, asked for only when it can matter; queries count a public
    ``DEFAULT_QUERY_TOKENS``, never their private lengths); otherwise the whole batch is one pass."""
    from synthq.config.fields import DEFAULT_QUERY_TOKENS, RETRIEVER_DOCUMENT_TOKENS

    chosen = Chosen()
    profile = hardware_profile("auto", device)
    if config.max_doc_length is None:
        cap = RETRIEVER_DOCUMENT_TOKENS[profile]
        length = min(cap, position_limit) if position_limit else cap
        chosen.add("max_doc_length", length, f"documents up to {length} tokens ({profile}: at most {cap})")
    max_doc_length = chosen.values.get("max_doc_length", config.max_doc_length)
    if config.mini_batch_size is not None or config.dp is not None or world_size > 1:
        return chosen
    if profile != "cpu":
        return chosen
    length = document_tokens(max_doc_length)
    example = min(DEFAULT_QUERY_TOKENS, config.max_query_length) + length * (1 + config.hard_negatives)
    if config.batch_size * example <= CPU_RETRIEVER_TOKENS:
        return chosen
    size = max(1, CPU_RETRIEVER_TOKENS // example)
    chosen.add(
        "mini_batch_size", size,
        f"GradCache in chunks of {size} (cpu: ≤ {CPU_RETRIEVER_TOKENS} tokens a pass for documents of "
        f"{length} tokens; the same loss, less memory)",
    )  # fmt: skip
    return chosen


def dp_group_pass_texts(device: str, document_tokens: int) -> int | None:
    """Texts a ``--dp group`` group sends through the encoder at once when it takes its own passes
    (on a CPU): at most :data:`CPU_RETRIEVER_TOKENS` tokens, every text counted at the document
    length (a public setting); a larger group's gradient is then computed by GradCache. ``None``
    (one pass per group) on an accelerator."""
    if hardware_profile("auto", device) != "cpu":
        return None
    return max(1, CPU_RETRIEVER_TOKENS // max(document_tokens, 1))


def generate_defaults(config, device: str, prompt_tokens: int) -> Chosen:
    """The values ``generate`` uses for options left unset: documents per batch (by profile and
    the generator's prompt length)."""
    chosen = Chosen()
    if config.generation_batch_size is None:
        profile = hardware_profile(config.profile, device)
        size = generation_batch(profile, prompt_tokens, config.max_new_tokens)
        budget = f": ≤ {CPU_GENERATION_TOKENS} tokens per batch" if profile == "cpu" else ""
        chosen.add("generation_batch_size", size, f"batch {size} documents ({profile} profile{budget})")
    return chosen
