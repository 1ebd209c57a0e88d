"""What a large corpus costs a stage: the Arrow cache's build, and what opening it adds afterwards.

    python benchmarks/data_scale.py [--passages 1000000 2000000] [--compare-with /work/main] [--out x.json]

For each ``--passages`` N it writes a synthetic BEIR directory (N passages of 40-80 words from a
5 000-word vocabulary, N/10 queries, one judgement each: 90 % train, 10 % test) into a temporary
directory, then runs every operation in a fresh Python process and reads that process's own peak
RSS (``os.wait4``) and wall time (interpreter start-up and imports included):

* ``build``: ``load_beir_dir`` with an empty cache (one validating pass per file, sorted id
  index, qrels -> row links);
* ``open_rehash``: open after the build with the remembered digests deleted (full sha256 of
  every file, then memory-map);
* ``open_lookup``: open with the cache warm, look up 10 000 random document ids;
* ``data_info``: ``python -m synthq data info DIR --json``;
* ``pairs``: ``training_pairs`` on the train split, then decode 1 000 pairs drawn by index;
* ``length_sorted``: the first length-sorted shard of 10 000 documents (what generate needs).

The same operations on a 12-passage corpus give the fixed cost of Python and the imports;
``adds_*`` subtracts it, which is what the corpus itself adds to a stage. With
``--compare-with PATH`` (a checkout of the dict-based reader) ``open_lookup`` and ``data_info``
also run against that code on the same files. Generated files and caches are deleted afterwards.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

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
    "length_sorted": """
from synthq.data.beir_io import read_corpus
corpus = read_corpus(root + "/corpus.jsonl")
shard = next(corpus.length_sorted_shards(shard_size=10_000))
out["shard"] = len(shard)
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


def run(code_or_args: list[str], root: Path, env: dict, cwd: Path) -> dict:
    """Run a child; its own peak RSS from ``wait4`` and wall time, plus what it printed."""
    started = time.perf_counter()
    process = subprocess.Popen(
        [sys.executable, *code_or_args, str(root)] if code_or_args[0] == "-c" else code_or_args,
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    stdout, stderr = process.stdout.read(), process.stderr.read()
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - started
    if process.returncode != 0:
        raise RuntimeError(f"{code_or_args[:2]} failed: {stderr[-2000:]}")
    result = {"wall_seconds": round(wall, 3), "peak_rss_gb": round(usage.ru_maxrss / 1e6, 4)}
    lines = stdout.strip().splitlines()
    if lines and lines[-1].startswith("{"):
        result.update(json.loads(lines[-1]))
    return result


def measure_all(root: Path, cache: Path, repo: Path, cli_only: bool = False) -> dict:
    env = {**os.environ, "SYNTHQ_CACHE": str(cache), "PYTHONPATH": str(repo), "HF_HUB_OFFLINE": "1"}
    results = {}
    info = [sys.executable, "-m", "synthq", "data", "info", str(root), "--json"]
    if cli_only:  # the dict-based reader: no cache to build
        code = PRELUDE + OPS["open_lookup"] + EPILOGUE
        results["open_lookup"] = run(["-c", code], root, env, repo)
        results["data_info"] = run(info, root, env, repo)
        return results
    shutil.rmtree(cache, ignore_errors=True)
    results["build"] = run(["-c", PRELUDE + OPS["build"] + EPILOGUE], root, env, repo)
    shutil.rmtree(cache / "arrow" / "digests", ignore_errors=True)
    results["open_rehash"] = run(["-c", PRELUDE + OPS["open_rehash"] + EPILOGUE], root, env, repo)
    time.sleep(2.1)  # let freshly written files age past the racy window once
    run(["-c", PRELUDE + OPS["open_rehash"] + EPILOGUE], root, env, repo)
    for name in ("open_lookup", "pairs", "length_sorted"):
        results[name] = run(["-c", PRELUDE + OPS[name] + EPILOGUE], root, env, repo)
    results["data_info"] = run(info, root, env, repo)
    return results


def disk_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--passages", type=int, nargs="+", default=[1_000_000])
    parser.add_argument("--compare-with", type=Path, help="a checkout with the dict-based reader")
    parser.add_argument("--workdir", type=Path, help="where to write corpora (default: a temp dir)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    report = {"cpu_count": os.cpu_count(), "sizes": {}}
    workdir = Path(tempfile.mkdtemp(prefix="data-scale-", dir=args.workdir))
    try:
        tiny_root = workdir / "tiny"
        write_corpus(tiny_root, 12)
        tiny = measure_all(tiny_root, workdir / "cache-tiny", REPO)
        report["tiny"] = tiny
        for n in args.passages:
            root = workdir / f"corpus-{n}"
            started = time.perf_counter()
            write_corpus(root, n)
            entry = {"write_seconds": round(time.perf_counter() - started, 1)}
            entry["source_bytes"] = disk_bytes(root)
            entry["ops"] = measure_all(root, workdir / "cache", REPO)
            entry["cache_bytes"] = disk_bytes(workdir / "cache")
            entry["adds"] = {
                op: {
                    "peak_rss_gb": round(value["peak_rss_gb"] - tiny[op]["peak_rss_gb"], 4),
                    "wall_seconds": round(value["wall_seconds"] - tiny[op]["wall_seconds"], 3),
                }
                for op, value in entry["ops"].items()
            }
            if args.compare_with:
                old = args.compare_with
                entry["dict_reader"] = measure_all(root, workdir / "cache-old", old, cli_only=True)
                old_tiny = measure_all(tiny_root, workdir / "cache-old", old, cli_only=True)
                entry["dict_reader_adds"] = {
                    op: {
                        "peak_rss_gb": round(value["peak_rss_gb"] - old_tiny[op]["peak_rss_gb"], 4),
                        "wall_seconds": round(value["wall_seconds"] - old_tiny[op]["wall_seconds"], 3),
                    }
                    for op, value in entry["dict_reader"].items()
                }
            report["sizes"][n] = entry
            shutil.rmtree(root, ignore_errors=True)
            shutil.rmtree(workdir / "cache", ignore_errors=True)
            print(json.dumps({n: entry}, indent=2), file=sys.stderr)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    text = json.dumps(report, indent=2)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
