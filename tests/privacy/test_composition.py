"""Composition per unit across artifacts: the ledger per private dataset, records that survive a
rewritten path, D and D minus one query, and unit sets shared or made under another key."""

from __future__ import annotations

import math

import pytest

from synthq.artifacts.create import create_artifact
from synthq.bookkeeping.releases import dataset_totals, ledger, ledger_lines
from synthq.config.generator import GenerateConfig
from synthq.data.beir_io import load_beir_dir, write_beir_dir
from synthq.privacy.guarantee import Guarantee
from synthq.stages import generate
from tests.helpers import finetune, private_copy


def test_the_ledger_composes_releases_per_private_dataset(tmp_path, tiny_beir, tiny_causal_dir):
    first = finetune(tmp_path, tiny_beir, tiny_causal_dir, "gen-a", epsilon=4.0, max_steps=2)
    second = finetune(tmp_path, tiny_beir, tiny_causal_dir, "gen-b", epsilon=2.0, max_steps=2)
    totals = dataset_totals([first.path, second.path])
    (total,) = totals.values()
    assert total == pytest.approx(first.privacy.epsilon + second.privacy.epsilon)
    leaky = tmp_path / "similarity"
    with create_artifact(leaky, "similarity", {"x": 1}, [{**first.inputs[0]}]) as writer:
        reads = Guarantee.non_private("reads the private queries", unit="query")
        writer.release(reads, first.inputs[0], ["tr-egg-0-0"])
    assert math.isinf(dataset_totals([first.path, leaky])[str(tiny_beir)])
    text = "\n".join(ledger_lines([first.path, leaky]))
    assert "read WITHOUT DP" in text and "DP release" in text and "is public" in text
    # an assumption both generators make is listed once, with how many make it
    shared = [line for line in ledger_lines([first.path, second.path]) if "(2 artifacts)" in line]
    assert shared and all(shared.count(line) == 1 for line in shared)


def test_the_ledger_keeps_the_record_when_a_path_is_rewritten(tmp_path, tiny_beir, tiny_causal_dir):
    data = private_copy(tmp_path, tiny_beir)
    generator = finetune(tmp_path, data, tiny_causal_dir, "gen", epsilon=8.0, max_steps=2)
    synthetic = generate.run(
        GenerateConfig(
            generator=generator.path, corpus=str(data), out=tmp_path / "syn", max_new_tokens=4, seed=0
        )
    )
    finetune(tmp_path, data, tiny_causal_dir, "gen", epsilon=1.0, max_steps=2, force=True)
    book = ledger([synthetic.path])
    assert book.total.epsilon == pytest.approx(generator.privacy.epsilon)
    text = "\n".join(ledger_lines([synthetic.path]))
    assert "changed since" in text and str(tmp_path / "gen") in text


def test_d_and_d_minus_one_query_compose_on_the_shared_units(tmp_path, tiny_beir, tiny_causal_dir):
    whole = private_copy(tmp_path, tiny_beir, "whole")
    smaller = private_copy(tmp_path, tiny_beir, "smaller")
    dataset = load_beir_dir(smaller)
    train = {q: d for q, d in dataset.qrels["train"].items() if q != "tr-egg-0-0"}
    write_beir_dir(smaller, dataset.corpus, dataset.queries, {**dataset.qrels, "train": train})
    first = finetune(tmp_path, whole, tiny_causal_dir, "gen-d", epsilon=4.0, max_steps=2)
    second = finetune(tmp_path, smaller, tiny_causal_dir, "gen-d-minus-q", epsilon=4.0, max_steps=2)
    book = ledger([first.path, second.path])
    # one log (the same query ids: the directory's edit does not split its ledger entry) ...
    assert len(book.datasets) == 1
    both = first.privacy.epsilon + second.privacy.epsilon
    assert book.total.epsilon == pytest.approx(both)  # ... but the shared queries are at 2ε
