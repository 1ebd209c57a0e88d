"""The embedded dataset: schema, ids, counts, split hygiene and non-trivial retrieval."""

from __future__ import annotations

import re
from collections import Counter

import pytest

from synthq.data.sources import embedded_dir, load_source


@pytest.fixture(scope="module")
def embedded():
    return load_source("embedded")  # validates schema, ids and qrels consistency


def tokens(text: str) -> set[str]:
    return set(re.findall(r"[a-z0-9]+", text.lower()))


def test_counts(embedded):
    assert len(embedded.corpus) >= 600
    assert set(embedded.splits) == {"train", "dev", "test"}
    train = embedded.qrels["train"]
    assert len(train) >= 1200
    assert len({doc for docs in train.values() for doc in docs}) >= 500
    assert len(embedded.qrels["dev"]) >= 100
    assert len(embedded.qrels["test"]) >= 250
    assert any(len(docs) > 1 for docs in embedded.qrels["test"].values())
    assert any(len(docs) > 1 for docs in embedded.qrels["dev"].values())


def test_passages_are_web_passage_sized_and_cover_many_topics(embedded):
    lengths = [len(doc["text"].split()) for doc in embedded.corpus.values()]
    assert min(lengths) >= 40 and max(lengths) <= 120
    topics = Counter(doc_id.rsplit("-", 1)[0] for doc_id in embedded.corpus)
    assert len(topics) >= 25
    assert min(topics.values()) >= 10  # every topic has near-miss neighbours


def test_splits_are_disjoint_and_not_near_copies(embedded):
    texts = {
        split: {embedded.queries[q].strip().lower() for q in qrels} for split, qrels in embedded.qrels.items()
    }
    assert not texts["train"] & texts["test"]
    assert not texts["train"] & texts["dev"]
    assert not texts["dev"] & texts["test"]
    train_token_sets = [tokens(t) for t in texts["train"]]
    for text in texts["test"] | texts["dev"]:
        query_tokens = tokens(text)
        for train_tokens in train_token_sets:
            union = query_tokens | train_tokens
            assert len(query_tokens & train_tokens) / len(union) < 0.8, f"near copy of a train query: {text}"


def test_no_evaluation_query_appears_verbatim_in_a_passage(embedded):
    passages = [doc["text"].lower() for doc in embedded.corpus.values()]
    for split in ("dev", "test"):
        for query_id in embedded.qrels[split]:
            query = embedded.queries[query_id].lower()
            assert not any(query in passage for passage in passages), query


def test_retrieval_is_not_trivial(embedded):
    """Many test queries share few words with their passage (paraphrases, not keyword copies)."""
    overlaps = []
    for query_id, docs in embedded.qrels["test"].items():
        query_tokens = tokens(embedded.queries[query_id])
        doc_tokens = set().union(*(tokens(embedded.corpus[d]["text"]) for d in docs))
        overlaps.append(len(query_tokens & doc_tokens) / max(len(query_tokens), 1))
    low_overlap = sum(o <= 0.5 for o in overlaps) / len(overlaps)
    assert low_overlap >= 0.3


def test_datasheet_exists_with_counts():
    sheet = (embedded_dir() / "README.md").read_text(encoding="utf-8")
    for heading in ("Counts", "Topics", "How it was written", "Licence", "Limitations"):
        assert heading in sheet
