"""Stage configs: one pydantic model per stage, loadable from YAML with ``key=value`` overrides.

The CLI turns options into one of these and calls the stage's ``run(config)``; pipelines build
the same objects from YAML. Every field that changes what a stage computes is part of the
artifact's fingerprint (see :mod:`synthq.artifacts`); ``out``, ``force`` and ``resume`` are not.
"""

from __future__ import annotations

import copy
import math
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import AliasChoices, BaseModel, ConfigDict, Field, field_validator

from synthq.errors import SynthqError

Accountant = Literal["rdp", "prv"]
Device = str  # "auto", "cpu", "cuda", "cuda:1", ...


class StageConfig(BaseModel):
    """Fields every stage has."""

    model_config = ConfigDict(extra="forbid", ser_json_inf_nan="strings")

    out: Path
    force: bool = Field(False, description="Redo the stage even if an up-to-date artifact exists.")
    resume: bool = Field(False, description="Continue an interrupted run from its last checkpoint.")


def _parse_epsilon(value: Any) -> float:
    if isinstance(value, str) and value.strip().lower() in ("inf", "infinity", "∞", "none"):
        return math.inf
    return float(value)


class FinetuneConfig(StageConfig):
    """``synthq finetune-lm``: (document → query) fine-tuning with DP-SGD/DP-Adam."""

    data: str = Field(
        description="Private pairs: a BEIR directory or source name (embedded, msmarco, beir:NAME)."
    )
    split: str = "train"
    model: str = Field(description="Hub id, local directory, or packaged alias (smollm2-135m).")
    epsilon: float = Field(8.0, description="Target ε; inf trains without noise or clipping.")
    delta: float | None = Field(None, description="δ; default 1/(2n).")
    clip_norm: float = 0.1
    accountant: Accountant = "rdp"
    optimizer: Literal["adam", "adafactor", "sgd"] = "adam"
    lr: float = 1e-3
    weight_decay: float = 0.0
    epochs: float = 3.0
    max_steps: int | None = Field(None, description="Cap on logical steps (overrides epochs when smaller).")
    batch_size: int = Field(
        1024, description="Logical (expected) batch size; Poisson sampling rate = batch/n."
    )
    physical_batch_size: int = Field(8, description="Micro-batch that fits in memory.")
    max_source_length: int = 384
    max_target_length: int = 128
    grad_sample_mode: Literal["auto", "ghost", "hooks", "vmap"] = Field(
        "auto",
        description="Per-example clipping: ghost (Opacus ghost norms, tied weights exact), hooks "
        "(Opacus per-example gradients), vmap (torch.func, any architecture); auto = ghost where possible.",
    )
    lora_rank: int = Field(0, description="0 = full fine-tuning; >0 trains LoRA adapters of this rank.")
    lora_alpha: float | None = None
    checkpoint_every: int = Field(50, description="Save a resumable checkpoint every N logical steps.")
    seed: int = 0
    device: Device = "auto"
    limit: int | None = Field(None, description="Use only the first N pairs (quick runs).")

    _parse_eps = field_validator("epsilon", mode="before")(_parse_epsilon)


class GenerateConfig(StageConfig):
    """``synthq generate``: nucleus-sample synthetic queries for public documents."""

    generator: Path
    corpus: str = Field(description="Public documents: a BEIR directory or source name.")
    split: str | None = Field("train", description="Use the documents of this qrels split; None = all.")
    num_queries: int = 1
    top_p: float = 0.8
    temperature: float = 1.0
    max_new_tokens: int = 32
    batch_size: int = 16
    max_resample: int = 3
    shard: str | None = Field(None, description="'i/n': process only the i-th of n document shards.")
    seed: int = 0
    device: Device = "auto"
    limit: int | None = None


class SimilarityConfig(StageConfig):
    """``synthq similarity``: BLEU, MAUVE and friends between synthetic and original queries."""

    synthetic: Path
    original: str
    split: str = "train"
    encoder: str = "minilm-l6"
    mauve_seeds: int = 5
    mauve_scaling_factor: float = 5.0
    min_samples: int = 50
    seed: int = 0
    device: Device = "auto"


DPMode = Literal["sample", "batch", "group", "logit"]


class TrainRetrieverConfig(StageConfig):
    """``synthq train-retriever``: dual encoder with in-batch softmax, optionally direct DP."""

    data: str = Field(description="A synthetic artifact, a BEIR directory or a source name.")
    split: str = "train"
    encoder: str = "minilm-l6"
    dp: DPMode | None = None
    epsilon: float = 8.0
    delta: float | None = None
    clip_norm: float = 1.0
    accountant: Accountant = "rdp"
    batch_size: int = 32
    epochs: float = 5.0
    max_steps: int | None = None
    lr: float = 2e-5
    warmup_ratio: float = 0.1
    temperature: float = Field(
        0.05, gt=0, description="Softmax temperature on cosine similarity (scale = 1/T)."
    )
    max_query_length: int = 128
    max_doc_length: int = 384
    group_size: int = Field(8, ge=1)
    aug_negatives: int = Field(0, ge=0)
    mini_batch_size: int | None = Field(
        None, ge=1, description="Non-private: GradCache (cached in-batch loss) in chunks of this size."
    )
    pair_chunk: int = Field(16, ge=1, description="--dp logit: per-pair gradients held in memory at once.")
    seed: int = 0
    device: Device = "auto"
    limit: int | None = None

    _parse_eps = field_validator("epsilon", mode="before")(_parse_epsilon)


class EvalConfig(StageConfig):
    """``synthq eval``: retrieval metrics on embedded, MS MARCO dev and BEIR datasets."""

    retrievers: list[str] = Field(
        default_factory=list, description="train-retriever artifacts (sentence-transformers dirs)."
    )
    datasets: list[str] = Field(
        default_factory=lambda: ["embedded"],
        description="embedded, msmarco, beir:NAME (or a bare BEIR name), or BEIR directories.",
    )
    split: str | None = Field(None, description="Default: test (msmarco: dev).")
    bm25: bool = Field(True, description="Add the BM25 reference row (bm25s).")
    untrained: list[str] = Field(
        default_factory=list, description="Encoder specs evaluated as-is (reference rows, ε = 0)."
    )
    batch_size: int = Field(64, ge=1, description="Encoding batch size.")
    top_k: int = Field(100, ge=100, description="Documents retrieved per query (≥ 100 for NDCG@100).")
    search_chunk_size: int = Field(50_000, ge=1, description="Documents scored per matrix product.")
    faiss: bool = Field(False, description="Search with FAISS IndexFlatIP instead of torch chunks.")
    device: Device = "auto"


class ReportConfig(StageConfig):
    """``synthq report``: merge evaluation artifacts into one set of tables and plots."""

    evals: list[str] = Field(min_length=1, description="Evaluation artifacts to merge.")
    title: str = "synthq results"
    paper: list[dict[str, Any]] = Field(default_factory=list, description="The paper's numbers beside ours.")
    similarity: list[str] = Field(default_factory=list, description="Similarity artifacts (BLEU, MAUVE).")


class CanaryAuditConfig(StageConfig):
    """``synthq canary-audit``: empirical ε lower bounds for the generator and the retriever.

    ``one-run``: ``canaries`` secrets each included once with probability ½ (Steinke et al., 2023);
    ``exposure``: Table 7's rank / exposure / leakage with canaries repeated ``repetitions`` times;
    ``both`` shares one generator per ε between the two."""

    data: str
    model: str
    method: Literal["one-run", "exposure", "both"] = "one-run"
    epsilons: list[float] = Field(default_factory=lambda: [math.inf, 8.0])
    canaries: int = Field(500, ge=2, description="One-run canaries (each included with probability 1/2).")
    canary_seed: int | None = Field(
        None, description="Seed for canary secrets and coins; None = secret OS randomness."
    )
    private_pairs: int | None = Field(
        None, ge=1, description="Train the audited generators on this many private pairs (None = all)."
    )
    confidence: float = Field(0.95, gt=0.5, lt=1)
    retriever_audit: bool = Field(True, description="Also audit retrievers trained on the synthetic queries.")
    retriever_documents: int = Field(
        200, ge=0, description="Public documents beside the canary documents in the retriever audit."
    )
    repetitions: list[int] = Field(default_factory=lambda: [10, 100])
    shapes: list[str] = Field(default_factory=lambda: ["random-query", "real-document", "random-document"])
    split: str = "train"
    canaries_per_shape: int = 5
    references: int = 99
    leak_samples: int = Field(10, description="Sampled queries per canary document for the leak test.")
    top_p: float = 0.8
    max_new_tokens: int = 24
    scoring_batch_size: int = Field(
        32,
        validation_alias=AliasChoices("scoring_batch_size", "batch_size"),
        description="Candidates per forward.",
    )
    seed: int = 0
    finetune: dict[str, Any] = Field(default_factory=dict, description="Extra finetune-lm options.")
    generate: dict[str, Any] = Field(
        default_factory=dict, description="Extra generate options (retriever audit)."
    )
    retriever: dict[str, Any] = Field(
        default_factory=dict, description="Extra train-retriever options (retriever audit)."
    )

    @field_validator("epsilons", mode="before")
    @classmethod
    def _parse_epsilons(cls, value: Any) -> Any:
        if isinstance(value, str):
            value = value.split(",")
        return [_parse_epsilon(v) for v in value]


def load_yaml(path: str | Path) -> dict:
    """Read a YAML mapping, with errors that name the file."""
    path = Path(path)
    if not path.is_file():
        raise SynthqError(f"{path}: no such config file")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as error:
        raise SynthqError(f"{path}: invalid YAML ({error})") from error
    if not isinstance(data, dict):
        raise SynthqError(f"{path}: expected a mapping at the top level")
    return data


def apply_overrides(data: dict, overrides: list[str]) -> dict:
    """Apply ``a.b.c=value`` overrides (values parsed as YAML scalars) to a nested mapping.

    Numeric parts index into lists (``stages.2.config.epochs=1``); missing mappings are created.
    The input is not modified."""
    result = copy.deepcopy(data)
    for item in overrides:
        if "=" not in item:
            raise SynthqError(f"override {item!r} is not of the form key=value")
        key, raw = item.split("=", 1)
        value = yaml.safe_load(raw) if raw else None
        node: Any = result
        parts = key.strip().split(".")
        for part in parts[:-1]:
            if isinstance(node, list):
                node = node[_list_index(node, part, item)]
                continue
            if not isinstance(node.get(part), dict | list):
                node[part] = {}
            node = node[part]
        if isinstance(node, list):
            node[_list_index(node, parts[-1], item)] = value
        else:
            node[parts[-1]] = value
    return result


def _list_index(items: list, part: str, item: str) -> int:
    if not part.isdigit() or int(part) >= len(items):
        raise SynthqError(f"override {item!r}: {part!r} is not an index of a list of {len(items)}")
    return int(part)
