"""The Arrow cache behind BEIR files: same records, lazy lookups, digests, rebuilds, concurrency."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from synthq.data.beir_io import load_beir_dir, read_corpus, read_qrels, write_beir_dir
from synthq.data.pairs import document_text, training_pairs
from synthq.data.store import CACHE_FORMAT, cached_build
from synthq.runtime import file_digests as digests_module
from synthq.runtime.errors import DataError
from synthq.runtime.file_digests import content_digest, file_sha256

ROOT = Path(__file__).resolve().parents[2]


def reference(root: Path) -> tuple[dict, dict, dict]:
    """An independent plain-Python reading of a valid BEIR directory (json and split only)."""
    corpus, queries, qrels = {}, {}, {}
    for line in (root / "corpus.jsonl").read_text(encoding="utf-8").splitlines():
        record = json.loads(line)
        corpus[str(record["_id"])] = {"title": record.get("title") or "", "text": record["text"]}
    for line in (root / "queries.jsonl").read_text(encoding="utf-8").splitlines():
        record = json.loads(line)
        queries[str(record["_id"])] = record["text"]
    for path in sorted((root / "qrels").glob("*.tsv")):
        split = qrels.setdefault(path.stem, {})
        for line in path.read_text(encoding="utf-8").splitlines()[1:]:
            query_id, doc_id, score = line.split("\t")
            split.setdefault(query_id, {})[doc_id] = int(score)
    return corpus, queries, qrels


@pytest.fixture
def cache(tmp_path, monkeypatch):
    path = tmp_path / "cache"
    monkeypatch.setenv("SYNTHQ_CACHE", str(path))
    return path


@pytest.fixture
def unicode_beir(tmp_path):
    corpus = {
        f"d{i:03d}-{'é' * (i % 3)}": {"title": f"T{i}" if i % 2 else "", "text": " ".join(["ü"] * (i + 1))}
        for i in range(50)
    }
    queries = {f"q{i}": f"question {i} ☃" for i in range(20)}
    qrels = {
        "train": {f"q{i}": {f"d{(7 * i) % 50:03d}-{'é' * ((7 * i) % 50 % 3)}": 1 + i % 2} for i in range(15)},
        "test": {"q19": {"d000-": 1, "d001-é": 0}, "q18": {"d002-éé": 2}},
    }
    return write_beir_dir(tmp_path / "unicode", corpus, queries, qrels)


def test_round_trip_equals_an_independent_reader(cache, unicode_beir, tiny_beir):
    for root in (unicode_beir, tiny_beir):
        corpus, queries, qrels = reference(root)
        dataset = load_beir_dir(root)
        assert list(dataset.corpus) == list(corpus)  # file order
        assert dict(dataset.corpus.items()) == corpus and dataset.corpus == corpus
        assert {doc_id: dataset.corpus[doc_id] for doc_id in reversed(list(corpus))} == corpus
        assert dict(dataset.queries) == queries and list(dataset.queries.values()) == list(queries.values())
        assert dataset.splits == sorted(qrels)
        for split, expected in qrels.items():
            assert list(dataset.qrels[split].items()) == list(expected.items())
            assert len(dataset.qrels[split]) == len(expected)
        assert "missing" not in dataset.corpus and 3 not in dataset.corpus
        with pytest.raises(KeyError):
            dataset.corpus["missing"]
        copy = write_beir_dir(
            root.parent / f"{root.name}-copy", dataset.corpus, dataset.queries, dataset.qrels
        )
        assert reference(copy) == (corpus, queries, qrels)


def test_cache_files_open_as_hugging_face_datasets(cache, unicode_beir):
    dataset = load_beir_dir(unicode_beir)
    hf = dataset.corpus.dataset()
    assert hf.column_names == ["_id", "title", "text"] and len(hf) == len(dataset.corpus)
    assert {row["_id"]: {"title": row["title"], "text": row["text"]} for row in hf} == dict(dataset.corpus)


def test_a_repeated_judgement_counts_once_and_two_grades_are_refused(cache, tmp_path, tiny_beir):
    root = tmp_path / "dup"
    shutil.copytree(tiny_beir, root)
    rows = ["query-id\tcorpus-id\tscore", "A\tegg-1\t1", "B\tegg-2\t1", "A\tegg-3\t2", "A\tegg-1\t1"]
    (root / "qrels" / "test.tsv").write_text("\n".join(rows) + "\n")
    qrels = read_qrels(root / "qrels" / "test.tsv")
    assert list(qrels.items()) == [("A", {"egg-1": 1, "egg-3": 2}), ("B", {"egg-2": 1})]
    (root / "qrels" / "test.tsv").write_text("\n".join([*rows[:-1], "A\tegg-1\t0"]) + "\n")
    with pytest.raises(DataError, match=r"test.tsv:5: pair \('A', 'egg-1'\) is judged 1 on line 2 and 0"):
        read_qrels(root / "qrels" / "test.tsv")


@pytest.mark.parametrize(
    ("corpus_lines", "query_lines", "test_qrels", "pattern"),
    [
        # the first problem in file order wins, as with the dict reader
        (
            ['{"_id": "a", "text": "x"}', '{"_id": "a", "text": "y"}', "{"],
            None,
            None,
            r"corpus.jsonl:2: duplicate",
        ),
        (['{"_id": "a", "text": "x"}', '{"_id": "a", "text": ""}'], None, None, r"corpus.jsonl:2: duplicate"),
        (None, None, ["ghost-doc-query\tghost\t1", "ghost\tegg-0\t1"], r"unknown document id 'ghost'"),
        (None, None, ["ghost\tghost-doc\t1", "test-egg-0\tghost-doc\t1"], r"unknown query id 'ghost'"),
        (None, None, ["test-egg-0\tghost-1\t1", "test-egg-0\tghost-2\t1"], r"unknown document id 'ghost-1'"),
    ],
)
def test_first_error_in_file_order(
    cache, tmp_path, tiny_beir, corpus_lines, query_lines, test_qrels, pattern
):
    root = tmp_path / "broken"
    shutil.copytree(tiny_beir, root)
    if corpus_lines:
        (root / "corpus.jsonl").write_text("\n".join(corpus_lines) + "\n")
    if test_qrels:
        with open(root / "queries.jsonl", "a") as handle:
            handle.write(json.dumps({"_id": "ghost-doc-query", "text": "who"}) + "\n")
        (root / "qrels" / "test.tsv").write_text("\n".join(test_qrels) + "\n")
    with pytest.raises(DataError, match=pattern):
        load_beir_dir(root)
    with pytest.raises(DataError, match=pattern):  # an invalid file is never cached
        load_beir_dir(root)


def test_lookups_are_lazy_and_pickle_by_path(cache, unicode_beir):
    dataset = load_beir_dir(unicode_beir)
    corpus = dataset.corpus
    blob = pickle.dumps(corpus)
    assert len(blob) < 1000 and pickle.loads(blob) == corpus
    rows = corpus.index.find_many(["d003-", "nope", "d001-é"])
    assert rows.tolist() == [3, -1, 1]
    assert corpus.row("d049-é") == 49 and corpus.id_at(49) == "d049-é"


def test_sorted_rows_and_batches(cache, unicode_beir):
    corpus = load_beir_dir(unicode_beir).corpus
    assert [corpus.id_at(int(r)) for r in corpus.sorted_rows()] == sorted(corpus)
    batches = list(corpus.batches(16))
    assert [len(ids) for ids, _ in batches] == [16, 16, 16, 2]
    assert [(i, d) for ids, docs in batches for i, d in zip(ids, docs, strict=True)] == list(corpus.items())


def test_training_pairs_is_a_lazy_sequence_equal_to_the_eager_list(cache, unicode_beir):
    dataset = load_beir_dir(unicode_beir)
    corpus, queries, qrels = reference(unicode_beir)
    eager = [
        (q, queries[q], d, document_text(corpus[d]))
        for q, docs in qrels["train"].items()
        for d, r in docs.items()
    ]
    pairs = training_pairs(dataset, "train", min_relevance=2)
    relevant = [e for e in eager if qrels["train"][e[0]][e[2]] >= 2]
    assert 0 < len(relevant) < len(eager)
    assert [(p.query_id, p.query, p.doc_id, p.document) for p in pairs] == relevant
    all_pairs = training_pairs(dataset, "train")
    assert [(p.query_id, p.query, p.doc_id, p.document) for p in all_pairs] == eager
    assert all_pairs[3:5] == list(all_pairs)[3:5] and all_pairs.take([4, 0]) == [all_pairs[4], all_pairs[0]]
    assert pickle.loads(pickle.dumps(all_pairs)) == all_pairs
    with pytest.raises(DataError, match="no relevant"):
        training_pairs(dataset, "test", min_relevance=3)


def test_digest_is_the_full_sha256_and_sees_a_middle_byte(tmp_path, cache):
    import hashlib

    path = tmp_path / "blob"
    data = bytearray(os.urandom(3 << 20))
    path.write_bytes(data)
    assert file_sha256(path) == hashlib.sha256(data).hexdigest()
    before = content_digest(path)
    data[len(data) // 2] ^= 1
    path.write_bytes(data)
    assert content_digest(path) == hashlib.sha256(data).hexdigest() != before


def test_remembered_digest_is_dropped_when_ctime_moves(tmp_path, cache, monkeypatch):
    """Edit the middle of a file, restore size and mtime: ctime still moves, so it is re-hashed."""
    monkeypatch.setattr(digests_module, "RACY_SECONDS", -1.0)  # remember even fresh files
    path = tmp_path / "blob"
    path.write_bytes(b"a" * 1000)
    first = content_digest(path)
    calls = []
    monkeypatch.setattr(digests_module, "file_sha256", lambda p: calls.append(p) or file_sha256(p))
    assert content_digest(path) == first and calls == []  # remembered
    stat = path.stat()
    time.sleep(0.05)
    with open(path, "r+b") as handle:
        handle.seek(500)
        handle.write(b"b")
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert path.stat().st_size == stat.st_size and path.stat().st_mtime_ns == stat.st_mtime_ns
    assert content_digest(path) != first and len(calls) == 1


def test_fresh_files_are_not_remembered(tmp_path, cache, monkeypatch):
    path = tmp_path / "blob"
    path.write_bytes(b"fresh")
    content_digest(path)
    calls = []
    monkeypatch.setattr(digests_module, "file_sha256", lambda p: calls.append(p) or file_sha256(p))
    content_digest(path)
    assert len(calls) == 1  # changed under RACY_SECONDS ago: hashed again


@pytest.mark.slow
def test_large_corpus_edited_in_the_middle_rebuilds(tmp_path, cache):
    """A >16 MiB corpus (beyond the size where artifact hashing samples) edited in the middle,
    same length: the cache key changes and the edited text is what is read."""
    root = tmp_path / "big"
    (root / "qrels").mkdir(parents=True)
    text = " ".join(["lorem"] * 70)
    with open(root / "corpus.jsonl", "w") as handle:
        for i in range(42_000):
            handle.write(json.dumps({"_id": f"doc{i:06d}", "title": "", "text": text}) + "\n")
    size = (root / "corpus.jsonl").stat().st_size
    assert size > 16 << 20
    first = read_corpus(root / "corpus.jsonl")
    raw = bytearray((root / "corpus.jsonl").read_bytes())
    middle = raw.index(b"doc021000")
    at = raw.index(b"lorem", middle)
    raw[at : at + 5] = b"ipsum"
    (root / "corpus.jsonl").write_bytes(raw)
    second = read_corpus(root / "corpus.jsonl")
    assert second.directory != first.directory
    assert second["doc021000"]["text"].startswith("ipsum") and first["doc021000"]["text"].startswith("lorem")
    assert len(list((cache / "arrow").glob("corpus-*"))) == 2


def test_file_changed_during_the_build_is_an_error(tmp_path, cache, monkeypatch, tiny_beir):
    monkeypatch.setattr("synthq.data.beir_io.content_digest", lambda path: "0" * 64)
    with pytest.raises(DataError, match="changed while it was being read"):
        read_corpus(tiny_beir / "corpus.jsonl")
    assert not [p for p in (cache / "arrow").iterdir() if p.name.startswith("corpus-")]


def test_failed_build_leaves_nothing(cache):
    def build(out):
        (out / "part").write_text("x")
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        cached_build("thing", "k", build)
    assert [p.name for p in (cache / "arrow").iterdir()] == [f".thing-v{CACHE_FORMAT}-k.lock"]


CONCURRENT = """
import sys, time
from synthq.data import store
original = store.cached_build
def logged(kind, key, build):
    def slow(out):
        with open(sys.argv[2], "a") as log:
            log.write(kind + "\\n")
        time.sleep(0.2)
        build(out)
    return original(kind, key, slow)
store.cached_build = logged
import synthq.data.beir_io as beir_io
beir_io.cached_build = logged
from synthq.data.beir_io import load_beir_dir
dataset = load_beir_dir(sys.argv[1])
print(len(dataset.corpus), sorted(dataset.corpus)[0], dataset.corpus.directory)
"""


def test_two_processes_build_once_and_share(tmp_path, cache, tiny_beir):
    log = tmp_path / "builds.log"
    env = {**os.environ, "SYNTHQ_CACHE": str(cache), "PYTHONPATH": str(ROOT)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CONCURRENT, str(tiny_beir), str(log)],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    outputs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), outputs
    assert outputs[0][0] == outputs[1][0] and outputs[0][0].startswith("12 ")
    # corpus, queries, three qrels files and three links: each built by one process only
    assert sorted(log.read_text().split()) == sorted(["corpus", "queries"] + ["qrels"] * 3 + ["links"] * 3)
    assert not [p for p in (cache / "arrow").iterdir() if ".tmp-" in p.name]


def test_find_many_agrees_with_find(cache, unicode_beir):
    corpus = load_beir_dir(unicode_beir).corpus
    keys = [*corpus, "x", "", "d0", "d049-éé"]
    assert corpus.index.find_many(keys).tolist() == [corpus.index.find(k) for k in keys]
    assert np.array_equal(corpus.index.find_many(list(corpus)), np.arange(len(corpus)))


def test_opening_a_cached_dataset_imports_neither_pandas_nor_datasets(cache, tiny_beir):
    """pyarrow's to_numpy/pa.array import pandas (~0.5 s, ~30 MB per process): not on the read path."""
    load_beir_dir(tiny_beir)  # build
    code = (
        "import sys\n"
        "from synthq.data.beir_io import load_beir_dir\nfrom synthq.data.pairs import training_pairs\n"
        "from synthq.data.summary import summarize\n"
        f"dataset = load_beir_dir({str(tiny_beir)!r})\n"
        "pairs = training_pairs(dataset, 'train')\n"
        "pairs.take([0, 1]); summarize(dataset); dict(dataset.corpus); dataset.corpus['egg-0']\n"
        "next(dataset.corpus.batches(4))\n"
        "print(sorted(m for m in ('pandas', 'datasets') if m in sys.modules))\n"
    )
    env = {**os.environ, "SYNTHQ_CACHE": str(cache), "PYTHONPATH": str(ROOT)}
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
