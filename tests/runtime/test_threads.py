"""The torch thread rule: cores shared by the ranks of a node, with the documented overrides."""

from __future__ import annotations

import pytest
import torch

from synthq.runtime.threads import available_cores, configure_threads, oversubscribed, thread_count


def idle(count):
    return False


def test_cores_are_shared_by_the_ranks_on_a_node():
    assert thread_count(environ={}, cores=16, busy=idle) == 16
    assert thread_count(environ={"LOCAL_WORLD_SIZE": "4"}, cores=16, busy=idle) == 4
    assert thread_count(environ={"LOCAL_WORLD_SIZE": "3"}, cores=16, busy=idle) == 5
    assert thread_count(environ={"LOCAL_WORLD_SIZE": "4"}, cores=2, busy=idle) == 1  # never zero


def test_busy_cores_mean_one_thread_unless_overridden():
    asked = []

    def busy(count):
        asked.append(count)
        return True

    assert thread_count(environ={"LOCAL_WORLD_SIZE": "2"}, cores=16, busy=busy) == 1
    assert asked == [8]
    assert thread_count(environ={"OMP_NUM_THREADS": "4"}, cores=16, busy=busy) == 4
    assert asked == [8]  # an override is not second-guessed
    probe_off = {"LOCAL_WORLD_SIZE": "2", "SYNTHQ_LOAD_PROBE": "0"}
    assert thread_count(environ=probe_off, cores=16, busy=busy) == 8 and asked == [8]  # not asked
    assert oversubscribed(1) is False  # one thread cannot be oversubscribed
    assert isinstance(oversubscribed(2, repeats=2), bool)


def test_overrides_in_order():
    environ = {"LOCAL_WORLD_SIZE": "2", "OMP_NUM_THREADS": "3", "SYNTHQ_THREADS": "5"}
    assert thread_count(7, environ=environ, cores=16) == 7  # --threads
    assert thread_count(environ=environ, cores=16) == 5
    assert thread_count(environ={"OMP_NUM_THREADS": "3"}, cores=16) == 3
    # torchrun sets OMP_NUM_THREADS=1 for every multi-rank launch: that is not a user's choice
    assert thread_count(environ={"LOCAL_WORLD_SIZE": "2", "OMP_NUM_THREADS": "1"}, cores=16, busy=idle) == 8
    assert thread_count(environ={"OMP_NUM_THREADS": "1"}, cores=16) == 1  # one process: it is
    assert thread_count(environ={"LOCAL_WORLD_SIZE": "2", "SYNTHQ_THREADS": "1"}, cores=16) == 1
    with pytest.raises(ValueError, match="OMP_NUM_THREADS"):
        thread_count(environ={"OMP_NUM_THREADS": "many"}, cores=4)
    with pytest.raises(ValueError, match="threads"):
        thread_count(0)


def test_container_quota_limits_the_cores(tmp_path):
    quota = tmp_path / "cpu.max"
    quota.write_text("100000 100000\n")  # one CPU's worth
    assert available_cores(quota) == 1
    quota.write_text("max 100000\n")
    assert available_cores(quota) >= 1


def test_configure_threads_sets_torch(monkeypatch):
    before = torch.get_num_threads()
    try:
        monkeypatch.setenv("SYNTHQ_THREADS", "1")
        assert configure_threads() == 1 and torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_the_threads_option_reaches_every_stage(monkeypatch, tiny_beir):
    """``synthq --threads N`` is what a stage's device setup then uses; below 1 is refused."""
    import os

    from typer.testing import CliRunner

    from synthq.cli.app import app

    monkeypatch.delenv("SYNTHQ_THREADS", raising=False)
    monkeypatch.setenv("SYNTHQ_THREADS", "")  # restored by monkeypatch after the test
    result = CliRunner().invoke(app, ["--threads", "3", "data", "info", str(tiny_beir)])
    assert result.exit_code == 0, result.output
    assert os.environ["SYNTHQ_THREADS"] == "3" and thread_count(busy=idle) == 3
    refused = CliRunner().invoke(app, ["--threads", "0", "data", "info", str(tiny_beir)])
    assert refused.exit_code == 2 and "--threads" in refused.output
