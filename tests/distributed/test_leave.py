"""The CLI leaves a joined process group before the interpreter's teardown (a gloo group left to
the teardown can SIGABRT a finished stage: "terminate called without an active exception")."""

from __future__ import annotations

import pytest
import torch.distributed as dist

from synthq.runtime import distributed


def _join_alone(tmp_path, name: str) -> None:
    store = f"file://{tmp_path / name}"
    dist.init_process_group(backend="gloo", init_method=store, rank=0, world_size=1)


def test_leave_destroys_a_gloo_group_whether_or_not_the_work_completed(tmp_path):
    for completed in (True, False):
        _join_alone(tmp_path, f"store-{completed}")
        assert distributed.topology().backend == "gloo"
        distributed.leave(completed=completed)
        assert not dist.is_initialized()
        assert distributed.topology().world_size == 1


def test_leave_without_a_group_does_nothing():
    assert not dist.is_initialized()
    distributed.leave()
    assert not dist.is_initialized()


def test_the_cli_leaves_the_group_after_a_command_and_after_a_failure(tmp_path, monkeypatch):
    from synthq.cli import errors as cli

    left = []
    monkeypatch.setattr(distributed, "leave", lambda completed=True: left.append(completed))
    monkeypatch.setattr(cli, "app", lambda **_: 0)
    assert cli._run_app() == 0

    def failing(**_):
        raise RuntimeError("boom")

    monkeypatch.setattr(cli, "app", failing)
    with pytest.raises(RuntimeError, match="boom"):
        cli._run_app()
    assert left == [True, False]
