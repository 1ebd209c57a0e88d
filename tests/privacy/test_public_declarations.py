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
