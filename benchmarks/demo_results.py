"""The README's results table, generated from a finished `make demo` run that passed ``--check``.

    python benchmarks/demo_results.py record runs/demo [--wall SECONDS]  # -> demo_results.json
    python benchmarks/demo_results.py readme [PAGE...]                   # the pages' block

``record`` holds the run to its pipeline's ``expected:`` figures (the same check as ``synthq run
pipelines/demo.yaml --check``; it refuses a run that fails it), then keeps what the README shows:
each row's NDCG@10 and Recall@10 with their 95 % bootstrap intervals and ε, exactly as the
report's tables compute them, the Holm-adjusted comparisons of the paper's ordering, when and on
what the run was made. ``readme`` rewrites the block between ``<!-- demo-results:start -->`` and
``<!-- demo-results:end -->`` from that snapshot; ``tests/benchmarks/test_demo_results.py`` fails
when the README's block differs from what the snapshot renders, so no figure there is typed by
hand. ``benchmarks/pipeline_wall.py demo`` records its run this way too.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

ROOT = Path(__file__).resolve().parents[1]
PIPELINE = ROOT / "pipelines" / "demo.yaml"
SNAPSHOT = ROOT / "benchmarks" / "demo_results.json"
README_PATH = ROOT / "README.md"
PAGES = [README_PATH, ROOT / "docs" / "results.md"]  # the pages that show the block
START, END = "<!-- demo-results:start -->", "<!-- demo-results:end -->"

# What each demo row is, in the README's words; the figures come from the run.
LABELS = {
    "ret-original": "original private queries, non-private",
    "ret-syn-eps8": "synthetic, 1 query per public document",
    "ret-dp-group-eps8": "direct DP on the private queries, group clipping",
    "ret-dp-sample-eps8": "direct DP on the private queries, per-query DP-SGD",
    "BM25": "BM25",
    "untrained minilm-l6": "untrained MiniLM-L6 (a strong public retriever)",
    "untrained smollm2-135m-enc-l2": "untrained start (`smollm2-135m-enc-l2`)",
}
# Rows whose learning rate the study chose on the private dev split without noise: their training
# ε is 8, but the configuration is a release no ε counts (`+ selection ∞`, as the study prints).
STUDY_TUNED = {"ret-syn-eps8", "ret-dp-group-eps8", "ret-dp-sample-eps8"}
# The comparisons the README states (better, worse), all Holm-adjusted over every pair.
ORDERING = [
    ("ret-original", "ret-syn-eps8"),
    ("ret-syn-eps8", "ret-dp-group-eps8"),
    ("ret-syn-eps8", "ret-dp-sample-eps8"),
    ("ret-original", "ret-dp-group-eps8"),
    ("ret-dp-group-eps8", "untrained smollm2-135m-enc-l2"),
]


def record(run: Path, wall_seconds: float | None = None) -> dict:
    """The snapshot of a finished demo run at ``run`` (refused unless ``--check`` passes)."""
    from synthq.artifacts.manifest import open_artifact
    from synthq.pipeline.check import check_expected
    from synthq.pipeline.plan import plan_pipeline
    from synthq.reporting.epsilon import epsilon_cell
    from synthq.reporting.merge import merge_rows
    from synthq.reporting.systems import systems
    from synthq.reporting.tables import RESAMPLING_SEED
    from synthq.retrieval.significance import bootstrap_ci

    plan = plan_pipeline(PIPELINE, [f"out={run}"])
    lines, failed = check_expected(plan)
    if failed:
        raise SystemExit("the run fails its check:\n" + "\n".join(lines))
    evaluation = open_artifact(plan.stage("eval-test").out)
    rows = []
    for system in systems(merge_rows([evaluation])[0]):
        row = {"name": system["retriever"], "epsilon": epsilon_cell(system)}
        for metric in ("ndcg@10", "recall@10"):
            low, high = bootstrap_ci(system["per_query"][metric], seed=RESAMPLING_SEED)
            row[metric] = [system["metrics"][metric], low, high]
        rows.append(row)
    rows.sort(key=lambda r: -r["ndcg@10"][0])
    pairs = open_artifact(plan.stage("report").out).metrics["significance"]["embedded"]
    ordering = []
    for better, worse in ORDERING:
        key = f"{better} > {worse}"
        found = pairs.get(key)
        if found is None:  # the run has them the other way round: say so, with the sign
            found = pairs[f"{worse} > {better}"]
            found = {**found, "difference": -found["difference"], "ci": [-found["ci"][1], -found["ci"][0]]}
        ordering.append({"better": better, "worse": worse, **found})
    from benchmarks.collect import machine

    described = machine()
    seconds = wall_seconds
    if seconds is None:  # the stages' own wall times, summed (the run's process adds a little)
        seconds = sum(
            (open_artifact(stage.out, verify=False).manifest.get("timings") or {}).get("wall_seconds", 0.0)
            for stage in plan.stages
        )
    return {
        "measured": {
            "at": time.strftime("%Y-%m-%d", time.gmtime()),
            "cpu": described["cpu"],
            "cores": described["cores"],
            "wall_minutes": round(seconds / 60, 1),
            "timed": "around the process" if wall_seconds is not None else "sum of the stages' wall times",
            "check": "passed",
            "pairs_tested": len(pairs),
        },
        "rows": rows,
        "ordering": ordering,
    }


def render(snapshot: dict) -> str:
    """The README block: the results table, then the comparisons, from a snapshot."""
    measured = snapshot["measured"]
    out = [
        "| retriever (embedded test split, 279 queries) | ε | NDCG@10 [95 % CI] | Recall@10 [95 % CI] |",
        "|---|---|---|---|",
    ]
    for row in snapshot["rows"]:
        epsilon = row["epsilon"] + (" + selection ∞ †" if row["name"] in STUDY_TUNED else "")
        cells = [LABELS.get(row["name"], row["name"]), epsilon]
        cells += [f"{v:.3f} [{lo:.3f}, {hi:.3f}]" for v, lo, hi in (row["ndcg@10"], row["recall@10"])]
        out.append("| " + " | ".join(cells) + " |")
    out += ["", "| comparison (paired, NDCG@10) | Δ [95 % CI] | p (Holm) |", "|---|---|---|"]
    for pair in snapshot["ordering"]:
        significant = pair["p_holm"] <= 0.05 and pair["difference"] > 0
        mark = "**significant**" if significant else "not significant"
        name = f"{_short(pair['better'])} − {_short(pair['worse'])}"
        low, high = pair["ci"]
        interval = f"{pair['difference']:+.3f} [{low:+.3f}, {high:+.3f}]"
        out.append(f"| {name} | {interval} | {pair['p_holm']:.3g} ({mark}) |")
    out += [
        "",
        f"Generated from the `make demo` run of {measured['at']} ({measured['wall_minutes']} minutes, "
        f"{measured['timed']}, on {measured['cores']} cores of an {measured['cpu']}; `--check` "
        f"{measured['check']}; Holm over all {measured['pairs_tested']} pairs) by "
        "`benchmarks/demo_results.py`. † Learning rates are fixed at the values the study chose on the "
        "private dev split without noise: a release no ε counts.",
    ]
    return "\n".join(out)


SHORT = {
    "ret-original": "original ε = ∞",
    "ret-syn-eps8": "synthetic ε = 8",
    "ret-dp-group-eps8": "direct DP group ε = 8",
    "ret-dp-sample-eps8": "direct DP-SGD ε = 8",
    "untrained smollm2-135m-enc-l2": "untrained start",
}


def _short(name: str) -> str:
    return SHORT.get(name, name)


def readme_block(text: str, snapshot: dict) -> str:
    """``text`` with the block between the markers replaced by the snapshot's rendering."""
    pattern = re.compile(re.escape(START) + r".*?" + re.escape(END), re.S)
    if not pattern.search(text):
        raise SystemExit(f"no {START} ... {END} block")
    return pattern.sub(lambda _: f"{START}\n{render(snapshot)}\n{END}", text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    recording = sub.add_parser("record", help="snapshot a finished, checked demo run")
    recording.add_argument("run", type=Path)
    recording.add_argument("--wall", type=float, help="the run's wall seconds, timed around the process")
    writing = sub.add_parser("readme", help="rewrite the pages' results block from the snapshot")
    writing.add_argument("pages", type=Path, nargs="*", default=PAGES)
    args = parser.parse_args()
    if args.command == "record":
        snapshot = record(args.run, args.wall)
        SNAPSHOT.write_text(json.dumps(snapshot, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        print(json.dumps(snapshot["measured"]))
    else:
        snapshot = json.loads(SNAPSHOT.read_text(encoding="utf-8"))
        for page in args.pages:
            page.write_text(readme_block(page.read_text(encoding="utf-8"), snapshot), encoding="utf-8")


if __name__ == "__main__":
    main()
