"""The ``synthq`` command line: one thin command per stage (options -> config -> stage.run).

A stage command's options are derived from its config model (:mod:`synthq.cli.options`): each
option's name, help, default, choices and valid range are written once, in :mod:`synthq.config`.
The functions below hold only what is particular to the command line (``generate --merge``,
``report --paper FILE``, extra result lines); the work is in :mod:`synthq.stages`.

Exit status: 0 success, 1 a file-system problem (permission, full disk), 2 a usage or input
error (one line, no traceback), 130 interrupted.
"""

from __future__ import annotations

import errno
import json
import os
import sys
import warnings
from pathlib import Path

import typer
from rich.markup import escape
from rich.table import Table

from synthq import __version__
from synthq.artifacts import open_artifact
from synthq.cli.options import (
    Interrupted,
    OptionError,
    StageOptions,
    plain_arguments,
    print_result,
    stage_command,
)
from synthq.privacy.guarantee import Guarantee, format_epsilon
from synthq.runtime.console import console, result, set_verbosity, verbosity, warn
from synthq.runtime.errors import SynthqError

plain_arguments()
app = typer.Typer(
    name="synthq",
    help=(
        "Private synthetic-query retrieval: fine-tune a query generator with differential "
        "privacy, generate synthetic queries, train and evaluate dual encoders, audit leakage."
    ),
    no_args_is_help=True,
    rich_markup_mode=None,
    add_completion=False,
    pretty_exceptions_enable=False,
)
data_app = typer.Typer(help="Inspect datasets (BEIR directories and named sources).", no_args_is_help=True)
app.add_typer(data_app, name="data")


def _version(value: bool) -> None:
    if value:
        typer.echo(f"synthq {__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Print more detail."),
    quiet: bool = typer.Option(
        False,
        "--quiet",
        "-q",
        help="Hide progress and info lines (results, warnings and errors still print).",
    ),
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Show the version."
    ),
    threads: int | None = typer.Option(
        None,
        "--threads",
        min=1,
        help="Torch CPU threads per process (default: this process' share of the free cores; "
        "same as SYNTHQ_THREADS).",
    ),
) -> None:
    set_verbosity(0 if quiet else 2 if verbose else 1)
    if threads is not None:  # read by synthq.runtime.threads when a stage sets up its device
        os.environ["SYNTHQ_THREADS"] = str(threads)
    if not verbose:
        _quiet_libraries()


def _quiet_libraries() -> None:
    """No progress bars or advice from Hugging Face libraries: synthq reports progress itself."""
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    # Bars that libraries draw with tqdm directly (transformers' GGUF conversion) would write
    # carriage returns into every non-terminal log; tqdm reads this when it is first imported.
    os.environ.setdefault("TQDM_DISABLE", "1")
    if "transformers" in sys.modules:  # already imported (tests, notebooks): switch it off there
        from transformers.utils import logging as transformers_logging

        transformers_logging.disable_progress_bar()
        transformers_logging.set_verbosity_error()


def _lineage(inputs: list[dict], depth: int = 0, max_depth: int = 6) -> list[str]:
    lines = []
    for record in inputs:
        label = record.get("stage") or record.get("kind", "?")
        lines.append(f"{'  ' * depth}- {label}: {record['path']} (sha256 {record['sha256'][:12]})")
        path = Path(record["path"])
        if record.get("kind") == "artifact" and depth < max_depth and (path / "manifest.json").is_file():
            try:
                parent = open_artifact(path, verify=False)
            except SynthqError:
                continue
            lines[-1] += f"  {parent.privacy.describe()}"
            lines.extend(_lineage(parent.inputs, depth + 1, max_depth))
    return lines


@app.command("info")
def info_command(
    path: Path = typer.Argument(..., metavar="DIR", help="An artifact directory written by a synthq stage."),
    as_json: bool = typer.Option(False, "--json", help="Print the manifest as JSON."),
) -> None:
    """Show an artifact: stage, privacy guarantee, input lineage, metrics and timings."""
    artifact = open_artifact(path)
    if as_json:
        typer.echo(json.dumps(artifact.manifest, indent=2))
        return
    guarantee = artifact.privacy
    result(f"[bold]{artifact.stage}[/] artifact at {artifact.path}")
    if artifact.verified:
        result("seal: verified with this installation's key; ε recomputed from its releases")
    else:
        result(f"[bold yellow]seal NOT verifiable[/]: {artifact.unverified_assumption}")
    result(f"created {artifact.manifest.get('created')} by synthq {artifact.manifest.get('synthq')}")
    result(
        f"[bold]privacy[/]: ε = {format_epsilon(guarantee.epsilon)}, δ = {guarantee.delta:.3g}, "
        f"{guarantee.per_unit}, mechanism = {guarantee.mechanism}, accountant = {guarantee.accountant}"
    )
    if guarantee.note:
        result(f"  {guarantee.note}")
    for assumption in guarantee.assumptions:
        result(f"  [yellow]assuming[/]: {assumption}")
    for key, value in guarantee.details.items():
        result(f"  {key}: {value}")
    for release in artifact.releases:
        own = Guarantee.from_manifest(release["guarantee"])
        units = release.get("units") or {}
        result(
            f"  release {release['id'][:8]} by {release['stage']} ({release['path']}) of "
            f"{release['data'].get('name')}: {own.describe()}, {units.get('count', '?')} "
            f"{units.get('kind', own.unit)} units",
            markup=False,
        )
    private = artifact.manifest.get("private_files", {})
    if private:
        result(
            f"[bold red]private diagnostics (ε = ∞)[/]: {', '.join(private)} — "
            f"{artifact.manifest.get('private_files_note', '')}"
        )
    if artifact.inputs:
        result("[bold]inputs[/]:")
        for line in _lineage(artifact.inputs):
            result(f"  {line}")
    for title, values in (("metrics", artifact.metrics), ("timings", artifact.timings)):
        if values:
            result(f"[bold]{title}[/]:")
            for key, value in values.items():
                shown = json.dumps(value) if isinstance(value, dict | list) else value
                result(f"  {key}: {shown}")


@app.command("ledger")
def ledger_command(
    paths: list[Path] = typer.Argument(
        ..., metavar="DIR", help="Artifact directories (their inputs are followed too)."
    ),
) -> None:
    """The privacy cost per private dataset of a set of artifacts: which are DP releases, what
    each assumed, which read private data without DP (basic composition over the releases)."""
    from synthq.privacy.ledger import ledger_lines

    for line in ledger_lines(paths):
        result(line, markup=False)


@app.command("key")
def key_command(
    export: Path | None = typer.Option(None, "--export", help="Copy the key to this new file (mode 0600)."),
    import_from: Path | None = typer.Option(None, "--import", help="Install a key a colleague exported."),
    replace: bool = typer.Option(False, "--replace", help="With --import: replace a different key."),
) -> None:
    """The owner's secret key: where it is, its public id, export and import for a team.

    It keys the identifiers of private datasets (nobody without it can test a candidate dataset
    against an artifact) and seals every manifest (an edited guarantee is refused)."""
    from synthq.privacy import keys

    if export is not None and import_from is not None:
        raise SynthqError("give --export or --import, not both")
    if import_from is not None:
        typer.echo(f"installed key {keys.import_key(import_from, replace=replace)} at {keys.key_path()}")
        return
    if export is not None:
        written = keys.export_key(export)
        typer.echo(f"key {keys.key_id()} exported to {written}: keep it as secret as the data")
        return
    typer.echo(f"key {keys.key_id()} at {keys.key_path()}")


@app.command("export")
def export_command(
    path: Path = typer.Argument(..., metavar="DIR", help="An artifact directory."),
    out: Path = typer.Option(..., "--out", help="Where to write the release copy (must not exist)."),
) -> None:
    """Copy an artifact for release, without its private diagnostics (losses and timings of
    private batches, ε = ∞)."""
    from synthq.artifacts import export_artifact

    exported, left_out = export_artifact(path, out)
    if left_out:
        console.print(f"left out (not listed as release payload): {', '.join(left_out)}", markup=False)
    result(
        f"release copy written to {exported.path}: {exported.privacy.describe(with_assumptions=True)}",
        markup=False,
    )


@data_app.command("info")
def data_info_command(
    source: str = typer.Argument(
        ..., metavar="SOURCE", help="A BEIR directory, or embedded, msmarco, beir:NAME."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the counts as JSON."),
) -> None:
    """Count documents, queries and judgements per split, and report validation problems."""
    from synthq.data.sources import load_source
    from synthq.data.summary import summarize

    summary = summarize(load_source(source))
    if as_json:
        typer.echo(json.dumps(summary, indent=2))
        return
    table = Table(title=f"{source}: {summary['documents']} documents, {summary['queries']} queries")
    for column in ("split", "queries", "judgements", "documents judged", "avg rel/query"):
        table.add_column(column, justify="right" if column != "split" else "left")
    for split, row in summary["splits"].items():
        table.add_row(
            split,
            str(row["queries"]),
            str(row["judgements"]),
            str(row["documents"]),
            f"{row['judgements'] / max(row['queries'], 1):.2f}",
        )
    result(table)
    for split, row in summary["splits"].items():
        if "users" in row:
            per = row["users"]["queries_per_user"]
            result(
                f"{split}: {row['users']['users']} users; queries per user min {per['min']}, "
                f"median {per['median']:g}, p99 {per['p99']:g}, max {per['max']}"
            )
    for warning in summary["warnings"]:
        warn(escape(warning))
    if not summary["warnings"]:
        result("[green]valid[/]: schema, ids and qrels are consistent")


@stage_command(app, "finetune-lm")
def finetune_lm_command(options: StageOptions):
    """Fine-tune a query generator (document -> query) with DP-Adam to a target ε."""
    from synthq.stages import finetune_lm

    return finetune_lm.run(options.config())


def _generate_result(artifact, mark: int) -> None:
    print_result(artifact, mark)
    metrics = artifact.metrics
    result(f"  {metrics['queries']} synthetic queries for {metrics['documents']} documents")


@stage_command(app, "generate", report=_generate_result)
def generate_command(
    options: StageOptions,
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


@stage_command(app, "filter", report=_filter_result)
def filter_command(options: StageOptions):
    """Keep the better synthetic queries (round-trip consistency, likelihood) and hold documents
    out for tuning: post-processing, no ε."""
    from synthq.stages import filter as filter_stage

    return filter_stage.run(options.config())


@stage_command(app, "evolve", report=_generate_result)
def evolve_command(options: StageOptions):
    """Private Evolution: a public model writes queries, the private pairs vote with DP noise
    (no fine-tuning)."""
    from synthq.stages import evolve

    return evolve.run(options.config())


@stage_command(app, "train-retriever", report=_train_retriever_result)
def train_retriever_command(options: StageOptions):
    """Train a dual encoder with in-batch softmax (non-private, or --dp baselines)."""
    from synthq.stages import train_retriever

    return train_retriever.run(options.config())


@stage_command(app, "eval")
def eval_command(options: StageOptions):
    """Evaluate retrievers (NDCG@10, Recall@10, ...) with ε beside every number."""
    from synthq.stages import evaluate

    return evaluate.run(options.config())


@stage_command(app, "report")
def report_command(
    options: StageOptions,
    paper: Path = typer.Option(
        None,
        "--paper",
        metavar="FILE",
        help="YAML with a `paper:` list of rows, e.g. pipelines/paper/table5.yaml.",
    ),
):
    """Merge evaluation artifacts into one README with tables and the privacy-utility plot."""
    from synthq.config import load_yaml
    from synthq.stages import report

    if paper is not None:
        rows = load_yaml(paper).get("paper")
        if not isinstance(rows, list):
            raise SynthqError(
                f"{paper}: expected a `paper:` list of rows (row, epsilon, dataset, ndcg@10, ...)"
            )
        options["paper"] = rows
    return report.run(options.config())


@stage_command(app, "similarity")
def similarity_command(options: StageOptions):
    """BLEU and MAUVE of synthetic queries against the originals (Table 6)."""
    from synthq.stages import similarity

    return similarity.run(options.config())


@stage_command(app, "canary-audit")
def canary_audit_command(options: StageOptions):
    """Insert canaries, fine-tune at each ε, and measure rank, exposure, leakage and an ε lower bound."""
    from synthq.stages import canary_audit

    return canary_audit.run(options.config())


@app.command("search")
def search_command(
    query: list[str] = typer.Argument(
        ..., metavar="QUERY", help="The query (several words, or several quoted queries with --each)."
    ),
    retriever: str = typer.Option(
        ...,
        "--retriever",
        metavar="DIR",
        help="A train-retriever artifact, or an encoder (alias, directory, hub id).",
    ),
    corpus: str = typer.Option(
        "embedded", "--corpus", metavar="SOURCE", help="Documents: a BEIR directory or source name."
    ),
    top_k: int = typer.Option(10, "--top-k", metavar="N", min=1, help="Documents shown per query."),
    each: bool = typer.Option(False, "--each", help="Treat each argument as its own query."),
    device: str = typer.Option(
        "auto", "--device", metavar="DEVICE", help="Device: auto, cpu, cuda, cuda:N or mps."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the hits as JSON lines."),
) -> None:
    """Try a retriever: the top-k documents of a corpus for a query, with their scores.

    Corpus embeddings are cached (as eval's are), so a second query on the same corpus only
    encodes the query."""
    from synthq.config import check_device
    from synthq.search import search

    try:
        check_device(device)
    except ValueError as error:
        raise OptionError(f"--device: {error}") from None
    queries = list(query) if each else [" ".join(query)]
    hits = search(retriever, corpus, queries, top_k=top_k, device=device)
    for text, ranked in zip(queries, hits, strict=True):
        if as_json:
            for rank, hit in enumerate(ranked, 1):
                typer.echo(json.dumps({"query": text, "rank": rank, **hit}))
            continue
        result(f"[bold]{escape(text)}[/]")
        for rank, hit in enumerate(ranked, 1):
            title = f"{hit['title']}: " if hit["title"] else ""
            result(
                f"  {rank:2d}. {hit['score']:.4f}  {hit['doc_id']}  {escape(_shorten(title + hit['text']))}"
            )


def _shorten(text: str, width: int = 100) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


@app.command("run")
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
    from synthq.pipeline import check_expected, describe_plan, pipeline_schema, plan_pipeline, run_plan

    if schema:
        typer.echo(json.dumps(pipeline_schema(), indent=2, ensure_ascii=False))
        return
    if pipeline is None:
        raise OptionError("give a PIPELINE file (or --schema)")

    plan = plan_pipeline(pipeline, overrides or [], force or [])
    for line in describe_plan(plan):
        console.print(line)
    if dry_run:
        return
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


_DISK_ADVICE = {
    errno.ENOSPC: "free some space or choose an --out on another disk, then rerun",
    errno.EDQUOT: "free some of your quota or choose an --out elsewhere, then rerun",
    errno.EACCES: "choose a writable --out (or fix the directory's permissions)",
    errno.EPERM: "choose a writable --out (or fix the directory's permissions)",
    errno.EROFS: "the file system is read-only; choose an --out elsewhere",
}


def _os_error_line(error: OSError) -> str:
    from synthq.artifacts import output_in_trouble

    trouble = output_in_trouble()
    where = error.filename or (f"while writing {trouble}" if trouble is not None else "?")
    advice = _DISK_ADVICE.get(error.errno, "check the path and rerun")
    return f"{where}: {error.strerror or error}; {advice}"


def _one_line_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """Library warnings as one synthq line (deprecations only with -v)."""
    if issubclass(category, DeprecationWarning | FutureWarning) and verbosity() < 2:
        return
    first = str(message).strip().splitlines()[0] if str(message).strip() else category.__name__
    console.print(f"[bold yellow]warning:[/] {escape(first)} [dim]({category.__name__})[/]", highlight=False)


def _fail(message: str, status: int) -> None:
    console.print(f"[bold red]synthq:[/] {escape(message)}", highlight=False)
    sys.exit(status)


def _run_app():
    """The app, then the process group left (if a stage joined one) while the interpreter lives."""
    from synthq.runtime import distributed

    try:
        status = app(standalone_mode=False, prog_name="synthq")
    except BaseException:
        distributed.leave(completed=False)
        raise
    distributed.leave(completed=True)
    return status


def main() -> None:
    """Console entry point: every failure a user can cause prints one line, no traceback.

    Exit status 2 for a usage or input error, 1 for a file-system problem, 130 for Ctrl-C."""
    from pydantic import ValidationError

    from synthq.config import validation_message

    warnings.showwarning = _one_line_warning
    try:
        status = _run_app()
    except Interrupted as error:
        _fail(str(error), 130)
    except (KeyboardInterrupt, typer.Abort):
        _fail("interrupted; rerun the command to start again", 130)
    except SynthqError as error:
        _fail(str(error), 2)
    except ValidationError as error:
        _fail(validation_message(error), 2)
    except typer.Exit as exit_:
        sys.exit(exit_.exit_code)
    except OSError as error:
        _fail(_os_error_line(error), 1)
    except Exception as error:
        if not (hasattr(error, "format_message") and hasattr(error, "exit_code")):
            raise  # a bug: keep the traceback
        # (typer's vendored) click usage errors: unknown option, missing argument, bad choice
        context = getattr(error, "ctx", None)
        command = context.command_path if context is not None else "synthq"
        message = error.format_message().replace("Value error, ", "")
        subcommand = command.removeprefix("synthq").strip()  # one "synthq:" prefix per line
        where = f"{subcommand}: " if subcommand else ""
        _fail(f"{where}{message} (see {command} --help)", error.exit_code)
    if isinstance(status, int) and status:
        sys.exit(status)
