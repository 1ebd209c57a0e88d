"""The artifact contract: atomic creation, verification, lineage, up-to-date checks."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from synthq.artifacts.create import create_artifact
from synthq.artifacts.freshness import existing_result, find_up_to_date
from synthq.artifacts.manifest import open_artifact, partial_dir
from synthq.artifacts.records import data_input_record
from synthq.config.generator import GenerateConfig
from synthq.privacy.guarantee import Guarantee
from synthq.runtime.errors import ArtifactError, PrivacyError
from tests.helpers import accounted

PRIVATE = accounted(epsilon=3.0, delta=1e-5, mechanism="dp-adam", accountant="rdp")


def make(out, payload="hello", config=None, inputs=()):
    config = config or {"out": str(out), "value": 1}
    with create_artifact(out, "generate", config, inputs) as writer:
        (writer.dir / "payload.txt").write_text(payload)
        (writer.dir / "sub").mkdir()
        (writer.dir / "sub" / "nested.json").write_text("{}")
        writer.privacy = PRIVATE
        writer.metrics["count"] = 2
    return open_artifact(out, stage="generate")


def test_create_and_open_round_trip(tmp_path):
    artifact = make(tmp_path / "art")
    manifest = json.loads((tmp_path / "art" / "manifest.json").read_text())
    assert manifest["stage"] == "generate" and manifest["schema"] == 2
    assert set(manifest["files"]) == {"payload.txt", "sub/nested.json"}
    assert manifest["config"]["value"] == 1
    assert "torch" in manifest["environment"] and "wall_seconds" in manifest["timings"]
    privacy = artifact.privacy
    assert (privacy.epsilon, privacy.delta, privacy.mechanism) == (3.0, 1e-5, "dp-adam")
    assert artifact.metrics == {"count": 2}
    assert not partial_dir(tmp_path / "art").exists()


def test_exception_leaves_nothing(tmp_path):
    out = tmp_path / "art"
    with pytest.raises(RuntimeError), create_artifact(out, "generate", {"out": str(out)}) as writer:
        (writer.dir / "half.txt").write_text("half")
        raise RuntimeError("boom")
    assert not out.exists() and not partial_dir(out).exists()


def test_missing_guarantee_is_an_error(tmp_path):
    out = tmp_path / "art"
    with pytest.raises(ArtifactError, match="privacy"), create_artifact(out, "generate", {}) as writer:
        (writer.dir / "x").write_text("x")
    assert not out.exists()


@pytest.mark.parametrize(
    ("guarantee", "refusal"),
    [
        (
            Guarantee(epsilon=3.0, delta=1e-5, mechanism="dp-adam", accountant="rdp"),
            "no mechanism parameters",
        ),
        (PRIVATE.model_copy(update={"epsilon": 1.0}), "does not match its mechanism's parameters"),
        (Guarantee.public(), "recorded as public"),
        (PRIVATE.model_copy(update={"epsilon": -1.0}), "negative"),
    ],
    ids=["unaccounted", "edited-epsilon", "public-release", "negative"],
)
def test_a_release_whose_epsilon_cannot_be_recomputed_is_refused_before_it_is_sealed(
    tmp_path, guarantee, refusal
):
    out = tmp_path / "art"
    data = {"name": "private", "sha256": "hmac:x", "kind": "data"}
    with pytest.raises(PrivacyError, match=refusal), create_artifact(out, "generate", {}) as writer:
        (writer.dir / "x").write_text("x")
        writer.release(guarantee, data, ["q1"])
    assert not out.exists() and not partial_dir(out).exists()


def test_a_private_guarantee_labelled_public_is_refused(tmp_path):
    out = tmp_path / "art"
    labelled = Guarantee(epsilon=8.0, delta=1e-5, mechanism="public")  # would print ε = 0
    with pytest.raises(PrivacyError, match="labelled public"), create_artifact(out, "generate", {}) as writer:
        (writer.dir / "x").write_text("x")
        writer.privacy = labelled
    assert not out.exists()


def test_keep_partial_for_resume(tmp_path):
    out = tmp_path / "art"
    with (
        pytest.raises(KeyboardInterrupt),
        create_artifact(out, "generate", {}, keep_partial_on_error=True) as w,
    ):
        (w.checkpoint_dir / "step-3.pt").write_text("state")
        raise KeyboardInterrupt
    assert not out.exists()
    assert (partial_dir(out) / "checkpoints" / "step-3.pt").exists()
    with create_artifact(out, "generate", {}, resume=True) as writer:
        assert (writer.checkpoint_dir / "step-3.pt").read_text() == "state"
        (writer.dir / "final.txt").write_text("done")
        writer.privacy = PRIVATE
    artifact = open_artifact(out)
    assert "checkpoints/step-3.pt" not in artifact.manifest["files"]  # scratch removed
    assert not (out / "checkpoints").exists()


def test_killed_process_leaves_no_artifact(tmp_path):
    out = tmp_path / "art"
    script = textwrap.dedent(
        f"""
        import time
        from synthq.artifacts.create import create_artifact
        with create_artifact({str(out)!r}, "generate", {{}}) as writer:
            (writer.dir / "payload.txt").write_text("x")
            print("started", flush=True)
            time.sleep(60)
        """
    )
    process = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert process.stdout.readline().strip() == "started"
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert not out.exists()  # a partial directory may remain hidden, but never the artifact
    process = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert process.stdout.readline().strip() == "started"
    process.send_signal(signal.SIGINT)  # Ctrl-C cleans up the partial directory too
    process.wait()
    assert not out.exists() and not partial_dir(out).exists()


def test_tampering_and_truncation_are_detected(tmp_path):
    make(tmp_path / "art")
    (tmp_path / "art" / "payload.txt").write_text("hellO")
    with pytest.raises(ArtifactError, match="payload.txt"):
        open_artifact(tmp_path / "art")
    make(tmp_path / "b")
    os.remove(tmp_path / "b" / "sub" / "nested.json")
    with pytest.raises(ArtifactError, match="nested.json.*missing"):
        open_artifact(tmp_path / "b")


def test_wrong_stage_schema_and_missing(tmp_path):
    make(tmp_path / "art")
    with pytest.raises(ArtifactError, match="expected 'finetune-lm'"):
        open_artifact(tmp_path / "art", stage="finetune-lm")
    manifest_path = tmp_path / "art" / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["schema"] = 99
    manifest_path.write_text(json.dumps(manifest))
    with pytest.raises(ArtifactError, match="schema"):
        open_artifact(tmp_path / "art")
    with pytest.raises(ArtifactError, match="no such artifact"):
        open_artifact(tmp_path / "missing")
    (tmp_path / "plain").mkdir()
    with pytest.raises(ArtifactError, match="not an artifact"):
        open_artifact(tmp_path / "plain")
    manifest_path.write_text("{not json")
    with pytest.raises(ArtifactError, match="corrupt"):
        open_artifact(tmp_path / "art")


def test_lineage_and_up_to_date(tmp_path, tiny_beir):
    data = data_input_record(tiny_beir, name="tiny")
    first = make(tmp_path / "first", inputs=[data])
    assert first.inputs[0]["sha256"] == data["sha256"]
    config = GenerateConfig(out=tmp_path / "second", generator=first.path, corpus=str(tiny_beir))
    inputs = [first.input_record()]
    assert existing_result("generate", config, inputs) is None
    with create_artifact(config.out, "generate", config, inputs) as writer:
        (writer.dir / "q.txt").write_text("q")
        writer.privacy = first.privacy.inherit(first.manifest_hash)
    second = open_artifact(config.out)
    assert second.inputs[0]["sha256"] == first.manifest_hash
    assert second.privacy.derived_from == [first.manifest_hash]
    # same config (a different --force/--resume does not matter) -> reused
    same = config.model_copy(update={"resume": True})
    assert existing_result("generate", same, inputs).path == config.out
    # a changed config, or changed inputs, is not up to date and needs --force
    changed = config.model_copy(update={"top_p": 0.9})
    assert find_up_to_date(config.out, "generate", changed, inputs) is None
    with pytest.raises(ArtifactError, match="--force"):
        existing_result("generate", changed, inputs)
    assert existing_result("generate", changed.model_copy(update={"force": True}), inputs) is None
    time.sleep(0.01)
    make(tmp_path / "first", payload="changed")  # replaces the input artifact
    assert (
        find_up_to_date(config.out, "generate", config, [open_artifact(tmp_path / "first").input_record()])
        is None
    )


def test_replacing_an_artifact_is_atomic(tmp_path):
    make(tmp_path / "art", payload="one")
    make(tmp_path / "art", payload="two")
    assert (tmp_path / "art" / "payload.txt").read_text() == "two"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["art"]


def test_an_output_another_process_finished_meanwhile_is_not_redone(tmp_path):
    """Two runs of one stage start together: both find nothing up to date; the other process
    finishes first. Under the lock, this one sees the up-to-date artifact and stops instead of
    training again and replacing it."""
    out = tmp_path / "art"
    config = GenerateConfig(out=out, generator="gen", corpus="embedded")
    assert existing_result("generate", config, []) is None  # this run: nothing there yet
    other = textwrap.dedent(
        f"""
        from synthq.config.generator import GenerateConfig
        from tests.artifacts.test_artifacts import make
        config = GenerateConfig(out={str(out)!r}, generator="gen", corpus="embedded")
        make({str(out)!r}, payload="theirs", config=config)
        """
    )
    subprocess.run([sys.executable, "-c", other], check=True, cwd=os.getcwd(), timeout=120)
    with (
        pytest.raises(ArtifactError, match="another process finished"),
        create_artifact(out, "generate", config) as writer,
    ):
        writer.privacy = PRIVATE
    assert (out / "payload.txt").read_text() == "theirs"
    # A run that looks again finds it up to date; a changed config may rewrite it.
    assert existing_result("generate", config, []) is not None
    changed = GenerateConfig(out=out, generator="gen", corpus="embedded", seed=5)
    assert make(out, payload="mine", config=changed).metrics == {"count": 2}
