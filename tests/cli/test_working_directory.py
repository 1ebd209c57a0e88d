"""Input paths are recorded so that the ledger, freshness and the likelihood filter are right from
any working directory: a chain written with relative paths from one directory and read from
another must not be reported as "changed since", "gone" or "rewritten since"."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from synthq.artifacts.freshness import check_resumable
from synthq.artifacts.manifest import MANIFEST, open_artifact, write_manifest
from synthq.bookkeeping.releases import ledger_lines
from synthq.config.generator import FinetuneConfig, GenerateConfig
from synthq.runtime.errors import ArtifactError
from synthq.runtime.hashing import config_to_dict, sha256_file
from synthq.stages import finetune_lm, generate
from tests.helpers import run_main


@pytest.fixture(scope="module")
def chain(tmp_path_factory, tiny_beir, tiny_causal_dir):
    """finetune-lm -> generate, run from ``project/`` with relative paths (as ``synthq`` would)."""
    project = tmp_path_factory.mktemp("wd") / "project"
    shutil.copytree(tiny_beir, project / "data")
    before = os.getcwd()
    os.chdir(project)
    try:
        finetune_lm.run(
            FinetuneConfig(data="data", model=str(tiny_causal_dir), out="runs/gen", epsilon=8.0, max_steps=2,
                           batch_size=4, physical_batch_size=4, max_source_length=48)
        )  # fmt: skip
        generate.run(
            GenerateConfig(generator="runs/gen", corpus="data", out="runs/syn", num_queries=2,
                           max_new_tokens=4, seed=0)
        )  # fmt: skip
    finally:
        os.chdir(before)
    return project


@pytest.fixture
def elsewhere(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_the_ledger_is_right_from_another_directory(chain, elsewhere, capsys, monkeypatch):
    status, output = run_main(["ledger", str(chain / "runs" / "syn")], capsys, monkeypatch)
    assert status == 0, output
    assert "private dataset" in output
    assert "changed since" not in output and "is gone" not in output
    queries = chain / "data" / "queries.jsonl"  # the check still sees a real change, from here too
    original = queries.read_bytes()
    try:
        queries.write_bytes(original + json.dumps({"_id": "extra", "text": "a new query"}).encode() + b"\n")
        status, output = run_main(["ledger", str(chain / "runs" / "syn")], capsys, monkeypatch)
    finally:
        queries.write_bytes(original)
    assert status == 0 and f"data {(chain / 'data').resolve()} changed since" in output


def test_the_likelihood_filter_finds_its_generator_from_another_directory(
    chain, elsewhere, capsys, monkeypatch
):
    out = elsewhere / "filtered"
    argv = [
        "-q",
        "filter",
        "--synthetic",
        str(chain / "runs" / "syn"),
        "--method",
        "likelihood",
        "--out",
        str(out),
    ]
    status, output = run_main(argv, capsys, monkeypatch)
    assert status == 0, output
    assert "rewritten since" not in output
    assert open_artifact(out, stage="filter").inputs


def test_an_older_manifest_with_relative_paths_is_read_against_where_it_ran(chain, elsewhere):
    """Manifests written before paths were recorded absolute: their relative paths are resolved
    against the directory their command ran in (recovered from their recorded ``out``), not the
    current one."""
    project = elsewhere / "copy" / "project"
    shutil.copytree(chain, project)
    shas = {}
    for name in ("gen", "syn"):  # rewritten as an older synthq wrote them (paths as given), resealed
        path = project / "runs" / name
        manifest = json.loads((path / MANIFEST).read_text())
        for record in manifest["inputs"]:
            if record["path"].startswith(str(chain)):
                record["path"] = os.path.relpath(record["path"], chain)
                record["sha256"] = shas.get(record["path"], record["sha256"])
        write_manifest(path, manifest)
        shas[f"runs/{name}"] = sha256_file(path / MANIFEST)
    assert open_artifact(project / "runs" / "syn").inputs[0]["path"] == "runs/gen"
    lines = ledger_lines([project / "runs" / "syn"])
    assert any("private dataset" in line for line in lines)
    assert not [line for line in lines if "changed since" in line or "is gone" in line], lines


def test_resuming_from_another_directory_is_not_refused_as_changed(
    tmp_path, tiny_beir, tiny_causal_dir, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    shutil.copytree(tiny_beir, tmp_path / "data")
    config = FinetuneConfig(data="data", model=str(tiny_causal_dir), out="gen")
    saved = {"path": "data", "kind": "data", "sha256": "abc"}  # as a checkpoint run from here recorded it
    state = {"config": json.dumps(config_to_dict(config)), "inputs": json.dumps([saved])}
    check_resumable(tmp_path / "state.pt", state, config, [{**saved, "path": str(tmp_path / "data")}])
    with pytest.raises(ArtifactError, match="changed since"):
        check_resumable(tmp_path / "state.pt", state, config, [{**saved, "sha256": "def"}])
