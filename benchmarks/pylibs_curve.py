"""The curve of what a private log buys against its size: from an eval of `pipelines/pylibs-curve.yaml`.

    .venv/bin/python benchmarks/pylibs_curve.py runs/pylibs-curve/eval-test runs/pylibs-curve-1000/eval-test \
        runs/pylibs-synthetic/eval-test runs/pylibs-combination/eval-test runs/pylibs-longer/eval-test \
        runs/pylibs-curve-synthetic/eval-test --users u100=100 --users u1000=1000 --users uall=1404 \
        --group "syn=ret-syn-eps8-g*-cf@uall" --group "warm-start, ε = 0=ret-syn-warm-cf@uall" \
        --group "both=ret-warm-then-dp@uall" --group "synthetic, retriever 3 epochs=ret-long-eps8-g*@uall" \
        --group "synthetic, retriever 3 epochs=ret-syn-u1000@u1000" \
        --group "synthetic, retriever 3 epochs=ret-syn-u100@u100" \
        --group "warm-start, ε = 0, retriever 3 epochs=ret-long-warm@uall" --plot docs/images/pylibs-curve.png

For each log size n (rows named ``ret-<route>-<tag>``; ``np`` is non-private training on those n
users' queries), each route's share of the non-private gain over the untrained start,
``(route - untrained) / (non-private - untrained)`` in NDCG@10 on the public test split, with a
paired bootstrap interval over test queries (the shares of one resample, 2,000 resamples, seed 0),
and the route's paired difference from the untrained start. Several evaluations of the same test
split are merged; ``--group ROUTE=GLOB@TAG`` makes the retrievers matching GLOB one route at log
size TAG, their per-query scores averaged (replicate generators: the mean over generators, as the
report merges them). Prints one JSON object; ``--plot`` draws the shares against n.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
from pathlib import Path

import numpy as np

UNTRAINED = "untrained minilm-l6"
LABELS = {"dp": "direct DP, group clipping", "syn": "synthetic", "both": "synthetic, then direct DP"}
RESAMPLES = 2000


def per_query(eval_dirs: list[Path], dataset: str) -> dict[str, np.ndarray]:
    """Retriever -> per-query NDCG@10 over the test queries, in one query order, from one or more
    evaluations of the same split (the first that scores a retriever gives it)."""
    rows: dict = {}
    for eval_dir in eval_dirs:
        scored = json.loads((eval_dir / "per_query.json").read_text(encoding="utf-8"))[dataset]
        rows.update({name: value for name, value in scored.items() if name not in rows})
    queries = sorted(rows[UNTRAINED]["ndcg@10"])
    for name, scores in rows.items():
        if sorted(scores["ndcg@10"]) != queries:
            raise SystemExit(f"{name}: scored on other queries than {UNTRAINED}")
    return {name: np.array([scores["ndcg@10"][q] for q in queries]) for name, scores in rows.items()}


def grouped(scores: dict[str, np.ndarray], groups: list[str]) -> dict[str, np.ndarray]:
    """``ROUTE=GLOB@TAG`` -> a route ``ret-ROUTE-TAG`` whose per-query score is the mean of the
    retrievers matching GLOB (which leave the table)."""
    out = dict(scores)
    for spec in groups:
        route, _, rest = spec.rpartition("=")  # a route name may hold "=" (ε = 8)
        pattern, _, tag = rest.rpartition("@")
        members = sorted(name for name in scores if fnmatch.fnmatch(name, pattern))
        if not members:
            raise SystemExit(f"--group {spec}: no retriever matches {pattern}")
        out[f"ret-{route}-{tag}"] = np.mean([scores[name] for name in members], axis=0)
        for name in members:
            out.pop(name, None)
    return {name: values for name, values in out.items() if name.startswith("ret-") or name == UNTRAINED}


def curve(scores: dict[str, np.ndarray], users: dict[str, int]) -> list[dict]:
    """One row per (route, n): mean NDCG@10, the share of the non-private gain and its interval."""
    rng = np.random.default_rng(0)
    start = scores[UNTRAINED]
    draws = rng.integers(0, len(start), size=(RESAMPLES, len(start)))
    rows = []
    for tag, n in sorted(users.items(), key=lambda item: item[1]):
        reference = scores.get(f"ret-np-{tag}")
        if reference is None:
            continue
        gain = reference - start
        for name, values in sorted(scores.items()):
            if not name.endswith(f"-{tag}") or name == f"ret-np-{tag}":
                continue
            route = name[len("ret-") : -len(f"-{tag}")]
            shares = (values - start)[draws].mean(axis=1) / gain[draws].mean(axis=1)
            difference = (values - start)[draws].mean(axis=1)
            rows.append(
                {
                    "route": route,
                    "users": n,
                    "ndcg@10": round(float(values.mean()), 4),
                    "non_private": round(float(reference.mean()), 4),
                    "untrained": round(float(start.mean()), 4),
                    "share_of_gain": round(float((values - start).mean() / gain.mean()), 3),
                    "share_interval": [round(float(x), 3) for x in np.percentile(shares, [2.5, 97.5])],
                    "minus_untrained": round(float((values - start).mean()), 4),
                    "minus_untrained_interval": [
                        round(float(x), 4) for x in np.percentile(difference, [2.5, 97.5])
                    ],
                }
            )
    return rows


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(6, 4))
    for route in sorted({row["route"] for row in rows}):
        mine = sorted((row for row in rows if row["route"] == route), key=lambda row: row["users"])
        n = [row["users"] for row in mine]
        share = [100 * row["share_of_gain"] for row in mine]
        low = [100 * (row["share_of_gain"] - row["share_interval"][0]) for row in mine]
        high = [100 * (row["share_interval"][1] - row["share_of_gain"]) for row in mine]
        axes.errorbar(n, share, yerr=[low, high], marker="o", capsize=3, label=LABELS.get(route, route))
    axes.axhline(0, color="grey", linewidth=0.8)
    axes.axhline(100, color="grey", linewidth=0.8, linestyle="--")
    axes.set_xscale("log")
    axes.set_xlabel("private users in the log (ε = 8 per user)")
    axes.set_ylabel("share of the non-private gain (%)")
    axes.set_title("pylibs, from MiniLM-L6: NDCG@10 on 1,056 public test queries")
    axes.legend()
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("eval_dirs", type=Path, nargs="+", help="eval artifacts of the same test split")
    parser.add_argument("--dataset", default="pylibs")
    parser.add_argument("--users", action="append", default=[], help="TAG=N: the log size behind rows *-TAG")
    parser.add_argument("--group", action="append", default=[], help="ROUTE=GLOB@TAG: replicates, one route")
    parser.add_argument("--plot", type=Path)
    args = parser.parse_args()
    users = {tag: int(n) for tag, n in (item.split("=", 1) for item in args.users)}
    rows = curve(grouped(per_query(args.eval_dirs, args.dataset), args.group), users)
    if args.plot:
        plot(rows, args.plot)
    evals = [str(path) for path in args.eval_dirs]
    summary = {"benchmark": "pylibs_curve", "evals": evals, "groups": args.group, "rows": rows}
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
