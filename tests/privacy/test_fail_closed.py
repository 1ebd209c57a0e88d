"""Fail closed (issue #38 flow 4, issue #40 fault 3): a split of a user-supplied dataset is private
unless its ``privacy.json`` declares it public; "private" never depends on a digest of the directory
matching, so no edit of the directory turns a trained-on split public, and a misspelt split name in
``privacy.json`` is refused."""

from __future__ import annotations

import hashlib
import json
import math
import shutil

import pytest

from synthq.bookkeeping.releases import ledger
from synthq.bookkeeping.splits import eval_data
from synthq.config.evaluation import EvalConfig
from synthq.data.sources import embedded_dir, public_benchmark
from synthq.runtime.errors import DataError
from synthq.runtime.hashing import sha256_file, sha256_tree
from synthq.stages import evaluate, train_retriever
from tests.helpers import eval_argv, one_line, private_copy, released_text, retriever_config, run_main


def _undeclared_copy(tmp_path, tiny_beir, name="mylog"):
    """tiny_beir as a user's own log: no privacy.json."""
    root = tmp_path / name
    shutil.copytree(tiny_beir, root)
    (root / "privacy.json").unlink()
    return root


def _rows(artifact) -> list[dict]:
    return json.loads((artifact.path / "results.json").read_text())


def test_a_trained_on_split_stays_private_whatever_is_edited(tmp_path, tiny_beir, tiny_encoder_dir):
    data = _undeclared_copy(tmp_path, tiny_beir)
    retriever = train_retriever.run(
        retriever_config(tmp_path / "dp", data, tiny_encoder_dir, dp="batch", epsilon=4)
    )
    assert math.isfinite(retriever.privacy.epsilon)

    def eval_train(tag: str):
        return evaluate.run(
            EvalConfig(
                out=tmp_path / f"ev-{tag}",
                retrievers=[str(retriever.path)],
                datasets=[str(data)],
                split="train",
            )
        )

    edits = {
        # the guide's privacy.json, declaring only the test split public
        "privacy-json": lambda: (data / "privacy.json").write_text(json.dumps({"public_splits": ["test"]})),
        # the users.tsv the user-level guide asks for
        "users": lambda: (data / "users.tsv").write_text(
            "".join(
                f"{q}\tu{i % 3}\n"
                for i, q in enumerate(
                    json.loads(line)["_id"] for line in (data / "queries.jsonl").read_text().splitlines()
                )
            )
        ),
        # a typo fixed in the (public) corpus
        "typo": lambda: (data / "corpus.jsonl").write_text(
            (data / "corpus.jsonl").read_text().replace("eggs", "egggs", 1)
        ),
    }
    for tag, edit in edits.items():
        before = sha256_tree(data)
        edit()
        assert sha256_tree(data) != before, tag  # the directory's digest changed
        scored = eval_train(tag)
        assert math.isinf(scored.privacy.epsilon), tag
        assert all(math.isinf(float(r["epsilon"])) for r in _rows(scored)), tag
        # the private dataset is never named by its plain digest
        assert sha256_tree(data) not in released_text(scored), tag
    # the ledger keeps one private dataset across the edits (its identity is its query ids, not the
    # directory's digest), so its total is not split into understated parts
    book = ledger([retriever.path, *(tmp_path / f"ev-{tag}" for tag in edits)])
    assert len(book.datasets) == 1
    assert math.isinf(next(iter(book.datasets.values())).total.epsilon)
    # the split the privacy.json declares public is public: the retriever's own ε, no more
    public = evaluate.run(
        EvalConfig(out=tmp_path / "ev-test", retrievers=[str(retriever.path)], datasets=[str(data)])
    )
    assert public.privacy.epsilon == pytest.approx(retriever.privacy.epsilon)


def test_a_fresh_dataset_without_privacy_json_is_private(
    tmp_path, tiny_beir, tiny_encoder_dir, capsys, monkeypatch
):
    data = _undeclared_copy(tmp_path, tiny_beir, "fresh")
    status, _ = run_main(
        eval_argv(tmp_path, tiny_encoder_dir, data, tmp_path / "ev", "--split", "test"), capsys, monkeypatch
    )
    assert status == 0
    rows = _rows(type("A", (), {"path": tmp_path / "ev"}))
    assert rows and all(math.isinf(float(r["epsilon"])) for r in rows)
    manifest = json.loads((tmp_path / "ev" / "manifest.json").read_text())
    (record,) = [r for r in manifest["inputs"] if r["kind"] == "data"]
    assert record["private"] and record["sha256"].startswith("hmac:")
    assert sha256_tree(data) not in json.dumps(manifest)
    # a dev split kept in a directory of its own, no privacy.json: private too
    dev_only = tmp_path / "dev-only"
    shutil.copytree(data, dev_only)
    for split in ("train", "test"):
        (dev_only / "qrels" / f"{split}.tsv").unlink()
    status, _ = run_main(
        eval_argv(tmp_path, tiny_encoder_dir, dev_only, tmp_path / "ev-dev", "--split", "dev"),
        capsys,
        monkeypatch,
    )
    assert status == 0
    assert all(math.isinf(float(r["epsilon"])) for r in _rows(type("A", (), {"path": tmp_path / "ev-dev"})))


def test_a_misspelt_split_in_privacy_json_is_refused(
    tmp_path, tiny_beir, tiny_encoder_dir, capsys, monkeypatch
):
    data = _undeclared_copy(tmp_path, tiny_beir, "typo")
    declaration = data / "privacy.json"
    declaration.write_text(json.dumps({"private_splits": ["train", "dve"], "public_splits": ["test"]}))
    status, output = run_main(
        eval_argv(tmp_path, tiny_encoder_dir, data, tmp_path / "ev", "--split", "dev"), capsys, monkeypatch
    )
    line = one_line(output)
    assert status != 0 and "'dve'" in line and str(declaration) in line
    assert not (tmp_path / "ev").exists()
    # a DP stage reading the dataset refuses it before any work too
    with pytest.raises(DataError, match="'dve'"):
        train_retriever.run(retriever_config(tmp_path / "dp", data, tiny_encoder_dir, dp="batch", epsilon=4))
    assert not (tmp_path / "dp").exists()
    for bad in ({"public_splits": "test"}, {"public_split": ["test"]}, ["test"]):
        declaration.write_text(json.dumps(bad))
        with pytest.raises(DataError, match="privacy.json"):
            eval_data(str(data), data, "dev")


def test_public_benchmarks_and_the_embedded_declaration(tmp_path):
    for spec in ("msmarco", "beir:scifact", "irds:beir/scifact/test", "fiqa"):
        assert public_benchmark(spec), spec
    (tmp_path / "fiqa").mkdir()  # a local directory that happens to share a benchmark's name
    assert not public_benchmark(str(tmp_path / "fiqa")) and not public_benchmark("embedded")
    root = embedded_dir()
    assert eval_data("embedded", root, "train").private and eval_data("embedded", root, "dev").private
    assert not eval_data("embedded", root, "test").private


def _drop_train_query(root) -> str:
    """D minus one private unit: the first train query (its line in queries.jsonl, its qrels)."""
    dropped = (root / "qrels" / "train.tsv").read_text().splitlines()[1].split("\t")[0]
    lines = (root / "queries.jsonl").read_text().splitlines()
    (root / "queries.jsonl").write_text(
        "".join(line + "\n" for line in lines if json.loads(line)["_id"] != dropped)
    )
    qrels = (root / "qrels" / "train.tsv").read_text().splitlines()
    (root / "qrels" / "train.tsv").write_text(
        "".join(r + "\n" for r in qrels if not r.startswith(f"{dropped}\t"))
    )
    return dropped


def test_a_public_split_eval_does_not_depend_on_the_private_splits(tmp_path, tiny_beir):
    """Issue #38, adversary test (b): the eval of the declared-public test split of a dataset that
    also holds private train/dev splits records the same input for D and D minus one private train
    query (or with a users.tsv added), and becomes stale when its own qrels/test.tsv is edited."""
    from synthq.artifacts.freshness import is_still_up_to_date
    from synthq.artifacts.records import current_input_hash, data_input_record
    from synthq.data.beir_io import read_queries

    data = private_copy(tmp_path, tiny_beir)

    def config(tag: str) -> EvalConfig:
        return EvalConfig(out=tmp_path / f"ev-{tag}", bm25=True, datasets=[str(data)], split="test")

    def data_inputs(artifact) -> list[dict]:
        return [r for r in artifact.inputs if r.get("kind") != "artifact"]

    full = evaluate.run(config("full"))
    (record,) = data_inputs(full)
    assert "private" not in record and "identity" not in record and not record["sha256"].startswith("hmac:")
    # an independent computation of what the read reads: the corpus, qrels/test.tsv, the test queries
    texts = read_queries(data / "queries.jsonl")
    test_ids = sorted(
        {line.split("\t")[0] for line in (data / "qrels/test.tsv").read_text().splitlines()[1:]}
    )
    judged = [(q, texts[q]) for q in test_ids]
    expected = {
        "split": "test",
        "parts": [
            {
                "part": "",
                "corpus": sha256_file(data / "corpus.jsonl"),
                "qrels": sha256_file(data / "qrels/test.tsv"),
                "queries": hashlib.sha256(json.dumps(judged, ensure_ascii=False).encode()).hexdigest(),
            }
        ],
    }
    assert record["sha256"] == hashlib.sha256(json.dumps(expected, sort_keys=True).encode()).hexdigest()
    manifest_full = (full.path / "manifest.json").read_text()

    dropped = _drop_train_query(data)
    assert dropped.startswith("tr-")
    minus_one = evaluate.run(config("minus-one"))
    assert data_inputs(minus_one) == data_inputs(full)  # identical input records: path, kind, digest
    (data / "users.tsv").write_text("".join(f"{q}\tu{i % 2}\n" for i, q in enumerate(texts)))
    with_users = evaluate.run(config("users"))
    assert data_inputs(with_users) == data_inputs(full)
    # the released results do not differ either (only the artifact's own path and timings may)
    assert json.loads((minus_one.path / "results.json").read_text()) == json.loads(
        (full.path / "results.json").read_text()
    )
    assert manifest_full.count(record["sha256"]) == 1

    # the freshness check recomputes the same digest from the recorded split ...
    assert current_input_hash(record) == record["sha256"]
    assert is_still_up_to_date(full.path, "eval", config("full"))
    assert not ledger([full.path]).changed
    # ... and an edit of the split's own qrels makes the eval stale and "changed since" in the ledger
    qrels = data / "qrels" / "test.tsv"
    qrels.write_text(qrels.read_text().replace("\t1\n", "\t2\n", 1))
    assert current_input_hash(record) != record["sha256"]
    assert not is_still_up_to_date(full.path, "eval", config("full"))
    assert any("changed since" in note for note in ledger([full.path]).changed)
    again = evaluate.run(config("full").model_copy(update={"force": True}))  # re-run on the edited split
    assert data_inputs(again)[0]["sha256"] == current_input_hash(record)

    # a read of a private split keeps the keyed record of the directory and the dataset's identity
    private = eval_data(str(data), data, "dev")
    assert private.private and private.record["private"] and private.record["identity"].startswith("hmac:")
    assert private.record["sha256"].startswith("hmac:")
    # records written before public-split records existed (a whole directory) still read
    old = data_input_record(data, "old", private=False)
    assert current_input_hash(old) == old["sha256"] == sha256_tree(data)
    old_private = data_input_record(data, "old", private=True)
    assert current_input_hash(old_private) == old_private["sha256"]


def test_a_part_declaring_a_split_private_keeps_it_private(tmp_path, tiny_beir):
    """Sub-datasets (CQADupStack's layout): a split one part declares private stays private
    whatever the top-level privacy.json says; with no top-level declaration it is public only when
    every part declares it public."""
    forum = tmp_path / "forum"
    for name in ("android", "gaming"):
        shutil.copytree(tiny_beir, forum / name)  # each declares train/dev private, test public
    assert not eval_data("forum", forum, "test").private
    assert eval_data("forum", forum, "train").private
    (forum / "gaming" / "privacy.json").write_text(json.dumps({"private_splits": ["train", "dev", "test"]}))
    (forum / "privacy.json").write_text(json.dumps({"public_splits": ["test"]}))
    assert eval_data("forum", forum, "test").private
    (forum / "gaming" / "privacy.json").unlink()
    (forum / "privacy.json").unlink()
    assert eval_data("forum", forum, "test").private  # one part declares nothing: fail closed
