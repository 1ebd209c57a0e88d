"""Stage configs: one pydantic model per stage, loadable from YAML with ``key=value`` overrides.

These models are the single source of truth for every option: the command line derives its
options from the fields (name, default, help text, allowed values and valid range; see
:mod:`synthq.cli.options`), and pipelines build the same objects from YAML. Each field carries its
valid range, so a bad value is refused before any work starts. Every field that changes what a
stage computes is part of the artifact's fingerprint (see :mod:`synthq.artifacts`); ``out``,
``force`` and ``resume`` are not.
"""

from __future__ import annotations

import copy
import math
import re
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    AfterValidator,
    AliasChoices,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from synthq.runtime.errors import SynthqError


def cli(**settings: Any) -> dict:
    """Command-line settings of a field, for ``Field(json_schema_extra=cli(...))``.

    Keys: ``flag`` (the option's name instead of ``--field-name``), ``aliases`` (old names that
    still work), ``argument`` (a positional argument), ``hidden`` (not an option), ``commas``
    (False: a list option whose values are not split on commas)."""
    return {"cli": settings}


def renamed_batch_size(name: str, default: int, description: str) -> Any:
    """A batch-size field with its own name that still accepts the old ``batch_size`` key and
    ``--batch-size`` flag."""
    return Field(
        default,
        ge=1,
        validation_alias=AliasChoices(name, "batch_size"),
        description=description,
        json_schema_extra=cli(aliases=["--batch-size"]),
    )


def _parse_epsilon(value: Any) -> Any:
    if isinstance(value, str):
        text = value.strip().lower()
        if text in ("inf", "infinity", "∞", "none"):
            return math.inf
        try:
            return float(text)
        except ValueError:
            raise ValueError(f"{value!r} is not a number or inf") from None
    return value


_DEVICE = re.compile(r"auto|cpu|mps|cuda(:\d+)?")


def check_device(value: str) -> str:
    """``auto``, ``cpu``, ``mps``, ``cuda`` or ``cuda:N``; CUDA only where this build sees a GPU."""
    if not _DEVICE.fullmatch(value):
        raise ValueError(f"{value!r} is not a device; use auto, cpu, cuda, cuda:N or mps")
    if value.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise ValueError(f"{value!r} requested but this torch build sees no CUDA GPU; use --device cpu")
        index = int(value.partition(":")[2] or 0)
        if index >= torch.cuda.device_count():
            raise ValueError(f"{value!r}: only {torch.cuda.device_count()} CUDA device(s) visible")
    return value


Accountant = Literal["rdp", "prv"]
Device = Annotated[
    str,
    AfterValidator(check_device),
    Field(description="Device: auto (a GPU if visible), cpu, cuda, cuda:N or mps."),
]
# ε > 0; "inf" (or ∞) means no privacy and no noise.
Epsilon = Annotated[float, BeforeValidator(_parse_epsilon), Field(gt=0)]
Seed = Annotated[int, Field(ge=0, description="Random seed.")]
# DP runs: None (default) draws sampling and noise from the OS's secure randomness; a given seed
# makes the run reproducible and is recorded as an assumption of the guarantee.
SecretSeed = Annotated[
    int | None,
    Field(
        ge=0,
        description="Seed for a bit-reproducible run. Default: DP sampling and noise come from the OS's "
        "secure randomness; a given seed is recorded in the guarantee as an assumption (an adversary "
        "who knows it can replay the noise).",
    ),
]
Limit = Annotated[int | None, Field(ge=1, description="Use only the first N items (quick runs).")]
PrivacyUnitName = Annotated[
    Literal["query", "user"],
    Field(
        description="What the guarantee protects: one query with all its pairs, or one user with all "
        "of their queries (needs user ids: metadata.user_id in queries.jsonl, or users.tsv)."
    ),
]
# Each user's rows are weighted 1/k, so K does not change the noise; it bounds a sampled user's
# share of a batch (compute) and is the bound group privacy needs to relate the two units.
DEFAULT_MAX_QUERIES_PER_USER = 8
MaxQueriesPerUser = Annotated[
    int,
    Field(
        ge=1,
        description="--privacy-unit user: keep at most K queries of each user, chosen with secret "
        "randomness (a user's weighted rows contribute at most C together whatever K is).",
    ),
]
Probability = Annotated[float, Field(gt=0, le=1)]
PublicCorpus = Annotated[
    str, Field(description="Public documents: a BEIR directory or source name (embedded, beir:NAME).")
]
DocumentList = Annotated[
    Path | None,
    Field(description="A public list of document ids (one per line) to write queries for; default: all."),
]


def refuse_limit_with_dp(limit: int | None, private: bool) -> None:
    """``--limit`` keeps a prefix of the private data chosen after looking at it, with n (and δ)
    taken from the prefix: not a selection a DP guarantee covers."""
    if limit is not None and private:
        raise ValueError(
            "--limit cannot be used with DP: it keeps a prefix of the private data and takes n and δ "
            "from it; use a DP-sampled subset or a separate dataset"
        )


class StageConfig(BaseModel):
    """Fields every stage has."""

    model_config = ConfigDict(extra="forbid", ser_json_inf_nan="strings")

    out: Path = Field(description="Artifact directory to write.")
    force: bool = Field(
        False, description="Redo the stage even if an up-to-date artifact exists (replaces only artifacts)."
    )
    # Only stages that checkpoint offer --resume (they redeclare it as ``Resume``).
    resume: bool = Field(False, json_schema_extra=cli(hidden=True))


Resume = Annotated[bool, Field(description="Continue an interrupted run from its last checkpoint.")]


class FinetuneConfig(StageConfig):
    """``synthq finetune-lm``: (document → query) fine-tuning with DP-SGD/DP-Adam."""

    data: str = Field(
        description="Private pairs: a BEIR directory or source name (embedded, msmarco, beir:NAME)."
    )
    split: str = Field("train", description="qrels split whose (query, document) pairs are trained on.")
    model: str = Field(description="Hub id (google-t5/t5-base), local directory, or alias (smollm2-135m).")
    epsilon: Epsilon = Field(8.0, description="Target ε; inf trains without noise or clipping.")
    delta: float | None = Field(None, gt=0, lt=1, description="δ; default 1/(2n).")
    clip_norm: float = Field(0.1, gt=0, description="Per-example clipping norm C (paper: 0.1).")
    accountant: Accountant = Field("rdp", description="Privacy accountant: rdp (Opacus RDP) or prv.")
    optimizer: Literal["adam", "adafactor", "sgd"] = Field(
        "adam", description="adam (DP-Adam), adafactor or sgd."
    )
    lr: float = Field(1e-3, gt=0, description="Learning rate (paper: 1e-3).")
    weight_decay: float = Field(0.0, ge=0, description="Decoupled weight decay.")
    epochs: float = Field(3.0, gt=0, description="Epochs (paper: 30).")
    max_steps: int | None = Field(
        None, ge=1, description="Cap on logical steps (overrides epochs when smaller)."
    )
    batch_size: int = Field(
        1024,
        ge=1,
        description="Expected batch, in queries; Poisson rate q = batch / training queries (paper: 1024).",
    )
    physical_batch_size: int = Field(8, ge=1, description="Micro-batch that fits in memory.")
    max_source_length: int = Field(384, ge=1, description="Document tokens kept.")
    max_target_length: int = Field(128, ge=1, description="Query tokens kept.")
    grad_sample_mode: Literal["auto", "ghost", "hooks", "vmap"] = Field(
        "auto",
        description="Per-example clipping: ghost (Opacus ghost norms, tied weights exact), hooks "
        "(Opacus per-example gradients), vmap (torch.func, any architecture); auto = ghost where possible.",
    )
    lora_rank: int = Field(0, ge=0, description="0 = full fine-tuning; >0 trains LoRA adapters of this rank.")
    lora_alpha: float | None = Field(None, gt=0, description="LoRA alpha (default 2 × rank).")
    checkpoint_every: int = Field(50, ge=1, description="Save a resumable checkpoint every N logical steps.")
    privacy_unit: PrivacyUnitName = "query"
    max_queries_per_user: MaxQueriesPerUser = DEFAULT_MAX_QUERIES_PER_USER
    seed: SecretSeed = None
    device: Device = "auto"
    limit: Limit = None
    resume: Resume = False

    @model_validator(mode="after")
    def _limit_without_dp(self) -> FinetuneConfig:
        refuse_limit_with_dp(self.limit, math.isfinite(self.epsilon))
        return self


class GenerateConfig(StageConfig):
    """``synthq generate``: nucleus-sample synthetic queries for public documents."""

    generator: Path = Field(description="A finetune-lm artifact.")
    corpus: PublicCorpus = "embedded"
    documents: DocumentList = None
    split: str | None = Field(
        None,
        description="Generate only for the documents judged in this qrels split. Which documents a "
        "private split judges can itself be private: this is recorded as the assumption that the "
        "judged-document set is public (the paper's MS MARCO setting). Default: the whole corpus.",
    )
    num_queries: int = Field(1, ge=1, description="Queries per document.")
    top_p: Probability = Field(0.8, description="Nucleus sampling mass, in (0, 1] (paper: 0.8).")
    temperature: float = Field(1.0, gt=0, description="Sampling temperature (> 0).")
    max_new_tokens: int = Field(32, ge=1, description="Longest query, in tokens.")
    generation_batch_size: int = renamed_batch_size(
        "generation_batch_size", 16, "Documents per generation batch."
    )
    max_resample: int = Field(3, ge=0, description="Retries for empty or degenerate queries.")
    shard: str | None = Field(None, description="i/n: generate only the i-th of n document shards.")
    seed: Seed = 0
    device: Device = "auto"
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

    data: str = Field(
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
    model: str = Field(
        "smollm2-135m",
        description="Public generator that writes and varies queries: alias, local directory or hub id "
        "(assumed public; a synthq artifact brings its own guarantee).",
    )
    embedder: str = Field(
        "minilm-l6", description="Public sentence encoder of the votes' nearest-neighbour search."
    )
    epsilon: Epsilon = Field(8.0, description="Target ε over all iterations.")
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
    privacy_unit: PrivacyUnitName = "query"
    max_queries_per_user: MaxQueriesPerUser = DEFAULT_MAX_QUERIES_PER_USER
    resume: Resume = False
    generation_seed: Seed = 0
    seed: SecretSeed = None
    device: Device = "auto"

    @model_validator(mode="after")
    def _keep_at_most_the_population(self) -> EvolveConfig:
        if self.queries_per_document > self.population:
            raise ValueError(
                f"--queries-per-document {self.queries_per_document} is more than the --population "
                f"{self.population} each document has"
            )
        return self


class SimilarityConfig(StageConfig):
    """``synthq similarity``: BLEU, MAUVE and friends between synthetic and original queries."""

    synthetic: Path = Field(description="A generate artifact.")
    original: str = Field(description="The original pairs (BEIR directory or source name).")
    split: str = Field("train", description="qrels split of the original queries.")
    encoder: str = Field("minilm-l6", description="Encoder whose features MAUVE compares.")
    mauve_seeds: int = Field(5, ge=1, description="k-means seeds to average MAUVE over.")
    mauve_scaling_factor: float = Field(
        5.0, gt=0, description="MAUVE's c in exp(-c KL) (mauve's default: 5)."
    )
    min_samples: int = Field(50, ge=2, description="Refuse MAUVE below this many queries per side.")
    seed: Seed = 0
    device: Device = "auto"


FilterMethod = Literal["consistency", "likelihood", "none"]


class FilterConfig(StageConfig):
    """``synthq filter``: keep the better synthetic queries and hold documents out for tuning
    (post-processing of the generator: no ε)."""

    synthetic: Path = Field(description="A generate (or filter) artifact.")
    method: FilterMethod = Field(
        "consistency",
        description="consistency: keep a query when a retriever finds its own document in the top K; "
        "likelihood: keep each document's most likely queries under the set's generator; none: keep all.",
    )
    retriever: str = Field(
        "minilm-l6",
        description="consistency: the retriever (encoder alias, directory, hub id, a train-retriever "
        "artifact, or bm25).",
    )
    top_k: int = Field(3, ge=1, description="consistency: how high the query's own document must rank.")
    keep: int = Field(1, ge=1, description="likelihood: queries kept per document.")
    holdout_documents: int = Field(
        0, ge=0, description="Move the queries of N documents (public hash of their ids) to a dev split."
    )
    encode_batch_size: int = Field(64, ge=1, description="consistency: texts per encoding batch.")
    scoring_batch_size: int = Field(16, ge=1, description="likelihood: queries per scoring batch.")
    device: Device = "auto"


DPMode = Literal["sample", "batch", "group", "logit"]


class TrainRetrieverConfig(StageConfig):
    """``synthq train-retriever``: dual encoder with in-batch softmax, optionally direct DP."""

    data: str = Field(description="A synthetic artifact, a BEIR directory or a source name.")
    split: str = Field("train", description="qrels split of the training pairs.")
    encoder: str = Field("minilm-l6", description="Shared encoder: alias, local directory or hub id.")
    dp: DPMode | None = Field(None, description="Direct DP on the private pairs (baselines); default: none.")
    epsilon: Epsilon = Field(8.0, description="Target ε for --dp.")
    delta: float | None = Field(None, gt=0, lt=1, description="δ for --dp (default 1/(2n)).")
    clip_norm: float = Field(
        1.0,
        gt=0,
        description="Clipping norm C for --dp (the paper uses 0.1 with T5-Base; 1.0 here by default).",
    )
    accountant: Accountant = Field("rdp", description="Privacy accountant for --dp: rdp or prv.")
    batch_size: int = Field(32, ge=1, description="Batch (paper: 32); the expected batch under --dp.")
    epochs: float = Field(5.0, gt=0, description="Epochs (paper: 5).")
    max_steps: int | None = Field(None, ge=1, description="Cap on steps.")
    lr: float = Field(2e-5, gt=0, description="Learning rate.")
    warmup_ratio: float = Field(0.1, ge=0, lt=1, description="Fraction of steps with linear warm-up.")
    temperature: float = Field(
        0.05, gt=0, description="Softmax temperature on cosine similarity (scale = 1/T)."
    )
    max_query_length: int = Field(128, ge=1, description="Query tokens kept.")
    max_doc_length: int = Field(384, ge=1, description="Document tokens kept.")
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
    privacy_unit: PrivacyUnitName = "query"
    max_queries_per_user: MaxQueriesPerUser = DEFAULT_MAX_QUERIES_PER_USER
    seed: SecretSeed = None
    device: Device = "auto"
    limit: Limit = None

    @model_validator(mode="after")
    def _limit_without_dp(self) -> TrainRetrieverConfig:
        refuse_limit_with_dp(self.limit, self.dp is not None)
        if self.dp is None and "epsilon" in self.model_fields_set and math.isfinite(self.epsilon):
            raise ValueError("--epsilon needs --dp: without it the retriever trains non-privately (ε = ∞)")
        if self.privacy_unit == "user" and self.dp is None:
            raise ValueError("--privacy-unit user needs --dp: training without DP protects no unit (ε = ∞)")
        return self


class EvalConfig(StageConfig):
    """``synthq eval``: retrieval metrics on embedded, MS MARCO dev and BEIR datasets."""

    retrievers: list[str] = Field(
        default_factory=list,
        description="A train-retriever artifact (repeatable).",
        json_schema_extra=cli(flag="--retriever", commas=False),
    )
    datasets: list[str] = Field(
        default_factory=lambda: ["embedded"],
        description="embedded, msmarco (dev split), beir:NAME, or BEIR directories (comma-separated).",
    )
    split: str | None = Field(None, description="Split to evaluate (default: test; msmarco: dev).")
    bm25: bool = Field(True, description="Add the BM25 reference row (ε = 0, public).")
    untrained: list[str] = Field(
        default_factory=list,
        description="Encoder evaluated as-is, e.g. minilm-l6 (repeatable; a reference row, ε = 0).",
        json_schema_extra=cli(commas=False),
    )
    encode_batch_size: int = renamed_batch_size("encode_batch_size", 64, "Texts per encoding batch.")
    top_k: int = Field(100, ge=100, description="Documents retrieved per query (≥ 100 for NDCG@100).")
    search_chunk_size: int = Field(50_000, ge=1, description="Documents scored per matrix product.")
    faiss: bool = Field(False, description="Search with FAISS IndexFlatIP instead of exact torch chunks.")
    select_on: str | None = Field(
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
        gt=0,
        description="Choose on a private dev split with report-noisy-max, spending this ε (pure DP, "
        "split over the methods that have more than one configuration) on the dev queries.",
    )
    device: Device = "auto"

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

    evals: list[str] = Field(
        min_length=1, description="Evaluation artifacts to merge.", json_schema_extra=cli(argument=True)
    )
    title: str = Field("synthq results", description="Title of the report.")
    paper: list[dict[str, Any]] = Field(
        default_factory=list,
        description="The paper's numbers beside ours.",
        json_schema_extra=cli(hidden=True),  # the command line reads them from --paper FILE
    )
    similarity: list[str] = Field(
        default_factory=list, description="Similarity artifacts (BLEU, MAUVE) to include (repeatable)."
    )


CANARY_SHAPES = ("random-query", "real-document", "random-document")


class CanaryAuditConfig(StageConfig):
    """``synthq canary-audit``: empirical ε lower bounds for the generator and the retriever.

    ``one-run``: ``canaries`` secrets each included once with probability ½ (Steinke et al., 2023);
    ``exposure``: Table 7's rank / exposure / leakage with canaries repeated ``repetitions`` times;
    ``both`` shares one generator per ε between the two."""

    data: str = Field(description="Private pairs: a BEIR directory or source name.")
    model: str = Field(description="Generator to fine-tune: hub id, local directory or alias.")
    method: Literal["one-run", "exposure", "both"] = Field(
        "one-run",
        description="one-run (canaries included once by a secret coin), exposure (Table 7) or both.",
    )
    epsilons: list[Epsilon] = Field(
        default_factory=lambda: [math.inf, 8.0], description="ε values (comma-separated); inf = non-private."
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
    privacy_unit: PrivacyUnitName = "query"
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
    top_p: Probability = Field(0.8, description="Nucleus mass of the leak test's sampling.")
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

    @model_validator(mode="after")
    def _finetune_options_are_valid(self) -> CanaryAuditConfig:
        fixed = {"data", "model", "out", "epsilon", "seed", "split", "resume", "privacy_unit",
                 "max_queries_per_user"}  # fmt: skip
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
            FinetuneConfig(data=self.data, model=self.model, out=self.out, **self.finetune)
        except ValidationError as error:
            raise ValueError(f"--finetune {validation_message(error)}") from None
        return self


def validation_message(error: ValidationError, flags: dict[str, str] | None = None) -> str:
    """One line for a pydantic error: ``option: message`` per problem, ``; ``-joined.

    ``flags`` maps field names to what the user typed them as (``--clip-norm``); by default a
    field is named as in YAML."""
    problems = []
    for item in error.errors():
        loc = [str(part) for part in item["loc"]]
        name = (flags or {}).get(loc[0], loc[0]) if loc else "value"
        message = item["msg"].removeprefix("Value error, ").replace("Input should be", "must be")
        message = {"extra_forbidden": "unknown option", "missing": "required"}.get(item["type"], message)
        if not loc:  # a check of the whole config names its options itself
            problems.append(message)
            continue
        problems.append(f"{name}{''.join(f'[{part}]' for part in loc[1:])}: {message}")
    return "; ".join(problems)


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
