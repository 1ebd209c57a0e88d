"""Configs of the stages that write synthetic queries: finetune-lm, generate, evolve and filter."""

from __future__ import annotations

import math
import re
from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from synthq.config.fields import (
    CPU_DOCUMENT_TOKENS,
    DEFAULT_DOCUMENT_TOKENS,
    DEFAULT_EPSILON,
    DEFAULT_MAX_QUERIES_PER_USER,
    DEFAULT_PRIVACY_UNIT,
    DEFAULT_QUERY_TOKENS,
    DEFAULT_TOP_P,
    Accountant,
    Device,
    DocumentList,
    Epsilon,
    Limit,
    MaxQueriesPerUser,
    PathField,
    PathOrName,
    PrecisionName,
    PrivacyUnitName,
    Probability,
    Profile,
    PublicCorpus,
    Resume,
    SecretSeed,
    Seed,
    StageConfig,
    batch_size_or_auto,
    cli,
    refuse_limit_with_dp,
    refuse_user_options_at_the_query_unit,
    renamed_batch_size,
)


class FinetuneConfig(StageConfig):
    """``synthq finetune-lm``: (document → query) fine-tuning with DP-SGD/DP-Adam."""

    data: PathOrName = Field(
        description="Private pairs: a BEIR directory or source name (embedded, msmarco, beir:NAME)."
    )
    split: str = Field("train", description="qrels split whose (query, document) pairs are trained on.")
    model: PathOrName = Field(
        description="Hub id (google-t5/t5-base), local directory, or alias (smollm2-135m)."
    )
    epsilon: Epsilon = Field(DEFAULT_EPSILON, description="Target ε; inf trains without noise or clipping.")
    delta: float | None = Field(None, gt=0, lt=1, description="δ; default 1/(2n).")
    clip_norm: float = Field(
        0.1, gt=0, allow_inf_nan=False, description="Per-example clipping norm C (paper: 0.1)."
    )
    accountant: Accountant = Field("rdp", description="Privacy accountant: rdp (Opacus RDP) or prv.")
    optimizer: Literal["adam", "adam-bc", "adafactor", "sgd"] = Field(
        "adam",
        description="adam (DP-Adam), adam-bc (DP-Adam with the noise's variance removed from the "
        "second moment, DP-AdamBC: Adam's adaptivity back under DP), adafactor or sgd.",
    )
    warm_start: str | None = Field(
        None,
        description="SOURCE:SPLIT of public (document, query) pairs to train on without DP before the DP "
        "phase (the split must be declared public; never the split you evaluate on): DP then adapts a "
        "generator that already writes queries. Costs no ε; recorded as a public input.",
    )
    warm_start_epochs: float = Field(1.0, gt=0, le=100, description="--warm-start: epochs over its pairs.")
    lr: float = Field(1e-3, gt=0, allow_inf_nan=False, description="Learning rate (paper: 1e-3).")
    weight_decay: float = Field(0.0, ge=0, allow_inf_nan=False, description="Decoupled weight decay.")
    epochs: float = Field(3.0, gt=0, allow_inf_nan=False, description="Epochs (paper: 30).")
    max_steps: int | None = Field(
        None,
        ge=0,
        description="Cap on logical steps (overrides epochs when smaller). 0 with --warm-start: "
        "the warm-started generator before any DP step, which reads nothing of --data (the "
        "ε = 0 control of a synthetic table).",
    )
    batch_size: Annotated[int, Field(ge=1)] | Literal["auto"] = Field(
        1024,
        description="Expected batch, in privacy units (queries, or users at --privacy-unit user); Poisson "
        "rate q = batch / units (paper: 1024 queries). auto: the batch with the least noise per "
        "signal σ/B at the target ε that still leaves 16 steps (printed with the σ/B of every batch "
        "weighed; needs a finite --epsilon).",
        json_schema_extra=cli(metavar="INT/auto"),
    )
    physical_batch_size: int | None = Field(
        None,
        ge=1,
        description="Micro-batch per forward/backward (memory, not the result). Default by --profile: "
        "gpu 32; cpu 8, or fewer so that a micro-batch holds ≤ 1024 tokens (document + query lengths; "
        "peak memory ≤ 4 GB for SmolLM2-135M with LoRA); recorded in the manifest.",
    )
    max_source_length: int | None = Field(
        None,
        ge=1,
        description="Document tokens kept. Default: read from the PUBLIC corpus (the 95th percentile "
        f"of its documents' token lengths under --model's tokenizer, rounded up to a multiple of 16, "
        f"at most {DEFAULT_DOCUMENT_TOKENS} on the gpu profile and {CPU_DOCUMENT_TOKENS} on the cpu "
        "profile, where the guide's fine-tuning and generation of long documents would take hours), "
        "never from the queries (documents are public in synthq's model: generate writes queries "
        "for every one); recorded in the manifest.",
    )
    max_target_length: int = Field(
        DEFAULT_QUERY_TOKENS,
        ge=1,
        description="Query tokens kept (a fixed public default: never read from the private queries; "
        "paper: 128).",
    )
    profile: Profile = "auto"
    grad_sample_mode: Literal["auto", "ghost", "hooks", "vmap"] = Field(
        "auto",
        description="Per-example clipping: ghost (Opacus ghost norms, tied weights exact), hooks "
        "(Opacus per-example gradients), vmap (torch.func, any architecture); auto = ghost where possible.",
    )
    lora_rank: int = Field(0, ge=0, description="0 = full fine-tuning; >0 trains LoRA adapters of this rank.")
    lora_alpha: float | None = Field(None, gt=0, description="LoRA alpha (default 2 × rank).")
    lora_targets: str = Field(
        "all-linear",
        pattern=r"^(all-linear|[A-Za-z_][A-Za-z0-9_]*(,[A-Za-z_][A-Za-z0-9_]*)*)$",
        description="Layers that get LoRA adapters: all-linear, or comma-separated module names "
        "(q_proj,v_proj for SmolLM2/Llama; q,v for T5). Under DP fewer coordinates carry less noise, "
        "yet on pylibs at ε = 8 a generator moved further the more it adapted (docs: results): keep "
        "all-linear and raise --lora-rank if a DP generator moves too little.",
    )
    query_only: bool = Field(
        False,
        description="Causal models with --lora-rank: the adapters act on the query only (activated "
        "LoRA): each document's keys and values come from the frozen (warm-started) model, computed "
        "once and reused by every epoch, and each DP step runs only the query tokens "
        "(benchmarks/dp_query_only.py). The generator is saved as the base model plus its adapter "
        "(query_adapter/); generate and scoring use the same path. With --max-steps 0 (the warm-started "
        "generator alone) there is no adapter to restrict: the option changes nothing.",
    )
    checkpoint_every: int = Field(50, ge=1, description="Save a resumable checkpoint every N logical steps.")
    privacy_unit: PrivacyUnitName = DEFAULT_PRIVACY_UNIT
    max_queries_per_user: MaxQueriesPerUser = DEFAULT_MAX_QUERIES_PER_USER
    user_clipping: Literal["auto", "per-example", "per-user"] = Field(
        "auto",
        description="--privacy-unit user: per-user clips the user's combined gradient to C (a "
        "user's pairs are summed, over several micro-batches when they do not fit one, then "
        "clipped once); per-example clips each of a user's k pairs to C with weight 1/k. Same "
        "sensitivity C, same accountant. auto = per-user for --privacy-unit user at a finite ε "
        "(it fit better on pydocs at ε = 8, docs: results), else per-example.",
    )
    seed: SecretSeed = None
    device: Device = "auto"
    precision: PrecisionName = "auto"
    limit: Limit = None
    resume: Resume = False

    @field_validator("lora_targets")
    @classmethod
    def _canonical_targets(cls, value: str) -> str:
        """One spelling per set of layers (sorted, each once), so equal runs share a fingerprint."""
        return value if value == "all-linear" else ",".join(sorted(set(value.split(","))))

    @model_validator(mode="after")
    def _limit_without_dp(self) -> FinetuneConfig:
        if self.lora_targets != "all-linear" and self.lora_rank == 0:
            raise ValueError(
                f"--lora-targets {self.lora_targets} needs --lora-rank > 0 (at 0 every weight is trained)"
            )
        if self.query_only and self.lora_rank == 0:
            raise ValueError("--query-only trains LoRA adapters on the query tokens: give --lora-rank > 0")
        refuse_limit_with_dp(self.limit, math.isfinite(self.epsilon))
        refuse_user_options_at_the_query_unit(self)
        return self

    @field_validator("batch_size", mode="before")
    @classmethod
    def _whole_number_or_auto(cls, value):
        return batch_size_or_auto(value)

    @model_validator(mode="after")
    def _auto_batch_needs_a_budget(self) -> FinetuneConfig:
        if self.batch_size == "auto" and not math.isfinite(self.epsilon):
            raise ValueError("--batch-size auto chooses the batch for a DP budget: give a finite --epsilon")
        return self

    @model_validator(mode="after")
    def _no_steps_only_after_a_warm_start(self) -> FinetuneConfig:
        if self.max_steps == 0 and not self.warm_start:
            raise ValueError(
                "--max-steps 0 trains nothing: it is only the public control of --warm-start "
                "(the warm-started generator before any DP step)"
            )
        return self

    @model_validator(mode="after")
    def _per_user_clipping_needs_users(self) -> FinetuneConfig:
        resolved = self.user_clipping != "auto" and "user_clipping" not in self.model_fields_set
        if self.user_clipping == "auto" or resolved:  # resolved here, so manifests record what ran
            per_user = self.privacy_unit == "user" and math.isfinite(self.epsilon)
            # not an option the user set: resolved again whenever the config is checked again (a
            # changed --epsilon or unit must not meet the old resolution as a choice)
            object.__setattr__(self, "user_clipping", "per-user" if per_user else "per-example")
        if self.user_clipping == "per-user" and self.privacy_unit != "user":
            raise ValueError("--user-clipping per-user needs --privacy-unit user")
        if self.user_clipping == "per-user" and not math.isfinite(self.epsilon):
            raise ValueError(
                "--user-clipping per-user needs a finite --epsilon: without DP nothing is clipped"
            )
        return self


class GenerateConfig(StageConfig):
    """``synthq generate``: nucleus-sample synthetic queries for public documents."""

    generator: PathField = Field(
        description="A finetune-lm artifact, or a public model (alias, hub id or local directory): "
        "the ε = 0 control, queries written with no private data."
    )
    few_shot: str | None = Field(
        None,
        description="SOURCE:SPLIT of public (document, query) pairs to show a public causal model in "
        "every prompt (InPars-style few-shot); the split must be declared public. Default: zero-shot.",
    )
    few_shot_examples: int = Field(3, ge=1, le=16, description="--few-shot: examples in each prompt.")
    corpus: PublicCorpus = "embedded"
    documents: DocumentList = None
    split: str | None = Field(
        None,
        description="Generate only for the documents judged in this qrels split. Which documents a "
        "private split judges can itself be private: this is recorded as the assumption that the "
        "judged-document set is public (the paper's MS MARCO setting). Default: the whole corpus.",
    )
    num_queries: int = Field(1, ge=1, description="Queries per document.")
    top_p: Probability = Field(DEFAULT_TOP_P, description="Nucleus sampling mass, in (0, 1] (paper: 0.8).")
    temperature: float = Field(1.0, gt=0, description="Sampling temperature (> 0).")
    max_new_tokens: int = Field(
        DEFAULT_QUERY_TOKENS,
        ge=1,
        description="Longest query, in tokens (documents are cut as the generator was trained).",
    )
    generation_batch_size: int | None = renamed_batch_size(
        "generation_batch_size",
        None,
        "Documents per generation batch. Default by --profile: on cpu as many as fit 8,192 tokens "
        "of prompts and queries (at most 96), 64 on gpu; recorded in the manifest.",
    )
    max_resample: int = Field(3, ge=0, description="Retries for empty or degenerate queries.")
    profile: Profile = "auto"
    shard: str | None = Field(None, description="i/n: generate only the i-th of n document shards.")
    seed: Seed = 0
    device: Device = "auto"
    precision: PrecisionName = "auto"
    limit: Limit = None
    resume: Resume = False

    @field_validator("shard")
    @classmethod
    def _shard_in_range(cls, value: str | None) -> str | None:
        if value is not None:
            if not re.fullmatch(r"\d+/\d+", value):
                raise ValueError(f"must look like i/n (e.g. 0/4), got {value!r}")
            index, count = (int(x) for x in value.split("/"))
            if not 0 <= index < count:
                raise ValueError(f"{value}: need 0 <= i < n")
        return value


class EvolveConfig(StageConfig):
    """``synthq evolve``: DP synthetic queries by Private Evolution (a public model, no training)."""

    data: PathOrName = Field(
        description="Private pairs that vote: a BEIR directory or source name (embedded, msmarco, beir:NAME)."
    )
    split: str = Field("train", description="qrels split whose (query, document) pairs vote.")
    corpus: PublicCorpus = "embedded"
    documents: DocumentList = None
    judged_split: str | None = Field(
        None,
        description="Write queries only for the documents judged in this qrels split of --corpus, "
        "recorded as the assumption that this set is public (as generate --split).",
    )
    model: PathOrName = Field(
        "smollm2-135m",
        description="Public generator that writes and varies queries: alias, local directory or hub id "
        "(assumed public; a synthq artifact brings its own guarantee).",
    )
    embedder: PathOrName = Field(
        "minilm-l6", description="Public sentence encoder of the votes' nearest-neighbour search."
    )
    epsilon: Epsilon = Field(DEFAULT_EPSILON, description="Target ε over all iterations.")
    delta: float | None = Field(None, gt=0, lt=1, description="δ; default 1/(2n).")
    accountant: Accountant = Field("prv", description="Privacy accountant: prv (exact here) or rdp.")
    iterations: int = Field(2, ge=1, description="Vote-and-vary rounds T (each one Gaussian mechanism).")
    population: int = Field(
        3, ge=2, description="Candidate queries per document in every round (the winner and its variations)."
    )
    queries_per_document: int = Field(1, ge=1, description="Queries kept per document after the last vote.")
    top_p: Probability = Field(0.9, description="Nucleus sampling mass of the public model, in (0, 1].")
    temperature: float = Field(1.0, gt=0, description="Sampling temperature (> 0).")
    max_new_tokens: int = Field(20, ge=1, description="Longest query, in tokens.")
    max_source_length: int = Field(96, ge=1, description="Document tokens in a prompt.")
    generation_batch_size: int = Field(96, ge=1, description="Prompts per generation batch.")
    encode_batch_size: int = Field(64, ge=1, description="Texts per embedding batch.")
    privacy_unit: PrivacyUnitName = DEFAULT_PRIVACY_UNIT
    max_queries_per_user: MaxQueriesPerUser = DEFAULT_MAX_QUERIES_PER_USER
    resume: Resume = False
    generation_seed: Seed = 0
    seed: SecretSeed = None
    device: Device = "auto"
    precision: PrecisionName = "auto"

    @model_validator(mode="after")
    def _keep_at_most_the_population(self) -> EvolveConfig:
        refuse_user_options_at_the_query_unit(self)
        if self.queries_per_document > self.population:
            raise ValueError(
                f"--queries-per-document {self.queries_per_document} is more than the --population "
                f"{self.population} each document has"
            )
        return self


FilterMethod = Literal["consistency", "likelihood", "none"]


class FilterConfig(StageConfig):
    """``synthq filter``: keep the better synthetic queries and hold documents out for tuning
    (post-processing of the generator: no ε)."""

    synthetic: PathField = Field(description="A generate (or filter) artifact.")
    method: FilterMethod = Field(
        "consistency",
        description="consistency: keep a query when a retriever finds its own document in the top K; "
        "likelihood: keep each document's most likely queries under the set's generator; none: keep all.",
    )
    retriever: PathOrName = Field(
        "minilm-l6",
        description="consistency: the retriever (encoder alias, directory, hub id, a train-retriever "
        "artifact, or bm25).",
    )
    top_k: int = Field(3, ge=1, description="consistency: how high the query's own document must rank.")
    corpus: PublicCorpus | None = Field(
        None,
        description="consistency: rank each query among the documents of this public corpus (a BEIR "
        "directory or source name holding every document of the set) instead of the set's own. A set "
        "written for a subset (generate --documents) is otherwise ranked among that subset only: a "
        "far easier test than among the whole corpus.",
    )
    keep: int = Field(1, ge=1, description="likelihood: queries kept per document.")
    holdout_documents: int = Field(
        0, ge=0, description="Move the queries of N documents (public hash of their ids) to a dev split."
    )
    encode_batch_size: int = Field(64, ge=1, description="consistency: texts per encoding batch.")
    scoring_batch_size: int = Field(16, ge=1, description="likelihood: queries per scoring batch.")
    device: Device = "auto"
    precision: PrecisionName = "auto"
