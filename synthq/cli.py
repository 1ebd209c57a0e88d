"""The ``synthq`` command line: one thin command per stage (options -> config -> stage.run).

Stage commands live here only as option parsing; the work is in :mod:`synthq.stages`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import typer
from rich.table import Table

from synthq import __version__
from synthq.artifacts import open_artifact
from synthq.console import console, set_verbosity
from synthq.errors import SynthqError
from synthq.privacy import format_epsilon

app = typer.Typer(
    name="synthq",
    help=(
        "Private synthetic-query retrieval: fine-tune a query generator with differential "
        "privacy, generate synthetic queries, train and evaluate dual encoders, audit leakage."
    ),
    no_args_is_help=True,
    rich_markup_mode="rich",
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
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Print only results and errors."),
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Show the version."
    ),
) -> None:
    set_verbosity(0 if quiet else 2 if verbose else 1)


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
    path: Path = typer.Argument(..., help="An artifact directory written by a synthq stage."),
    as_json: bool = typer.Option(False, "--json", help="Print the manifest as JSON."),
) -> None:
    """Show an artifact: stage, privacy guarantee, input lineage, metrics and timings."""
    artifact = open_artifact(path)
    if as_json:
        typer.echo(json.dumps(artifact.manifest, indent=2))
        return
    guarantee = artifact.privacy
    console.print(f"[bold]{artifact.stage}[/] artifact at {artifact.path}")
    console.print(f"created {artifact.manifest.get('created')} by synthq {artifact.manifest.get('synthq')}")
    console.print(
        f"[bold]privacy[/]: ε = {format_epsilon(guarantee.epsilon)}, δ = {guarantee.delta:.3g}, "
        f"unit = {guarantee.unit}, mechanism = {guarantee.mechanism}, accountant = {guarantee.accountant}"
    )
    if guarantee.note:
        console.print(f"  {guarantee.note}")
    for key, value in guarantee.details.items():
        console.print(f"  {key}: {value}")
    if artifact.inputs:
        console.print("[bold]inputs[/]:")
        for line in _lineage(artifact.inputs):
            console.print(f"  {line}")
    for title, values in (("metrics", artifact.metrics), ("timings", artifact.timings)):
        if values:
            console.print(f"[bold]{title}[/]:")
            for key, value in values.items():
                shown = json.dumps(value) if isinstance(value, dict | list) else value
                console.print(f"  {key}: {shown}")


@data_app.command("info")
def data_info_command(
    source: str = typer.Argument(..., help="A BEIR directory, or embedded, msmarco, beir:NAME."),
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
    console.print(table)
    for warning in summary["warnings"]:
        console.print(f"[yellow]warning:[/] {warning}")
    if not summary["warnings"]:
        console.print("[green]valid[/]: schema, ids and qrels are consistent")


@app.command("finetune-lm")
def finetune_lm_command(
    data: str = typer.Option(..., "--data", help="Private pairs: a BEIR dir, embedded, msmarco, beir:NAME."),
    model: str = typer.Option(..., "--model", help="Hub id (google-t5/t5-base), local dir, or smollm2-135m."),
    out: Path = typer.Option(..., "--out", help="Generator artifact directory to write."),
    epsilon: str = typer.Option("8", help="Target ε; 'inf' trains without DP."),
    delta: float = typer.Option(None, help="δ (default 1/(2n))."),
    clip_norm: float = typer.Option(0.1, help="Per-example clipping norm C (paper: 0.1)."),
    accountant: str = typer.Option("rdp", help="rdp or prv."),
    optimizer: str = typer.Option("adam", help="adam (DP-Adam), adafactor or sgd."),
    lr: float = typer.Option(1e-3, help="Learning rate (paper: 1e-3)."),
    epochs: float = typer.Option(3.0, help="Epochs (paper: 30)."),
    max_steps: int = typer.Option(None, help="Cap on logical steps."),
    batch_size: int = typer.Option(1024, help="Logical batch; Poisson rate = batch/n (paper: 1024)."),
    physical_batch_size: int = typer.Option(8, help="Micro-batch that fits in memory."),
    max_source_length: int = typer.Option(384),
    max_target_length: int = typer.Option(128),
    lora_rank: int = typer.Option(0, help="Train LoRA adapters of this rank instead of all weights."),
    grad_sample_mode: str = typer.Option(
        "auto", help="Per-example clipping: auto (ghost where possible), ghost, hooks or vmap."
    ),
    split: str = typer.Option("train"),
    limit: int = typer.Option(None, help="Use only the first N pairs."),
    seed: int = typer.Option(0),
    device: str = typer.Option("auto"),
    checkpoint_every: int = typer.Option(50, help="Checkpoint every N steps (for --resume)."),
    force: bool = typer.Option(False, "--force", help="Redo an up-to-date artifact."),
    resume: bool = typer.Option(False, "--resume", help="Continue an interrupted run."),
) -> None:
    """Fine-tune a query generator (document -> query) with DP-Adam to a target ε."""
    from synthq.config import FinetuneConfig
    from synthq.stages import finetune_lm

    config = FinetuneConfig(
        data=data, model=model, out=out, epsilon=epsilon, delta=delta, clip_norm=clip_norm,
        accountant=accountant, optimizer=optimizer, lr=lr, epochs=epochs, max_steps=max_steps,
        batch_size=batch_size, physical_batch_size=physical_batch_size, max_source_length=max_source_length,
        max_target_length=max_target_length, lora_rank=lora_rank, split=split, limit=limit, seed=seed,
        device=device, checkpoint_every=checkpoint_every, force=force, resume=resume,
        grad_sample_mode=grad_sample_mode,
    )  # fmt: skip
    artifact = finetune_lm.run(config)
    console.print(f"generator written to {artifact.path}: {artifact.privacy.describe()}")


@app.command("generate")
def generate_command(
    out: Path = typer.Option(..., "--out", help="Synthetic dataset artifact (a BEIR dir) to write."),
    generator: Path = typer.Option(None, "--generator", help="A finetune-lm artifact."),
    corpus: str = typer.Option("embedded", "--corpus", help="Public documents: a BEIR dir or source name."),
    split: str = typer.Option("train", help="Generate for the documents judged in this split."),
    all_documents: bool = typer.Option(False, "--all", help="Generate for every corpus document instead."),
    num_queries: int = typer.Option(1, help="Queries per document."),
    top_p: float = typer.Option(0.8, help="Nucleus sampling mass (paper: 0.8)."),
    temperature: float = typer.Option(1.0),
    max_new_tokens: int = typer.Option(32),
    batch_size: int = typer.Option(16, help="Documents per generation batch."),
    max_resample: int = typer.Option(3, help="Retries for empty or degenerate queries."),
    shard: str = typer.Option(None, help="i/n: generate only the i-th of n document shards."),
    merge: list[Path] = typer.Option(None, "--merge", help="Merge these shard artifacts into --out."),
    seed: int = typer.Option(0),
    limit: int = typer.Option(None, help="Only the first N documents."),
    device: str = typer.Option("auto"),
    force: bool = typer.Option(False, "--force"),
    resume: bool = typer.Option(False, "--resume", help="Skip documents an interrupted run finished."),
) -> None:
    """Nucleus-sample synthetic queries for public documents (inherits the generator's ε)."""
    from synthq.config import GenerateConfig
    from synthq.stages import generate

    if merge:
        artifact = generate.merge(list(merge), out, force=force)
    else:
        if generator is None:
            raise typer.BadParameter("--generator is required (or --merge SHARDS)")
        config = GenerateConfig(
            generator=generator, corpus=corpus, out=out, split=None if all_documents else split,
            num_queries=num_queries, top_p=top_p, temperature=temperature, max_new_tokens=max_new_tokens,
            batch_size=batch_size, max_resample=max_resample, shard=shard, seed=seed, limit=limit,
            device=device, force=force, resume=resume,
        )  # fmt: skip
        artifact = generate.run(config)
    metrics = artifact.metrics
    console.print(
        f"{metrics['queries']} synthetic queries for {metrics['documents']} documents in {artifact.path} "
        f"({artifact.privacy.describe()})"
    )


@app.command("train-retriever")
def train_retriever_command(
    data: str = typer.Option(..., "--data", help="A synthetic artifact, a BEIR dir, or a source name."),
    out: Path = typer.Option(..., "--out", help="Retriever artifact (a sentence-transformers dir) to write."),
    encoder: str = typer.Option("minilm-l6", help="Shared encoder: alias, local dir or hub id."),
    dp: str = typer.Option(None, help="Direct DP on the private pairs: sample, batch, group or logit."),
    epsilon: str = typer.Option("8", help="Target ε for --dp."),
    delta: float = typer.Option(None, help="δ for --dp (default 1/(2n))."),
    clip_norm: float = typer.Option(1.0, help="Clipping norm C for --dp (paper: 0.1)."),
    accountant: str = typer.Option("rdp"),
    batch_size: int = typer.Option(32, help="Batch (paper: 32); the expected batch under --dp."),
    epochs: float = typer.Option(5.0, help="Epochs (paper: 5)."),
    max_steps: int = typer.Option(None),
    lr: float = typer.Option(2e-5),
    temperature: float = typer.Option(0.05, help="Softmax temperature on cosine similarity."),
    max_query_length: int = typer.Option(128),
    max_doc_length: int = typer.Option(384),
    group_size: int = typer.Option(8, help="--dp group: pairs per group."),
    aug_negatives: int = typer.Option(0, help="--dp group: augmented negatives per group document."),
    mini_batch_size: int = typer.Option(None, help="Non-private: GradCache loss in chunks of this size."),
    pair_chunk: int = typer.Option(16, help="--dp logit: per-pair gradients held in memory at once."),
    split: str = typer.Option("train"),
    limit: int = typer.Option(None),
    seed: int = typer.Option(0),
    device: str = typer.Option("auto"),
    force: bool = typer.Option(False, "--force"),
) -> None:
    """Train a dual encoder with in-batch softmax (non-private, or --dp baselines)."""
    from synthq.config import TrainRetrieverConfig
    from synthq.stages import train_retriever

    if dp is not None and dp not in ("sample", "batch", "group", "logit"):
        raise typer.BadParameter(f"{dp!r}: expected sample, batch, group or logit", param_hint="--dp")

    config = TrainRetrieverConfig(
        data=data, out=out, encoder=encoder, dp=dp, epsilon=epsilon, delta=delta, clip_norm=clip_norm,
        accountant=accountant, batch_size=batch_size, epochs=epochs, max_steps=max_steps, lr=lr,
        temperature=temperature, max_query_length=max_query_length, max_doc_length=max_doc_length,
        group_size=group_size, aug_negatives=aug_negatives, mini_batch_size=mini_batch_size,
        pair_chunk=pair_chunk, split=split, limit=limit, seed=seed, device=device, force=force,
    )  # fmt: skip
    artifact = train_retriever.run(config)
    console.print(f"retriever written to {artifact.path}: {artifact.privacy.describe()}")
    if dp is not None:
        details = artifact.privacy.details
        console.print(
            f"  --dp {dp}: sensitivity {details['sensitivity']:.4g}, σ {details['noise_multiplier']:.3f}, "
            f"q {details['sample_rate']:.4f}, {details['steps']} steps"
        )


@app.command("eval")
def eval_command(
    out: Path = typer.Option(..., "--out", help="Evaluation artifact directory to write."),
    retriever: list[str] = typer.Option(None, "--retriever", help="A train-retriever artifact (repeatable)."),
    datasets: str = typer.Option(
        "embedded", help="Comma-separated: embedded, msmarco (dev split), beir:NAME, BEIR directories."
    ),
    split: str = typer.Option(None, help="Split to evaluate (default: test; msmarco: dev)."),
    bm25: bool = typer.Option(True, help="Add a BM25 reference row (ε = 0, public)."),
    untrained: list[str] = typer.Option(
        None, "--untrained", help="Encoder spec evaluated as-is, e.g. minilm-l6 (repeatable)."
    ),
    batch_size: int = typer.Option(64, help="Encoding batch size."),
    top_k: int = typer.Option(100, help="Documents retrieved per query (≥ 100)."),
    search_chunk_size: int = typer.Option(50_000, help="Documents scored per matrix product."),
    faiss: bool = typer.Option(False, "--faiss", help="Search with FAISS (else exact torch chunks)."),
    device: str = typer.Option("auto"),
    force: bool = typer.Option(False, "--force"),
) -> None:
    """Evaluate retrievers (NDCG@10, Recall@10, ...) with ε beside every number."""
    from pydantic import ValidationError

    from synthq.config import EvalConfig
    from synthq.stages import evaluate

    try:
        config = EvalConfig(
            retrievers=retriever or [], datasets=[d.strip() for d in datasets.split(",") if d.strip()],
            split=split, bm25=bm25, untrained=untrained or [], batch_size=batch_size, top_k=top_k,
            search_chunk_size=search_chunk_size, faiss=faiss, device=device, out=out, force=force,
        )  # fmt: skip
    except ValidationError as error:
        raise SynthqError(f"invalid eval options: {error}") from None
    artifact = evaluate.run(config)
    console.print(f"evaluation written to {artifact.path}: {artifact.privacy.describe()} (all rows together)")


@app.command("report")
def report_command(
    evals: list[str] = typer.Argument(..., help="Evaluation artifacts to merge."),
    out: Path = typer.Option(..., "--out"),
    title: str = typer.Option("synthq results"),
    similarity: list[str] = typer.Option(None, "--similarity", help="Similarity artifacts to include."),
    paper: Path = typer.Option(
        None, "--paper", help="YAML with a `paper:` list of rows, e.g. pipelines/paper/table5.yaml."
    ),
    force: bool = typer.Option(False, "--force"),
) -> None:
    """Merge evaluation artifacts into one README with tables and the privacy-utility plot."""
    from synthq.config import ReportConfig, load_yaml
    from synthq.stages import report

    paper_rows = []
    if paper is not None:
        paper_rows = load_yaml(paper).get("paper")
        if not isinstance(paper_rows, list):
            raise SynthqError(
                f"{paper}: expected a `paper:` list of rows (row, epsilon, dataset, ndcg@10, ...)"
            )
    artifact = report.run(
        ReportConfig(
            evals=evals, out=out, title=title, similarity=similarity or [], paper=paper_rows, force=force
        )
    )
    console.print(f"report written to {artifact.path}: {artifact.privacy.describe()}")


@app.command("similarity")
def similarity_command(
    synthetic: Path = typer.Option(..., "--synthetic", help="A generate artifact."),
    original: str = typer.Option(..., "--original", help="The original pairs (BEIR dir or source name)."),
    out: Path = typer.Option(..., "--out"),
    split: str = typer.Option("train"),
    encoder: str = typer.Option("minilm-l6", help="Encoder whose features MAUVE compares."),
    mauve_seeds: int = typer.Option(5, help="k-means seeds to average MAUVE over."),
    min_samples: int = typer.Option(50, help="Refuse MAUVE below this many queries per side."),
    mauve_scaling_factor: float = typer.Option(5.0, help="MAUVE's c in exp(-c KL) (mauve's default: 5)."),
    seed: int = typer.Option(0),
    device: str = typer.Option("auto", help="Device for the MAUVE feature encoder."),
    force: bool = typer.Option(False, "--force"),
) -> None:
    """BLEU and MAUVE of synthetic queries against the originals (Table 6)."""
    from synthq.config import SimilarityConfig
    from synthq.stages import similarity

    config = SimilarityConfig(
        synthetic=synthetic, original=original, out=out, split=split, encoder=encoder,
        mauve_seeds=mauve_seeds, min_samples=min_samples, mauve_scaling_factor=mauve_scaling_factor,
        seed=seed, device=device, force=force,
    )  # fmt: skip
    similarity.run(config)


@app.command("canary-audit")
def canary_audit_command(
    data: str = typer.Option(..., "--data", help="Private pairs: a BEIR dir, embedded, msmarco, beir:NAME."),
    model: str = typer.Option(..., "--model", help="Generator to fine-tune: hub id, local dir or alias."),
    out: Path = typer.Option(..., "--out", help="Audit artifact directory to write."),
    method: str = typer.Option("one-run", help="one-run (Steinke et al. 2023), exposure (Table 7) or both."),
    epsilons: str = typer.Option("inf,8", help="Comma-separated ε values; inf = non-private."),
    canaries: int = typer.Option(500, help="One-run canaries, each included once with probability 1/2."),
    canary_seed: int = typer.Option(
        None, help="Reproducible canary secrets and coins (default: OS randomness)."
    ),
    private_pairs: int = typer.Option(None, help="Train the audited generators on this many private pairs."),
    retriever_audit: bool = typer.Option(
        True, help="Also audit retrievers trained on the synthetic queries."
    ),
    retriever_documents: int = typer.Option(
        200, help="Public documents beside the canaries (retriever audit)."
    ),
    repetitions: str = typer.Option("10,100", help="Exposure method: comma-separated insertion counts."),
    shapes: str = typer.Option("random-query,real-document,random-document", help="Exposure canary shapes."),
    canaries_per_shape: int = typer.Option(
        5, help="Exposure method: canaries per shape and repetition count."
    ),
    references: int = typer.Option(99, help="Exposure method: candidate secrets per canary."),
    leak_samples: int = typer.Option(
        10, help="Exposure method: sampled queries per canary for the leak test."
    ),
    scoring_batch_size: int = typer.Option(32, "--scoring-batch-size", "--batch-size", help="Scoring batch."),
    seed: int = typer.Option(0),
    finetune: list[str] = typer.Option(
        None, "--finetune", help="finetune-lm option as key=value (repeatable), e.g. lora_rank=8."
    ),
    retriever: list[str] = typer.Option(None, "--retriever", help="train-retriever option as key=value."),
    force: bool = typer.Option(False, "--force", help="Redo an up-to-date audit."),
    resume: bool = typer.Option(False, "--resume", help="Continue an interrupted audit."),
) -> None:
    """Train a generator per ε with canaries and prove empirical ε lower bounds (one-run, exposure)."""
    from synthq.config import CanaryAuditConfig, apply_overrides
    from synthq.stages import canary_audit

    config = CanaryAuditConfig(
        data=data,
        model=model,
        out=out,
        method=method,
        epsilons=epsilons,
        canaries=canaries,
        canary_seed=canary_seed,
        private_pairs=private_pairs,
        retriever_audit=retriever_audit,
        retriever_documents=retriever_documents,
        repetitions=[int(r) for r in repetitions.split(",")],
        shapes=shapes.split(","),
        canaries_per_shape=canaries_per_shape,
        references=references,
        leak_samples=leak_samples,
        scoring_batch_size=scoring_batch_size,
        seed=seed,
        finetune=apply_overrides({}, finetune or []),
        retriever=apply_overrides({}, retriever or []),
        force=force,
        resume=resume,
    )
    artifact = canary_audit.run(config)
    console.print(f"audit written to {artifact.path} ({artifact.privacy.describe()})")


@app.command("run")
def run_command(
    pipeline: Path = typer.Argument(..., help="A pipeline YAML, e.g. pipelines/demo.yaml."),
    overrides: list[str] = typer.Argument(None, help="key=value overrides, e.g. vars.limit=100."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the plan; run nothing."),
    force: list[str] = typer.Option(None, "--force", help="Redo this stage (repeatable; all = every one)."),
) -> None:
    """Run a whole pipeline: every stage through its public run, skipping up-to-date artifacts."""
    from synthq.stages.pipeline import describe_plan, plan_pipeline, run_plan

    plan = plan_pipeline(pipeline, overrides or [], force or [])
    for line in describe_plan(plan):
        console.print(line)
    if not dry_run:
        run_plan(plan)


def main() -> None:
    """Console entry point: user errors print one clear line and exit with status 2."""
    try:
        app(standalone_mode=False)
    except SynthqError as error:
        console.print(f"[bold red]error:[/] {error}")
        sys.exit(2)
    except KeyboardInterrupt:
        console.print("[bold red]interrupted[/]: no partial artifact was left in place")
        sys.exit(130)
    except typer.Exit as exit_:
        sys.exit(exit_.exit_code)
    except typer.Abort:
        sys.exit(1)
    except Exception as error:
        # Typer's (vendored) click usage errors: show them the way click's standalone mode does.
        if hasattr(error, "show") and hasattr(error, "exit_code"):
            error.show()
            sys.exit(error.exit_code)
        raise
