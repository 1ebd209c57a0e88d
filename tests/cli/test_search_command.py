"""``synthq search``: its options, generated from :class:`synthq.config.search.SearchConfig`, reach
the search as they did when they were written by hand."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from synthq.cli.app import app

runner = CliRunner()


def fake_search(calls: list):
    def search(retriever, corpus, queries, top_k=10, device="auto"):
        calls.append({"retriever": retriever, "corpus": corpus, "queries": queries, "top_k": top_k,
                      "device": device})  # fmt: skip
        return [
            [{"doc_id": f"d{i}", "score": 0.5, "title": "T", "text": "body"}] for i, _ in enumerate(queries)
        ]

    return search


def test_words_are_one_query_with_the_defaults(monkeypatch):
    from synthq import search

    calls = []
    monkeypatch.setattr(search, "search", fake_search(calls))
    result = runner.invoke(app, ["search", "--retriever", "r", "boil", "an egg"])
    assert result.exit_code == 0, result.output
    assert calls == [
        {"retriever": "r", "corpus": "embedded", "queries": ["boil an egg"], "top_k": 10, "device": "auto"}
    ]
    assert "boil an egg" in result.output and "1. 0.5000  d0  T: body" in result.output


def test_each_json_and_every_option(monkeypatch):
    from synthq import search

    calls = []
    monkeypatch.setattr(search, "search", fake_search(calls))
    argv = ["search", "--retriever", "r", "--corpus", "c", "--top-k", "3", "--device", "cpu", "--each",
            "--json", "a, b", "c"]  # fmt: skip
    result = runner.invoke(app, argv)
    assert result.exit_code == 0, result.output
    assert calls == [{"retriever": "r", "corpus": "c", "queries": ["a, b", "c"], "top_k": 3, "device": "cpu"}]
    hits = [json.loads(line) for line in result.output.splitlines()]
    assert [(h["query"], h["rank"], h["doc_id"]) for h in hits] == [("a, b", 1, "d0"), ("c", 1, "d1")]


def test_a_bad_option_is_refused_before_searching(monkeypatch):
    from synthq import search
    from synthq.cli.options import OptionError

    calls = []
    monkeypatch.setattr(search, "search", fake_search(calls))
    for option, value in (("--top-k", "0"), ("--device", "gpu")):
        result = runner.invoke(app, ["search", "--retriever", "r", option, value, "q"])
        assert isinstance(result.exception, OptionError) and str(result.exception).startswith(f"{option}: ")
    assert calls == []
