"""What a large corpus costs a stage: the Arrow cache's build, and what opening it adds afterwards.

    python benchmarks/data_scale.py [--passages 1000000 2000000] [--repeats 3]
        [--compare-with /work/main] [--workdir DIR [--keep-corpora]] [--out x.json]

For each ``--passages`` N it writes a synthetic BEIR directory (N passages of 40-80 words from a
5 000-word vocabulary, N/10 queries, one judgement each: 90 % train, 10 % test), then runs each
operation in a fresh Python process and records its wall time (interpreter start-up and imports
included), its peak RSS (``os.wait4``) and the peaks of its anonymous and file-backed resident
memory (``/proc/PID/status`` every 10 ms; file-backed pages of the mapped cache are the shared
page cache: one copy for every process and torchrun rank on the machine, reclaimable):

* ``build``: ``load_beir_dir`` with an empty cache (one validating pass per file, sorted id
  index, qrels -> row links);
* ``open_rehash``: open after the build with the remembered digests deleted (full sha256 of
  every file, then memory-map);
* ``open_lookup``: open with the cache warm, look up 10 000 random document ids;
* ``pairs``: ``training_pairs`` on the train split, then decode 1 000 pairs drawn by index;
* ``data_info``: ``python -m synthq data info DIR --json``.

The same operations on a 12-passage corpus give the fixed cost of Python and the imports;
``adds`` subtracts it (warm operations alternate between the two corpora ``--repeats`` times and
report medians, so that load from other processes on a shared CPU hits both alike): what the
corpus itself adds to a stage. With ``--compare-with PATH`` (a checkout of the dict-based reader)
``open_lookup`` and ``data_info`` also run once against that code on the same files. Generated
corpora and caches are deleted afterwards unless ``--keep-corpora``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from benchmarks._measure import emit  # noqa: E402

PRELUDE = """
import json, random, sys, time
started = time.perf_counter()
root = sys.argv[1]
out = {}
"""
OPS = {
    "build": """
from synthq.data import load_beir_dir
dataset = load_beir_dir(root)
out["documents"] = len(dataset.corpus)
""",
    "open_rehash": """
from synthq.data import load_beir_dir
dataset = load_beir_dir(root)
""",
    "open_lookup": """
from synthq.data import load_beir_dir
dataset = load_beir_dir(root)
out["open_seconds"] = round(time.perf_counter() - started, 3)
n = len(dataset.corpus)
ids = [f"doc{r:08d}" for r in random.Random(1).choices(range(n), k=10_000)]
t = time.perf_counter()
words = sum(len(dataset.corpus[i]["text"].split()) for i in ids)
out["lookup_10k_seconds"] = round(time.perf_counter() - t, 3)
out["lookup_words"] = words
""",
    "pairs": """
from synthq.data import load_beir_dir, training_pairs
pairs = training_pairs(load_beir_dir(root, splits=["train"]), "train")
t = time.perf_counter()
batch = [pairs[i] for i in random.Random(2).sample(range(len(pairs)), min(1000, len(pairs)))]
out["pairs"] = len(pairs)
out["decode_sample_seconds"] = round(time.perf_counter() - t, 4)
""",
}
EPILOGUE = """
out["inner_seconds"] = round(time.perf_counter() - started, 3)
print(json.dumps(out))
"""


def write_corpus(root: Path, passages: int, seed: int = 0) -> None:
    """N synthetic passages (40-80 words), N/10 queries with one judgement each."""
    rng = random.Random(seed)
    vocabulary = [
        "".join(rng.choices("abcdefghijklmnopqrstuvwxyz", k=rng.randint(3, 9))) for _ in range(5000)
    ]
    (root / "qrels").mkdir(parents=True)
    with open(root / "corpus.jsonl", "w", encoding="utf-8") as handle:
        for i in range(passages):
            text = " ".join(rng.choices(vocabulary, k=rng.randint(40, 80)))
            title = " ".join(rng.choices(vocabulary, k=3))
            handle.write(json.dumps({"_id": f"doc{i:08d}", "title": title, "text": text}) + "\n")
    queries = max(passages // 10, 2)
    with open(root / "queries.jsonl", "w", encoding="utf-8") as handle:
        for q in range(queries):
            handle.write(json.dumps({"_id": f"q{q}", "text": " ".join(rng.choices(vocabulary, k=8))}) + "\n")
    with (
        open(root / "qrels" / "train.tsv", "w") as train,
        open(root / "qrels" / "test.tsv", "w") as test,
    ):
        for handle in (train, test):
            handle.write("query-id\tcorpus-id\tscore\n")
        for q in range(queries):
            (test if q % 10 == 0 else train).write(f"q{q}\tdoc{rng.randrange(passages):08d}\t1\n")


def _rss_parts(pid: int) -> tuple[int, int]:
    """(RssAnon, RssFile) of a live process in kB, from /proc (0, 0 once it is gone)."""
    try:
        fields = dict(
            line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line
        )
        return int(fields["RssAnon"].split()[0]), int(fields["RssFile"].split()[0])
    except (OSError, KeyError, ValueError):
        return 0, 0


def run(code_or_args: list[str], root: Path, env: dict, cwd: Path) -> dict:
    """Run a child: wall time, its own peak RSS (``wait4``), and the peaks of its anonymous and
    file-backed resident memory sampled every 10 ms (mapped cache pages are file-backed: shared
    page cache, one copy for every process that maps the file, reclaimable)."""
    started = time.perf_counter()
    with tempfile.TemporaryFile("w+") as stdout, tempfile.TemporaryFile("w+") as stderr:
        process = subprocess.Popen(
            [sys.executable, *code_or_args, str(root)] if code_or_args[0] == "-c" else code_or_args,
            cwd=cwd,
            env=env,
            stdout=stdout,
            stderr=stderr,
            text=True,
        )
        anon = file = 0
        while True:
            pid, status, usage = os.wait4(process.pid, os.WNOHANG)
            if pid:
                break
            a, f = _rss_parts(process.pid)
            anon, file = max(anon, a), max(file, f)
            time.sleep(0.01)
        process.returncode = os.waitstatus_to_exitcode(status)
        wall = time.perf_counter() - started
        stdout.seek(0), stderr.seek(0)
        out, err = stdout.read(), stderr.read()
    if process.returncode != 0:
        raise RuntimeError(f"{code_or_args[:2]} failed: {err[-2000:]}")
    result = {
        "wall_seconds": round(wall, 3),
        "peak_rss_gb": round(usage.ru_maxrss / 1e6, 4),
        "peak_anon_gb": round(anon / 1e6, 4),
        "peak_file_gb": round(file / 1e6, 4),
    }
    lines = out.strip().splitlines()
    if lines and lines[-1].startswith("{"):
        result.update(json.loads(lines[-1]))
    return result


WARM_OPS = ("open_lookup", "pairs", "data_info")


def op_command(op: str, root: Path) -> list[str]:
    if op == "data_info":
        return [sys.executable, "-m", "synthq", "data", "info", str(root), "--json"]
    return ["-c", PRELUDE + OPS[op] + EPILOGUE]


def environment(cache: Path, repo: Path) -> dict:
    return {**os.environ, "SYNTHQ_CACHE": str(cache), "PYTHONPATH": str(repo), "HF_HUB_OFFLINE": "1"}


def cold(root: Path, cache: Path, repo: Path) -> dict:
    """Build the cache from nothing, then open with the digests forgotten (full re-hash)."""
    env = environment(cache, repo)
    shutil.rmtree(cache, ignore_errors=True)
    results = {"build": run(op_command("build", root), root, env, repo)}
    shutil.rmtree(cache / "arrow" / "digests", ignore_errors=True)
    results["open_rehash"] = run(op_command("open_rehash", root), root, env, repo)
    time.sleep(2.1)  # let freshly written files age past the racy window, then remember digests
    run(op_command("open_rehash", root), root, env, repo)
    return results


def median_run(runs: list[dict]) -> dict:
    return {
        k: round(statistics.median(r[k] for r in runs), 4) for k in runs[0] if isinstance(runs[0][k], float)
    }


def warm(roots: dict[str, tuple[Path, Path]], repo: Path, repeats: int, ops=WARM_OPS) -> dict:
    """Each op ``repeats`` times on every root, interleaved so that load on a shared CPU hits
    the small and the large corpus alike; medians."""
    runs: dict[str, dict[str, list]] = {name: {op: [] for op in ops} for name in roots}
    for _ in range(repeats):
        for op in ops:
            for name, (root, cache) in roots.items():
                runs[name][op].append(run(op_command(op, root), root, environment(cache, repo), repo))
    return {
        name: {op: {**median_run(r), "runs": len(r)} for op, r in by_op.items()}
        for name, by_op in runs.items()
    }


def difference(large: dict, small: dict) -> dict:
    keys = ("wall_seconds", "peak_rss_gb", "peak_anon_gb", "peak_file_gb")
    return {op: {k: round(v[k] - small[op][k], 4) for k in keys if k in v} for op, v in large.items()}


def disk_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--passages", type=int, nargs="+", default=[1_000_000])
    parser.add_argument("--repeats", type=int, default=3, help="runs per warm operation (medians)")
    parser.add_argument("--compare-with", type=Path, help="a checkout with the dict-based reader")
    parser.add_argument("--workdir", type=Path, help="where to write corpora (default: a temp dir)")
    parser.add_argument("--keep-corpora", action="store_true", help="reuse/keep corpus-N in --workdir")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    report = {"cpu_count": os.cpu_count(), "load_average_start": os.getloadavg(), "sizes": {}}
    workdir = (
        args.workdir if args.keep_corpora else Path(tempfile.mkdtemp(prefix="data-scale-", dir=args.workdir))
    )
    try:
        tiny_root, tiny_cache = workdir / "corpus-12", workdir / "cache-12"
        if not tiny_root.is_dir():
            write_corpus(tiny_root, 12)
        report["tiny_cold"] = cold(tiny_root, tiny_cache, REPO)
        for n in args.passages:
            root, cache = workdir / f"corpus-{n}", workdir / f"cache-{n}"
            entry = {}
            if not root.is_dir():
                started = time.perf_counter()
                write_corpus(root, n)
                entry["write_seconds"] = round(time.perf_counter() - started, 1)
            entry["source_bytes"] = disk_bytes(root)
            entry["cold"] = cold(root, cache, REPO)
            entry["cache_bytes"] = disk_bytes(cache)
            both = warm({"tiny": (tiny_root, tiny_cache), "large": (root, cache)}, REPO, args.repeats)
            entry["warm"], entry["tiny_warm"] = both["large"], both["tiny"]
            entry["adds"] = difference(both["large"], both["tiny"])
            entry["adds"].update(difference(entry["cold"], report["tiny_cold"]))
            if args.compare_with:
                old = warm(
                    {"tiny": (tiny_root, tiny_cache), "large": (root, cache)},
                    args.compare_with,
                    1,
                    ("open_lookup", "data_info"),
                )
                entry["dict_reader"] = old["large"]
                entry["dict_reader_adds"] = difference(old["large"], old["tiny"])
            report["sizes"][n] = entry
            shutil.rmtree(cache, ignore_errors=True)
            if not args.keep_corpora:
                shutil.rmtree(root, ignore_errors=True)
            print(json.dumps({n: entry}, indent=2), file=sys.stderr)
    finally:
        if not args.keep_corpora:
            shutil.rmtree(workdir, ignore_errors=True)
    report["load_average_end"] = os.getloadavg()
    text = json.dumps(report, indent=2)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)
    if os.environ.get("SYNTHQ_BENCH_JSON"):  # make bench: what each size adds, for the table
        emit(
            {
                "benchmark": "data_scale",
                "repeats": args.repeats,
                "results": {str(n): entry["adds"] for n, entry in report["sizes"].items()},
            },
            show=False,
        )


if __name__ == "__main__":
    main()
