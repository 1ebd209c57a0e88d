"""A full disk (ENOSPC) during ``finetune-lm`` is one line and exit status 1, as in ``generate`` and
``train-retriever``: torch and safetensors wrap the OSError in their own exceptions (a
RuntimeError from ``torch.save``, a ``SafetensorError`` whose message ends in ``(os error 28)``),
which used to reach the user as a 51-line traceback."""

from __future__ import annotations

import errno
import io

import pytest
from safetensors import SafetensorError

from synthq.artifacts import checkpoint
from tests.helpers import one_line, run_main


def _argv(tiny_beir, model, out, *extra):
    return ["-q", "finetune-lm", "--data", str(tiny_beir), "--model", str(model), "--out", str(out),
            "--epsilon", "inf", "--max-steps", "2", "--batch-size", "4", "--physical-batch-size", "4",
            *extra]  # fmt: skip


def test_a_full_disk_while_saving_the_model_is_one_line(
    tmp_path, tiny_beir, tiny_causal_dir, capsys, monkeypatch
):
    import transformers.modeling_utils

    def full_disk(*args, **kwargs):
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr(transformers.modeling_utils, "safe_save_file", full_disk)
    out = tmp_path / "gen"
    status, output = run_main(_argv(tiny_beir, tiny_causal_dir, out), capsys, monkeypatch)
    line = one_line(output)
    assert status == 1
    assert f"while writing {out}: No space left on device; free some space" in line


class _FullDisk(io.RawIOBase):
    def writable(self):
        return True

    def write(self, data):
        raise OSError(errno.ENOSPC, "No space left on device")


def test_a_full_disk_while_writing_a_checkpoint_is_one_line(
    tmp_path, tiny_beir, tiny_causal_dir, capsys, monkeypatch
):
    real_open = open

    def open_on_a_full_disk(path, mode="r", *args, **kwargs):
        if "w" in mode and str(path).endswith(".tmp"):
            real_open(path, "wb").close()  # created, then the disk is full
            return io.BufferedWriter(_FullDisk())
        return real_open(path, mode, *args, **kwargs)

    monkeypatch.setattr(checkpoint, "open", open_on_a_full_disk, raising=False)
    out = tmp_path / "gen"
    status, output = run_main(
        _argv(tiny_beir, tiny_causal_dir, out, "--checkpoint-every", "1"), capsys, monkeypatch
    )
    line = one_line(output)
    assert status == 1
    assert "No space left on device; free some space" in line
    assert not list(tmp_path.glob(".gen.partial/checkpoints/*"))  # the cut-off copy is removed, not resumable


def test_a_full_disk_during_export_names_the_release_not_the_source(tmp_path, capsys, monkeypatch):
    from synthq.artifacts import export
    from synthq.artifacts.create import create_artifact
    from synthq.privacy.guarantee import Guarantee

    source = tmp_path / "ev"
    with create_artifact(source, "eval", {}) as writer:
        (writer.dir / "results.md").write_text("# results\n")
        writer.privacy = Guarantee.public()

    def full_disk(src, dst, *args, **kwargs):  # as shutil's sendfile path reports it: the source
        raise OSError(errno.ENOSPC, "No space left on device", str(src), None, str(dst))

    monkeypatch.setattr(export.shutil, "copyfile", full_disk)
    release = tmp_path / "release"
    status, output = run_main(["-q", "export", str(source), "--out", str(release)], capsys, monkeypatch)
    line = one_line(output)
    assert status == 1
    assert f"{release}: No space left on device; free some space" in line and "results.md" not in line
    assert not release.exists() and not list(tmp_path.glob(".release*"))


def test_a_full_disk_when_the_owner_key_is_first_written_leaves_no_key_and_names_the_setting(
    tmp_path, capsys, monkeypatch
):
    """Issue #74: the key used to be written in place, so a full disk left a 0-byte owner.key that
    every later command refused ("not a synthq key (0 bytes)"), and the message read ``?:``."""
    import os

    from synthq.privacy import keys

    state = tmp_path / "state"
    monkeypatch.setenv("SYNTHQ_STATE", str(state))
    keys._load_key.cache_clear()
    real_fdopen = os.fdopen

    def fdopen_on_a_full_disk(descriptor, mode="r", *args, **kwargs):
        if "w" in mode:
            os.close(descriptor)
            return io.BufferedWriter(_FullDisk())
        return real_fdopen(descriptor, mode, *args, **kwargs)

    monkeypatch.setattr(os, "fdopen", fdopen_on_a_full_disk)
    status, output = run_main(["key"], capsys, monkeypatch)
    line = one_line(output)
    assert status == 1
    assert f"{state / keys.KEY_FILE}: No space left on device" in line and "SYNTHQ_STATE" in line
    assert "?" not in line.split(":")[1]
    assert list(state.iterdir()) == []  # neither a cut-off key nor its hidden copy
    monkeypatch.setattr(os, "fdopen", real_fdopen)  # space freed
    keys._load_key.cache_clear()
    status, output = run_main(["key"], capsys, monkeypatch)
    assert status == 0 and len((state / keys.KEY_FILE).read_bytes()) == keys.KEY_BYTES


def test_a_full_disk_leaves_no_partial_artifact_unless_a_checkpoint_can_resume(
    tmp_path, tiny_beir, tiny_causal_dir, capsys, monkeypatch
):
    """Issue #74: finetune-lm (and generate) left ``.X.partial`` behind after a full disk, without a
    word; now the partial is removed unless it holds a checkpoint, and then the line says so."""
    import transformers.modeling_utils

    def full_disk(*args, **kwargs):
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr(transformers.modeling_utils, "safe_save_file", full_disk)
    out = tmp_path / "gen"
    status, output = run_main(_argv(tiny_beir, tiny_causal_dir, out), capsys, monkeypatch)
    assert status == 1 and "--resume" not in one_line(output)
    assert not (tmp_path / ".gen.partial").exists()  # nothing to resume from: nothing kept

    status, output = run_main(
        _argv(tiny_beir, tiny_causal_dir, out, "--checkpoint-every", "1"), capsys, monkeypatch
    )
    line = one_line(output)
    assert status == 1 and (tmp_path / ".gen.partial" / "checkpoints").is_dir()
    assert f"the checkpoint in {tmp_path / '.gen.partial'} is kept: rerun with --resume" in line


def test_a_full_disk_while_writing_the_statement_names_it_and_leaves_nothing(tmp_path, capsys, monkeypatch):
    from pathlib import Path

    from synthq.artifacts.create import create_artifact
    from synthq.privacy.guarantee import Guarantee

    source = tmp_path / "ev"
    with create_artifact(source, "eval", {}) as writer:
        (writer.dir / "results.md").write_text("# results\n")
        writer.privacy = Guarantee.public()
    real_write_text = Path.write_text

    def write_text_on_a_full_disk(self, *args, **kwargs):
        if self.name.endswith(".partial"):
            real_write_text(self, "")  # created, then the disk is full
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write_text(self, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", write_text_on_a_full_disk)
    out = tmp_path / "statement.md"
    status, output = run_main(["ledger", str(source), "--statement", "--out", str(out)], capsys, monkeypatch)
    assert status == 1 and one_line(output).startswith(f"synthq: {out}: No space left on device; free some")
    assert not out.exists() and not list(tmp_path.glob(".statement*"))


def test_a_full_disk_in_a_pipeline_stage_is_the_disk_line_with_its_stage(tmp_path):
    """Issue #74: ``synthq run`` exited 2 with the serializer's raw error and no path."""
    from types import SimpleNamespace

    from synthq.pipeline.run import _run_stage

    def stage_run(config):
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    class Config:  # a stage without --resume
        model_fields: dict = {}
        out = tmp_path / "gen"

    stage = SimpleNamespace(name="gen", stage="finetune-lm", config=Config(), forced=False)
    with pytest.raises(
        OSError, match="No space left on device .pipeline 'demo' stopped at stage 'gen'"
    ) as raised:
        _run_stage(SimpleNamespace(name="demo"), stage, stage_run, {})
    assert raised.value.errno == errno.ENOSPC


def test_a_full_cache_disk_is_blamed_on_the_cache_not_on_out(tmp_path, monkeypatch):
    """A library's ENOSPC names no file; when SYNTHQ_CACHE lies on another disk that is full, the
    advice is about SYNTHQ_CACHE, not ``--out``."""
    from pathlib import Path

    from synthq.artifacts.process_state import this_process
    from synthq.cli import errors

    cache = tmp_path / "cache"
    monkeypatch.setenv("SYNTHQ_CACHE", str(cache))
    monkeypatch.setattr(
        errors, "_disk", lambda path: (2, 0, 10**9) if cache in (path, *path.parents) else (1, 10**10, 10**11)
    )
    monkeypatch.setattr(this_process, "writing", [Path(tmp_path / "out")])
    line = errors._os_error_line(OSError(errno.ENOSPC, "No space left on device"))
    assert line.startswith(f"while writing {tmp_path / 'out'}: No space left on device; point SYNTHQ_CACHE")
    assert "--out" not in line


def test_a_full_disk_with_no_output_and_no_file_named_does_not_speak_of_out(monkeypatch):
    """``data info`` (which writes only synthq's cache) on a full disk: no ``?`` for a path and no
    ``--out`` it does not have."""
    from synthq.artifacts.process_state import this_process
    from synthq.cli import errors

    monkeypatch.setattr(this_process, "writing", [])
    monkeypatch.setattr(this_process, "failed", [])
    monkeypatch.setattr(errors, "_full_setting_elsewhere", lambda trouble: None)
    line = errors._os_error_line(OSError(errno.ENOSPC, "No space left on device"))
    assert line.startswith("No space left on device; free some space, or point SYNTHQ_CACHE (now ")
    assert "--out" not in line and "?" not in line
