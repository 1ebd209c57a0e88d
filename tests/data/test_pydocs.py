"""The pydocs dataset (stdlib docstrings): loading, split declaration, users, hygiene, datasheet."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from synthq.data.sources import declared_splits, load_source, pydocs_dir, resolve_source, source_name
from synthq.data.summary import summarize
from tests.data.shipped import load_builder, query_users

BUILDER = Path(__file__).resolve().parents[2] / "data" / "build_pydocs.py"


@pytest.fixture(scope="module")
def pydocs():
    return load_source("pydocs")  # validates schema, ids and qrels consistency


@pytest.fixture(scope="module")
def builder():
    return load_builder("build_pydocs")


@pytest.fixture(scope="module")
def users() -> dict[str, str]:
    return query_users(pydocs_dir())


def test_named_source_resolves_to_the_shipped_directory():
    assert resolve_source("pydocs") == pydocs_dir()
    assert source_name("pydocs") == "pydocs"


def test_counts_and_summary_validate(pydocs):
    assert set(pydocs.splits) == {"train", "dev", "test"}
    assert len(pydocs.qrels["test"]) >= 1000
    assert len(pydocs.qrels["dev"]) >= 150
    assert len(pydocs.qrels["train"]) >= 300
    assert len(pydocs.corpus) <= 8000
    summary = summarize(pydocs)  # what `synthq data info pydocs` prints
    assert not summary["warnings"], summary["warnings"]
    for split in ("train", "dev", "test"):
        assert summary["splits"][split]["users"]["queries_without_user"] == 0


def test_test_is_public_train_and_dev_private():
    assert declared_splits(pydocs_dir()) == {"test": "public", "train": "private", "dev": "private"}


def test_no_user_in_two_splits(pydocs, users):
    by_split = {split: {users[q] for q in qrels} for split, qrels in pydocs.qrels.items()}
    assert not by_split["train"] & by_split["dev"]
    assert not by_split["train"] & by_split["test"]
    assert not by_split["dev"] & by_split["test"]
    # heavy and light users, as in a query log
    assert min(len(v) for v in by_split.values()) >= 10


def test_judged_documents_exist_and_do_not_contain_their_query(pydocs):
    for split, qrels in pydocs.qrels.items():
        for query_id, docs in qrels.items():
            assert docs, query_id
            query = " ".join(pydocs.queries[query_id].lower().split()).rstrip(".")
            for doc_id in docs:
                document = pydocs.corpus[doc_id]  # KeyError: a judged document is missing
                assert query not in " ".join(document["text"].lower().split()), (split, query_id)
                assert document["title"] == ""  # the qualified name would leak the answer


def test_documents_are_sized_for_two_cpu_cores(pydocs):
    lengths = [len(doc["text"].split()) for doc in pydocs.corpus.values()]
    assert min(lengths) >= 20 and max(lengths) <= 200


def test_datasheet_counts_match_the_files(builder):
    sheet = (pydocs_dir() / "README.md").read_text(encoding="utf-8")
    for start, end, block in (
        (builder.COUNTS_START, builder.COUNTS_END, builder.counts_block),
        (builder.USERS_START, builder.USERS_END, builder.users_block),
    ):
        written = re.search(re.escape(start) + r"\n(.*)\n" + re.escape(end), sheet, re.S)
        assert written, f"{start} block missing from the datasheet"
        assert written.group(1) == block(pydocs_dir())
    build = json.loads((pydocs_dir() / "build.json").read_text(encoding="utf-8"))
    assert build["python"] in sheet
    for heading in ("Counts", "Users", "How it was built", "Licence", "PSF", "Intended use", "biases"):
        assert heading in sheet
