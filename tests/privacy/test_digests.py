"""No plain digest of anything private in a manifest (issue #38 flows 3 and 6): one function keys
every digest of a private file, a private split's derivative or a ``diagnostics/`` file; public
files keep their plain sha256; ``--split`` records the judged-document *set*, never the qrels file."""

from __future__ import annotations

import hashlib
import json
import math
import shutil

import pytest

from synthq.artifacts.export import export_artifact
from synthq.artifacts.manifest import open_artifact
from synthq.config.evaluation import EvalConfig
from synthq.config.generator import GenerateConfig
from synthq.data.beir_io import read_qrels
from synthq.privacy import keys
from synthq.privacy.digests import artifact_digest, file_record, judged_set_digest
from synthq.runtime.errors import ArtifactError
from synthq.runtime.hashing import sha256_file, sha256_tree
from synthq.stages import evaluate, generate, train_retriever
from synthq.stages.evolve import recipe as evolve
from tests.helpers import evolve_config, finetune, private_copy, released_text, retriever_config


def _plain_digests_of(root) -> set[str]:
    """Every plain sha256 an adversary holding candidate copies of ``root`` could test: each file's
    and the whole tree's."""
    return {sha256_file(p) for p in root.rglob("*") if p.is_file()} | {sha256_tree(root)}


def test_the_digest_keys_private_inputs_and_diagnostics_and_leaves_public_files_plain(tmp_path, monkeypatch):
    public = tmp_path / "corpus.jsonl"
    public.write_text('{"_id": "d1", "text": "public"}\n')
    private = tmp_path / "diagnostics" / "selection.md"
    private.parent.mkdir()
    private.write_text("| cand | dev ndcg@10 |\n| a | 0.731 |\n")
    assert artifact_digest(public, private=False) == hashlib.sha256(public.read_bytes()).hexdigest()
    keyed = artifact_digest(private, private=True)
    assert keyed.startswith("hmac:") and hashlib.sha256(private.read_bytes()).hexdigest() not in keyed
    assert keyed == artifact_digest(private, private=True)  # stable for the owner
    assert artifact_digest(tmp_path / "diagnostics", private=True).startswith("hmac:")  # a tree too
    assert file_record(public, "corpus", private=False)["sha256"] == sha256_file(public)
    assert file_record(private, "x", private=True)["sha256"] == keyed
    # the judged-document set: the sorted unique ids, one per line
    assert judged_set_digest(["b", "a", "b"]) == hashlib.sha256(b"a\nb").hexdigest()
    monkeypatch.setenv("SYNTHQ_STATE", str(tmp_path / "another-installation"))
    keys._load_key.cache_clear()
    assert artifact_digest(private, private=True) != keyed  # meaningless without the owner's key


def test_generate_split_records_the_judged_set_not_the_private_qrels(tmp_path, tiny_beir, tiny_causal_dir):
    data = private_copy(tmp_path, tiny_beir)
    generator = finetune(tmp_path, data, tiny_causal_dir, "gen", epsilon="inf", max_steps=1, batch_size=2)
    config = GenerateConfig(
        out=tmp_path / "syn", generator=generator.path, corpus=str(data), split="train",
        max_new_tokens=4, seed=0,
    )  # fmt: skip
    syn = generate.run(config)
    qrels = data / "qrels" / "train.tsv"
    judged = sorted({d for docs in read_qrels(qrels).values() for d, rel in docs.items() if rel > 0})
    (record,) = [r for r in syn.inputs if r.get("kind") == "judged-set"]
    assert record["sha256"] == hashlib.sha256("\n".join(judged).encode()).hexdigest()
    # no plain digest of any private file (the qrels, the queries, the directory) in what is released
    private_files = _plain_digests_of(data) - {sha256_file(data / "corpus.jsonl")}
    release, _ = export_artifact(syn.path, tmp_path / "release")
    for text in (released_text(syn), released_text(release)):
        assert not [d for d in private_files if d in text]
    assert sha256_file(qrels) not in released_text(syn)
    # up to date for the owner: the same inputs, nothing re-generated, nothing "changed since"
    again = generate.run(config)
    assert again.manifest_hash == syn.manifest_hash


def test_evolve_judged_split_records_the_judged_set(tmp_path, tiny_beir, tiny_causal_dir, tiny_encoder_dir):
    data = private_copy(tmp_path, tiny_beir)
    evolved = evolve.run(
        evolve_config(
            tmp_path / "pe",
            data,
            tiny_causal_dir,
            tiny_encoder_dir,
            iterations=1,
            max_new_tokens=4,
            judged_split="train",
        )  # fmt: skip
    )
    assert [r for r in evolved.inputs if r.get("kind") == "judged-set"]
    private_files = _plain_digests_of(data) - {sha256_file(data / "corpus.jsonl")}
    assert not [d for d in private_files if d in released_text(evolved)]


def test_private_diagnostics_are_listed_by_keyed_digests_and_still_verified(
    tmp_path, tiny_beir, tiny_encoder_dir
):
    """Flow 6: a noisy selection on a private dev split keeps the un-noised dev scores in
    diagnostics/selection.md; the manifest lists its keyed digest, which a hypothesised dev set
    cannot be tested against."""
    data = private_copy(tmp_path, tiny_beir)
    paths = [
        str(train_retriever.run(
            retriever_config(tmp_path / f"dp-{lr}", data, tiny_encoder_dir, dp="batch", epsilon=4, lr=lr)
        ).path)
        for lr in (1e-5, 1e-3)
    ]  # fmt: skip
    dev = evaluate.run(EvalConfig(out=tmp_path / "dev", retrievers=paths, datasets=[str(data)], split="dev"))
    assert math.isinf(dev.privacy.epsilon)
    noisy = evaluate.run(
        EvalConfig(
            out=tmp_path / "test",
            retrievers=paths,
            datasets=[str(data)],
            select_on=str(dev.path),
            select_epsilon=1.0,
        )  # fmt: skip
    )
    diagnostics = sorted((noisy.path / "diagnostics").rglob("*"))
    assert (noisy.path / "diagnostics" / "selection.md") in diagnostics
    manifest_text = (noisy.path / "manifest.json").read_text()
    listed = noisy.manifest["private_files"]
    for path in (p for p in diagnostics if p.is_file()):
        relative = path.relative_to(noisy.path).as_posix()
        assert listed[relative].startswith("hmac:")
        assert sha256_file(path) not in manifest_text  # was the plain sha256 of the private scores
    # the owner still verifies them: an edit of a diagnostics file is refused
    open_artifact(noisy.path)
    target = noisy.path / "diagnostics" / "selection.md"
    target.write_text(target.read_text() + "\n")
    with pytest.raises(ArtifactError, match="selection.md"):
        open_artifact(noisy.path)
    shutil.rmtree(noisy.path)
    assert not json.loads(manifest_text).get("files", {}).get("diagnostics/selection.md")


def test_a_public_split_record_reads_only_that_split_of_every_sub_dataset(tmp_path, tiny_beir):
    """A public-split read is named by its corpus, qrels/<split>.tsv and that split's queries, per
    sub-dataset: plain (public), blind to the private splits, recomputed from the recorded split."""
    from synthq.privacy.digests import current_digest, public_split_record

    forum = tmp_path / "forum"
    for name in ("a", "b"):
        shutil.copytree(tiny_beir, forum / name)
    record = public_split_record(forum, "forum", "test")
    assert record["kind"] == "public-split" and record["split"] == "test"
    assert not record["sha256"].startswith("hmac:") and "private" not in record
    assert current_digest(record) == record["sha256"]
    # private splits and user metadata of a sub-dataset: not read, not recorded
    (forum / "b" / "qrels" / "train.tsv").write_text("query-id\tcorpus-id\tscore\n")
    (forum / "b" / "users.tsv").write_text("tr-x\tu1\n")
    queries = forum / "b" / "queries.jsonl"
    queries.write_text(queries.read_text() + json.dumps({"_id": "tr-new", "text": "a private one"}) + "\n")
    assert current_digest(record) == record["sha256"]
    # the text of a judged test query, a test judgement, the public corpus: each is read
    for edit in (
        lambda: queries.write_text(
            "".join(
                json.dumps({**json.loads(line), "text": json.loads(line)["text"] + "!"}) + "\n"
                if json.loads(line)["_id"].startswith("test-")
                else line + "\n"
                for line in queries.read_text().splitlines()
            )
        ),
        lambda: (forum / "a" / "qrels" / "test.tsv").write_text(
            (forum / "a" / "qrels" / "test.tsv").read_text() + "test-extra\tx\t1\n"
        ),
        lambda: (forum / "a" / "corpus.jsonl").write_text((forum / "a" / "corpus.jsonl").read_text() + "\n"),
    ):
        before = current_digest(record)
        edit()
        assert current_digest(record) not in (before, None)
    assert current_digest(record) != record["sha256"]
    shutil.rmtree(forum / "a" / "qrels")
    assert current_digest(record) is None  # the split is gone: the read would fail


def test_a_set_of_sub_datasets_has_an_identity_that_unrelated_edits_keep(tmp_path, tiny_beir):
    """Sub-datasets (no top-level queries.jsonl) are one dataset to the ledger: an unrelated edit
    (a users.tsv added to one part) must not split their releases into two understated totals."""
    from synthq.privacy.digests import dataset_identity

    forum = tmp_path / "forum"
    for name in ("a", "b"):
        shutil.copytree(tiny_beir, forum / name)
    before = dataset_identity(forum)
    assert before is not None and before.startswith("hmac:")
    (forum / "a" / "users.tsv").write_text("query-id\tuser-id\n")
    assert dataset_identity(forum) == before
    queries = forum / "b" / "queries.jsonl"
    queries.write_text(queries.read_text().splitlines()[0] + "\n")
    assert dataset_identity(forum) != before  # other queries: another dataset
