"""The pylibs dataset (scientific-Python docstrings, users = defining modules): a log of more than
a thousand authors, split by user, its datasheet recomputed from the files, the builder's rules."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import pytest

from synthq.data.sources import declared_splits, load_source, pylibs_dir, resolve_source, source_name
from synthq.data.summary import summarize
from tests.data.shipped import load_builder, query_users

BUILDER = Path(__file__).resolve().parents[2] / "data" / "build_pylibs.py"


@pytest.fixture(scope="module")
def pylibs():
    return load_source("pylibs")  # validates schema, ids and qrels consistency


@pytest.fixture(scope="module")
def builder():
    return load_builder("build_pylibs")


@pytest.fixture(scope="module")
def users() -> dict[str, str]:
    return query_users(pylibs_dir())


def test_named_source_resolves_to_the_shipped_directory():
    assert resolve_source("pylibs") == pylibs_dir()
    assert source_name("pylibs") == "pylibs"


def test_a_log_of_thousands_of_authors(pylibs, users):
    """The issue's floor: >= 5,000 private training queries from >= 1,000 users, >= 1,000 public
    test queries, a private dev split; every query has its user."""
    train_users = {users[q] for q in pylibs.qrels["train"]}
    assert len(pylibs.qrels["train"]) >= 5000 and len(train_users) >= 1000
    assert len(pylibs.qrels["test"]) >= 1000 and len(pylibs.qrels["dev"]) >= 400
    summary = summarize(pylibs)  # what `synthq data info pylibs` prints
    assert not summary["warnings"], summary["warnings"]
    for split in ("train", "dev", "test"):
        assert summary["splits"][split]["users"]["queries_without_user"] == 0
    assert declared_splits(pylibs_dir()) == {"test": "public", "train": "private", "dev": "private"}


def test_users_are_modules_in_one_split_each_with_at_most_the_cap(pylibs, users, builder):
    by_split = {split: Counter(users[q] for q in qrels) for split, qrels in pylibs.qrels.items()}
    for a, b in (("train", "dev"), ("train", "test"), ("dev", "test")):
        assert not set(by_split[a]) & set(by_split[b])
    for counts in by_split.values():
        assert max(counts.values()) <= builder.MAX_PAIRS_PER_USER
    packages = {user.split(".")[0] for user in users.values()}
    assert packages == set(builder.PACKAGES)  # every package contributes, nothing else does


def test_judged_documents_exist_are_bounded_and_do_not_contain_their_query(pylibs, builder):
    for split, qrels in pylibs.qrels.items():
        for query_id, docs in qrels.items():
            query = " ".join(pylibs.queries[query_id].lower().split()).rstrip(".")
            for doc_id in docs:
                document = pylibs.corpus[doc_id]  # KeyError: a judged document is missing
                assert query not in " ".join(document["text"].lower().split()), (split, query_id)
                assert document["title"] == ""
    lengths = [len(doc["text"].split()) for doc in pylibs.corpus.values()]
    assert min(lengths) >= 20 and max(lengths) <= builder.MAX_DOC_WORDS


def test_the_split_rule_fills_dev_then_test_then_train_and_leaves_the_rest_out(builder):
    counts = Counter({f"m{i}": 1 + i % 5 for i in range(4000)})
    splits = builder.assign_splits(counts)
    filled = Counter()
    for user, split in splits.items():
        filled[split] += counts[user]
    assert builder.DEV_TARGET <= filled["dev"] <= builder.DEV_TARGET * 1.1
    assert builder.TEST_TARGET <= filled["test"] <= builder.TEST_TARGET * 1.1
    assert builder.TRAIN_TARGET <= filled["train"] < builder.TRAIN_TARGET + 5
    assert filled["left out"] == sum(counts.values()) - filled["dev"] - filled["test"] - filled["train"]


def test_the_cap_keeps_the_first_pairs_of_a_module_and_as_many_distractors(builder):
    pairs = [{"name": f"m.f{i:02d}", "user": "m", "query": "q", "text": "t"} for i in range(20)]
    extra = [{"name": f"m.d{i}", "user": "m", "query": None, "text": "t"} for i in range(30)]
    stats = {}
    kept, spare = builder.cap_per_user(pairs, extra, stats)
    cap = builder.MAX_PAIRS_PER_USER
    assert [p["name"] for p in kept] == [f"m.f{i:02d}" for i in range(cap)] and len(spare) == cap
    assert stats[f"left out: pairs past {cap} of a module"] == 20 - cap


def test_datasheet_counts_match_the_files(builder):
    sheet = (pylibs_dir() / "README.md").read_text(encoding="utf-8")
    for start, end, block in (
        (builder.COUNTS_START, builder.COUNTS_END, builder.counts_block),
        (builder.PACKAGES_START, builder.PACKAGES_END, builder.packages_block),
    ):
        written = re.search(re.escape(start) + r"\n(.*)\n" + re.escape(end), sheet, re.S)
        assert written, f"{start} block missing from the datasheet"
        assert written.group(1) == block(pylibs_dir())
    build = json.loads((pylibs_dir() / "build.json").read_text(encoding="utf-8"))
    for distribution, version in build["packages"].items():
        assert f"{distribution} {version}" in sheet
    for heading in ("Counts", "Users", "How it was built", "Licence", "Intended use", "biases"):
        assert heading in sheet
