"""``synthq run``: a whole pipeline (plan, run, check), or the JSON Schema of pipeline files."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.markup import escape

from synthq.cli.options import Interrupted, OptionError
from synthq.runtime.console import console, result, warn


def run_command(
    pipeline: Path = typer.Argument(
        None, metavar="PIPELINE", help="A pipeline YAML, e.g. pipelines/demo.yaml.", show_default=False
    ),
    overrides: list[str] = typer.Argument(
        None, metavar="KEY=VALUE", help="key=value overrides, e.g. vars.limit=100."
    ),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the plan; run nothing."),
    force: list[str] = typer.Option(
        None, "--force", metavar="STAGE", help="Redo this stage (repeatable; all = every one)."
    ),
    check: bool = typer.Option(
        False,
        "--check",
        help="Compare the results with the pipeline's `expected:` figures; exit 1 on a regression.",
    ),
    schema: bool = typer.Option(
        False, "--schema", help="Print the JSON Schema of pipeline files (for editors) and exit."
    ),
) -> None:
    """Run a whole pipeline: every stage through its public run, skipping up-to-date artifacts."""
    from synthq.pipeline.check import check_expected
    from synthq.pipeline.inputs import missing_inputs
    from synthq.pipeline.plan import plan_pipeline
    from synthq.pipeline.progress import describe_plan, precision_warnings
    from synthq.pipeline.run import run_plan
    from synthq.pipeline.schema import pipeline_schema

    if schema:
        typer.echo(json.dumps(pipeline_schema(), indent=2, ensure_ascii=False))
        return
    if pipeline is None:
        raise OptionError("give a PIPELINE file (or --schema)")

    plan = plan_pipeline(pipeline, overrides or [], force or [])
    missing = missing_inputs(plan)
    if dry_run:  # the plan is the command's result: on stdout, so `--dry-run > plan.txt` keeps it
        for line in describe_plan(plan):
            result(line)
        for line in missing:
            result(escape(f"missing input: {line}"))
        for line in precision_warnings(plan):  # on stderr, as the stage itself would warn
            warn(escape(line))
        return
    for line in describe_plan(plan):
        console.print(line)
    if missing:  # refused now rather than when that stage is reached, perhaps hours in
        more = f" (and {len(missing) - 1} more; see --dry-run)" if len(missing) > 1 else ""
        raise OptionError(f"pipeline {plan.name!r}: {missing[0]}{more}; nothing was run")
    try:
        run_plan(plan)
    except KeyboardInterrupt:
        raise Interrupted(
            "interrupted; rerun the same command to continue (finished stages are kept)"
        ) from None
    if check:
        lines, failed = check_expected(plan)
        for line in lines:
            result(line)
        if failed:
            raise typer.Exit(1)
        result(f"check passed: {len(lines)} expected figure(s) within tolerance")
