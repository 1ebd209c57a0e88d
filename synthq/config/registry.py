"""The one registry of stages: name -> module exposing ``run(config)``, config class, and the
one-line summary its command shows. Pipelines find stages here, manifests take their stage names
from here, and the command line registers one command per entry, in this order
(:mod:`synthq.cli.stage_commands`).

A stage's module is imported only when the stage runs, so that ``synthq --help`` and pipeline
planning never load torch-heavy code; the config classes (pydantic only) are imported here.
A new stage touches the places docs/development.md#new-stage lists.
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
    summary: str = ""  # the command's help line (``synthq --help``, ``synthq STAGE --help``)

    def config_type(self) -> type:
        return self.config_class

    def run_function(self) -> Callable:
        return importlib.import_module(self.module).run


STAGES: dict[str, StageEntry] = {  # in the order ``synthq --help`` lists them
    "finetune-lm": StageEntry(
        "synthq.stages.finetune_lm", FinetuneConfig,
        "Fine-tune a query generator (document -> query) with DP-Adam to a target ε.",
    ),
    "generate": StageEntry(
        "synthq.stages.generate", GenerateConfig,
        "Nucleus-sample synthetic queries for public documents (inherits the generator's ε).",
    ),
    "filter": StageEntry(
        "synthq.stages.filter", FilterConfig,
        "Keep the better synthetic queries (round-trip consistency, likelihood) and hold documents "
        "out for tuning: post-processing, no ε.",
    ),
    "evolve": StageEntry(
        "synthq.stages.evolve.recipe", EvolveConfig,
        "Private Evolution: a public model writes queries, the private pairs vote with DP noise "
        "(no fine-tuning).",
    ),
    "train-retriever": StageEntry(
        "synthq.stages.train_retriever", TrainRetrieverConfig,
        "Train a dual encoder with in-batch softmax (non-private, or --dp baselines).",
    ),
    "eval": StageEntry(
        "synthq.stages.evaluate", EvalConfig,
        "Evaluate retrievers (NDCG@10, Recall@10, ...) with ε beside every number.",
    ),
    "report": StageEntry(
        "synthq.stages.report", ReportConfig,
        "Merge evaluation artifacts into one README with tables and the privacy-utility plot.",
    ),
    "similarity": StageEntry(
        "synthq.stages.similarity", SimilarityConfig,
        "BLEU and MAUVE of synthetic queries against the originals (Table 6).",
    ),
    "canary-audit": StageEntry(
        "synthq.stages.canary_audit", CanaryAuditConfig,
        "Insert canaries, fine-tune at each ε, and measure rank, exposure, leakage and an ε lower bound.",
    ),
}  # fmt: skip


# Stages whose artifact is a synthetic set (BEIR layout), which every reader of synthetic data takes.
SYNTHETIC_STAGES = ("generate", "evolve", "filter")


def stage_entry(name: str) -> StageEntry:
    if name not in STAGES:
        raise SynthqError(f"unknown stage {name!r}; known stages: {', '.join(STAGES)}")
    return STAGES[name]
