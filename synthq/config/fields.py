"""Field types and defaults shared by the stage configs, and :class:`StageConfig`, their base.

Each default that several stages share is written here once (``DEFAULT_EPSILON``,
``DEFAULT_PRIVACY_UNIT``, ``DEFAULT_TOP_P``, ``DEFAULT_MAX_QUERIES_PER_USER``,
``DEFAULT_QUERY_TOKENS``, ``DEFAULT_DOCUMENT_TOKENS``), as is each
field type's valid range and help text (``Epsilon``, ``Device``, ``SecretSeed``, ...). Per-field
command-line settings go in ``Field(json_schema_extra=cli(...))`` (see :func:`cli`).
"""

from __future__ import annotations

import math
import os
import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, AliasChoices, BaseModel, BeforeValidator, ConfigDict, Field

# The paper's target ε: the default of every stage that spends privacy budget.
DEFAULT_EPSILON = 8.0
# The default privacy unit: one query with all of its pairs (``user`` needs user ids).
DEFAULT_PRIVACY_UNIT = "query"
# Nucleus sampling mass of the fine-tuned generator (paper: 0.8): generate's default, the leak
# test's, and the one saved with a fine-tuned generator.
DEFAULT_TOP_P = 0.8
# Each user's rows are weighted 1/k, so K does not change the noise; it bounds a sampled user's
# share of a batch (compute) and is the bound group privacy needs to relate the two units.
DEFAULT_MAX_QUERIES_PER_USER = 8
# Query (target) tokens of a generator, a public constant: queries are short, and a length read off
# the private queries would be a release without noise (ε = ∞).
DEFAULT_QUERY_TOKENS = 32
# Document (source) tokens: the paper's length (T5 on TPUs), the cap of a length derived from a
# public corpus and the length used when the documents are private.
DEFAULT_DOCUMENT_TOKENS = 384
# On a CPU (2 cores) every stage costs in proportion to the document tokens. On long documents
# (data/pylibs-long, p95 696 tokens) the README guide took 7 min to fine-tune and 11 to generate at
# 128 generator tokens, and its synthetic retriever 9.5 min at 256 (GradCache): past its half hour.
# A generator reads at most CPU_DOCUMENT_TOKENS on the cpu profile, a retriever at most
# RETRIEVER_DOCUMENT_TOKENS["cpu"] on a CPU (the length MiniLM-L6 was trained at), unless told.
# docs/performance.md#first-hour-long has the guide's time and what the caps cost.
CPU_DOCUMENT_TOKENS = 128
RETRIEVER_DOCUMENT_TOKENS = {"cpu": 128, "gpu": DEFAULT_DOCUMENT_TOKENS}


def cli(**settings: Any) -> dict:
    """Command-line settings of a field, for ``Field(json_schema_extra=cli(...))``.

    Keys: ``flag`` (the option's name instead of ``--field-name``), ``aliases`` (old names that
    still work), ``argument`` (a positional argument), ``required`` (with ``argument``: the
    command line itself refuses a missing argument), ``metavar`` (the value's name in the help
    instead of ``TEXT``, ``INT``, ...), ``hidden`` (not an option), ``commas`` (False: a list
    option whose values are not split on commas)."""
    return {"cli": settings}


def renamed_batch_size(name: str, default: int | None, description: str) -> Any:
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


def batch_size_or_auto(value: Any) -> int | str:
    """An expected batch as written (config, command line): a whole number ≥ 1, or ``"auto"`` (the
    batch :func:`synthq.dp.batch_choice.choose_batch_size` picks); anything else is a ValueError."""
    if isinstance(value, str) and value.strip().lower() == "auto":
        return "auto"
    try:
        number = int(str(value).strip()) if not isinstance(value, int) else value
    except ValueError:
        number = 0
    if isinstance(value, bool) or number < 1:
        raise ValueError(f"must be a whole number ≥ 1, or auto (got {value!r})")
    return number


def check_device(value: str) -> str:
    """``auto``, ``cpu``, ``mps``, ``cuda`` or ``cuda:N``; CUDA and MPS only where this build and
    machine have them."""
    if not _DEVICE.fullmatch(value):
        raise ValueError(f"{value!r} is not a device; use auto, cpu, cuda, cuda:N or mps")
    if value.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise ValueError(f"{value!r} requested but this torch build sees no CUDA GPU; use --device cpu")
        index = int(value.partition(":")[2] or 0)
        if index >= torch.cuda.device_count():
            raise ValueError(f"{value!r}: only {torch.cuda.device_count()} CUDA device(s) visible")
    if value == "mps":
        import torch

        if not torch.backends.mps.is_available():  # the tensors' first move failed with a traceback
            raise ValueError("'mps' requested but this torch build or machine has no MPS GPU; use cpu")
    return value


Accountant = Literal["rdp", "prv"]
PrecisionName = Annotated[
    Literal["auto", "bf16", "fp32"],
    Field(
        description="Forward passes in bf16 autocast or fp32; weights, DP norms, clipping and noise stay "
        "fp32. auto = bf16 on a CUDA GPU that supports it, fp32 elsewhere (bf16 on a CPU is allowed, slow).",
    ),
]
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
Profile = Annotated[
    Literal["auto", "cpu", "gpu"],
    Field(
        description="Machine profile of the batch-size defaults: cpu (small micro-batches, peak memory "
        "≤ 4 GB), gpu, or auto (gpu when the device is a CUDA GPU). An explicit batch size always wins.",
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
MaxQueriesPerUser = Annotated[
    int,
    Field(
        ge=1,
        description="--privacy-unit user: keep at most K queries of each user, chosen with secret "
        "randomness (a user's weighted rows contribute at most C together whatever K is).",
    ),
]


def refuse_user_options_at_the_query_unit(config) -> None:
    """``--max-queries-per-user`` given at ``--privacy-unit query`` would be silently ignored
    (every query is its own unit): refused, naming the option that makes it mean something."""
    if config.privacy_unit != "user" and "max_queries_per_user" in config.model_fields_set:
        raise ValueError(
            "--max-queries-per-user applies with --privacy-unit user (at the query unit every query "
            "is its own unit); add --privacy-unit user or drop it"
        )


Probability = Annotated[float, Field(gt=0, le=1)]


def _path_text(value: Any) -> Any:
    """A path given as an ``os.PathLike`` (a :class:`pathlib.Path`, an artifact the Python API
    returned) reads as its text, as the command line gives it."""
    return os.fspath(value) if isinstance(value, os.PathLike) else value


# A field that names a directory, a file or a source name (``embedded``, a hub id): text, which a
# ``pathlib.Path`` or an artifact object may give (``train_retriever(data=syn.path)``, ``data=syn``).
PathOrName = Annotated[str, BeforeValidator(_path_text)]
# A field that is a path only: a ``pathlib.Path``, which a string or an artifact object may give.
PathField = Annotated[Path, BeforeValidator(_path_text)]
PublicCorpus = Annotated[
    PathOrName, Field(description="Public documents: a BEIR directory or source name (embedded, beir:NAME).")
]
DocumentList = Annotated[
    PathField | None,
    Field(description="A public list of document ids (one per line) to write queries for; default: all."),
]
Resume = Annotated[bool, Field(description="Continue an interrupted run from its last checkpoint.")]


def revalidated(config: StageConfig) -> StageConfig:
    """``config`` checked again by every validator of its class, as the command line checks it.

    A config object can reach a stage without its checks: ``model_copy(update=...)`` and
    ``model_construct`` validate nothing, and a failed assignment leaves the field assigned. The
    Python API and every stage whose checks decide ε (finetune-lm, train-retriever, evolve) pass
    what they are given through here first, so ``limit=8`` on a DP config is refused whichever
    way it was set. The options the caller set stay the set ones (defaults are not pinned)."""
    return type(config).model_validate(config.model_dump(exclude_unset=True))


def refuse_limit_with_dp(limit: int | None, private: bool) -> None:
    """``--limit`` keeps a prefix of the private data chosen after looking at it, with n (and δ)
    taken from the prefix: not a selection a DP guarantee covers."""
    if limit is not None and private:
        raise ValueError(
            "--limit cannot be used with DP: it keeps a prefix of the private data and takes n and δ "
            "from it; use a DP-sampled subset or a separate dataset"
        )


def _named_path(value: Any) -> Any:
    """An output path must name something: ``""`` would be the current directory."""
    value = _path_text(value)
    if isinstance(value, str) and not value.strip():
        raise ValueError("is empty; name the artifact directory to write")
    return value


class StageConfig(BaseModel):
    """Fields every stage has.

    These models are the single source of truth for every option: the command line derives its
    options from the fields (name, default, help text, allowed values and valid range; see
    :mod:`synthq.cli.options`), and pipelines build the same objects from YAML. Each field carries
    its valid range, so a bad value is refused before any work starts. Every field that changes
    what a stage computes is part of the artifact's fingerprint (see :mod:`synthq.artifacts`);
    ``out``, ``force`` and ``resume`` are not.
    """

    # validate_assignment: ``config.limit = 6`` on a DP config is refused as the command line
    # refuses ``--limit`` with DP (review round 5, flow 2); :func:`revalidated` covers the rest
    model_config = ConfigDict(extra="forbid", ser_json_inf_nan="strings", validate_assignment=True)

    out: Annotated[Path, BeforeValidator(_named_path)] = Field(description="Artifact directory to write.")
    force: bool = Field(
        False, description="Redo the stage even if an up-to-date artifact exists (replaces only artifacts)."
    )
    # Only stages that checkpoint offer --resume (they redeclare it as ``Resume``).
    resume: bool = Field(False, json_schema_extra=cli(hidden=True))
