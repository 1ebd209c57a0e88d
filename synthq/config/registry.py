"""Stage name -> (module exposing ``run(config)``, config class): how pipelines find stages.

A stage's module is imported only when the stage runs, so that ``synthq --help`` and pipeline
planning never load torch-heavy code; the config classes (pydantic only) are imported here.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass

from synthq.config.audit import CanaryAuditConfig
from synthq.config.evaluation import EvalConfig, ReportConfig, SimilarityConfig
from synthq.config.generator import EvolveConfig, FilterConfig, FinetuneConfig, GenerateConfig
from synthq.config.retriever import TrainRetrieverConfig
from synthq.runtime.errors import SynthqError


@dataclass(frozen=True)
class StageEntry:
    module: str
    config_class: type

    def config_type(self) -> type:
        return self.config_class

    def run_function(self) -> Callable:
        return importlib.import_module(self.module).run


STAGES: dict[str, StageEntry] = {
    "finetune-lm": StageEntry("synthq.stages.finetune_lm", FinetuneConfig),
    "generate": StageEntry("synthq.stages.generate", GenerateConfig),
    "filter": StageEntry("synthq.stages.filter", FilterConfig),
    "evolve": StageEntry("synthq.stages.evolve", EvolveConfig),
    "similarity": StageEntry("synthq.stages.similarity", SimilarityConfig),
    "train-retriever": StageEntry("synthq.stages.train_retriever", TrainRetrieverConfig),
    "eval": StageEntry("synthq.stages.evaluate", EvalConfig),
    "report": StageEntry("synthq.stages.report", ReportConfig),
    "canary-audit": StageEntry("synthq.stages.canary_audit", CanaryAuditConfig),
}


# Stages whose artifact is a synthetic set (BEIR layout), which every reader of synthetic data takes.
SYNTHETIC_STAGES = ("generate", "evolve", "filter")


def stage_entry(name: str) -> StageEntry:
    if name not in STAGES:
        raise SynthqError(f"unknown stage {name!r}; known stages: {', '.join(STAGES)}")
    return STAGES[name]
