"""Fault injection: ``synthq generate`` killed (SIGKILL) or interrupted (SIGINT) at random
points of its work leaves no finished-looking artifact, and the rerun with ``--resume``
completes with a payload byte-identical to an uninterrupted run's."""

from __future__ import annotations

import json
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


@pytest.mark.slow
@pytest.mark.parametrize("signal_number", [signal.SIGKILL, signal.SIGINT], ids=["SIGKILL", "SIGINT"])
def test_interrupted_generate_resumes_to_the_same_payload(signal_number, generator, tiny_beir, tmp_path):
    env = environment(tmp_path)
    reference = tmp_path / "reference"
    process = subprocess.Popen(command(generator, tiny_beir, reference), cwd=REPO, env=env)
    assert started(process, reference)
    begun = time.monotonic()
    assert process.wait() == 0
    work_seconds = time.monotonic() - begun
    expected = payload(reference)
    rng = random.Random(17 + signal_number)
    interrupted = 0
    for trial in range(3):
        out = tmp_path / f"run-{trial}"
        process = subprocess.Popen(
            command(generator, tiny_beir, out), cwd=REPO, env=env, stderr=subprocess.PIPE, text=True
        )
        if started(process, out):
            time.sleep(rng.uniform(0, work_seconds))
            process.send_signal(signal_number)
        status = process.wait()
        stderr = process.stderr.read()
        if status != 0:
            interrupted += 1
            assert not is_artifact(out)  # nothing that looks finished
            if signal_number == signal.SIGINT:
                assert status == 130
                assert stderr.strip() == "synthq: interrupted; rerun with --resume to continue", stderr
            else:
                assert status == -signal.SIGKILL
            resumed = subprocess.run(command(generator, tiny_beir, out, "--resume"), cwd=REPO, env=env)
            assert resumed.returncode == 0
        assert payload(out) == expected
        assert not partial_dir(out).exists()
        queries = [json.loads(line) for line in (out / "queries.jsonl").read_text().splitlines()]
        assert len(queries) == len(open_artifact(reference).metrics and queries)
    assert interrupted >= 1  # at least one signal landed inside the work
