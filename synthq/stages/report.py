"""``synthq report``: one README with every evaluation's tables, the privacy-utility plot,
similarity scores and, when given, the paper's numbers side by side.

Args (:class:`synthq.config.evaluation.ReportConfig`):
    evals: ``eval`` artifacts; their rows are merged (a reference row or retriever evaluated in
        several of them on the same dataset appears once).
    similarity: ``similarity`` artifacts (BLEU, MAUVE) shown with their synthetic set's ε.
    paper: the paper's rows (``row``, ``epsilon``, ``dataset``, metrics), matched to ours on
        dataset and ε.

Outputs: ``README.md`` (Tables 3-5 layout with intervals and the pairwise significance tests
when the evaluations kept per-query scores, the dev selection of each evaluation that made one,
similarity, paper vs ours), ``results.json`` (the merged rows) and ``privacy_utility.png``. The
manifest's metrics carry the NDCG@10 comparisons (``significance`` -> dataset -> ``"better >
worse"`` -> difference, ci, p, p_holm), so a pipeline's ``expected:`` block can require one.

Privacy unit and sensitivity:
    The report only re-reads its inputs (post-processing). It publishes the results of every
    model in every input, so it inherits every input's releases: its guarantee composes them per
    unit (one DP release counts once; independent releases compose; a non-private model, a private
    split's scores, or a similarity artifact, which reads the private queries, make it ε = ∞).
    Every row shown is recomputed from the releases its members carry
    (:mod:`synthq.reporting.row_privacy`): seeds and generator replicates from different
    evaluations compose, and a model in several evaluations carries all of their releases, in
    whatever order they are given. Tables show the model's ε and, where it differs, the scores' ε.
"""

from __future__ import annotations

import json

from synthq.artifacts.create import create_artifact
from synthq.artifacts.freshness import existing_result
from synthq.artifacts.manifest import Artifact, open_artifact
from synthq.bookkeeping.inputs import artifact_input
from synthq.bookkeeping.releases import ledger_lines
from synthq.config.evaluation import ReportConfig
from synthq.reporting.eval_files import RESULTS_FILE, SELECTION_FILE
from synthq.reporting.merge import merge_rows
from synthq.reporting.plot import privacy_utility_plot
from synthq.reporting.tables import (
    pairwise_comparisons,
    paper_comparison,
    results_markdown,
    significance_metrics,
    similarity_table,
)
from synthq.runtime.console import result
from synthq.runtime.hashing import json_safe

STAGE = "report"


def run(config: ReportConfig) -> Artifact:
    evals = [artifact_input(path, stage="eval") for path in config.evals]
    similarities = [artifact_input(path, stage="similarity") for path in config.similarity]
    inputs = [a.input_record() for a in evals + similarities]
    if (done := existing_result(STAGE, config, inputs)) is not None:
        return done
    rows, _ = merge_rows(evals)
    found = pairwise_comparisons(rows)
    with create_artifact(config.out, STAGE, config, inputs) as writer:
        sections = [
            results_markdown(rows, title=config.title, found=found),
            "![privacy-utility](privacy_utility.png)\n",
        ]
        for artifact in evals:  # a foreign evaluation's account of its choice is its editor's words
            if artifact.verified and (artifact.path / SELECTION_FILE).is_file():
                sections += [
                    f"## Hyper-parameters chosen on dev ({artifact.path.name})\n",
                    (artifact.path / SELECTION_FILE).read_text(encoding="utf-8"),
                ]
        if similarities:
            sections += ["## Synthetic vs original queries\n", similarity_table(similarities)]
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
        writer.metrics["significance"] = significance_metrics(found)
    result(text, markup=False)
    return open_artifact(config.out, STAGE)
