"""A retriever is never scored on the split its generator learnt from (issue #74, wrong 1).

``finetune-lm --warm-start D:test --max-steps 0`` (the ε = 0 control), then ``generate``,
``train-retriever`` and ``eval --datasets D --split test`` used to print a score at ε ``0
(public)`` whose generator had been trained on those very test queries; ``generate --few-shot
D:test`` (the test queries in every prompt) likewise. Both are refused, as ``--select-on`` on the
evaluated split is, whether the split is named by the same directory or by a copy of it; so is a
retriever trained on the evaluated split itself.
"""

from __future__ import annotations

import shutil

import pytest

from synthq.config.evaluation import EvalConfig
from synthq.config.generator import FinetuneConfig, GenerateConfig
from synthq.runtime.errors import DataError
from synthq.stages import evaluate, finetune_lm, generate, train_retriever
from tests.helpers import private_copy, retriever_config


def _retriever(tmp_path, data, generator, encoder, name, **generate_options):
    syn = generate.run(
        GenerateConfig(generator=generator, corpus=str(data), out=tmp_path / f"syn-{name}", max_new_tokens=4,
                       seed=0, device="cpu", **generate_options)
    )  # fmt: skip
    return train_retriever.run(retriever_config(tmp_path / f"ret-{name}", syn.path, encoder))


def test_a_generator_trained_or_prompted_on_the_evaluated_split_is_not_scored_on_it(
    tmp_path, tiny_beir, tiny_causal_dir, tiny_encoder_dir
):
    data = private_copy(tmp_path, tiny_beir, "log", public=("test",))
    control = finetune_lm.run(
        FinetuneConfig(data=str(data), model=str(tiny_causal_dir), out=tmp_path / "control",
                       warm_start=f"{data}:test", warm_start_epochs=1, max_steps=0, max_source_length=32,
                       seed=3, device="cpu")
    )  # fmt: skip
    assert control.privacy.epsilon == 0
    warmed = _retriever(tmp_path, data, control.path, tiny_encoder_dir, "warm")
    prompted = _retriever(tmp_path, data, tiny_causal_dir, tiny_encoder_dir, "few", few_shot=f"{data}:test",
                          few_shot_examples=2)  # fmt: skip
    copy = tmp_path / "copy"
    shutil.copytree(data, copy)  # the same split under another name: matched by content

    for ret, role in ((warmed, "--warm-start"), (prompted, "few-shot")):
        for dataset in (data, copy):
            out = tmp_path / "eval"
            with pytest.raises(DataError, match=f"as {role}.*, the split this eval scores") as refused:
                evaluate.run(EvalConfig(retrievers=[str(ret.path)], datasets=[str(dataset)], split="test",
                                        bm25=False, out=out, device="cpu"))  # fmt: skip
            assert str(ret.path) in str(refused.value) and not out.exists()
    scored = evaluate.run(
        EvalConfig(retrievers=[str(warmed.path)], datasets=[str(data)], split="dev", bm25=False,
                   out=tmp_path / "dev", device="cpu")
    )  # fmt: skip
    assert scored.stage == "eval"  # another split of the same dataset is scored as before


def test_a_retriever_trained_on_the_evaluated_split_is_not_scored_on_it_but_a_held_out_read_is_no_training(
    tmp_path, tiny_beir, tiny_causal_dir, tiny_encoder_dir
):
    """Training data is matched by directory and split too (``train-retriever --data D --split
    test``); a DP generator's learning check reads a public split for its held-out loss, which
    measures and trains nothing: its retriever is scored on that split as before."""
    data = private_copy(tmp_path, tiny_beir, "log", public=("test",))
    direct = train_retriever.run(
        retriever_config(tmp_path / "ret-direct", data, tiny_encoder_dir, split="test")
    )
    with pytest.raises(DataError, match=r"as its training data, the split this eval scores"):
        evaluate.run(EvalConfig(retrievers=[str(direct.path)], datasets=[str(data)], split="test", bm25=False,
                                out=tmp_path / "eval", device="cpu"))  # fmt: skip
    gen = finetune_lm.run(
        FinetuneConfig(data=str(data), model=str(tiny_causal_dir), out=tmp_path / "gen", epsilon=8.0,
                       max_steps=1, batch_size=4, physical_batch_size=4, max_source_length=32, seed=3,
                       device="cpu")
    )  # fmt: skip
    assert any(r.get("role") == "held-out loss" and r.get("split") == "test" for r in gen.inputs)
    ret = _retriever(tmp_path, data, gen.path, tiny_encoder_dir, "dp")
    scored = evaluate.run(
        EvalConfig(retrievers=[str(ret.path)], datasets=[str(data)], split="test", bm25=False,
                   out=tmp_path / "test", device="cpu")
    )  # fmt: skip
    assert scored.stage == "eval"
