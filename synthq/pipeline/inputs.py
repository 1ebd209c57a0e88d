"""A pipeline's inputs that are not there: every local path a stage reads must exist now or be
written by an earlier stage of the same pipeline.

Paths in a pipeline file are read against the current directory, as on the command line (the
shipped pipelines are run from the repository root: ``out: runs/demo``, ``data: embedded``).
``--dry-run`` lists the missing ones and a real run refuses to start with one, instead of
failing at that stage hours later. Source names (``embedded``, ``msmarco``, ``beir:NAME``,
``irds:ID``), model aliases, hub ids and ``bm25`` are not paths and are not checked here.
"""

from __future__ import annotations

import os
from pathlib import Path

from synthq.pipeline.plan import Plan

# Fields whose value is always a local path (an artifact or a file).
_PATH_FIELDS = ("synthetic", "documents", "retrievers", "evals", "similarity", "select_on")
# Fields holding a dataset: a BEIR directory or a source name.
_DATA_FIELDS = ("data", "corpus", "original", "datasets")
# Fields holding a model: an alias, a hub id, a directory or an artifact (``generate --generator``
# takes a finetune-lm artifact or a public model: the ε = 0 control).
_MODEL_FIELDS = ("generator", "model", "encoder", "embedder", "untrained", "retriever")


def _named_source(spec: str) -> bool:
    from synthq.data.sources import BEIR_DATASETS, IRDS_PREFIX, SHIPPED_SOURCES

    first = spec.split("/", 1)[0]
    return (
        spec in (*SHIPPED_SOURCES, "msmarco")
        or spec.startswith(("beir:", IRDS_PREFIX))
        or first in BEIR_DATASETS
    )


def _explicitly_local(spec: str) -> bool:
    """A model spec that can only be a path (``org/name`` could be a hub id)."""
    return spec.startswith(("/", "./", "../", "~")) or spec.count("/") >= 2


def _values(value) -> list[str]:
    if value is None:
        return []
    if isinstance(value, list | tuple):
        return [str(v) for v in value if v is not None]
    return [str(value)]


def _written_by(path: Path, outputs: list[Path]) -> bool:
    resolved = path.expanduser().resolve()
    return any(resolved == out or out in resolved.parents for out in outputs)


def missing_inputs(plan: Plan) -> list[str]:
    """One line per input that does not exist and that no earlier stage writes."""
    from synthq.models.resolve import aliases

    known_models = set(aliases()) | {"bm25"}
    lines: list[str] = []
    outputs: list[Path] = []
    for stage in plan.stages:
        fields = type(stage.config).model_fields
        for name in (*_PATH_FIELDS, *_DATA_FIELDS, *_MODEL_FIELDS):
            if name not in fields or (name == "select_on" and stage.stage != "eval"):
                continue
            for spec in _values(getattr(stage.config, name)):
                if name in _DATA_FIELDS and _named_source(spec):
                    continue
                if name in _MODEL_FIELDS and (spec in known_models or not _explicitly_local(spec)):
                    continue
                path = Path(spec)
                if path.expanduser().exists() or _written_by(path, outputs):
                    continue
                where = "" if path.is_absolute() else f" (read from {os.getcwd()})"
                lines.append(
                    f"stage {stage.name!r} ({stage.stage}): {name} {spec} does not exist{where} "
                    "and no earlier stage writes it"
                )
        outputs.append(stage.out.expanduser().resolve())
    return lines
