"""A corpus or query file whose fields are not JSON strings is refused through the command line:
one line naming file:line and the field's JSON type, never stored as a Python repr, never called
"empty text"."""

from __future__ import annotations

import json
import shutil

import pytest

from tests.helpers import one_line, run_main

BAD_FIELDS = [
    ("corpus.jsonl", "text", ["Poached eggs", "toast"], "'text' is a list"),
    ("corpus.jsonl", "text", {"a": 1}, "'text' is an object"),
    ("corpus.jsonl", "text", True, "'text' is true/false"),
    ("corpus.jsonl", "text", 0, "'text' is a number"),
    ("corpus.jsonl", "title", ["Poached eggs"], "'title' is a list"),
    ("corpus.jsonl", "_id", 7, "'_id' is a number"),
    ("queries.jsonl", "text", ["how", "to"], "'text' is a list"),
    ("queries.jsonl", "text", 0, "'text' is a number"),
    ("queries.jsonl", "_id", ["q"], "'_id' is a list"),
]


def _with_field(tmp_path, tiny_beir, filename: str, field: str, value) -> tuple:
    root = tmp_path / "data"
    shutil.copytree(tiny_beir, root)
    path = root / filename
    lines = path.read_text(encoding="utf-8").splitlines()
    record = json.loads(lines[1])
    record[field] = value
    lines[1] = json.dumps(record)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return root, path


@pytest.mark.parametrize(("filename", "field", "value", "words"), BAD_FIELDS)
def test_a_non_string_field_is_refused_with_file_line_and_type(
    filename, field, value, words, tmp_path, tiny_beir, capsys, monkeypatch
):
    root, path = _with_field(tmp_path, tiny_beir, filename, field, value)
    status, output = run_main(["data", "info", str(root)], capsys, monkeypatch)
    line = one_line(output)
    assert status == 2
    assert f"{path}:2: " in line
    assert words in line
    assert "empty text" not in line
    if isinstance(value, list | dict):  # the type is named, the (possibly private) words are not
        assert json.dumps(value)[1:-1] not in line


def test_null_title_and_a_numeric_user_id_are_still_read(tmp_path, tiny_beir):
    from synthq.data.beir_io import read_corpus, read_queries

    root, corpus_path = _with_field(tmp_path, tiny_beir, "corpus.jsonl", "title", None)
    queries_path = root / "queries.jsonl"
    lines = queries_path.read_text(encoding="utf-8").splitlines()
    record = json.loads(lines[0])
    record["metadata"] = {"user_id": 42}
    lines[0] = json.dumps(record)
    queries_path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    doc_id = json.loads(corpus_path.read_text().splitlines()[1])["_id"]
    assert read_corpus(corpus_path)[doc_id]["title"] == ""
    queries = read_queries(queries_path)
    assert queries.table.column("user_id")[0].as_py() == "42"
