"""Named sources: local directories, the embedded set, BEIR downloads (offline errors)."""

from __future__ import annotations

import pytest

from synthq.data import sources as sources_module
from synthq.data.sources import default_eval_split, resolve_source, source_name
from synthq.runtime.errors import DataError


def test_local_directory(tiny_beir):
    assert resolve_source(str(tiny_beir)) == tiny_beir
    assert source_name(str(tiny_beir)) == tiny_beir.name


def test_split_defaults():
    assert default_eval_split("msmarco") == "dev"
    assert default_eval_split("beir:msmarco") == "dev"
    assert default_eval_split("beir:fiqa") == "test"
    assert default_eval_split("embedded") == "test"


def test_unknown_source(tmp_path):
    with pytest.raises(DataError, match="not a directory or known source"):
        resolve_source(str(tmp_path / "nope"))
    with pytest.raises(DataError, match="unknown BEIR dataset 'nope'"):
        resolve_source("beir:nope")


def test_offline_download_error_says_where_to_put_files(monkeypatch, tmp_path):
    def no_network(url, out_dir):
        raise OSError("network unreachable")

    import beir.util

    monkeypatch.setattr(beir.util, "download_and_unzip", no_network)
    with pytest.raises(DataError) as error:
        resolve_source("beir:scifact")
    assert "scifact/corpus.jsonl" in str(error.value) and "by hand" in str(error.value)


def test_downloaded_dataset_is_reused_from_cache(monkeypatch, tiny_beir):
    import shutil

    from synthq.runtime.paths import cache_dir

    target = cache_dir("beir") / "scifact"
    shutil.copytree(tiny_beir, target)
    assert resolve_source("beir:scifact") == target
    assert resolve_source("scifact") == target


def test_download_unzips_into_cache(monkeypatch, tiny_beir):
    import shutil

    import beir.util

    calls = []

    def fake_download(url, out_dir):
        calls.append(url)
        target = f"{out_dir}/fiqa"
        shutil.copytree(tiny_beir, target)
        return target

    monkeypatch.setattr(beir.util, "download_and_unzip", fake_download)
    path = resolve_source("beir:fiqa")
    assert (path / "corpus.jsonl").is_file()
    assert calls == [sources_module.BEIR_URL.format(name="fiqa")]
    resolve_source("beir:fiqa")
    assert len(calls) == 1


def _no_zip(monkeypatch):
    import beir.util

    def no_network(url, out_dir):
        raise OSError("network unreachable")

    monkeypatch.setattr(beir.util, "download_and_unzip", no_network)


def test_offline_error_names_zip_hub_and_local_path(monkeypatch):
    """HF_HUB_OFFLINE=1 (conftest): both the zip and the hub fail; the message says what to do."""
    _no_zip(monkeypatch)
    with pytest.raises(DataError) as error:
        resolve_source("msmarco")
    message = str(error.value)
    assert "msmarco.zip" in message and "BeIR/msmarco" in message
    assert "msmarco/corpus.jsonl exists" in message and "by hand" in message


def _imitate_hub(root, beir):
    """The hub's layout: ``BeIR/<name>`` holds gzipped corpus/queries JSONL declared as configs in
    its README, ``BeIR/<name>-qrels`` the split TSVs (``dev.tsv`` becomes ``validation``)."""
    import gzip
    import shutil

    data, qrels = root / "scifact", root / "scifact-qrels"
    data.mkdir(parents=True)
    for name in ("corpus", "queries"):
        with open(beir / f"{name}.jsonl", "rb") as source, gzip.open(data / f"{name}.jsonl.gz", "wb") as out:
            out.write(source.read())
    (data / "README.md").write_text(
        "---\nconfigs:\n"
        "- config_name: corpus\n  data_files:\n  - split: corpus\n    path: corpus.jsonl.gz\n"
        "- config_name: queries\n  data_files:\n  - split: queries\n    path: queries.jsonl.gz\n---\n"
    )
    shutil.copytree(beir / "qrels", qrels)
    return data, qrels


def test_hub_layout_converts_to_the_same_beir_dataset(monkeypatch, tmp_path, tiny_beir):
    from synthq.data.beir_io import load_beir_dir

    _no_zip(monkeypatch)
    monkeypatch.setenv("SYNTHQ_CACHE", str(tmp_path / "cache"))
    data, qrels = _imitate_hub(tmp_path / "hub", tiny_beir)
    with open(qrels / "test.tsv", "a") as handle:
        handle.write("test-egg-0\tegg-1\t0\n")
    monkeypatch.setattr(sources_module, "HUB_REPO", str(tmp_path / "hub" / "{name}"))
    monkeypatch.setattr(sources_module, "HUB_QRELS_REPO", str(tmp_path / "hub" / "{name}-qrels"))
    path = resolve_source("beir:scifact")
    converted, original = load_beir_dir(path), load_beir_dir(tiny_beir)
    assert converted.splits == ["dev", "test", "train"]
    assert converted.corpus == original.corpus and list(converted.corpus) == list(original.corpus)
    assert converted.queries == original.queries
    assert converted.qrels["train"] == original.qrels["train"]
    assert converted.qrels["dev"] == original.qrels["dev"]
    assert converted.qrels["test"] == {**original.qrels["test"], "test-egg-0": {"egg-0": 1, "egg-1": 0}}
    assert not list(path.parent.glob(".scifact.hub-*"))  # no temporary directory left behind


def test_hub_keeps_string_ids(monkeypatch, tmp_path):
    """Numeric ids with leading zeros survive the hub's CSV type inference."""
    from synthq.data.beir_io import load_beir_dir, write_beir_dir

    _no_zip(monkeypatch)
    monkeypatch.setenv("SYNTHQ_CACHE", str(tmp_path / "cache"))
    beir = write_beir_dir(
        tmp_path / "numeric",
        {"007": {"title": "", "text": "a passage"}, "7": {"title": "t", "text": "another"}},
        {"0001": "a question"},
        {"test": {"0001": {"007": 1, "7": 2}}},
    )
    _imitate_hub(tmp_path / "hub", beir)
    monkeypatch.setattr(sources_module, "HUB_REPO", str(tmp_path / "hub" / "{name}"))
    monkeypatch.setattr(sources_module, "HUB_QRELS_REPO", str(tmp_path / "hub" / "{name}-qrels"))
    converted = load_beir_dir(resolve_source("beir:scifact"))
    assert dict(converted.qrels["test"]) == {"0001": {"007": 1, "7": 2}}
    assert sorted(converted.corpus) == ["007", "7"]


def _fake_ir_datasets(beir_root):
    """An ``ir_datasets`` module serving a local BEIR directory under one id, with the record
    types ir_datasets uses (GenericDoc / GenericQuery / TrecQrel namedtuples)."""
    import types
    from collections import namedtuple

    from synthq.data.beir_io import load_beir_dir

    data = load_beir_dir(beir_root)
    doc, query, qrel = (
        namedtuple("BeirTitleDoc", "doc_id text title"),
        namedtuple("GenericQuery", "query_id text"),
        namedtuple("TrecQrel", "query_id doc_id relevance iteration"),
    )

    class Dataset:
        def has_docs(self):
            return True

        has_queries = has_qrels = has_docs

        def docs_iter(self):
            return (doc(d, data.corpus[d]["text"], data.corpus[d]["title"]) for d in data.corpus)

        def queries_iter(self):
            return (query(q, data.queries[q]) for q in data.qrels["test"])

        def qrels_iter(self):
            return (qrel(q, d, r, "0") for q, docs in data.qrels["test"].items() for d, r in docs.items())

    def load(dataset_id):
        if dataset_id != "beir/tiny/test":
            raise KeyError(dataset_id)
        return Dataset()

    return types.SimpleNamespace(load=load)


def test_ir_datasets_names_are_sources(monkeypatch, tiny_beir):
    import sys

    from synthq.data.beir_io import load_beir_dir

    monkeypatch.setitem(sys.modules, "ir_datasets", _fake_ir_datasets(tiny_beir))
    spec = "irds:beir/tiny/test"
    assert source_name(spec) == "beir-tiny-test" and default_eval_split(spec) == "test"
    assert default_eval_split("irds:msmarco-passage/dev/small") == "dev"
    converted, original = load_beir_dir(resolve_source(spec)), load_beir_dir(tiny_beir)
    assert dict(converted.corpus) == dict(original.corpus)
    assert converted.qrels == {"test": original.qrels["test"]}
    assert {q: converted.queries[q] for q in converted.queries} == {
        q: original.queries[q] for q in original.qrels["test"]
    }
    assert resolve_source(spec) == resolve_source(spec)  # converted once, then the cache
    with pytest.raises(DataError, match="not an ir_datasets id"):
        resolve_source("irds:nope/x")
