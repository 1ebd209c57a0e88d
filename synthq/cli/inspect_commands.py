"""The commands that read artifacts and datasets without running a stage: info, ledger, key,
export and ``data info``."""

from __future__ import annotations

import datetime as _dt
import json
from pathlib import Path

import typer
from rich.markup import escape
from rich.table import Table

from synthq.artifacts.locking import artifact_holding
from synthq.artifacts.manifest import MANIFEST, is_artifact, open_artifact
from synthq.privacy.guarantee import Guarantee, format_epsilon
from synthq.runtime.console import console, result, warn
from synthq.runtime.errors import SynthqError

data_app = typer.Typer(help="Inspect datasets (BEIR directories and named sources).", no_args_is_help=True)


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


def _shown(value) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, dict):
        return ", ".join(f"{k}={_shown(v)}" for k, v in value.items() if v not in (None, ""))
    if isinstance(value, list):
        return f"{len(value)} entries (synthq info --json lists them)"
    return str(value)


def detail_lines(details: dict) -> list[str]:
    """A guarantee's parameters as a reader wants them (named as ``--json`` names them): nothing
    empty, no Python repr of a record (issue #74: an empty ``accountant_fallback:`` and a dict were
    printed as stored)."""
    return [f"{key}: {_shown(value)}" for key, value in details.items() if value not in (None, "", [], {})]


def info_command(
    path: Path = typer.Argument(..., metavar="DIR", help="An artifact directory written by a synthq stage."),
    as_json: bool = typer.Option(False, "--json", help="Print the manifest as JSON."),
) -> None:
    """Show an artifact: stage, privacy guarantee, input lineage, metrics and timings."""
    from synthq.bookkeeping.inputs import artifact_input

    artifact = artifact_input(path)
    if as_json:
        typer.echo(json.dumps(artifact.manifest, indent=2))
        return
    guarantee = artifact.privacy
    result(f"[bold]{artifact.stage}[/] artifact at {artifact.path}")
    if artifact.verified:
        result("seal: verified with this installation's key; ε recomputed from its releases")
    else:
        result(f"[bold yellow]seal NOT verifiable[/]: {artifact.path}: {artifact.unverified_reason}")
    # no stamp in the manifest: in a pipeline the times of consecutive stages would publish a DP
    # stage's wall time (a function of how many private pairs it sampled); this is the local file's
    written = _dt.datetime.fromtimestamp((artifact.path / MANIFEST).stat().st_mtime, _dt.timezone.utc)
    version = artifact.manifest.get("synthq")
    result(f"written {written.isoformat(timespec='seconds')} (file time) by synthq {version}")
    result(
        f"[bold]privacy[/]: ε = {format_epsilon(guarantee.epsilon)}, δ = {guarantee.delta:.3g}, "
        f"{guarantee.per_unit}, mechanism = {guarantee.mechanism}, accountant = {guarantee.accountant}"
    )
    if guarantee.note:
        result(f"  {guarantee.note}")
    for assumption in guarantee.assumptions:
        result(f"  [yellow]assuming[/]: {assumption}")
    for line in detail_lines(guarantee.details):
        result(f"  {line}", markup=False)
    for release in artifact.releases:
        own = Guarantee.from_manifest(release["guarantee"])
        units = release.get("units") or {}
        result(
            f"  release {release['id'][:8]} by {release['stage']} ({release['path']}) of "
            f"{release['data'].get('name')}: {own.describe()}, over its "
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


def ledger_command(
    paths: list[Path] = typer.Argument(
        ..., metavar="DIR", help="Artifact directories (their inputs are followed too)."
    ),
    statement: bool = typer.Option(
        False,
        "--statement",
        help="Write the one-page Markdown privacy statement a reviewer signs (every number "
        "recomputed from the sealed release records) instead of the ledger.",
    ),
    out: Path | None = typer.Option(
        None, "--out", metavar="FILE", help="With --statement: write it to FILE (default: stdout)."
    ),
    force: bool = typer.Option(False, "--force", help="With --out: replace an existing FILE."),
    compose: str = typer.Option(
        "units",
        "--compose",
        metavar="MODE",
        help="units: per privacy unit, summing only releases whose data share units (tighter; "
        "which releases share is read from the data without noise, one bit per pair of releases); "
        "sum: every release's ε added, reading nothing of the data (share this one where that bit "
        "matters).",
    ),
) -> None:
    """The privacy cost per private dataset of a set of artifacts: which are DP releases, what
    each assumed, which read private data without DP (basic composition over the releases)."""
    if compose not in ("units", "sum"):
        raise SynthqError(f"--compose {compose}: must be units or sum")
    if not statement:
        if out is not None:
            raise SynthqError("--out goes with --statement (the ledger itself is printed)")
        from synthq.bookkeeping.releases import ledger_lines

        for line in ledger_lines(paths, compose):
            result(line, markup=False)
        return
    if out is not None and out.is_dir():
        raise SynthqError(f"--out {out}: is a directory; give the statement's file path ({out}/statement.md)")
    if out is not None and (out.name == "manifest.json" or artifact_holding(out) is not None):
        raise SynthqError(f"--out {out}: is inside an artifact directory; write the statement elsewhere")
    if out is not None and out.exists() and not force:
        raise SynthqError(f"--out {out}: already exists; pass --force to replace it")
    from synthq.bookkeeping.statement import statement_for

    text = statement_for(paths, compose)
    if out is None:
        typer.echo(text, nl=False)
        return
    partial = out.with_name(f".{out.name}.partial")
    try:
        partial.write_text(text, encoding="utf-8")
        partial.replace(out)  # whole or not at all
    except OSError as error:  # a full disk: no cut-off copy left behind, and the message names --out
        partial.unlink(missing_ok=True)
        raise OSError(error.errno, error.strerror, str(out)) from error
    result(f"privacy statement written to {out}", markup=False)


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


def export_command(
    path: Path = typer.Argument(..., metavar="DIR", help="An artifact directory."),
    out: Path = typer.Option(..., "--out", help="Where to write the release copy (must not exist)."),
) -> None:
    """Copy an artifact for release, without its private diagnostics (losses and timings of
    private batches, ε = ∞)."""
    from synthq.artifacts.export import export_artifact
    from synthq.bookkeeping.inputs import artifact_input

    artifact_input(path)  # refused when its ε would call an ε = ∞ read public
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
        ..., metavar="SOURCE", help="A BEIR directory, or embedded, pydocs, msmarco, beir:NAME."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the counts as JSON."),
) -> None:
    """Count documents, queries and judgements per split, and report validation problems."""
    from synthq.bookkeeping.splits import split_is_private
    from synthq.data.beir_io import load_beir_dir
    from synthq.data.sources import resolve_source
    from synthq.data.summary import summarize

    root = resolve_source(source)
    summary = summarize(load_beir_dir(root))
    synthetic = is_artifact(root)  # a synthetic set: eval's scores on it carry the set's own ε
    for split, row in summary["splits"].items():  # as eval reads it: fail closed, by privacy.json
        private = split_is_private(source, root, split)
        row["privacy"] = "the set's ε" if synthetic else "private" if private else "public"
    if as_json:
        typer.echo(json.dumps(summary, indent=2))
        return
    table = Table(title=f"{source}: {summary['documents']} documents, {summary['queries']} queries")
    for column in ("split", "privacy", "queries", "judgements", "documents judged", "avg rel/query"):
        table.add_column(column, justify="right" if column not in ("split", "privacy") else "left")
    for split, row in summary["splits"].items():
        table.add_row(
            split,
            row["privacy"],
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
    if any(row["privacy"] == "private" for row in summary["splits"].values()):
        result(
            "private splits: their scores are ε = ∞ and what trains on them is accounted; a split is "
            "private unless the dataset's privacy.json declares it public"
        )
    for warning in summary["warnings"]:
        warn(escape(warning))
    if not summary["warnings"]:
        result("[green]valid[/]: schema, ids and qrels are consistent")
