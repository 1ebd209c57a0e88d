"""The pylibs-long dataset (pylibs' docstrings kept whole, at the README guide's size): the shipped
corpus of long documents the first hour is measured on. Its documents are long (p95 above 300
tokens of the guide's generator), its splits are by user, and its datasheet is recomputed from
the files."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest

from synthq.data.sources import declared_splits, load_source
from synthq.data.summary import summarize
from synthq.models.defaults import quantile_length
from tests.data.shipped import load_builder, query_users

ROOT = Path(__file__).resolve().parents[2] / "data" / "pylibs-long"


@pytest.fixture(scope="module")
def long_set():
    return load_source(str(ROOT))  # validates schema, ids and qrels consistency


@pytest.fixture(scope="module")
def builder():
    return load_builder("build_pylibs_long")


def test_a_log_of_the_guide_size_split_by_user(long_set, builder):
    users = query_users(ROOT)
    by_split = {split: Counter(users[q] for q in qrels) for split, qrels in long_set.qrels.items()}
    for a, b in (("train", "dev"), ("train", "test"), ("dev", "test")):
        assert not set(by_split[a]) & set(by_split[b])
    assert builder.TRAIN_TARGET <= sum(by_split["train"].values()) < builder.TRAIN_TARGET + 13
    assert len(by_split["train"]) >= 50  # users: DP at the user unit has something to sample
    assert declared_splits(ROOT) == {"test": "public", "train": "private", "dev": "private"}
    summary = summarize(long_set)  # what `synthq data info data/pylibs-long` prints
    assert not summary["warnings"], summary["warnings"]
    judged = {doc for qrels in long_set.qrels.values() for docs in qrels.values() for doc in docs}
    assert judged == set(long_set.corpus)  # no distractors: every document is judged


def test_its_documents_are_long(long_set, builder):
    """p95 of the guide generator's tokens per document above 300 (pylibs' are cut at 128 words)."""
    from transformers import AutoTokenizer

    from synthq.models.resolve import resolve_model

    tokenizer = AutoTokenizer.from_pretrained(resolve_model("smollm2-135m"))
    texts = [doc["text"] for doc in long_set.corpus.values()]
    lengths = [len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]
    assert quantile_length(lengths, cap=10_000) > 300
    assert max(len(text.split()) for text in texts) <= builder.MAX_DOC_WORDS


def test_datasheet_counts_match_the_files(builder):
    sheet = (ROOT / "README.md").read_text(encoding="utf-8")
    start, end = builder.pylibs.COUNTS_START, builder.pylibs.COUNTS_END
    written = re.search(re.escape(start) + r"\n(.*)\n" + re.escape(end), sheet, re.S)
    assert written and written.group(1) == builder.counts_block(ROOT)
    assert f"`{builder.SPLIT_SALT}`" in sheet and "no distractors are kept" in sheet
