"""``synthq report``: one README with every evaluation's tables, the privacy-utility plot,
similarity scores and, when given, the paper's numbers side by side.

Args (:class:`synthq.config.ReportConfig`):
    evals: ``eval`` artifacts; their rows are merged (a reference row or retriever evaluated in
        several of them on the same dataset appears once).
    similarity: ``similarity`` artifacts (BLEU, MAUVE) shown with their synthetic set's ε.
    paper: the paper's rows (``row``, ``epsilon``, ``dataset``, metrics), matched to ours on
        dataset and ε.

Outputs: ``README.md`` (Tables 3-5 layout with intervals and the pairwise significance tests
when the evaluations kept per-query scores, the dev selection of each evaluation that made one,
similarity, paper vs ours), ``results.json`` (the merged rows) and ``privacy_utility.png``.

Privacy unit and sensitivity:
    The report only re-reads its inputs (post-processing). It publishes the results of every
    model in every input, so its guarantee is :func:`synthq.reporting.tables.combined_guarantee` over those
    models (one DP release counts once; independent releases compose; a non-private model, or a
    similarity artifact, which reads the private queries, makes it ε = ∞).
"""

from __future__ import annotations

import json
from pathlib import Path

from synthq.artifacts import Artifact, create_artifact, existing_result, json_safe, open_artifact
from synthq.config import ReportConfig
from synthq.privacy.guarantee import Guarantee, format_epsilon
from synthq.privacy.ledger import ledger_lines
from synthq.reporting.tables import (
    RESULTS_FILE,
    SELECTION_FILE,
    attach_per_query,
    paper_comparison,
    privacy_utility_plot,
    read_per_query,
    results_markdown,
)
from synthq.runtime.console import result
from synthq.runtime.errors import ArtifactError

STAGE = "report"


def _rows(artifact: Artifact) -> list[dict]:
    """The evaluation's rows, each with its per-query scores when the evaluation kept them."""
    path = artifact.path / RESULTS_FILE
    try:
        rows = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as error:
        raise ArtifactError(f"{path}: unreadable evaluation results ({error})") from error
    rows = attach_per_query(rows, read_per_query(artifact.path))
    return [{**r, "epsilon": float(r["epsilon"])} for r in rows]


def _similarity_table(artifacts: list[Artifact]) -> str:
    lines = [
        "| synthetic set | ε | BLEU | MAUVE | distinct-2 | verbatim copies |",
        "|---|---|---|---|---|---|",
    ]
    for artifact in artifacts:
        m = artifact.metrics
        synthetic_epsilon = float(m.get("synthetic_epsilon", "inf"))
        has_mauve = m.get("mauve_mean") is not None
        mauve = f"{m['mauve_mean']:.3f} ± {m['mauve_std']:.3f}" if has_mauve else "—"
        lines.append(
            f"| {Path(artifact.config['synthetic']).name} | {format_epsilon(synthetic_epsilon)} "
            f"| {m['bleu']:.2f} | {mauve} "
            f"| {m['distinct_2']:.3f} | {100 * m['verbatim_copy_rate']:.1f}% |"
        )
    return "\n".join(lines) + "\n"


def merge_rows(evals: list[Artifact]) -> tuple[list[dict], list[tuple[str, Guarantee]]]:
    """The rows of all evaluations, each (dataset, split, model) once, and the (hash, guarantee)
    of every model whose results they publish. Two different models with the same name get
    their hash appended so the tables never mix them up."""
    rows, seen, names, sources = [], set(), {}, []
    for artifact in evals:
        for row in _rows(artifact):
            model = row.get("model_id") or row["retriever"]
            key = (row["dataset"], row.get("split"), model)
            if key in seen:
                continue
            seen.add(key)
            if names.setdefault(row["retriever"], model) != model:
                row = {**row, "retriever": f"{row['retriever']} [{model.split(':')[-1][:8]}]"}
            rows.append(row)
            if "privacy" in row:
                sources.append((model, Guarantee.from_manifest(row["privacy"])))
            else:  # results written before rows carried their guarantee: the eval's own
                sources.append((artifact.manifest_hash, artifact.privacy))
    return rows, sources


def run(config: ReportConfig) -> Artifact:
    evals = [open_artifact(path, stage="eval") for path in config.evals]
    similarities = [open_artifact(path, stage="similarity") for path in config.similarity]
    inputs = [a.input_record() for a in evals + similarities]
    if (done := existing_result(STAGE, config, inputs)) is not None:
        return done
    rows, _ = merge_rows(evals)
    with create_artifact(config.out, STAGE, config, inputs) as writer:
        sections = [results_markdown(rows, title=config.title), "![privacy-utility](privacy_utility.png)\n"]
        for artifact in evals:
            if (artifact.path / SELECTION_FILE).is_file():
                sections += [
                    f"## Hyper-parameters chosen on dev ({artifact.path.name})\n",
                    (artifact.path / SELECTION_FILE).read_text(encoding="utf-8"),
                ]
        if similarities:
            sections += ["## Synthetic vs original queries\n", _similarity_table(similarities)]
        if config.paper:
            sections += ["## Paper vs ours\n", paper_comparison(rows, config.paper)]
        ledger = ledger_lines([a.path for a in [*evals, *similarities]])
        sections += ["## Privacy ledger\n", "```\n" + "\n".join(ledger) + "\n```\n"]
        text = "\n".join(sections)
        (writer.dir / "README.md").write_text(text, encoding="utf-8")
        published = [{k: v for k, v in r.items() if k != "per_query"} for r in rows]
        (writer.dir / RESULTS_FILE).write_text(json.dumps(json_safe(published), indent=2), encoding="utf-8")
        privacy_utility_plot(rows, writer.dir / "privacy_utility.png")
        for artifact in [*evals, *similarities]:  # the report publishes them: their releases
            writer.inherit(artifact)
        writer.metrics["rows"] = len(rows)
    result(text, markup=False)
    return open_artifact(config.out, STAGE)
