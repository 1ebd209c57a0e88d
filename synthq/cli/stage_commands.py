"""One thin command per stage: options -> config -> the stage's ``run``, then its result lines.

Each command's options come from its stage's config model (:func:`synthq.cli.options.stage_command`
registers it, in :mod:`synthq.cli.app`). The functions below hold only what is particular to the
command line (``generate --merge``, ``report --paper FILE``, extra result lines); the work is in
:mod:`synthq.stages`.
"""

from __future__ import annotations

from pathlib import Path

import typer

from synthq.cli.options import ConfigOptions, OptionError, print_result
from synthq.runtime.console import result
from synthq.runtime.errors import SynthqError


def finetune_lm_command(options: ConfigOptions):
    """Fine-tune a query generator (document -> query) with DP-Adam to a target ε."""
    from synthq.stages import finetune_lm

    return finetune_lm.run(options.config())


def _generate_result(artifact, mark: int) -> None:
    print_result(artifact, mark)
    metrics = artifact.metrics
    result(f"  {metrics['queries']} synthetic queries for {metrics['documents']} documents")


def generate_command(
    options: ConfigOptions,
    merge: list[Path] = typer.Option(
        None,
        "--merge",
        metavar="SHARD",
        help="Merge these shard artifacts into --out (repeatable, or several after one --merge).",
    ),
    shards: list[Path] = typer.Argument(
        None, metavar="SHARD", help="More shard artifacts to --merge.", show_default=False
    ),
    all_documents: bool = typer.Option(
        False, "--all", help="Generate for every corpus document (the default; overrides --split)."
    ),
):
    """Nucleus-sample synthetic queries for public documents (inherits the generator's ε)."""
    from synthq.stages import generate

    shards = list(merge or []) + list(shards or [])
    if shards:
        if not merge:
            raise OptionError(f"unexpected argument {str(shards[0])!r}: give shard artifacts after --merge")
        if "out" not in options:
            raise OptionError("--out: required")
        return generate.merge(shards, Path(options["out"]), force=bool(options.get("force")))
    if all_documents:
        options["split"] = None
    return generate.run(options.config())


def _train_retriever_result(artifact, mark: int) -> None:
    print_result(artifact, mark)
    details, dp = artifact.privacy.details, artifact.config.get("dp")
    if dp is not None and "noise_multiplier" in details:
        result(
            f"  --dp {dp}: sensitivity {details['sensitivity']:.4g}, σ {details['noise_multiplier']:.3f}, "
            f"q {details['sample_rate']:.4f}, {details['steps']} steps"
        )


def _filter_result(artifact, mark: int) -> None:
    print_result(artifact, mark)
    metrics = artifact.metrics
    result(
        f"  {metrics['method']}: kept {metrics['queries_kept']} of {metrics['queries_before']} queries "
        f"({100 * metrics['kept_fraction']:.1f} %); {metrics['dev_queries']} held out in split dev"
    )


def filter_command(options: ConfigOptions):
    """Keep the better synthetic queries (round-trip consistency, likelihood) and hold documents
    out for tuning: post-processing, no ε."""
    from synthq.stages import filter as filter_stage

    return filter_stage.run(options.config())


def evolve_command(options: ConfigOptions):
    """Private Evolution: a public model writes queries, the private pairs vote with DP noise
    (no fine-tuning)."""
    from synthq.stages import evolve

    return evolve.run(options.config())


def train_retriever_command(options: ConfigOptions):
    """Train a dual encoder with in-batch softmax (non-private, or --dp baselines)."""
    from synthq.stages import train_retriever

    return train_retriever.run(options.config())


def eval_command(options: ConfigOptions):
    """Evaluate retrievers (NDCG@10, Recall@10, ...) with ε beside every number."""
    from synthq.stages import evaluate

    return evaluate.run(options.config())


def report_command(
    options: ConfigOptions,
    paper: Path = typer.Option(
        None,
        "--paper",
        metavar="FILE",
        help="YAML with a `paper:` list of rows, e.g. pipelines/paper/table5.yaml.",
    ),
):
    """Merge evaluation artifacts into one README with tables and the privacy-utility plot."""
    from synthq.config.loading import load_yaml
    from synthq.stages import report

    if paper is not None:
        rows = load_yaml(paper).get("paper")
        if not isinstance(rows, list):
            raise SynthqError(
                f"{paper}: expected a `paper:` list of rows (row, epsilon, dataset, ndcg@10, ...)"
            )
        options["paper"] = rows
    return report.run(options.config())


def similarity_command(options: ConfigOptions):
    """BLEU and MAUVE of synthetic queries against the originals (Table 6)."""
    from synthq.stages import similarity

    return similarity.run(options.config())


def canary_audit_command(options: ConfigOptions):
    """Insert canaries, fine-tune at each ε, and measure rank, exposure, leakage and an ε lower bound."""
    from synthq.stages import canary_audit

    return canary_audit.run(options.config())


# (stage, command, result lines), in the order ``synthq --help`` lists them.
STAGE_COMMANDS = (
    ("finetune-lm", finetune_lm_command, print_result),
    ("generate", generate_command, _generate_result),
    ("filter", filter_command, _filter_result),
    ("evolve", evolve_command, _generate_result),
    ("train-retriever", train_retriever_command, _train_retriever_result),
    ("eval", eval_command, print_result),
    ("report", report_command, print_result),
    ("similarity", similarity_command, print_result),
    ("canary-audit", canary_audit_command, print_result),
)
