"""What makes pairs public, and what happens when that stops being true (review round 5, flows 1
and 3).

* A synthq artifact is never a source of public pairs: a DP synthetic set with a ``privacy.json``
  written into it is refused by ``finetune-lm --warm-start`` and ``generate --few-shot``, which
  would otherwise write an ε = 0 "control" or an ε = 0 set from it.
  Nor is a dataset one of whose parts (or files) is, or lies inside, an artifact, for a warm start,
  few-shot examples, an eval or a public corpus.
* A read of a split declared public records the declaration (and every artifact made from it
  carries the record, sealed), and once the dataset's ``privacy.json`` no longer declares the split
  public (retracted: moved to ``private_splits``), everything that uses the artifact refuses it,
  naming the read: the ledger and the statement (which would otherwise count that ε = ∞ read as
  public), ``info``, ``export``, the Python API's ``open_artifact`` and every stage that reads it.
"""

from __future__ import annotations

import json
import math
import shutil

import pytest

from synthq.config.generator import FinetuneConfig, GenerateConfig
from synthq.runtime.errors import PrivacyError
from synthq.stages import finetune_lm, generate


def _dp_synthetic_set(tmp_path, tiny_beir, tiny_causal_dir):
    gen = finetune_lm.run(
        FinetuneConfig(data=str(tiny_beir), model=str(tiny_causal_dir), out=tmp_path / "gen", epsilon=4.0,
                       max_steps=1, batch_size=4, physical_batch_size=4, max_source_length=32, seed=3,
                       device="cpu")
    )  # fmt: skip
    syn = generate.run(
        GenerateConfig(generator=gen.path, corpus=str(tiny_beir), out=tmp_path / "syn", max_new_tokens=4,
                       seed=0, device="cpu")
    )  # fmt: skip
    assert math.isfinite(syn.privacy.epsilon) and syn.privacy.epsilon > 0
    return syn


def test_a_synthetic_set_declared_public_is_never_read_as_public_pairs(tmp_path, tiny_beir, tiny_causal_dir):
    """Flow 1: a privacy.json written into a DP synthetic set (or the set's directory nested one
    level down) does not make its pairs public for a warm start or few-shot examples; the
    refusal names the artifact and never suggests declaring the split."""
    syn = _dp_synthetic_set(tmp_path, tiny_beir, tiny_causal_dir)
    (syn.path / "privacy.json").write_text(json.dumps({"public_splits": ["train"]}))
    nested = tmp_path / "nested"
    shutil.copytree(syn.path, nested / "inner")
    (nested / "inner" / "manifest.json").rename(nested / "manifest.json")  # the set inside an artifact

    for source in (syn.path, nested / "inner"):
        with pytest.raises(PrivacyError, match="synthq .*artifact") as refused:
            finetune_lm.run(
                FinetuneConfig(data=str(tiny_beir), model=str(tiny_causal_dir), out=tmp_path / "control",
                               warm_start=f"{source}:train", max_steps=0, seed=3, device="cpu")
            )  # fmt: skip
        assert "no privacy.json can make them public" in str(refused.value)
        assert not (tmp_path / "control").exists()
        with pytest.raises(PrivacyError, match="synthq .*artifact"):
            generate.run(
                GenerateConfig(generator=tiny_causal_dir, corpus=str(tiny_beir), few_shot=f"{source}:train",
                               few_shot_examples=2, out=tmp_path / "zero", max_new_tokens=4, seed=0,
                               device="cpu")
            )  # fmt: skip
        assert not (tmp_path / "zero").exists()


def test_a_public_read_whose_declaration_is_retracted_fails_closed(
    tmp_path, tiny_beir, tiny_causal_dir, tiny_encoder_dir, capsys, monkeypatch
):
    """Flow 3: the ε = 0 control (a warm start on D:test) and an eval on D:test record why the
    split was public; once D's privacy.json moves test to the private splits, the ledger, ``info``,
    ``export`` and every stage that would build on them refuse, naming the read; declared public
    again, all of it opens as before."""
    from synthq.bookkeeping.releases import ledger
    from synthq.bookkeeping.splits import PUBLIC_BY_DECLARATION
    from synthq.config.evaluation import EvalConfig, ReportConfig
    from synthq.stages import evaluate, report
    from tests.helpers import one_line, private_copy, run_main

    data = private_copy(tmp_path, tiny_beir, "log", public=("test",))
    control = finetune_lm.run(
        FinetuneConfig(data=str(data), model=str(tiny_causal_dir), out=tmp_path / "control",
                       warm_start=f"{data}:test", warm_start_epochs=1, max_steps=0, max_source_length=32,
                       seed=3, device="cpu")
    )  # fmt: skip
    ev = evaluate.run(EvalConfig(out=tmp_path / "ev", datasets=[str(data)], untrained=[str(tiny_encoder_dir)],
                                 bm25=False, device="cpu"))  # fmt: skip
    assert control.privacy.epsilon == 0 and ev.privacy.epsilon == 0
    reads = [r for a in (control, ev) for r in a.inputs if r.get("kind") == "public-split"]
    assert len(reads) == 2 and all(r["public_by"] == PUBLIC_BY_DECLARATION for r in reads)
    declared = (data / "privacy.json").read_text()

    (data / "privacy.json").write_text(json.dumps({"private_splits": ["train", "dev", "test"]}))
    for artifact in (control, ev):
        with pytest.raises(PrivacyError, match="no longer declares it public"):
            ledger([artifact.path])
        status, output = run_main(["info", str(artifact.path)], capsys, monkeypatch)
        assert status != 0 and "no longer declares it public" in one_line(output)
        status, output = run_main(["export", str(artifact.path), "--out", str(tmp_path / "copy")], capsys,
                                  monkeypatch)  # fmt: skip
        assert status != 0 and not (tmp_path / "copy").exists()
    with pytest.raises(PrivacyError, match="no longer declares it public"):  # built on the control
        generate.run(GenerateConfig(generator=control.path, corpus=str(data), out=tmp_path / "syn",
                                    max_new_tokens=4, seed=0, device="cpu"))  # fmt: skip
    with pytest.raises(PrivacyError, match="no longer declares it public"):  # its scores reported
        report.run(ReportConfig(evals=[str(ev.path)], out=tmp_path / "rep"))
    assert not (tmp_path / "syn").exists() and not (tmp_path / "rep").exists()

    (data / "privacy.json").write_text(declared)
    assert ledger([control.path, ev.path]).datasets == {}


def test_every_public_read_is_carried_and_checked_even_when_its_reader_is_gone(
    tmp_path, tiny_beir, tiny_causal_dir, tiny_encoder_dir, monkeypatch
):
    """Review round 5, second pass (findings 1, 2, 6, 7): a DP finetune-lm's held-out loss reads
    the public test split and records it; the ε = 0 control's warm start is carried, sealed, into
    the set generated from it, so moving the control away does not lose it; a user's dataset named
    like a benchmark (``fiqa``) is checked by its declaration, from any working directory."""
    from synthq import api
    from synthq.bookkeeping.releases import ledger
    from synthq.stages import train_retriever
    from tests.helpers import private_copy, retriever_config

    data = private_copy(tmp_path, tiny_beir, "fiqa", public=("test",))
    dp = finetune_lm.run(
        FinetuneConfig(data=str(data), model=str(tiny_causal_dir), out=tmp_path / "dp", epsilon=4.0,
                       max_steps=1, batch_size=4, physical_batch_size=4, max_source_length=32, seed=3,
                       device="cpu")
    )  # fmt: skip
    assert [(r["split"], r["role"]) for r in dp.public_reads] == [("test", "held-out loss")]
    control = finetune_lm.run(
        FinetuneConfig(data=str(data), model=str(tiny_causal_dir), out=tmp_path / "control",
                       warm_start=f"{data}:test", warm_start_epochs=1, max_steps=0, max_source_length=32,
                       seed=3, device="cpu")
    )  # fmt: skip
    syn = generate.run(GenerateConfig(generator=control.path, corpus=str(data), out=tmp_path / "syn",
                                      max_new_tokens=4, seed=0, device="cpu"))  # fmt: skip
    assert [r["role"] for r in syn.public_reads] == ["--warm-start"]
    shutil.move(str(control.path), str(tmp_path / "elsewhere"))  # an intermediate cleaned up

    (data / "privacy.json").unlink()  # nothing declared: every split private (fail closed)
    monkeypatch.chdir(tmp_path)  # where a directory named fiqa exists: still no benchmark
    for artifact in (dp, syn):
        with pytest.raises(PrivacyError, match="no longer declares it public"):
            ledger([artifact.path])
        with pytest.raises(PrivacyError, match="no longer declares it public"):
            api.open_artifact(artifact.path)
    with pytest.raises(PrivacyError, match="no longer declares it public"):
        train_retriever.run(retriever_config(tmp_path / "ret", syn.path, tiny_encoder_dir))
    assert not (tmp_path / "ret").exists()


def test_a_dataset_holding_an_artifact_is_no_public_source(
    tmp_path, tiny_beir, tiny_causal_dir, tiny_encoder_dir
):
    """Findings 4, 9, 10 and a false alarm: a directory whose part links to a DP synthetic set is
    refused by eval and as public pairs, a synthetic set is refused as generate's public corpus, a
    copy without the manifest draws a warning, and a foreign ``manifest.json`` above a dataset
    (a web project's) is no synthq artifact."""
    from synthq.config.evaluation import EvalConfig
    from synthq.stages import evaluate

    syn = _dp_synthetic_set(tmp_path, tiny_beir, tiny_causal_dir)
    (syn.path / "privacy.json").write_text(json.dumps({"public_splits": ["train"]}))
    wrap = tmp_path / "wrap"
    wrap.mkdir()
    (wrap / "part").symlink_to(syn.path)
    with pytest.raises(PrivacyError, match="synthq .*artifact"):
        evaluate.run(EvalConfig(out=tmp_path / "ev", datasets=[str(wrap)], split="train",
                                untrained=[str(tiny_encoder_dir)], bm25=False, device="cpu"))  # fmt: skip
    with pytest.raises(PrivacyError, match="synthq .*artifact"):
        generate.run(GenerateConfig(generator=tiny_causal_dir, corpus=str(syn.path), out=tmp_path / "g",
                                    max_new_tokens=4, seed=0, device="cpu"))  # fmt: skip
    linked = tmp_path / "linked"
    (linked / "qrels").mkdir(parents=True)
    for name in ("corpus.jsonl", "queries.jsonl", "qrels/train.tsv", "privacy.json"):
        (linked / name).symlink_to(syn.path / name)
    with pytest.raises(PrivacyError, match="synthq .*artifact"):
        finetune_lm.run(FinetuneConfig(data=str(tiny_beir), model=str(tiny_causal_dir), out=tmp_path / "c",
                                       warm_start=f"{linked}:train", max_steps=0, device="cpu"))  # fmt: skip
    from synthq.config.generator import FilterConfig
    from synthq.stages import filter as filter_stage

    with pytest.raises(PrivacyError, match="synthq .*artifact"):  # as the ranking corpus
        filter_stage.run(FilterConfig(synthetic=syn.path, corpus=str(syn.path), out=tmp_path / "f",
                                      method="consistency", retriever="bm25"))  # fmt: skip
    with pytest.raises(PrivacyError, match="pass the artifact itself"):  # as new private data
        finetune_lm.run(FinetuneConfig(data=str(linked), model=str(tiny_causal_dir), out=tmp_path / "d",
                                       epsilon=4.0, max_steps=1))  # fmt: skip
    assert not any((tmp_path / n).exists() for n in ("ev", "g", "c", "f", "d"))

    from synthq.bookkeeping.inputs import public_pairs_input

    copy = tmp_path / "copy"
    shutil.copytree(syn.path, copy)
    (copy / "manifest.json").unlink()
    with _warned() as seen:
        public_pairs_input(f"{copy}:train", "--warm-start")
    assert any("synthetic ids" in line for line in seen)

    webapp = tmp_path / "webapp"
    shutil.copytree(tiny_beir, webapp / "log")
    (webapp / "manifest.json").write_text(json.dumps({"name": "my app", "version": "1.0"}))
    assert public_pairs_input(f"{webapp / 'log'}:test", "--warm-start").split == "test"


def _warned():
    """Collects what synthq.runtime.console.warn prints."""
    import contextlib
    from unittest import mock

    @contextlib.contextmanager
    def collecting():
        lines: list[str] = []
        with mock.patch("synthq.runtime.console.warn", side_effect=lambda m: lines.append(m)):
            yield lines

    return collecting()


def test_a_misspelt_public_split_is_missing_not_private(tmp_path, tiny_beir, tiny_causal_dir):
    """Issue #74: ``--warm-start D:tset`` says the split does not exist and lists the splits there
    (their names are public), instead of calling it "not declared public"."""
    from synthq.runtime.errors import DataError

    with pytest.raises(DataError, match=r"has no split 'tset' \(its splits: dev, test, train\)"):
        finetune_lm.run(FinetuneConfig(data=str(tiny_beir), model=str(tiny_causal_dir), out=tmp_path / "g",
                                       warm_start=f"{tiny_beir}:tset", max_steps=0))  # fmt: skip


def test_a_foreign_manifest_asks_nothing_of_this_machine_s_files(tmp_path, tiny_beir, monkeypatch):
    """Review round 5, third pass (finding 1): a manifest sealed under another key may name this
    machine's private log in a plain record with a guessed digest; the ledger never digests what it
    names, so no "changed since" line answers the guess, in either composition."""
    from synthq.artifacts.create import create_artifact
    from synthq.bookkeeping.releases import ledger_lines

    data = tmp_path / "log"
    shutil.copytree(tiny_beir, data)
    guess = {"path": str(data), "kind": "data", "name": "log", "sha256": "0" * 64}  # "the log minus q"
    monkeypatch.setenv("SYNTHQ_STATE", str(tmp_path / "colleague-state"))
    with create_artifact(tmp_path / "foreign", "generate", {"out": "x"}, inputs=[guess]) as writer:
        writer.public()
    monkeypatch.setenv("SYNTHQ_STATE", str(tmp_path / "my-state"))
    for compose in ("units", "sum"):
        lines = ledger_lines([tmp_path / "foreign"], compose=compose)
        assert not any(str(data) in line for line in lines if "changed since" in line), lines


def test_public_reads_keep_every_claim_and_leave_fingerprints_alone():
    """Findings 6, 9 and 10: two records of one split that say different things are both kept (each
    is checked; a foreign one never replaces this installation's); the held-out read is left out of
    a fingerprint (a generator made before it was recorded stays up to date); a malformed list is
    refused, naming the artifact."""
    from pathlib import Path

    from synthq.artifacts.freshness import config_fingerprint
    from synthq.artifacts.manifest import Artifact
    from synthq.artifacts.writer import unique_public_reads
    from synthq.runtime.errors import ArtifactError

    mine = {"path": "/d", "name": "/d", "split": "test", "public_by": "declared public in privacy.json"}
    forged = {**mine, "name": "beir:fiqa", "public_by": "public benchmark"}
    assert unique_public_reads([forged, mine, dict(mine)]) == [forged, mine]
    data = {"path": "/d", "kind": "data", "role": "data", "sha256": "hmac:1"}
    held_out = {"path": "/d", "kind": "public-split", "role": "held-out loss", "split": "test", "sha256": "2"}
    assert config_fingerprint({"lr": 1}, [data]) == config_fingerprint({"lr": 1}, [data, held_out])
    broken = Artifact(Path("/a"), {"public_reads": [{"split": "test"}]})
    with pytest.raises(ArtifactError, match="public_reads"):
        broken.public_reads  # noqa: B018
