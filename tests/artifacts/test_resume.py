"""Resuming an artifact: a changed config or edited data is refused; a full disk names the artifact
and the partial keeps only its checkpoints."""

from __future__ import annotations

import pytest

from synthq.artifacts.manifest import partial_dir
from synthq.data.beir_io import load_beir_dir, write_beir_dir
from synthq.runtime.errors import ArtifactError
from synthq.stages import finetune_lm
from tests.helpers import finetune, output_held_by_another_process, private_copy


def test_resume_with_a_changed_config_is_refused(tmp_path, tiny_beir, tiny_causal_dir, monkeypatch):
    options = dict(epsilon="inf", epochs=4, checkpoint_every=2)
    original = finetune_lm.GeneratorTraining.step
    calls = {"n": 0}

    def interrupted(self, on_micro_batch=None):
        calls["n"] += 1
        if calls["n"] == 5:
            raise KeyboardInterrupt
        return original(self, on_micro_batch)

    monkeypatch.setattr(finetune_lm.GeneratorTraining, "step", interrupted)
    with pytest.raises(KeyboardInterrupt):
        finetune(tmp_path, tiny_beir, tiny_causal_dir, "gen", **options)
    monkeypatch.setattr(finetune_lm.GeneratorTraining, "step", original)
    assert (partial_dir(tmp_path / "gen") / "checkpoints" / "state.pt").is_file()
    changed = {**options, "epsilon": 8.0}
    with pytest.raises(ArtifactError, match="other settings.*epsilon.*--force instead of --resume"):
        finetune(tmp_path, tiny_beir, tiny_causal_dir, "gen", **changed, resume=True)
    assert not (tmp_path / "gen").exists()
    with pytest.raises(ArtifactError, match="rerun with --resume"):  # dropping --resume alone
        finetune(tmp_path, tiny_beir, tiny_causal_dir, "gen", **changed)
    # while another process writes the output, its checkpoint is not called an interrupted run's
    with output_held_by_another_process(tmp_path / "gen") as holder:
        refused = pytest.raises(ArtifactError, match=f"being written by synthq pid {holder.pid} on ")
        with refused:
            finetune(tmp_path, tiny_beir, tiny_causal_dir, "gen", **changed)
    assert finetune(tmp_path, tiny_beir, tiny_causal_dir, "gen", **changed, force=True).privacy.epsilon < 8.01


def test_resume_on_edited_data_is_refused(tmp_path, tiny_beir, tiny_causal_dir, monkeypatch):
    data = private_copy(tmp_path, tiny_beir)
    original = finetune_lm.GeneratorTraining.step
    calls = {"n": 0}

    def interrupted(self, on_micro_batch=None):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        return original(self, on_micro_batch)

    monkeypatch.setattr(finetune_lm.GeneratorTraining, "step", interrupted)
    options = dict(epsilon=8.0, max_steps=4, checkpoint_every=1)
    with pytest.raises(KeyboardInterrupt):
        finetune(tmp_path, data, tiny_causal_dir, "gen", **options)
    monkeypatch.setattr(finetune_lm.GeneratorTraining, "step", original)
    assert (partial_dir(tmp_path / "gen") / "checkpoints" / "state.pt").is_file()
    dataset = load_beir_dir(data)
    queries = {**dataset.queries, "tr-egg-0-0": "an edited private query"}
    write_beir_dir(data, dataset.corpus, queries, dataset.qrels)
    with pytest.raises(ArtifactError, match="changed since the interrupted run"):
        finetune(tmp_path, data, tiny_causal_dir, "gen", **options, resume=True)
    assert not (tmp_path / "gen").exists()


def test_a_full_disk_names_the_artifact_and_a_resume_keeps_only_checkpoints(tmp_path):
    """A library reports ENOSPC without a file name: the error names the artifact being written.
    The partial directory keeps its checkpoints for --resume; what the failed run had begun to
    write beside them (a cut-off model) is gone before the resumed run writes, so it cannot end up
    in the finished artifact."""
    import errno

    from synthq.artifacts.create import create_artifact
    from synthq.artifacts.manifest import open_artifact, partial_dir
    from synthq.cli.errors import _os_error_line

    out = tmp_path / "gen"
    with (
        pytest.raises(OSError) as failure,
        create_artifact(out, "generate", {"v": 1}, keep_partial_on_error=True) as w,
    ):
        (w.checkpoint_dir / "state.pt").write_bytes(b"whole checkpoint")
        (w.dir / "model.safetensors").write_bytes(b"cut o")
        raise OSError(errno.ENOSPC, "No space left on device")
    line = _os_error_line(failure.value)
    assert line.startswith(f"while writing {out}: No space left on device") and "free some space" in line
    assert (partial_dir(out) / "model.safetensors").exists()
    with create_artifact(out, "generate", {"v": 1}, resume=True, keep_partial_on_error=True) as writer:
        assert sorted(p.name for p in writer.dir.iterdir()) == ["checkpoints"]
        assert (writer.checkpoint_dir / "state.pt").read_bytes() == b"whole checkpoint"
        (writer.dir / "model.safetensors").write_bytes(b"the whole model")
        writer.public()
    assert set(open_artifact(out).manifest["files"]) == {"model.safetensors"}
