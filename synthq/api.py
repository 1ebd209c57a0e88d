"""The stages as Python functions: the same configs as the command line, the artifact back.

Each function takes either the stage's config object or its fields as keyword arguments (the
config's field names: ``data``, ``model``, ``epsilon``, ``out``, ... — what ``synthq STAGE
--help`` lists, with dashes as underscores), runs the stage exactly as the command does (the same
checks, the same artifact, the same privacy record) and returns the
:class:`~synthq.artifacts.manifest.Artifact` it wrote (or found up to date)::

    from synthq import finetune_lm, generate, train_retriever, evaluate

    gen = finetune_lm(data="embedded", model="smollm2-135m", lora_rank=8, epsilon=8, out="runs/gen")
    syn = generate(generator=gen.path, corpus="embedded", out="runs/syn")
    ret = train_retriever(data=syn.path, encoder="minilm-l6", out="runs/ret")
    table = evaluate(retrievers=[ret.path], datasets=["embedded"], out="runs/eval")
    print(ret.privacy.describe())  # ε = 8.00 ..., inherited from the generator

A bad value raises :class:`pydantic.ValidationError` naming the field, as the command line says
it in one line; a stage's own refusal raises the :class:`~synthq.runtime.errors.SynthqError` the
command would print.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from synthq.artifacts.manifest import Artifact
from synthq.config.registry import stage_entry

__all__ = [
    "canary_audit", "evaluate", "evolve", "filter_queries", "finetune_lm", "generate", "ledger",
    "open_artifact", "report", "run_stage", "similarity", "train_retriever",
]  # fmt: skip


def run_stage(stage: str, config=None, /, **options) -> Artifact:
    """Run the stage named ``stage`` (``finetune-lm``, ``generate``, ... as ``synthq run``
    pipelines name them) with ``config`` (its config object, validated again as the command line
    validates its options; ``options`` then replace fields of it) or with ``options`` alone;
    return its artifact."""
    entry = stage_entry(stage)
    config_class = entry.config_type()
    if config is None:
        config = config_class(**options)
    elif not isinstance(config, config_class):
        raise TypeError(f"{stage} takes a {config_class.__name__}, not a {type(config).__name__}")
    else:  # validated again whatever happened to it (copied with updates, assigned to): flow 2
        config = config_class(**{**config.model_dump(exclude_unset=True), **options})
    from synthq.runtime.quiet import quiet_libraries

    with quiet_libraries():  # the command line's stderr: no library progress bars or advice
        return entry.run_function()(config)


def _stage_function(stage: str, name: str) -> Callable[..., Artifact]:
    entry = stage_entry(stage)
    config_class = entry.config_type()

    def call(config=None, /, **options) -> Artifact:
        return run_stage(stage, config, **options)

    call.__name__ = call.__qualname__ = name
    call.__doc__ = (
        f"{entry.summary}\n\nThe ``synthq {stage}`` stage: a :class:`{config_class.__module__}."
        f"{config_class.__name__}` or its fields as keyword arguments; returns the artifact."
    )
    return call


# one function per registered stage (synthq.config.registry: its summary is the docstring's first line)
finetune_lm = _stage_function("finetune-lm", "finetune_lm")
generate = _stage_function("generate", "generate")
filter_queries = _stage_function("filter", "filter_queries")  # not ``filter``: Python's builtin
evolve = _stage_function("evolve", "evolve")
train_retriever = _stage_function("train-retriever", "train_retriever")
evaluate = _stage_function("eval", "evaluate")  # not ``eval``: Python's builtin
report = _stage_function("report", "report")
similarity = _stage_function("similarity", "similarity")
canary_audit = _stage_function("canary-audit", "canary_audit")


def ledger(*paths: str | Path):
    """The privacy ledger of these artifacts (their inputs followed), per private dataset and
    unit: what ``synthq ledger`` prints, as a :class:`synthq.bookkeeping.releases.Ledger`."""
    from synthq.bookkeeping.releases import ledger as read_ledger

    if not paths:  # an empty ledger would read as "nothing read private data"
        raise TypeError("ledger() needs at least one artifact path (as synthq ledger DIR... does)")
    return read_ledger([Path(p) for p in paths])


def open_artifact(path: str | Path, stage: str | None = None) -> Artifact:
    """Open an artifact as ``synthq info`` does: the seal and every ε checked, and refused when it
    rests on a read of a split that is no longer declared public (its ε would call an ε = ∞ read
    public; :func:`synthq.bookkeeping.splits.refuse_retracted`)."""
    from synthq.bookkeeping.inputs import artifact_input

    return artifact_input(path, stage=stage)
