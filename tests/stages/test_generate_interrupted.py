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

from synthq.artifacts.manifest import is_artifact, open_artifact, partial_dir
from synthq.stages.generate import PROGRESS_FILE

REPO = Path(__file__).resolve().parents[2]


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


def default_sigint() -> None:
    """Give the child the SIGINT of a terminal's Ctrl-C. A test run started in the background by
    a non-interactive shell (``pytest ... &``, as CI scripts may) ignores SIGINT, the child
    inherits that, and Python then installs no KeyboardInterrupt handler: the signal would be
    dropped by design of the shell, not by synthq."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def logged_queries(process: subprocess.Popen, out: Path, count: int) -> int:
    """Wait until the progress log holds ``count`` finished queries (or the run has ended)."""
    log = partial_dir(out) / "checkpoints" / PROGRESS_FILE
    lines = 0
    while process.poll() is None:
        lines = log.read_bytes().count(b"\n") if log.is_file() else 0
        if lines >= count:
            break
        time.sleep(0.002)
    return lines


@pytest.fixture(scope="module")
def reference(generator, tiny_beir, tmp_path_factory):
    """The payload of an uninterrupted run."""
    root = tmp_path_factory.mktemp("reference")
    out = root / "reference"
    process = subprocess.Popen(command(generator, tiny_beir, out), cwd=REPO, env=environment(root))
    assert started(process, out)
    assert process.wait() == 0
    return payload(out)


@pytest.mark.slow
@pytest.mark.parametrize("signal_number", [signal.SIGKILL, signal.SIGINT], ids=["SIGKILL", "SIGINT"])
def test_interrupted_generate_resumes_to_the_same_payload(
    signal_number, generator, reference, tiny_beir, tmp_path
):
    expected = reference
    env = environment(tmp_path)
    out = tmp_path / "run"
    process = subprocess.Popen(
        command(generator, tiny_beir, out), cwd=REPO, env=env, stderr=subprocess.PIPE, text=True,
        preexec_fn=default_sigint,
    )  # fmt: skip
    assert started(process, out)
    # a random point inside the work: after k of the 72 queries are logged (k drawn from the
    # first half), so a fast run cannot finish before the signal (a sleep drawn from the
    # reference run's time once landed after an idle machine had finished)
    after = random.Random(17 + signal_number).randint(1, 36)
    assert logged_queries(process, out, after) >= after, "the run ended before the signal"
    process.send_signal(signal_number)
    status = process.wait()
    stderr = process.stderr.read()
    assert status != 0, f"the signal was not acted on: {stderr}"
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
