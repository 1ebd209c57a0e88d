"""Configs of the stages that measure: eval (retrieval metrics), report (tables) and similarity."""

from __future__ import annotations

from typing import Any

from pydantic import Field, model_validator

from synthq.config.fields import (
    Device,
    PathField,
    PathOrName,
    PrecisionName,
    Seed,
    StageConfig,
    cli,
    renamed_batch_size,
)


class EvalConfig(StageConfig):
    """``synthq eval``: retrieval metrics on embedded, MS MARCO dev and BEIR datasets."""

    retrievers: list[PathOrName] = Field(
        default_factory=list,
        description="A train-retriever artifact (repeatable).",
        json_schema_extra=cli(flag="--retriever", commas=False),
    )
    datasets: list[PathOrName] = Field(
        default_factory=lambda: ["embedded"],
        description="embedded, pydocs, msmarco (dev split), beir:NAME or BEIR directories (comma-separated).",
    )
    split: str | None = Field(None, description="Split to evaluate (default: test; msmarco: dev).")
    bm25: bool = Field(True, description="Add the BM25 reference row (ε = 0, public).")
    untrained: list[PathOrName] = Field(
        default_factory=list,
        description="Encoder evaluated as-is, e.g. minilm-l6 (repeatable; a reference row, ε = 0).",
        json_schema_extra=cli(commas=False),
    )
    encode_batch_size: int = renamed_batch_size("encode_batch_size", 64, "Texts per encoding batch.")
    top_k: int = Field(100, ge=100, description="Documents retrieved per query (≥ 100 for NDCG@100).")
    search_chunk_size: int = Field(50_000, ge=1, description="Documents scored per matrix product.")
    faiss: bool = Field(False, description="Search with FAISS IndexFlatIP instead of exact torch chunks.")
    select_on: PathOrName | None = Field(
        None,
        description="A dev eval artifact: evaluate only each method's best configuration on it "
        "(every seed of it); retrievers it did not score are kept. On a private dev split the "
        "choice is a release: unaccounted (ε = ∞) unless --select-epsilon.",
    )
    select_data: bool = Field(
        False,
        description="With --select-on: the synthetic set is tuned too (its filter, queries per "
        "document): one choice per generator and encoder among all its sets, not one per set.",
    )
    select_epsilon: float | None = Field(
        None,
        ge=1e-3,
        allow_inf_nan=False,
        description="Choose on a private dev split with report-noisy-max, spending this ε (pure DP, "
        "split over the methods that have more than one configuration) on the dev queries; at least 0.001 "
        "(below it the choice is a coin flip).",
    )
    device: Device = "auto"
    precision: PrecisionName = "auto"

    @model_validator(mode="after")
    def _selection_needs_a_dev_evaluation(self) -> EvalConfig:
        for name in ("select_data", "select_epsilon"):
            if (
                name in self.model_fields_set
                and getattr(self, name) not in (None, False)
                and not self.select_on
            ):
                raise ValueError(
                    f"--{name.replace('_', '-')} needs --select-on (a dev evaluation to choose on)"
                )
        return self


class ReportConfig(StageConfig):
    """``synthq report``: merge evaluation artifacts into one set of tables and plots."""

    evals: list[PathOrName] = Field(
        min_length=1, description="Evaluation artifacts to merge.", json_schema_extra=cli(argument=True)
    )
    title: str = Field("synthq results", description="Title of the report.")
    paper: list[dict[str, Any]] = Field(
        default_factory=list,
        description="The paper's numbers beside ours.",
        json_schema_extra=cli(hidden=True),  # the command line reads them from --paper FILE
    )
    similarity: list[PathOrName] = Field(
        default_factory=list, description="Similarity artifacts (BLEU, MAUVE) to include (repeatable)."
    )


class SimilarityConfig(StageConfig):
    """``synthq similarity``: BLEU, MAUVE and friends between synthetic and original queries."""

    synthetic: PathField = Field(description="A generate artifact.")
    original: PathOrName = Field(description="The original pairs (BEIR directory or source name).")
    split: str = Field("train", description="qrels split of the original queries.")
    encoder: PathOrName = Field("minilm-l6", description="Encoder whose features MAUVE compares.")
    mauve_seeds: int = Field(5, ge=1, description="k-means seeds to average MAUVE over.")
    mauve_scaling_factor: float = Field(
        5.0, gt=0, description="MAUVE's c in exp(-c KL) (mauve's default: 5)."
    )
    min_samples: int = Field(50, ge=2, description="Refuse MAUVE below this many queries per side.")
    seed: Seed = 0
    device: Device = "auto"
    precision: PrecisionName = "auto"
