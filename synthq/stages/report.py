"""``synthq report``: one README with every evaluation's tables, the privacy-utility plot,
similarity scores and, when given, the paper's numbers side by side.

The report only re-reads evaluation and similarity artifacts; its guarantee is theirs
combined (post-processing), so its ε is the largest of its inputs' when they share sources and
∞ if any input is non-private.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from synthq.artifacts import Artifact, create_artifact, existing_result, open_artifact
from synthq.config import ReportConfig
from synthq.console import console
from synthq.privacy import Guarantee, format_epsilon
from synthq.report import paper_comparison, privacy_utility_plot, results_table

STAGE = "report"


def _rows(artifact: Artifact) -> list[dict]:
    rows = json.loads((artifact.path / "results.json").read_text(encoding="utf-8"))
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


def run(config: ReportConfig) -> Artifact:
    evals = [open_artifact(path, stage="eval") for path in config.evals]
    similarities = [open_artifact(path, stage="similarity") for path in config.similarity]
    inputs = [a.input_record() for a in evals + similarities]
    if (done := existing_result(STAGE, config, inputs)) is not None:
        return done
    rows, seen = [], set()
    for artifact in evals:
        for row in _rows(artifact):
            key = (row["dataset"], row["retriever"])
            if key not in seen:  # reference rows appear in several evaluations
                seen.add(key)
                rows.append(row)
    with create_artifact(config.out, STAGE, config, inputs) as writer:
        sections = [f"# {config.title}\n", "Every number is shown with the ε of the model it belongs to.\n"]
        sections += ["## Retrieval\n", results_table(rows), "![privacy-utility](privacy_utility.png)\n"]
        if similarities:
            sections += ["## Synthetic vs original queries\n", _similarity_table(similarities)]
        if config.paper:
            sections += ["## Paper vs ours\n", paper_comparison(rows, config.paper)]
        text = "\n".join(sections)
        (writer.dir / "README.md").write_text(text, encoding="utf-8")
        serialisable = [
            {**r, "epsilon": r["epsilon"] if math.isfinite(r["epsilon"]) else "inf"} for r in rows
        ]
        (writer.dir / "results.json").write_text(json.dumps(serialisable, indent=2), encoding="utf-8")
        privacy_utility_plot(rows, writer.dir / "privacy_utility.png")
        guarantees = [a.privacy for a in evals + similarities]
        if any(not g.is_private for g in guarantees):
            writer.privacy = Guarantee.non_private("includes results of a model trained without DP")
        else:
            writer.privacy = max(guarantees, key=lambda g: g.epsilon, default=Guarantee.public())
        writer.metrics["rows"] = len(rows)
    console.print(text)
    return open_artifact(config.out, STAGE)
