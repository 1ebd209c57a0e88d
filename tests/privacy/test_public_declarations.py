"""What makes pairs public, and what happens when that stops being true (review round 5, flows 1
and 3).

* A synthq artifact is never a source of public pairs: a DP synthetic set with a ``privacy.json``
  written into it is refused by ``finetune-lm --warm-start`` and ``generate --few-shot``, which
  would otherwise write an ε = 0 "control" or an ε = 0 set from it.
* A read of a split declared public records the declaration, and once the dataset's
  ``privacy.json`` no longer declares the split public (retracted: moved to ``private_splits``),
  everything that reads the artifact fails closed: the ledger counts that read as ε = ∞,
  ``info`` and opening the artifact as an input refuse it, eval rows on that split are ∞.
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
