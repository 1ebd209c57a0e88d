"""An id with whitespace (issue #74): ``synthq data info`` used to call such a dataset valid, then
``eval`` refused it after scoring every model (a TREC run separates its columns by spaces). Now
``data info`` warns and ``eval`` refuses before any scoring, with the same advice."""

from __future__ import annotations

import shutil

import pytest

from synthq.config.evaluation import EvalConfig
from synthq.data.beir_io import load_beir_dir
from synthq.data.summary import summarize
from synthq.runtime.errors import DataError
from synthq.stages import evaluate
from tests.helpers import run_main


@pytest.fixture
def spaced(tmp_path, tiny_beir):
    root = tmp_path / "spaced"
    shutil.copytree(tiny_beir, root)
    corpus = root / "corpus.jsonl"
    corpus.write_text(corpus.read_text().replace('"egg-0"', '"egg 0"'))
    for qrels in (root / "qrels").glob("*.tsv"):
        qrels.write_text(qrels.read_text().replace("\tegg-0\t", "\tegg 0\t"))
    return root


def test_data_info_reports_an_id_with_whitespace(spaced, capsys, monkeypatch):
    warnings = summarize(load_beir_dir(spaced))["warnings"]
    assert any("document id 'egg 0' holds whitespace" in w for w in warnings)
    status, output = run_main(["data", "info", str(spaced)], capsys, monkeypatch)
    assert status == 0 and "holds whitespace" in output and "valid:" not in output


def test_eval_refuses_an_id_with_whitespace_before_scoring(tmp_path, spaced, tiny_encoder_dir, monkeypatch):
    def never(*args, **kwargs):
        raise AssertionError("scored before the ids were checked")

    monkeypatch.setattr(evaluate, "bm25_search", never)
    with pytest.raises(DataError, match="document id 'egg 0' holds whitespace: eval's TREC run files"):
        evaluate.run(EvalConfig(datasets=[str(spaced)], untrained=[str(tiny_encoder_dir)],
                                out=tmp_path / "ev", device="cpu"))  # fmt: skip
    assert not (tmp_path / "ev").exists()
