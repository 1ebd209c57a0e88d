"""Fault injection: ``synthq generate`` killed (SIGKILL) or interrupted (SIGINT) at random
points of its work leaves no finished-looking artifact, and the rerun with ``--resume``
completes with a payload byte-identical to an uninterrupted run's."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from synthq.artifacts import is_artifact, open_artifact, partial_dir

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def generator(tmp_path_factory, tiny_causal_dir):
    from tests.stages.test_generate import tiny_generator_artifact

    return tiny_generator_artifact(tiny_causal_dir, tmp_path_factory.mktemp("gen") / "causal", steps=30)


def command(generator, corpus: Path, out: Path, *extra: str) -> list[str]:
    return [
        sys.executable, "-m", "synthq", "-q", "generate", "--generator", str(generator.path),
        "--corpus", str(corpus), "--all", "--num-queries", "6", "--generation-batch-size", "1",
        "--device", "cpu", "--out", str(out), *extra,
    ]  # fmt: skip


def environment(tmp_path: Path) -> dict:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "SYNTHQ_CACHE": str(tmp_path / "cache")}


def payload(path: Path) -> dict:
    return open_artifact(path, stage="generate").manifest["files"]


def started(process: subprocess.Popen, out: Path) -> bool:
    """Wait until the stage is writing (its partial directory exists) or has ended."""
    while process.poll() is None:
        if (partial_dir(out) / "checkpoints").is_dir():
            return True
        time.sleep(0.005)
    return False


@pytest.fixture(scope="module")
def reference(generator, tiny_beir, tmp_path_factory):
    """An uninterrupted run: (its payload, seconds of work after the partial directory appeared)."""
    root = tmp_path_factory.mktemp("reference")
    out = root / "reference"
    process = subprocess.Popen(command(generator, tiny_beir, out), cwd=REPO, env=environment(root))
    assert started(process, out)
    begun = time.monotonic()
    assert process.wait() == 0
    return payload(out), time.monotonic() - begun


@pytest.mark.slow
@pytest.mark.parametrize("signal_number", [signal.SIGKILL, signal.SIGINT], ids=["SIGKILL", "SIGINT"])
def test_interrupted_generate_resumes_to_the_same_payload(
    signal_number, generator, reference, tiny_beir, tmp_path
):
    expected, work_seconds = reference
    env = environment(tmp_path)
    out = tmp_path / "run"
    process = subprocess.Popen(
        command(generator, tiny_beir, out), cwd=REPO, env=env, stderr=subprocess.PIPE, text=True
    )
    assert started(process, out)
    # a random point inside the work (the run on a busy machine takes at least as long)
    time.sleep(random.Random(17 + signal_number).uniform(0, 0.6 * work_seconds))
    process.send_signal(signal_number)
    status = process.wait()
    stderr = process.stderr.read()
    assert status != 0, "the signal came after the run finished"
    if is_artifact(out):  # the signal landed after the atomic rename, during interpreter exit:
        assert payload(out) == expected  # then the artifact is whole, never half-written
        return
    assert partial_dir(out).is_dir()  # nothing looks finished; what is done is kept for --resume
    if signal_number == signal.SIGINT:
        assert status == 130
        assert stderr.strip() == "synthq: interrupted; rerun with --resume to continue", stderr
    else:
        assert status == -signal.SIGKILL
    resumed = subprocess.run(command(generator, tiny_beir, out, "--resume"), cwd=REPO, env=env)
    assert resumed.returncode == 0
    assert payload(out) == expected
    assert not partial_dir(out).exists()
