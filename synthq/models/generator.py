"""The query generator: one interface over seq2seq (T5 family) and causal (SmolLM2, GPT-2,
Llama-style) language models that learn document -> query.

* Seq2seq: the encoder reads ``generate_query: <document>``; the decoder produces the query.
* Causal: a prompt template around the document, then the query; the loss covers only the
  query tokens (and the end-of-sequence token that teaches the model to stop).

The kind is detected from the model config (``is_encoder_decoder``). A saved generator is a
Hugging Face ``save_pretrained`` directory plus ``synthq_generator.json`` (kind, prompt
template, lengths), so ``AutoModelFor*.from_pretrained`` reads it as well as synthq does.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

import torch
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoModelForSeq2SeqLM,
    AutoTokenizer,
    BatchEncoding,
    PreTrainedTokenizerBase,
)

from synthq.models.resolve import resolve_model
from synthq.runtime.errors import ModelResolutionError, SettingError
from synthq.runtime.precision import autocast_forward

SEQ2SEQ_PREFIX = "generate_query: "
CAUSAL_TEMPLATE = "Document: {document}\nSearch query:"
GENERATOR_FILE = "synthq_generator.json"
Kind = Literal["seq2seq", "causal"]


def detect_kind(config) -> Kind:
    return "seq2seq" if getattr(config, "is_encoder_decoder", False) else "causal"


def check_generator_model(path: Path, named: str) -> None:
    """Refuse a sentence-transformers encoder (its ``modules.json``) where a query generator is
    read: transformers would load it as a causal LM all the same, and the run fail later on a
    symptom (its tokenizer has no end-of-sequence token) that names neither the model nor the fix.
    ``named``: how the user gave it (``--model minilm-l6``)."""
    if (path / "modules.json").is_file() and not (path / GENERATOR_FILE).is_file():
        raise ModelResolutionError(
            f"{named}: {path} is a sentence-transformers encoder (modules.json), not a query generator; "
            "give a causal LM or T5 (e.g. smollm2-135m, or a finetune-lm artifact); an encoder is "
            "train-retriever's --encoder"
        )


def _model_class(config):
    """The transformers auto class that loads a generator of ``config``'s kind."""
    return AutoModelForSeq2SeqLM if detect_kind(config) == "seq2seq" else AutoModelForCausalLM


def _prepare_tokenizer(tokenizer: PreTrainedTokenizerBase, kind: Kind) -> PreTrainedTokenizerBase:
    if tokenizer.pad_token is None:
        # Causal LMs often ship without a pad token; EOS is safe because padding is masked out.
        tokenizer.pad_token = tokenizer.eos_token
    if tokenizer.eos_token is None:
        raise ModelResolutionError("the tokenizer has no end-of-sequence token; cannot teach queries to stop")
    # Left padding keeps every causal prompt flush against its generated continuation.
    tokenizer.padding_side = "left" if kind == "causal" else "right"
    return tokenizer


class QueryGenerator:
    """A document -> query language model with its tokenizer and prompt format.

    Args:
        model: a ``PreTrainedModel`` (seq2seq or causal).
        tokenizer: its tokenizer.
        max_source_length: documents are truncated to this many tokens (paper: 384).
        template: the causal prompt template, with ``{document}``.
    """

    def __init__(self, model, tokenizer, max_source_length: int = 384, template: str = CAUSAL_TEMPLATE):
        self.model = model
        self.kind: Kind = detect_kind(model.config)
        self.tokenizer = _prepare_tokenizer(tokenizer, self.kind)
        self.max_source_length = max_source_length
        self.template = template
        # query-only (activated LoRA, synthq.models.query_only): adapters on the invocation and
        # the query only; the document prefix runs through the frozen base model
        self.query_only = False
        self.prefix_dtype = "bfloat16"

    def enable_query_only(self, prefix_dtype: str | None = None) -> None:
        """Query-only mode (:mod:`synthq.models.query_only`). Causal: the prompt splits at the
        template's ``{document}`` into a prefix that the frozen base model reads and an invocation
        (the template's tail) from which on the adapters act; needs a template with text after
        ``{document}``. Seq2seq: the encoder is frozen (adapters on the decoder only) and its
        output cached. ``prefix_dtype``: how caches are stored (default bf16 for a causal model's
        keys and values, fp32 for the small encoder outputs)."""
        if self.kind == "seq2seq":
            adapted = [n for n, p in self.model.named_parameters() if p.requires_grad and "encoder." in n]
            if adapted:
                raise SettingError(
                    f"--query-only on a seq2seq model trains the decoder only, not {adapted[0]}"
                )
            self.query_only = True
            self.prefix_dtype = prefix_dtype or "float32"
            return
        if not split_template(self.template)[1]:
            raise SettingError(f"--query-only: the template {self.template!r} has no text after {{document}}")
        self.query_only = True
        self.prefix_dtype = prefix_dtype or "bfloat16"

    # ------------------------------------------------------------------ loading and saving
    @classmethod
    def load(
        cls, spec_or_path: str | Path, device: str = "cpu", max_source_length: int | None = None
    ) -> QueryGenerator:
        """Load from a model spec (hub id, local dir, alias) or a generator artifact directory."""
        path = resolve_model(str(spec_or_path))
        check_generator_model(path, f"model {str(spec_or_path)!r}")
        saved = {}
        if (path / GENERATOR_FILE).is_file():
            saved = json.loads((path / GENERATOR_FILE).read_text(encoding="utf-8"))
        model = _model_class(AutoConfig.from_pretrained(path)).from_pretrained(path, dtype=torch.float32)
        if (path / "adapter_config.json").is_file() and not hasattr(model, "peft_config"):
            from peft import PeftModel

            model = PeftModel.from_pretrained(model, path).merge_and_unload()
        query_only = saved.get("query_only")
        if query_only:  # the base model and its query-only adapter, kept apart
            model = _load_query_adapter(model, path / query_only["adapter"])
        tokenizer = AutoTokenizer.from_pretrained(path)
        length = max_source_length or saved.get("max_source_length", 384)
        generator = cls(model.to(device), tokenizer, length, saved.get("template", CAUSAL_TEMPLATE))
        if query_only:
            generator.enable_query_only(query_only["prefix_dtype"])
        return generator

    def save(self, directory: Path, generation_defaults: dict | None = None) -> None:
        """``save_pretrained`` model and tokenizer, generation defaults, and the prompt format."""
        directory = Path(directory)
        model = self.model
        saved: dict = {}
        if (
            self.query_only and self.kind == "causal"
        ):  # the adapter apart: merged, it would act on the document
            model = _save_query_adapter(model, directory / QUERY_ADAPTER, self.invocation_ids())
            saved["query_only"] = {"adapter": QUERY_ADAPTER, "prefix_dtype": self.prefix_dtype}
        elif hasattr(model, "merge_and_unload"):  # LoRA: ship a plain model others can load
            model = model.merge_and_unload()
        model.save_pretrained(directory)
        self.tokenizer.save_pretrained(directory)
        if generation_defaults:
            generation_config = model.generation_config
            for key, value in generation_defaults.items():
                setattr(generation_config, key, value)
            generation_config.save_pretrained(directory)
        (directory / GENERATOR_FILE).write_text(
            json.dumps(
                {
                    "kind": self.kind,
                    "template": self.template,
                    "max_source_length": self.max_source_length,
                    **saved,
                },
                indent=2,
            ),
            encoding="utf-8",
        )

    # ------------------------------------------------------------------ text formats
    def source_text(self, document: str) -> str:
        if self.kind == "seq2seq":
            return SEQ2SEQ_PREFIX + document
        return self.template.format(document=document)

    def truncated_documents(self, documents: list[str]) -> list[str]:
        """Truncate documents (not the template around them) to ``max_source_length`` tokens."""
        encoded = self.tokenizer(
            documents, add_special_tokens=False, truncation=True, max_length=self.max_source_length
        )
        return [self.tokenizer.decode(ids) for ids in encoded["input_ids"]]

    def target_ids(self, queries: list[str], max_target_length: int) -> list[list[int]]:
        """Each query's token ids, cut to ``max_target_length - 1``, then EOS (what is learned)."""
        return self._query_ids(queries, max_target_length)

    def prefix_ids(self, documents: list[str]) -> list[list[int]]:
        """Query-only mode: each prompt's prefix (BOS where the tokenizer adds one, then the
        template up to and with the truncated document), tokenized apart from the invocation;
        a seq2seq model's whole encoder input."""
        if self.kind == "seq2seq":
            return self._prompt_ids(documents)
        head = split_template(self.template)[0]
        ids = self.tokenizer(
            [head.format(document=d) for d in self.truncated_documents(documents)], add_special_tokens=False
        )["input_ids"]
        return [self._with_bos(x) for x in ids]

    def invocation_ids(self) -> list[int]:
        """Query-only mode: the template's text after ``{document}``, from which on the adapters act."""
        return self.tokenizer(split_template(self.template)[1], add_special_tokens=False)["input_ids"]

    def _with_bos(self, ids: list[int]) -> list[int]:
        bos = self.tokenizer.bos_token_id
        return [bos, *ids] if bos is not None and getattr(self.tokenizer, "add_bos_token", False) else ids

    def _query_ids(self, queries: list[str], max_target_length: int) -> list[list[int]]:
        prefix = "" if self.kind == "seq2seq" else " "
        encoded = self.tokenizer([prefix + q for q in queries], add_special_tokens=False)["input_ids"]
        eos = self.tokenizer.eos_token_id
        return [ids[: max_target_length - 1] + [eos] for ids in encoded]

    def _prompt_ids(self, documents: list[str]) -> list[list[int]]:
        if self.query_only and self.kind == "causal":  # prefix and invocation tokenized apart
            invocation = self.invocation_ids()
            return [prefix + invocation for prefix in self.prefix_ids(documents)]
        sources = [self.source_text(d) for d in self.truncated_documents(documents)]
        if self.kind == "seq2seq":
            ids = self.tokenizer(sources, add_special_tokens=True)["input_ids"]
            eos = self.tokenizer.eos_token_id
            return [x if x and x[-1] == eos else [*x, eos] for x in ids]
        ids = self.tokenizer(sources, add_special_tokens=False)["input_ids"]
        return [self._with_bos(x) for x in ids]

    # ------------------------------------------------------------------ batches
    def training_batch(
        self, documents: list[str], queries: list[str], max_target_length: int = 128
    ) -> dict[str, torch.Tensor]:
        """``input_ids``, ``attention_mask`` and ``labels`` (−100 on prompt and padding).

        Seq2seq: labels are the query tokens + EOS (the model shifts them into decoder inputs).
        Causal: one sequence prompt + query + EOS, left-padded, loss only on query + EOS."""
        prompts = self._prompt_ids(documents)
        targets = self._query_ids(queries, max_target_length)
        pad = self.tokenizer.pad_token_id
        if self.kind == "seq2seq":
            width = max(len(p) for p in prompts)
            label_width = max(len(t) for t in targets)
            input_ids = [p + [pad] * (width - len(p)) for p in prompts]
            mask = [[1] * len(p) + [0] * (width - len(p)) for p in prompts]
            labels = [t + [-100] * (label_width - len(t)) for t in targets]
        else:
            sequences = [p + t for p, t in zip(prompts, targets, strict=True)]
            width = max(len(s) for s in sequences)
            input_ids = [[pad] * (width - len(s)) + s for s in sequences]
            mask = [[0] * (width - len(s)) + [1] * len(s) for s in sequences]
            labels = [
                [-100] * (width - len(s)) + [-100] * len(p) + t
                for s, p, t in zip(sequences, prompts, targets, strict=True)
            ]
        batch = {
            "input_ids": torch.tensor(input_ids),
            "attention_mask": torch.tensor(mask),
            "labels": torch.tensor(labels),
        }
        if self.kind == "causal":
            # Left padding must not shift positions: an example's loss (and its per-example
            # gradient) is then the same in any batch, which DP's privacy unit relies on.
            batch["position_ids"] = (batch["attention_mask"].cumsum(-1) - 1).clamp(min=0)
        return batch

    def generation_batch(self, documents: list[str]) -> BatchEncoding:
        """Prompts for ``generate``: left-padded for causal models, right-padded for seq2seq."""
        prompts = self._prompt_ids(documents)
        pad = self.tokenizer.pad_token_id
        width = max(len(p) for p in prompts)
        if self.kind == "causal":
            ids = [[pad] * (width - len(p)) + p for p in prompts]
            mask = [[0] * (width - len(p)) + [1] * len(p) for p in prompts]
        else:
            ids = [p + [pad] * (width - len(p)) for p in prompts]
            mask = [[1] * len(p) + [0] * (width - len(p)) for p in prompts]
        return BatchEncoding({"input_ids": torch.tensor(ids), "attention_mask": torch.tensor(mask)})

    def decode_new_tokens(self, output_ids: torch.Tensor, batch: BatchEncoding | dict) -> list[str]:
        """The generated queries: prompt removed (causal), cut at EOS or a newline, stripped."""
        if self.kind == "causal":
            output_ids = output_ids[:, batch["input_ids"].shape[1] :]
        texts = self.tokenizer.batch_decode(output_ids, skip_special_tokens=True)
        return [text.split("\n")[0].strip() for text in texts]

    # ------------------------------------------------------------------ scoring
    def sequence_log_likelihood(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Sum of log p(label tokens) per row of a :meth:`training_batch`."""
        labels = batch["labels"]
        logits = self.model(**{k: v for k, v in batch.items() if k != "labels"}, labels=labels).logits
        if self.kind == "causal":
            logits, labels = logits[:, :-1], labels[:, 1:]
        return _label_log_likelihood(logits, labels)

    @torch.no_grad()
    @autocast_forward
    def query_log_likelihood(
        self, documents: list[str], queries: list[str], batch_size: int = 16, max_target_length: int = 128
    ) -> torch.Tensor:
        """log p(query | document) summed over the query tokens and EOS, one value per pair."""
        if self.query_only and self.kind == "causal":  # a seq2seq model's plain forward is the same
            return self._query_only_log_likelihood(documents, queries, batch_size, max_target_length)
        device = next(self.model.parameters()).device
        values = []
        for start in range(0, len(documents), batch_size):
            batch = self.training_batch(
                documents[start : start + batch_size], queries[start : start + batch_size], max_target_length
            )
            values.append(self.sequence_log_likelihood({k: v.to(device) for k, v in batch.items()}).cpu())
        return torch.cat(values) if values else torch.empty(0)

    @torch.no_grad()
    @autocast_forward
    def candidate_log_likelihoods(
        self, document: str, queries: list[str], batch_size: int = 32, max_target_length: int = 128
    ) -> torch.Tensor:
        """:meth:`query_log_likelihood` of many candidate queries for ONE document, computing what
        they share once (the canary audit's candidates differ only in the secret).

        Seq2seq: the encoder runs once; the decoder scores every candidate. Causal: the prompt and
        the candidates' longest common token prefix run once with a KV cache; only each
        candidate's remaining tokens run per candidate, on a copy of that cache. Query-only: the
        document's prefix cache once, the candidates on it."""
        if self.query_only and self.kind == "causal":
            return self._query_only_log_likelihood([document], queries, batch_size, max_target_length)
        device = next(self.model.parameters()).device
        prompt = self._prompt_ids([document])[0]
        targets = self._query_ids(queries, max_target_length)
        if not targets:
            return torch.empty(0)
        if self.kind == "seq2seq":
            source = torch.tensor([prompt], device=device)
            encoded = self.model.get_encoder()(input_ids=source, attention_mask=torch.ones_like(source))
            values = []
            for start in range(0, len(targets), batch_size):
                chunk = targets[start : start + batch_size]
                width = max(len(t) for t in chunk)
                labels = torch.tensor([t + [-100] * (width - len(t)) for t in chunk], device=device)
                hidden = encoded.last_hidden_state.expand(len(chunk), -1, -1)
                logits = self.model(
                    encoder_outputs=(hidden,), attention_mask=torch.ones_like(source).expand(len(chunk), -1),
                    labels=labels,
                ).logits  # fmt: skip
                values.append(_label_log_likelihood(logits, labels).cpu())
            return torch.cat(values)
        return self._causal_candidates(prompt, targets, batch_size, device)

    def _query_only_log_likelihood(
        self, documents: list[str], queries: list[str], batch_size: int, max_target_length: int
    ) -> torch.Tensor:
        """Query-only mode: the frozen prefix caches of the documents (one document: shared by
        every query), then the adapted invocation and query tokens on them, as in training."""
        from synthq.models.query_only import QueryOnlyView

        view = QueryOnlyView(self)
        device = next(self.model.parameters()).device
        distinct = list(dict.fromkeys(documents))
        states = dict(zip(distinct, view.states(distinct), strict=True))
        values = []
        for start in range(0, len(queries), batch_size):
            chunk = range(start, min(start + batch_size, len(queries)))
            docs = [documents[i] if len(documents) > 1 else documents[0] for i in chunk]
            batch = view.batch([states[d] for d in docs], [queries[i] for i in chunk], max_target_length)
            batch = {k: v.to(device) for k, v in batch.items()}
            labels = batch.pop("labels")
            logits = view.model(**batch).logits
            values.append(_label_log_likelihood(logits[:, :-1], labels[:, 1:]).cpu())
        return torch.cat(values) if values else torch.empty(0)

    def _causal_candidates(self, prompt: list[int], targets: list[list[int]], batch_size: int, device):
        import copy

        shared = 0
        while all(len(t) > shared + 1 for t in targets) and len({t[shared] for t in targets}) == 1:
            shared += 1  # every candidate keeps ≥ 1 token of its own (EOS at least)
        prefix = torch.tensor([prompt + targets[0][:shared]], device=device)
        # logits only where a query token is predicted: the prompt's last position and the shared
        # tokens' (the vocabulary projection of every prompt position was a fifth of the work)
        out = self.model(
            input_ids=prefix,
            attention_mask=torch.ones_like(prefix),
            use_cache=True,
            logits_to_keep=shared + 1,
        )
        log_probs = torch.log_softmax(out.logits[0].float(), dim=-1)
        # row k predicts shared query token k; the last row each candidate's first own token
        common = sum(float(log_probs[k, targets[0][k]]) for k in range(shared))
        first = log_probs[-1]
        values = []
        for start in range(0, len(targets), batch_size):
            rest = [t[shared:] for t in targets[start : start + batch_size]]
            width = max(len(r) for r in rest)
            ids = torch.tensor([r + [r[-1]] * (width - len(r)) for r in rest], device=device)
            mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rest], device=device)
            cache = copy.deepcopy(out.past_key_values)
            cache.batch_repeat_interleave(len(rest))
            full_mask = torch.cat(
                [torch.ones(len(rest), prefix.shape[1], device=device, dtype=mask.dtype), mask], 1
            )
            positions = prefix.shape[1] + torch.arange(width, device=device).expand(len(rest), -1)
            logits = self.model(
                input_ids=ids, attention_mask=full_mask, position_ids=positions, past_key_values=cache
            ).logits
            labels = torch.where(mask.bool(), ids, torch.full_like(ids, -100))
            # logits at position t predict token t + 1 of the candidate's own part
            own = _label_log_likelihood(logits[:, :-1], labels[:, 1:]).cpu() if width > 1 else 0.0
            heads = first[ids[:, 0]].cpu()
            values.append(common + heads + own)
        return torch.cat(values)


def split_template(template: str) -> tuple[str, str]:
    """A causal template cut after ``{document}``: the prefix (with the document) and the
    invocation that follows it (``"Document: {document}"``, ``"\nSearch query:"``)."""
    head, found, tail = template.partition("{document}")
    return (head + found, tail) if found else (template, "")


QUERY_ADAPTER = "query_adapter"


def _save_query_adapter(model, directory: Path, invocation: list[int]):
    """Save a query-only generator's LoRA adapter to ``directory`` as an activated LoRA (PEFT
    reads it back with ``alora_invocation_tokens``: the adapter acts from the invocation on, as
    trained) and return the base model, adapters removed, to save beside it."""
    import copy

    config = model.peft_config["default"]
    plain = config.alora_invocation_tokens
    config.alora_invocation_tokens = list(invocation)
    try:
        model.save_pretrained(directory)
    finally:
        config.alora_invocation_tokens = plain
    return copy.deepcopy(model).unload()


def _load_query_adapter(model, directory: Path):
    """A saved query-only adapter on ``model``, frozen, as PEFT's activated LoRA: a plain forward
    pass over a whole row (``model.generate``, a full-sequence loss) then acts from the
    invocation on, as trained; synthq's own paths (:mod:`synthq.models.query_only`,
    :mod:`synthq.models.sampling`) run the prefix through the base model themselves and pass
    :func:`~synthq.models.query_only.activated` offsets so the adapter acts on every token after it."""
    from peft import PeftModel

    model = PeftModel.from_pretrained(model, directory)
    for parameter in model.parameters():
        parameter.requires_grad_(False)
    return model


def _label_log_likelihood(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Σ log p(label) per row over the positions whose label is not −100 (logits aligned to labels)."""
    mask = labels != -100
    log_probs = torch.log_softmax(logits.float(), dim=-1)
    picked = log_probs.gather(-1, labels.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    return (picked * mask).sum(dim=-1)


def lora_target_modules(model: torch.nn.Module, targets: str) -> str | list[str]:
    """``targets`` as peft's ``target_modules``: ``all-linear``, or the comma-separated names, each
    the last name of at least one linear layer (never the output layer, which shares its weight
    with the input embeddings in tied models: merging an adapter there would change both). A name
    that matches none is refused, naming those the model has."""
    if targets == "all-linear":
        return targets
    names = [name.strip() for name in targets.split(",") if name.strip()]
    output = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    linear_names = {
        name.rsplit(".", 1)[-1]
        for name, module in model.named_modules()
        if isinstance(module, torch.nn.Linear) and name and module is not output
    }
    missing = [name for name in names if name not in linear_names]
    if missing:
        raise SettingError(
            f"--lora-targets {targets}: no linear layer named {', '.join(missing)} in this model "
            f"(the output layer excluded); its linear layers are named {', '.join(sorted(linear_names))}"
        )
    return names


def check_lora_targets(spec: str | Path, targets: str) -> None:
    """Refuse ``targets`` that name no linear layer of the model at ``spec``, from its config alone
    (a model of empty tensors on the meta device: no weights read), before a stage reads any data."""
    if targets == "all-linear":
        return
    config = AutoConfig.from_pretrained(resolve_model(str(spec)))
    with torch.device("meta"):
        model = _model_class(config).from_config(config)
    lora_target_modules(model, targets)


def apply_lora(
    generator: QueryGenerator,
    rank: int,
    alpha: float | None = None,
    targets: str = "all-linear",
    decoder_only: bool = False,
) -> None:
    """Replace the generator's model by a peft LoRA model: adapters of rank ``rank`` (``alpha``
    default ``2 · rank``) on every linear layer, or with ``targets`` a comma-separated list of
    module names (``q_proj,v_proj``) on the linear layers of those names only
    (:func:`lora_target_modules`); only the adapters are trainable. ``decoder_only`` (a seq2seq
    model, ``--query-only``): on the decoder's layers alone, the encoder left frozen."""
    from peft import LoraConfig, get_peft_model

    modules = lora_target_modules(generator.model, targets)
    if decoder_only:
        output = generator.model.get_output_embeddings()
        modules = [
            name
            for name, module in generator.model.named_modules()
            if isinstance(module, torch.nn.Linear)
            and name.startswith("decoder.")
            and module is not output
            and (modules == "all-linear" or name.rsplit(".", 1)[-1] in modules)
        ]
    lora = LoraConfig(
        r=rank,
        lora_alpha=alpha or 2 * rank,
        lora_dropout=0.0,
        target_modules=modules,
        task_type="SEQ_2_SEQ_LM" if generator.kind == "seq2seq" else "CAUSAL_LM",
    )
    generator.model = get_peft_model(generator.model, lora)
