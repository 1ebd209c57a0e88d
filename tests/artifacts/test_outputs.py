"""Outputs and their safety: --force replaces only artifacts and never an input, up-to-date runs skip,
edits inside large files are seen, and one writer holds an output's lock."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from synthq.artifacts.create import create_artifact
from synthq.artifacts.locking import lock_path, output_lock
from synthq.artifacts.manifest import open_artifact
from synthq.privacy.guarantee import Guarantee
from synthq.runtime import hashing
from synthq.runtime.errors import ArtifactError
from synthq.runtime.hashing import sha256_tree
from tests.helpers import accounted, eval_argv, one_line, output_held_by_another_process, run_main


def tree(path: Path) -> dict[str, bytes]:
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def test_force_refuses_a_directory_that_is_not_an_artifact(
    tmp_path, tiny_encoder_dir, tiny_beir, capsys, monkeypatch
):
    users = tmp_path / "v"
    users.mkdir()
    (users / "keep").write_text("mine")
    status, output = run_main(
        eval_argv(tmp_path, tiny_encoder_dir, tiny_beir, users, "--force"), capsys, monkeypatch
    )
    assert status == 2 and "not a synthq artifact" in one_line(output)
    assert tree(users) == {"keep": b"mine"}


def test_force_never_replaces_an_input(tmp_path, tiny_encoder_dir, tiny_beir, capsys, monkeypatch):
    import shutil

    data = tmp_path / "tinycopy"
    shutil.copytree(tiny_beir, data)
    before = tree(data)
    status, output = run_main(
        eval_argv(tmp_path, tiny_encoder_dir, data, data, "--force"), capsys, monkeypatch
    )
    assert status == 2 and "is an input of this command" in one_line(output)
    assert tree(data) == before
    # an input artifact is protected as well, even though it is an artifact
    source = tmp_path / "ret"
    with create_artifact(source, "train-retriever", {"x": 1}) as writer:
        shutil.copytree(tiny_encoder_dir, writer.dir, dirs_exist_ok=True)
        writer.privacy = accounted(epsilon=8.0, delta=1e-5, mechanism="dp-adam")
    before = tree(source)
    argv = ["eval", "--retriever", str(source), "--datasets", str(tiny_beir), "--out", str(source), "--force"]
    status, output = run_main(argv, capsys, monkeypatch)
    assert status == 2 and "is an input" in one_line(output) and tree(source) == before


def test_force_replaces_an_artifact_and_skips_print_up_to_date(
    tmp_path, tiny_encoder_dir, tiny_beir, capsys, monkeypatch
):
    out = tmp_path / "ev"
    argv = eval_argv(tmp_path, tiny_encoder_dir, tiny_beir, out)
    status, output = run_main(argv, capsys, monkeypatch)
    assert status == 0, output
    assert output.count("eval written to") == 1 and "Traceback" not in output
    status, output = run_main(argv, capsys, monkeypatch)
    assert status == 0 and "written to" not in output and "up to date" in output
    status, output = run_main(["-q", *argv, "--force"], capsys, monkeypatch)
    lines = [line for line in output.splitlines() if line.strip()]
    assert status == 0 and lines[-1].startswith("eval written to")  # -q keeps the result
    assert "| retriever | method | ε |" in output  # and the table
    assert open_artifact(out, stage="eval")


def test_edits_inside_large_files_are_seen_and_hashes_cached(tmp_path, monkeypatch):
    from synthq.runtime import file_digests as store

    monkeypatch.setattr(hashing, "LARGE_FILE_BYTES", 1024)
    monkeypatch.setattr(store, "RACY_SECONDS", -1.0)  # remember the digest of a file just written
    root = tmp_path / "data"
    root.mkdir()
    big = root / "corpus.jsonl"
    content = bytearray(b"x" * (5 << 20))
    big.write_bytes(content)
    first = sha256_tree(root)
    reads = []
    real = store.file_sha256
    monkeypatch.setattr(store, "file_sha256", lambda p, *a: reads.append(p) or real(p, *a))
    assert sha256_tree(root) == first and reads == []  # unchanged: from the cache, not re-read
    content[len(content) // 2] = ord("y")  # one byte in the middle, same size
    stat = big.stat()
    big.write_bytes(content)
    os.utime(big, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    assert sha256_tree(root) != first and reads == [big]


def test_second_writer_on_the_same_out_is_refused(tmp_path):
    out = tmp_path / "a"
    with output_held_by_another_process(out) as holder:
        refused = pytest.raises(ArtifactError, match=f"being written by synthq pid {holder.pid} on ")
        with refused, create_artifact(out, "eval", {}) as writer:
            writer.privacy = Guarantee.public()
        assert not out.exists()
    with create_artifact(out, "eval", {}) as writer:  # a killed holder leaves no stale lock
        writer.privacy = Guarantee.public()
    assert open_artifact(out) and not lock_path(out).exists()


def test_lock_is_exclusive_within_a_process(tmp_path):
    refused = pytest.raises(ArtifactError, match=f"pid {os.getpid()}")
    with output_lock(tmp_path / "o"), refused, output_lock(tmp_path / "o"):
        pass
