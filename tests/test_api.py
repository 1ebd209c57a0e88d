"""The Python API: ``from synthq import finetune_lm, ...`` runs the stages as the command line
does and returns their artifacts; ``import synthq`` stays light."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from pydantic import ValidationError

import synthq
from synthq.config.retriever import TrainRetrieverConfig


def test_import_synthq_loads_no_heavy_library_until_a_stage_is_called():
    code = (
        "import sys, synthq; from synthq import finetune_lm; "
        "print(sorted(m for m in ('torch', 'numpy', 'transformers', 'opacus') if m in sys.modules))"
    )
    shown = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert shown.stdout.strip() == "[]"
    from synthq import api

    assert set(synthq.API) <= set(api.__all__)
    with pytest.raises(AttributeError, match="no attribute 'fine_tune'"):
        synthq.fine_tune  # noqa: B018


def test_the_stages_chain_from_python_with_the_guarantee_carried(tmp_path, tiny_beir, tiny_causal_dir,
                                                                  tiny_encoder_dir):  # fmt: skip
    from synthq import evaluate, finetune_lm, generate, ledger, train_retriever

    small = dict(batch_size=8, max_steps=2, physical_batch_size=4, max_source_length=48)
    gen = finetune_lm(data=str(tiny_beir), model=str(tiny_causal_dir), epsilon=8, out=tmp_path / "g", **small)
    assert gen.stage == "finetune-lm" and 0 < gen.privacy.epsilon <= 8
    syn = generate(generator=gen.path, corpus=str(tiny_beir), max_new_tokens=8, out=tmp_path / "syn")
    tiny = dict(max_steps=1, batch_size=4, max_query_length=16, max_doc_length=32)
    encoder = str(tiny_encoder_dir)
    config = TrainRetrieverConfig(data=str(syn.path), encoder=encoder, out=tmp_path / "ret", **tiny)
    ret = train_retriever(config)
    assert ret.privacy.epsilon == pytest.approx(gen.privacy.epsilon)  # post-processing
    again = train_retriever(config, out=tmp_path / "ret")  # up to date: the same artifact
    assert again.manifest_hash == ret.manifest_hash
    table = evaluate(retrievers=[str(ret.path)], datasets=[str(tiny_beir)], out=tmp_path / "eval")
    rows = json.loads((table.path / "results.json").read_text())
    assert any(row["kind"] == "retriever" for row in rows)
    book = ledger(ret.path)
    assert len(book.datasets) == 1
    with pytest.raises(ValidationError, match="epsilon"):
        finetune_lm(data=str(tiny_beir), model=str(tiny_causal_dir), epsilon=-1, out=tmp_path / "bad")
    with pytest.raises(TypeError, match="takes a FinetuneConfig"):
        finetune_lm(config)


def test_a_config_changed_after_validation_gets_every_check_of_the_command_line(
    tmp_path, tiny_beir, tiny_causal_dir, tiny_encoder_dir
):
    """Review round 5, flow 2: ``--limit`` with DP is refused on the command line; a config
    assigned to, copied with an update or built without validation is refused the same way by
    the Python API and by the stage itself, before anything is written (a file-order prefix of the
    private data would otherwise be sealed at the full run's ε)."""
    from synthq import finetune_lm, train_retriever
    from synthq.config.generator import FinetuneConfig
    from synthq.stages import finetune_lm as finetune_stage
    from synthq.stages import train_retriever as retriever_stage
    from tests.helpers import retriever_config

    generator = FinetuneConfig(data=str(tiny_beir), model=str(tiny_causal_dir), epsilon=4, max_steps=1,
                               out=tmp_path / "gen")  # fmt: skip
    with pytest.raises(ValidationError, match="--limit cannot be used with DP"):
        generator.limit = 6
    with pytest.raises(ValidationError, match="--limit cannot be used with DP"):
        finetune_lm(generator)  # the failed assignment left limit = 6 behind: run_stage checks again
    with pytest.raises(ValidationError, match="--limit cannot be used with DP"):
        finetune_stage.run(generator)  # and so does the stage

    dp = retriever_config(tmp_path / "ret", tiny_beir, tiny_encoder_dir, dp="group", epsilon=4)
    copied = dp.model_copy(update={"limit": 8})
    built = TrainRetrieverConfig.model_construct(**{**dp.model_dump(), "limit": 8})
    for config in (copied, built):
        with pytest.raises(ValidationError, match="--limit cannot be used with DP"):
            train_retriever(config)
        with pytest.raises(ValidationError, match="--limit cannot be used with DP"):
            retriever_stage.run(config)
    assert not (tmp_path / "gen").exists() and not (tmp_path / "ret").exists()
    # without DP a limit is a plain choice, and the options set stay the ones set
    assert (
        TrainRetrieverConfig(data=str(tiny_beir), encoder="x", out=tmp_path / "x")
        .model_copy(update={"limit": 8})
        .limit
        == 8
    )


def test_the_ledger_of_no_artifact_is_refused_as_on_the_command_line():
    """Issue #74: ``ledger()`` returned an empty ledger (read as "nothing read private data")
    where ``synthq ledger`` refuses a missing DIR."""
    with pytest.raises(TypeError, match="at least one artifact"):
        synthq.ledger()


def test_a_resolved_default_is_resolved_again_not_pinned(tmp_path):
    """``user_clipping`` resolves ``auto`` from the unit and ε: checked again after a change (an
    assignment, a revalidation), it follows the new values instead of refusing its old resolution
    as if the user had chosen it; a choice the user made is still refused where it cannot work."""
    import math

    from synthq.config.fields import revalidated
    from synthq.config.generator import FinetuneConfig

    config = FinetuneConfig(data="d", model="m", out=tmp_path / "g", epsilon=8, privacy_unit="user")
    assert config.user_clipping == "per-user" and "user_clipping" not in config.model_fields_set
    config.epsilon = math.inf
    assert config.user_clipping == revalidated(config).user_clipping == "per-example"
    with pytest.raises(ValidationError, match="needs a finite --epsilon"):
        FinetuneConfig(data="d", model="m", out=tmp_path / "g", epsilon=math.inf, privacy_unit="user",
                       user_clipping="per-user")  # fmt: skip


SEEN: list = []


def run(config):
    """A stage whose libraries talk: a transformers progress bar and a two-line warning."""
    import warnings

    from transformers.utils import logging as transformers_logging

    for _ in transformers_logging.tqdm(range(3), desc="Loading weights"):
        pass
    warnings.warn("a library's advice\nand its second line", UserWarning, stacklevel=1)
    SEEN.append(transformers_logging.is_progress_bar_enabled())


def test_a_stage_run_from_python_has_the_command_lines_quiet_stderr_and_restores_it(
    tmp_path, monkeypatch, capsys
):
    """Faults round 5: the Python API's stderr carried transformers' "Loading weights" and
    "Writing model shards" bars and multi-line library warnings that the command line hides."""
    import os
    import warnings

    from transformers.utils import logging as transformers_logging

    from synthq.config import registry
    from synthq.config.fields import StageConfig

    config_class = type("NoisyConfig", (StageConfig,), {})
    monkeypatch.setitem(registry.STAGES, "generate", registry.StageEntry(__name__, config_class))
    monkeypatch.delenv("TRANSFORMERS_VERBOSITY", raising=False)
    monkeypatch.setattr(warnings, "showwarning", warnings.showwarning)
    bars, level = transformers_logging.is_progress_bar_enabled(), transformers_logging.get_verbosity()
    transformers_logging.enable_progress_bar()  # the caller's state: bars on (a notebook's default)
    try:
        showwarning = warnings.showwarning
        capsys.readouterr()
        synthq.run_stage("generate", out=tmp_path / "noisy")
        err = capsys.readouterr().err
        assert SEEN[-1] is False and "Loading weights" not in err, err
        assert (
            "warning: a library's advice (UserWarning)" in " ".join(err.split()) and "second line" not in err
        )
        assert transformers_logging.is_progress_bar_enabled()  # given back
        assert transformers_logging.get_verbosity() == level and warnings.showwarning is showwarning
        assert "TRANSFORMERS_VERBOSITY" not in os.environ
    finally:
        (transformers_logging.enable_progress_bar if bars else transformers_logging.disable_progress_bar)()
