"""Named sources: local directories, the embedded set, BEIR downloads (offline errors)."""

from __future__ import annotations

import pytest

from synthq.data import default_eval_split, resolve_source, source_name
from synthq.data import sources as sources_module
from synthq.errors import DataError


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

    from synthq.paths import cache_dir

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
