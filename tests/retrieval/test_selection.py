"""Dev selection: per method, the configuration with the best dev score (mean over seeds), and
``eval --select-on`` evaluating only that configuration's retrievers on test."""

from __future__ import annotations

import json
import math

import pytest

from synthq.artifacts.create import create_artifact
from synthq.config.evaluation import EvalConfig
from synthq.privacy.guarantee import Guarantee
from synthq.retrieval.selection import select_best, selection_markdown, varying_settings
from synthq.runtime.errors import DataError
from tests.helpers import accounted, tiny_retriever_artifact


def _row(model, method, lr, seed, score, kind="retriever", epsilon=8.0):
    return {"dataset": "d", "split": "dev", "retriever": model, "model_id": f"artifact:{model}", "kind": kind,
            "epsilon": epsilon,
            "method": method, "variant": f"{method}-{lr}", "seed": seed,
            "settings": {"lr": lr, "seed": seed, "epochs": 1}, "metrics": {"ndcg@10": score}}  # fmt: skip


def test_sweep_picks_the_dev_best_value_averaged_over_seeds():
    rows = [
        _row("dp-lr1e-4-s0", "direct DP", 1e-4, 0, 0.50),
        _row("dp-lr1e-4-s1", "direct DP", 1e-4, 1, 0.50),
        _row("dp-lr1e-3-s0", "direct DP", 1e-3, 0, 0.70),  # the best single run ...
        _row("dp-lr1e-3-s1", "direct DP", 1e-3, 1, 0.40),  # ... but not the best mean (0.55)
        _row("dp-lr1e-2-s0", "direct DP", 1e-2, 0, 0.60),
        _row("dp-lr1e-2-s1", "direct DP", 1e-2, 1, 0.58),
        _row("orig-lr3e-5", "original", 3e-5, 0, 0.80, epsilon=math.inf),
        _row("orig-lr1e-4", "original", 1e-4, 0, 0.75, epsilon=math.inf),
        _row("dp-eps1-lr1e-3", "direct DP", 1e-3, 0, 0.30, epsilon=1.0),  # another ε: its own best
        _row("untrained", "untrained", None, None, 0.99, kind="untrained"),  # never a candidate
    ]
    choices = select_best(rows)
    dp, original = choices["direct DP, ε = 8.00"], choices["original, ε = ∞"]
    assert set(choices) == {"direct DP, ε = 8.00", "direct DP, ε = 1.00", "original, ε = ∞"}
    assert dp.best.settings["lr"] == 1e-2
    assert dp.best.score == pytest.approx(0.59)
    assert dp.model_ids == {"artifact:dp-lr1e-2-s0", "artifact:dp-lr1e-2-s1"}
    assert original.model_ids == {"artifact:orig-lr3e-5"}
    assert choices["direct DP, ε = 1.00"].model_ids == {"artifact:dp-eps1-lr1e-3"}
    assert varying_settings(dp) == ["lr"]  # seed differs within, not between
    text = selection_markdown(choices)
    assert "| **direct DP, ε = 8.00** | **lr=0.01** | **2** | **0.5900** |" in text and "costs no ε" in text


def test_selection_needs_one_dataset():
    rows = [_row("a", "m", 1, 0, 0.5), {**_row("b", "m", 2, 0, 0.6), "dataset": "other"}]
    with pytest.raises(DataError, match="one dev dataset"):
        select_best(rows)


def test_eval_select_on_keeps_the_chosen_retrievers(tmp_path, tiny_encoder_dir, tiny_beir):
    from synthq.stages import evaluate

    privacy = accounted(epsilon=8.0, delta=1e-6, mechanism="dp-sample")
    low, high, other = (
        tiny_retriever_artifact(
            tmp_path / name, tiny_encoder_dir, privacy, {"dp": "sample", "lr": lr, "seed": 0}
        )
        for name, lr in (("ret-lr-low", 1e-4), ("ret-lr-high", 1e-2), ("ret-untuned", 1e-3))
    )
    dev = evaluate.run(
        EvalConfig(
            retrievers=[str(low.path), str(high.path)],
            datasets=[str(tiny_beir)],
            split="dev",
            bm25=False,
            out=tmp_path / "dev",
        )  # fmt: skip
    )
    # The two copies score the same on the real dev split; make the high lr the dev-best.
    rows = json.loads((dev.path / "results.json").read_text())
    for row in rows:
        row["metrics"]["ndcg@10"] = 0.9 if row["retriever"] == "ret-lr-high" else 0.1
    with create_artifact(tmp_path / "dev-edited", "eval", {"note": "edited dev scores"}) as writer:
        (writer.dir / "results.json").write_text(json.dumps(rows))
        writer.privacy = Guarantee.public()
    test = evaluate.run(
        EvalConfig(
            retrievers=[str(low.path), str(high.path), str(other.path)],
            datasets=[str(tiny_beir)],
            bm25=False,
            select_on=str(tmp_path / "dev-edited"),
            out=tmp_path / "test",
        )  # fmt: skip
    )
    names = [r["retriever"] for r in json.loads((test.path / "results.json").read_text())]
    assert names == ["ret-lr-high", "ret-untuned"]  # ret-untuned was not on dev: kept
    text = (test.path / "results.md").read_text()
    assert "## Hyper-parameters chosen on dev" in text and "**lr=0.01**" in text


def test_select_data_chooses_among_the_synthetic_sets_of_one_generator():
    """With ``across_data`` the set (filter, queries per document) is a tuned setting: one choice
    per generator and encoder (the row's ``family``), the set shown as a setting."""

    def synthetic(model, method, family, lr, seed, score):
        return _row(model, method, lr, seed, score) | {"family": family}

    g, h = "synthetic (g), e", "synthetic (h), e"
    rows = [
        synthetic("x3-lr1", "synthetic (g, 3 queries/doc), e", g, 1e-3, 0, 0.50),
        synthetic("x3-lr3", "synthetic (g, 3 queries/doc), e", g, 3e-3, 0, 0.60),
        synthetic("cons-lr1-s0", "synthetic (g, consistency-filtered), e", g, 1e-3, 0, 0.70),
        synthetic("cons-lr1-s1", "synthetic (g, consistency-filtered), e", g, 1e-3, 1, 0.60),
        synthetic("h-lr1", "synthetic (h), e", h, 1e-3, 0, 0.30),
        _row("dp-lr1", "direct DP", 1e-3, 0, 0.20),  # no family: its own method, as before
    ]
    per_set = select_best(rows)
    assert (
        len(per_set) == 4 and per_set["synthetic (g, 3 queries/doc), e, ε = 8.00"].best.settings["lr"] == 3e-3
    )
    choices = select_best(rows, across_data=True)
    assert set(choices) == {f"{g}, ε = 8.00", f"{h}, ε = 8.00", "direct DP, ε = 8.00"}
    best = choices[f"{g}, ε = 8.00"]
    assert best.model_ids == {"artifact:cons-lr1-s0", "artifact:cons-lr1-s1"}  # mean 0.65 > 0.60
    assert best.best.settings["synthetic set"] == "synthetic (g, consistency-filtered), e"
    assert varying_settings(best) == ["lr", "synthetic set"] and len(best.candidates) == 3
    assert "synthetic set=synthetic (g, consistency-filtered), e" in selection_markdown(choices)


def test_select_data_and_select_epsilon_need_select_on():
    for extra in ({"select_data": True}, {"select_epsilon": 1.0}):
        with pytest.raises(ValueError, match="needs --select-on"):
            EvalConfig(out="x", retrievers=["r"], **extra)
