"""Stages on awkward inputs: a one-query split still plots, and lengths beyond an encoder's positions
are clamped."""

from __future__ import annotations

import shutil

import pytest

from synthq.config.evaluation import EvalConfig
from synthq.stages import evaluate, train_retriever
from tests.helpers import retriever_config


def test_eval_on_a_one_query_split_plots(tmp_path, tiny_beir, tiny_encoder_dir):
    data = tmp_path / "one"
    shutil.copytree(tiny_beir, data)
    lines = (data / "qrels" / "test.tsv").read_text().splitlines()
    (data / "qrels" / "test.tsv").write_text("\n".join(lines[:2]) + "\n")
    retriever = train_retriever.run(retriever_config(tmp_path / "ret", data, tiny_encoder_dir))
    config = EvalConfig(out=tmp_path / "ev", retrievers=[str(retriever.path)], datasets=[str(data)])
    result = evaluate.run(config)
    assert (result.path / "privacy_utility.png").stat().st_size > 1000


@pytest.mark.parametrize("dp", [None, "sample", "group"])
def test_lengths_beyond_the_encoders_positions_are_clamped(tmp_path, tiny_beir, tiny_encoder_dir, dp, capsys):
    import json

    data = tmp_path / "long"
    shutil.copytree(tiny_beir, data)
    records = [json.loads(line) for line in (data / "corpus.jsonl").read_text().splitlines()]
    for record in records:
        record["text"] = " ".join([record["text"]] * 80)  # far beyond 512 tokens
    (data / "corpus.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    options = {"max_doc_length": 2000} | ({"dp": dp, "epsilon": 8} if dp else {})
    artifact = train_retriever.run(retriever_config(tmp_path / "ret", data, tiny_encoder_dir, **options))
    assert artifact.config["max_doc_length"] == 2000  # the artifact records what was asked
    error = capsys.readouterr().err
    assert "beyond" in error and "using 512" in error
