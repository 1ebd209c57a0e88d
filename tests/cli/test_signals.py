"""Interrupted runs through the real entry point in a child process: SIGTERM is handled as Ctrl-C
(one line, exit 143, the lock released, the checkpoint kept and resumable), and after a kill -9
a rerun without --resume neither restarts silently nor discards the checkpoint."""

from __future__ import annotations

import signal
import subprocess
import sys

from synthq.artifacts.locking import lock_path
from synthq.artifacts.manifest import open_artifact, partial_dir
from tests.helpers import one_line, run_main

# The child runs `synthq ARGV` and sends itself SIGNAL right after writing its first checkpoint:
# exactly where an operator's kill would land in a long run, without a race.
CHILD = """
import os, sys
from synthq.stages import finetune_lm
from synthq.cli.errors import main
signum, save = int(sys.argv[1]), finetune_lm.save_checkpoint
def save_then_die(*args, **kwargs):
    save(*args, **kwargs)
    os.kill(os.getpid(), signum)
finetune_lm.save_checkpoint = save_then_die
sys.argv = ["synthq", *sys.argv[2:]]
main()
"""


def _argv(tiny_beir, model, out) -> list[str]:
    return ["finetune-lm", "--data", str(tiny_beir), "--model", str(model), "--out", str(out),
            "--epsilon", "8", "--max-steps", "4", "--batch-size", "4", "--physical-batch-size", "4",
            "--checkpoint-every", "1", "--seed", "0"]  # fmt: skip


def _killed(signum: int, argv: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", CHILD, str(int(signum)), *argv], capture_output=True, text=True, timeout=300
    )


def test_sigterm_is_handled_as_ctrl_c(tmp_path, tiny_beir, tiny_causal_dir, capsys, monkeypatch):
    out = tmp_path / "gen"
    child = _killed(signal.SIGTERM, ["-q", *_argv(tiny_beir, tiny_causal_dir, out)])
    assert child.returncode == 143, child.stderr
    line = one_line(child.stderr + child.stdout)
    assert "terminated (SIGTERM); rerun with --resume to continue" in line
    assert not lock_path(out).exists()
    assert (partial_dir(out) / "checkpoints" / "state.pt").is_file() and not out.exists()
    status, output = run_main([*_argv(tiny_beir, tiny_causal_dir, out), "--resume"], capsys, monkeypatch)
    assert status == 0, output
    assert "resuming at step 1 of 4" in output
    assert open_artifact(out, stage="finetune-lm").manifest["metrics"]["steps"] == 4


def test_a_rerun_after_kill_9_asks_for_resume_or_force(
    tmp_path, tiny_beir, tiny_causal_dir, capsys, monkeypatch
):
    out = tmp_path / "gen"
    child = _killed(signal.SIGKILL, _argv(tiny_beir, tiny_causal_dir, out))
    assert child.returncode == -signal.SIGKILL
    checkpoint = partial_dir(out) / "checkpoints" / "state.pt"
    assert checkpoint.is_file()
    saved = checkpoint.read_bytes()
    status, output = run_main(_argv(tiny_beir, tiny_causal_dir, out), capsys, monkeypatch)
    line = one_line(output)
    assert status == 2
    assert f"{out}: an interrupted run left a checkpoint in {partial_dir(out)}" in line
    assert "--resume" in line and "--force" in line
    assert checkpoint.read_bytes() == saved and not out.exists()  # nothing discarded, nothing started
    status, output = run_main([*_argv(tiny_beir, tiny_causal_dir, out), "--force"], capsys, monkeypatch)
    assert status == 0, output
    assert "discarding the interrupted run's checkpoint" in output
    assert "resuming" not in output and not partial_dir(out).exists()


def test_a_pipeline_rerun_continues_an_interrupted_stage(
    tmp_path, tiny_beir, tiny_causal_dir, capsys, monkeypatch
):
    pipeline = tmp_path / "p.yaml"
    pipeline.write_text(
        f"name: p\nout: {tmp_path / 'runs'}\nstages:\n  - name: gen\n    stage: finetune-lm\n"
        f"    config: {{data: {tiny_beir}, model: {tiny_causal_dir}, epsilon: 8, max_steps: 4, batch_size: 4,"
        " physical_batch_size: 4, checkpoint_every: 1, seed: 0}\n"
    )
    child = _killed(signal.SIGKILL, ["run", str(pipeline)])
    assert child.returncode == -signal.SIGKILL
    out = tmp_path / "runs" / "gen"
    assert (partial_dir(out) / "checkpoints" / "state.pt").is_file()
    status, output = run_main(["run", str(pipeline)], capsys, monkeypatch)
    assert status == 0, output
    assert f"gen: continuing the interrupted run from {partial_dir(out)}" in output.replace("\n", "")
    assert "resuming at step 1 of 4" in output
    assert open_artifact(out, stage="finetune-lm").manifest["metrics"]["steps"] == 4
