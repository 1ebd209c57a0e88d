"""Config of ``synthq plan``: a private log's size, a target budget, and the README recipe's settings
of each route's DP stage."""

from __future__ import annotations

import math
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from synthq.config.fields import (
    DEFAULT_EPSILON,
    DEFAULT_MAX_QUERIES_PER_USER,
    Accountant,
    Epsilon,
    MaxQueriesPerUser,
    PrivacyUnitName,
    batch_size_or_auto,
    cli,
    refuse_user_options_at_the_query_unit,
)

BatchOrAuto = Annotated[int, Field(ge=1)] | Literal["auto"]


class PlanConfig(BaseModel):
    """``synthq plan``: both routes' DP plans for a log of this size, before any training.

    Not a stage (it writes no artifact), but its options come from these fields as a stage's do.
    Its defaults are the README recipe's settings, not the stages' own defaults."""

    model_config = ConfigDict(extra="forbid")

    data: str | None = Field(
        None,
        description="The private log (BEIR directory or pylibs, pydocs, embedded): its units are counted.",
        json_schema_extra=cli(metavar="SOURCE"),
    )
    units: int | None = Field(
        None, ge=1, description="The number of privacy units, instead of counting them (reads nothing)."
    )
    split: str = Field("train", description="The private training split.")
    privacy_unit: PrivacyUnitName = "user"
    max_queries_per_user: MaxQueriesPerUser = DEFAULT_MAX_QUERIES_PER_USER
    epsilon: Epsilon = Field(DEFAULT_EPSILON, description="Target ε of each route (finite).")
    delta: float | None = Field(None, gt=0, lt=1, description="δ; default 1/(2n), as the stages.")
    accountant: Accountant = Field("rdp", description="Privacy accountant: rdp (Opacus RDP) or prv.")
    generator_batch_size: BatchOrAuto = Field(
        64,
        description="finetune-lm --batch-size (the README recipe's 64; auto: as finetune-lm --batch-size "
        "auto).",
        json_schema_extra=cli(metavar="INT/auto"),
    )
    generator_epochs: float = Field(
        1.0, gt=0, allow_inf_nan=False, description="finetune-lm --epochs (the README recipe's 1)."
    )
    generator_max_steps: int | None = Field(None, ge=1, description="finetune-lm --max-steps.")
    retriever_batch_size: BatchOrAuto = Field(
        64,
        description="train-retriever --dp group --batch-size (the recipe's 64; auto: the least noise per "
        "clipped group among batches that leave 16 steps).",
        json_schema_extra=cli(metavar="INT/auto"),
    )
    retriever_group_size: int = Field(8, ge=1, description="train-retriever --group-size (its default 8).")
    retriever_epochs: float = Field(
        1.0, gt=0, allow_inf_nan=False, description="train-retriever --epochs, both routes (the recipe's 1)."
    )
    documents: int | None = Field(
        None, ge=1, description="Public documents to write queries for (default: the log's corpus)."
    )
    num_queries: int = Field(3, ge=1, description="generate --num-queries.")
    details: bool = Field(
        False, description="Also print each route's plan in full and the measured runs behind the verdict."
    )
    as_json: bool = Field(False, description="Print the plans as JSON.", json_schema_extra=cli(flag="--json"))

    @field_validator("generator_batch_size", "retriever_batch_size", mode="before")
    @classmethod
    def _whole_number_or_auto(cls, value):
        return batch_size_or_auto(value)

    @field_validator("epsilon", mode="before")
    @classmethod
    def _a_number(cls, value):
        if isinstance(value, str | float) and str(value).strip().lower() == "nan":
            raise ValueError("must be a finite number > 0, not nan")
        return value

    @field_validator("epsilon")
    @classmethod
    def _finite(cls, value: float) -> float:
        if not math.isfinite(value):
            raise ValueError("synthq plan needs a finite ε > 0 (a plan at ε = inf has no noise to plan)")
        return value

    @model_validator(mode="after")
    def _something_to_count(self) -> PlanConfig:
        if self.data is None and (self.units is None or self.documents is None):
            raise ValueError("give --data, or both --units and --documents")
        refuse_user_options_at_the_query_unit(self)
        return self

    @property
    def rows_per_unit(self) -> int:
        """Rows a unit contributes at most: K at the user unit, 1 at the query unit."""
        return self.max_queries_per_user if self.privacy_unit == "user" else 1
