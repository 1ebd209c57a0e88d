"""Config of ``synthq canary-audit``: which canaries, which ε, and the stages' options it trains with."""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal

from pydantic import Field, ValidationError, field_validator, model_validator

from synthq.config.fields import (
    DEFAULT_EPSILON,
    DEFAULT_MAX_QUERIES_PER_USER,
    DEFAULT_PRIVACY_UNIT,
    DEFAULT_TOP_P,
    Epsilon,
    MaxQueriesPerUser,
    PathOrName,
    PrivacyUnitName,
    Probability,
    Resume,
    Seed,
    StageConfig,
    refuse_user_options_at_the_query_unit,
    renamed_batch_size,
)
from synthq.config.generator import FinetuneConfig
from synthq.config.loading import validation_message

CANARY_SHAPES = ("random-query", "real-document", "random-document")


class CanaryAuditConfig(StageConfig):
    """``synthq canary-audit``: empirical ε lower bounds for the generator and the retriever.

    ``one-run``: ``canaries`` secrets each included once with probability ½ (Steinke et al., 2023);
    ``exposure``: Table 7's rank / exposure / leakage with canaries repeated ``repetitions`` times;
    ``both`` shares one generator per ε between the two."""

    data: PathOrName = Field(description="Private pairs: a BEIR directory or source name.")
    model: PathOrName = Field(description="Generator to fine-tune: hub id, local directory or alias.")
    method: Literal["one-run", "exposure", "both"] = Field(
        "one-run",
        description="one-run (canaries included once by a secret coin), exposure (Table 7) or both.",
    )
    epsilons: list[Epsilon] = Field(
        default_factory=lambda: [math.inf, DEFAULT_EPSILON],
        description="ε values (comma-separated); inf = non-private.",
    )
    canaries: int = Field(500, ge=2, description="One-run canaries (each included with probability 1/2).")
    canary_seed: int | None = Field(
        None, ge=0, description="Seed for canary secrets and coins; default: secret OS randomness."
    )
    private_pairs: int | None = Field(
        None, ge=1, description="Train the audited generators on this many private pairs (default: all)."
    )
    secret_references: int = Field(
        7,
        ge=0,
        description="one-run: random secrets of the same form each secret is compared with under the "
        "same model, so what every canary gains (the digit format) cancels (0 = raw likelihood).",
    )
    confidence: float = Field(0.95, gt=0.5, lt=1, description="Confidence of the ε lower bounds.")
    retriever_audit: bool = Field(True, description="Also audit retrievers trained on the synthetic queries.")
    retriever_documents: int = Field(
        200, ge=0, description="Public documents beside the canary documents in the retriever audit."
    )
    repetitions: list[Annotated[int, Field(ge=1)]] = Field(
        default_factory=lambda: [10, 100],
        description="exposure: insertion counts per canary (comma-separated).",
    )
    shapes: list[Literal[CANARY_SHAPES]] = Field(  # type: ignore[valid-type]
        default_factory=lambda: list(CANARY_SHAPES), description="exposure: canary shapes (comma-separated)."
    )
    split: str = Field("train", description="qrels split of the private pairs.")
    privacy_unit: PrivacyUnitName = DEFAULT_PRIVACY_UNIT
    max_queries_per_user: MaxQueriesPerUser = DEFAULT_MAX_QUERIES_PER_USER
    canary_queries_per_user: int = Field(
        3,
        ge=1,
        description="--privacy-unit user: canary pairs each canary user writes (one coin per user; "
        "at most --max-queries-per-user).",
    )
    canaries_per_shape: int = Field(5, ge=1, description="exposure: canaries per shape and repetition count.")
    references: int = Field(99, ge=1, description="exposure: candidate secrets per canary (rank, exposure).")
    leak_samples: int = Field(10, ge=0, description="Sampled queries per canary document for the leak test.")
    top_p: Probability = Field(DEFAULT_TOP_P, description="Nucleus mass of the leak test's sampling.")
    max_new_tokens: int = Field(24, ge=1, description="Longest sampled query in the leak test.")
    scoring_batch_size: int = renamed_batch_size(
        "scoring_batch_size", 32, "Candidates scored per forward pass."
    )
    seed: Seed = 0
    finetune: dict[str, Any] = Field(
        default_factory=dict,
        description="A finetune-lm option as key=value (repeatable), e.g. lora_rank=8.",
    )
    generate: dict[str, Any] = Field(
        default_factory=dict, description="A generate option as key=value (repeatable; retriever audit)."
    )
    retriever: dict[str, Any] = Field(
        default_factory=dict,
        description="A train-retriever option as key=value (repeatable; retriever audit).",
    )
    resume: Resume = False

    @field_validator("epsilons", "repetitions", "shapes", mode="before")
    @classmethod
    def _comma_separated(cls, value: Any) -> Any:
        return value.split(",") if isinstance(value, str) else value

    def unit_options(self) -> dict:
        """The privacy unit as the audited fine-tuning takes it (K only at the user unit)."""
        if self.privacy_unit == "user":
            return {"privacy_unit": "user", "max_queries_per_user": self.max_queries_per_user}
        return {"privacy_unit": self.privacy_unit}

    @model_validator(mode="after")
    def _finetune_options_are_valid(self) -> CanaryAuditConfig:
        fixed = {"data", "model", "out", "epsilon", "seed", "split", "resume", "privacy_unit",
                 "max_queries_per_user"}  # fmt: skip
        refuse_user_options_at_the_query_unit(self)
        if self.privacy_unit == "user":
            if self.method != "one-run":
                raise ValueError("--privacy-unit user audits with --method one-run (canary users); the "
                                 "exposure audit's repeated canaries are query-level")  # fmt: skip
            if self.canary_queries_per_user > self.max_queries_per_user:
                raise ValueError("--canary-queries-per-user must be at most --max-queries-per-user, or the "
                                 "bound would drop canaries")  # fmt: skip
        unknown = sorted(set(self.finetune) - set(FinetuneConfig.model_fields))
        if unknown:
            raise ValueError(f"--finetune: unknown finetune-lm option(s) {', '.join(unknown)}")
        clash = sorted(set(self.finetune) & fixed)
        if clash:
            raise ValueError(f"--finetune: {', '.join(clash)} is set by the audit itself")
        try:
            FinetuneConfig(
                data=self.data, model=self.model, out=self.out, **self.unit_options(), **self.finetune
            )  # fmt: skip
        except ValidationError as error:
            raise ValueError(f"--finetune {validation_message(error)}") from None
        return self
