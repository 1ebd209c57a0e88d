"""The command of every stage: options -> config -> the stage's ``run``, then its result lines.

A stage is registered once, in :data:`synthq.config.registry.STAGES` (module, config, summary):
its command's options come from the config model and its help from the summary
(:func:`synthq.cli.options.stage_command`). Most commands are :func:`plain_command`; only what is
particular to the command line is written here: own options (``generate --merge``, ``report
--paper FILE``: :data:`OWN_COMMANDS`) and lines after the result line (:data:`RESULT_LINES`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import typer

from synthq.cli.options import ConfigOptions, OptionError, print_result
from synthq.config.registry import STAGES, stage_entry
from synthq.runtime.console import result
from synthq.runtime.errors import SynthqError


def plain_command(stage: str) -> Callable:
    """The command of a stage with nothing particular to the command line."""

    def command(options: ConfigOptions):
        config = options.config()  # a bad option is refused before the stage imports torch
        return stage_entry(stage).run_function()(config)

    command.__name__ = command.__qualname__ = f"{stage.replace('-', '_')}_command"
    return command


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
    shards = list(merge or []) + list(shards or [])
    if shards:
        if not merge:
            raise OptionError(f"unexpected argument {str(shards[0])!r}: give shard artifacts after --merge")
        if "out" not in options:
            raise OptionError("--out: required")
        from synthq.stages import generate

        return generate.merge(shards, Path(options["out"]), force=bool(options.get("force")))
    if all_documents:
        options["split"] = None
    config = options.config()  # a bad option is refused before the stage imports torch
    from synthq.stages import generate

    return generate.run(config)


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


def report_command(
    options: ConfigOptions,
    paper: Path = typer.Option(
        None,
        "--paper",
        metavar="FILE",
        help="YAML with a `paper:` list of rows, e.g. pipelines/paper/table5.yaml.",
    ),
):
    from synthq.config.loading import load_yaml

    if paper is not None:
        rows = load_yaml(paper).get("paper")
        if not isinstance(rows, list):
            raise SynthqError(
                f"{paper}: expected a `paper:` list of rows (row, epsilon, dataset, ndcg@10, ...)"
            )
        options["paper"] = rows
    config = options.config()
    from synthq.stages import report

    return report.run(config)


# What a command adds to its stage: own options (its help line is the registry's summary)...
OWN_COMMANDS: dict[str, Callable] = {"generate": generate_command, "report": report_command}
# ...and lines after the result line.
RESULT_LINES: dict[str, Callable] = {
    "generate": _generate_result,
    "evolve": _generate_result,
    "filter": _filter_result,
    "train-retriever": _train_retriever_result,
}


def stage_commands() -> Iterator[tuple[str, Callable, Callable]]:
    """(stage, command, result lines) for every registered stage, in the registry's order."""
    for stage in STAGES:
        yield stage, OWN_COMMANDS.get(stage) or plain_command(stage), RESULT_LINES.get(stage, print_result)
