"""Config of ``synthq train-retriever``: the dual encoder, trained on synthetic queries or with direct DP."""

from __future__ import annotations

import math
from typing import Literal

from pydantic import Field, model_validator

from synthq.config.fields import (
    DEFAULT_EPSILON,
    DEFAULT_MAX_QUERIES_PER_USER,
    DEFAULT_PRIVACY_UNIT,
    RETRIEVER_DOCUMENT_TOKENS,
    Accountant,
    Device,
    Epsilon,
    Limit,
    MaxQueriesPerUser,
    PathOrName,
    PrecisionName,
    PrivacyUnitName,
    SecretSeed,
    StageConfig,
    refuse_limit_with_dp,
    refuse_user_options_at_the_query_unit,
)

DPMode = Literal["sample", "batch", "group", "logit"]


class TrainRetrieverConfig(StageConfig):
    """``synthq train-retriever``: dual encoder with in-batch softmax, optionally direct DP."""

    data: PathOrName = Field(description="A synthetic artifact, a BEIR directory or a source name.")
    split: str = Field("train", description="qrels split of the training pairs.")
    encoder: PathOrName = Field("minilm-l6", description="Shared encoder: alias, local directory or hub id.")
    dp: DPMode | None = Field(None, description="Direct DP on the private pairs (baselines); default: none.")
    epsilon: Epsilon = Field(DEFAULT_EPSILON, description="Target ε for --dp.")
    delta: float | None = Field(None, gt=0, lt=1, description="δ for --dp (default 1/(2n)).")
    clip_norm: float = Field(
        1.0,
        gt=0,
        allow_inf_nan=False,
        description="Clipping norm C for --dp (the paper uses 0.1 with T5-Base; 1.0 here by default).",
    )
    accountant: Accountant = Field("rdp", description="Privacy accountant for --dp: rdp or prv.")
    batch_size: int = Field(
        32,
        ge=1,
        description="Batch of pairs (paper: 32); under --dp the expected batch of privacy units "
        "(pairs, or users at --privacy-unit user).",
    )
    epochs: float = Field(5.0, gt=0, allow_inf_nan=False, description="Epochs (paper: 5).")
    max_steps: int | None = Field(None, ge=1, description="Cap on steps.")
    lr: float = Field(2e-5, gt=0, allow_inf_nan=False, description="Learning rate.")
    weight_decay: float = Field(
        0.01, ge=0, allow_inf_nan=False, description="Decoupled weight decay (AdamW)."
    )
    warmup_ratio: float = Field(0.1, ge=0, lt=1, description="Fraction of steps with linear warm-up.")
    temperature: float = Field(
        0.05, gt=0, description="Softmax temperature on cosine similarity (scale = 1/T)."
    )
    max_query_length: int = Field(128, ge=1, description="Query tokens kept.")
    max_doc_length: int | None = Field(
        None,
        ge=1,
        description=f"Document tokens kept. Default: {RETRIEVER_DOCUMENT_TOKENS['gpu']} on a GPU, "
        f"{RETRIEVER_DOCUMENT_TOKENS['cpu']} on a CPU (within the encoder's positions); recorded in "
        "the manifest.",
    )
    group_size: int = Field(8, ge=1, description="--dp group: pairs per group.")
    aug_negatives: int = Field(0, ge=0, description="--dp group: augmented negatives per group document.")
    mini_batch_size: int | None = Field(
        None, ge=1, description="Non-private: GradCache (cached in-batch loss) in chunks of this size."
    )
    pair_chunk: int = Field(16, ge=1, description="--dp logit: per-pair gradients held in memory at once.")
    freeze_embeddings: bool = Field(
        False,
        description="Keep the token-embedding matrix fixed: fewer weights to train and, under --dp, "
        "to noise; faster steps.",
    )
    queries_per_document: int | None = Field(
        None,
        ge=1,
        description="Train on the first K pairs of each document (file order), e.g. one query per "
        "document of a set generated with --num-queries 3. Not with --dp.",
    )
    hard_negatives: int = Field(
        0,
        ge=0,
        description="Non-private: N extra negatives per pair for the in-batch softmax, mined by the "
        "starting encoder on the corpus (its top documents for the query, without the query's "
        "positives and near-ties at ≥ 95 % of the positive's score). Free on a synthetic set and a "
        "public corpus. Not with --dp.",
    )
    privacy_unit: PrivacyUnitName = DEFAULT_PRIVACY_UNIT
    max_queries_per_user: MaxQueriesPerUser = DEFAULT_MAX_QUERIES_PER_USER
    seed: SecretSeed = None
    device: Device = "auto"
    precision: PrecisionName = "auto"
    limit: Limit = None

    @model_validator(mode="after")
    def _limit_without_dp(self) -> TrainRetrieverConfig:
        refuse_limit_with_dp(self.limit, self.dp is not None)
        refuse_user_options_at_the_query_unit(self)
        if self.dp is None and "epsilon" in self.model_fields_set and math.isfinite(self.epsilon):
            raise ValueError("--epsilon needs --dp: without it the retriever trains non-privately (ε = ∞)")
        if self.hard_negatives and self.dp is not None:
            raise ValueError(
                "--hard-negatives is for non-private training (a synthetic set, or public pairs): "
                "direct DP with mined negatives is not built"
            )
        if self.privacy_unit == "user" and self.dp is None:
            raise ValueError("--privacy-unit user needs --dp: training without DP protects no unit (ε = ∞)")
        return self
