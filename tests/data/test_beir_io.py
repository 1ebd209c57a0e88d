"""BEIR reading, writing and every validation error (with file and line)."""

from __future__ import annotations

import json

import pytest

from synthq.data.beir_io import load_beir_dir, write_beir_dir
from synthq.data.pairs import training_pairs
from synthq.data.summary import summarize
from synthq.runtime.errors import DataError


def test_round_trip(tmp_path, tiny_beir):
    dataset = load_beir_dir(tiny_beir)
    assert len(dataset.corpus) == 12 and dataset.splits == ["dev", "test", "train"]
    out = write_beir_dir(tmp_path / "copy", dataset.corpus, dataset.queries, dataset.qrels)
    again = load_beir_dir(out)
    assert again.corpus == dataset.corpus
    assert again.queries == dataset.queries
    assert again.qrels == dataset.qrels


def test_beir_generic_loader_reads_our_output(tmp_path, tiny_beir):
    from beir.datasets.data_loader import GenericDataLoader

    dataset = load_beir_dir(tiny_beir)
    out = write_beir_dir(tmp_path / "copy", dataset.corpus, dataset.queries, dataset.qrels)
    corpus, queries, qrels = GenericDataLoader(str(out)).load(split="test")
    assert len(corpus) == 12 and set(queries) == set(dataset.qrels["test"])
    assert qrels == dataset.qrels["test"]


def test_training_pairs(tiny_beir):
    pairs = training_pairs(load_beir_dir(tiny_beir), "train")
    assert len(pairs) == 17
    first = pairs[0]
    assert first.query == "how long to boil an egg" and first.doc_id == "egg-0"
    assert first.document.startswith("egg Boil eggs")  # BEIR join: title + " " + text
    with pytest.raises(DataError, match="no qrels for split 'nope'"):
        training_pairs(load_beir_dir(tiny_beir), "nope")


def write(path, lines):
    path.write_bytes(b"".join(line if isinstance(line, bytes) else line.encode() + b"\n" for line in lines))


@pytest.fixture
def broken(tmp_path, tiny_beir):
    import shutil

    root = tmp_path / "broken"
    shutil.copytree(tiny_beir, root)
    return root


@pytest.mark.parametrize(
    ("file", "lines", "pattern"),
    [
        (
            "corpus.jsonl",
            ['{"_id": "a", "text": "x"}', '{"_id": "b", "text": '],
            r"corpus.jsonl:2: malformed JSON",
        ),
        ("corpus.jsonl", ['{"_id": "a", "text": "x"}', '{"text": "y"}'], r"corpus.jsonl:2: missing '_id'"),
        ("corpus.jsonl", ['{"_id": "a", "text": "x"}', '{"_id": "a", "text": "y"}'], r":2: duplicate id 'a'"),
        ("corpus.jsonl", ['{"_id": "a", "text": "  "}'], r"corpus.jsonl:1: document 'a' has empty text"),
        ("corpus.jsonl", [b'{"_id": "a", "text": "caf\xe9"}\n'], r"corpus.jsonl:1: not valid UTF-8"),
        ("corpus.jsonl", ["[1, 2]"], r"corpus.jsonl:1: expected a JSON object"),
        ("corpus.jsonl", [""], r"corpus.jsonl: corpus is empty"),
        ("queries.jsonl", ['{"_id": "q", "text": ""}'], r"queries.jsonl:1: query 'q' has empty text"),
        (
            "qrels/test.tsv",
            ["query-id\tcorpus-id\tscore", "q1\tegg-0"],
            r"test.tsv:2: expected 3 tab-separated",
        ),
        ("qrels/test.tsv", ["test-egg-0\tegg-0\thigh"], r"test.tsv:1: relevance 'high' is not a number"),
        # int() truncated 0.5 to 0 and the judged query vanished from eval (fault pass, round 4)
        # a pair judged 1 then 0 was read as 0 without a word (fault pass, round 4)
        (
            "qrels/test.tsv",
            ["query-id\tcorpus-id\tscore", "test-egg-0\tegg-0\t1", "test-egg-0\tegg-0\t0"],
            r"test.tsv:3: pair \('test-egg-0', 'egg-0'\) is judged 1 on line 2 and 0 here",
        ),
        (
            "qrels/test.tsv",
            ["query-id\tcorpus-id\tscore", "test-egg-0\tegg-0\t0.5"],
            r"test.tsv:2: relevance '0.5' is not a whole grade",
        ),
        ("qrels/test.tsv", ["ghost\tegg-0\t1"], r"test.tsv: split 'test' names unknown query id 'ghost'"),
        ("qrels/test.tsv", ["test-egg-0\tghost\t1"], r"names unknown document id 'ghost'"),
    ],
)
def test_validation_errors_name_file_and_line(broken, file, lines, pattern):
    write(broken / file, lines)
    with pytest.raises(DataError, match=pattern):
        load_beir_dir(broken)


def test_a_byte_order_mark_before_the_qrels_header_is_read_as_the_header(broken):
    lines = (broken / "qrels" / "test.tsv").read_text().splitlines()
    write(broken / "qrels" / "test.tsv", ["\ufeff" + lines[0], *lines[1:]])
    dataset = load_beir_dir(broken)
    assert len(dataset.qrels["test"]) == len(lines) - 1
    assert all(relevance == 1 for docs in dataset.qrels["test"].values() for relevance in docs.values())


def test_a_whole_grade_written_as_a_float_is_that_grade(broken):
    lines = (broken / "qrels" / "test.tsv").read_text().splitlines()
    query, doc, _ = lines[1].split("\t")
    write(broken / "qrels" / "test.tsv", [lines[0], f"{query}\t{doc}\t2.0", *lines[2:]])
    assert load_beir_dir(broken).qrels["test"][query][doc] == 2


def test_missing_files(tmp_path, broken):
    (broken / "queries.jsonl").unlink()
    with pytest.raises(DataError, match=r"queries.jsonl: file not found"):
        load_beir_dir(broken)
    with pytest.raises(DataError, match="dataset directory not found"):
        load_beir_dir(tmp_path / "nowhere")
    with pytest.raises(DataError, match="qrels/x.tsv: file not found"):
        load_beir_dir(broken.parent / "missing-split", splits=None) if False else None
        from synthq.data.beir_io import read_qrels

        read_qrels(broken / "qrels" / "x.tsv")


def test_summary_counts_and_warnings(broken):
    summary = summarize(load_beir_dir(broken))
    assert summary["documents"] == 12
    assert summary["splits"]["train"] == {"queries": 17, "judgements": 17, "documents": 12}
    assert summary["warnings"] == []
    with open(broken / "queries.jsonl", "a") as handle:
        handle.write(json.dumps({"_id": "orphan", "text": "how long to boil an egg"}) + "\n")
    with open(broken / "qrels" / "test.tsv", "a") as handle:
        handle.write("orphan\tegg-0\t1\n")
    summary = summarize(load_beir_dir(broken))
    assert any("both test and train" in w for w in summary["warnings"])
