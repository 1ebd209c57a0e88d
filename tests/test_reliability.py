"""Issue #17 through the command line: every mistake one line with the right exit status,
nothing deleted, nothing written; --force replaces only artifacts; full input hashes; the
output lock; quiet mode; progress in logs; model cards; search; derived options."""

from __future__ import annotations

import errno
import json
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from synthq import artifacts, cli
from synthq.artifacts import create_artifact, open_artifact, output_lock, sha256_tree
from synthq.config import EvalConfig, FinetuneConfig, GenerateConfig, TrainRetrieverConfig
from synthq.privacy.guarantee import Guarantee
from synthq.runtime.errors import ArtifactError

REPO = Path(__file__).resolve().parents[1]


def run_main(argv: list[str], capsys, monkeypatch) -> tuple[int, str]:
    """``synthq ARGV`` in this process through the real entry point; (exit status, stderr+stdout)."""
    monkeypatch.setattr(sys, "argv", ["synthq", *argv])
    monkeypatch.setattr(warnings, "showwarning", warnings.showwarning)  # main() replaces it
    capsys.readouterr()
    try:
        cli.main()
        status = 0
    except SystemExit as exit_:
        status = exit_.code if isinstance(exit_.code, int) else 1
    captured = capsys.readouterr()
    return status, captured.err + captured.out


def one_line(output: str) -> str:
    lines = [line for line in output.splitlines() if line.strip()]
    assert len(lines) == 1, output
    assert "Traceback" not in output
    return lines[0]


def tree(path: Path) -> dict[str, bytes]:
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


# --- 4 and 7: option values are range-checked before any work, one line naming the option ---

BAD_OPTIONS = [
    (["train-retriever", "--data", "embedded", "--dp", "batch", "--clip-norm=-1"], "--clip-norm"),
    (["finetune-lm", "--data", "embedded", "--model", "m", "--clip-norm", "0"], "--clip-norm"),
    (["generate", "--generator", "g", "--top-p", "1.5"], "--top-p"),
    (["generate", "--generator", "g", "--top-p", "0"], "--top-p"),
    (["generate", "--generator", "g", "--temperature", "0"], "--temperature"),
    (["generate", "--generator", "g", "--batch-size", "0"], "--generation-batch-size"),
    (["generate", "--generator", "g", "--max-new-tokens", "0"], "--max-new-tokens"),
    (["generate", "--generator", "g", "--shard", "3/2"], "--shard"),
    (["finetune-lm", "--data", "embedded", "--model", "m", "--max-steps", "0"], "--max-steps"),
    (["finetune-lm", "--data", "embedded", "--model", "m", "--epochs", "0"], "--epochs"),
    (["finetune-lm", "--data", "embedded", "--model", "m", "--lora-rank", "-1"], "--lora-rank"),
    (["finetune-lm", "--data", "embedded", "--model", "m", "--epsilon", "abc"], "--epsilon"),
    (["finetune-lm", "--data", "embedded", "--model", "m", "--epsilon", "0"], "--epsilon"),
    (["finetune-lm", "--data", "embedded", "--model", "m", "--delta", "1"], "--delta"),
    (["finetune-lm", "--data", "embedded", "--model", "m", "--accountant", "foo"], "--accountant"),
    (["finetune-lm", "--data", "embedded", "--model", "m", "--optimizer", "foo"], "--optimizer"),
    (["train-retriever", "--data", "embedded", "--group-size", "0"], "--group-size"),
    (["train-retriever", "--data", "embedded", "--dp", "foo"], "--dp"),
    (["canary-audit", "--data", "embedded", "--model", "m", "--epsilons", "8,-1"], "--epsilons"),
    (["canary-audit", "--data", "embedded", "--model", "m", "--finetune", "lora_rnk=4"], "lora_rnk"),
    (["canary-audit", "--data", "embedded", "--model", "m", "--finetune", "clip_norm=-1"], "clip_norm"),
    (["eval", "--device", "foo"], "--device"),
    (["eval", "--top-k", "5"], "--top-k"),
    (["eval", "--bogus"], "--bogus"),
]


@pytest.mark.parametrize(
    ("argv", "option"), BAD_OPTIONS, ids=lambda v: " ".join(v) if isinstance(v, list) else v
)
def test_bad_option_values_are_one_line_errors(argv, option, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    status, output = run_main([*argv, "--out", str(tmp_path / "out")], capsys, monkeypatch)
    assert status == 2
    line = one_line(output)
    assert line.startswith("synthq") and option in line
    assert list(tmp_path.iterdir()) == []  # nothing written, not even a partial directory


def test_cuda_on_a_cpu_build(tmp_path, capsys, monkeypatch):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    status, output = run_main(["eval", "--device", "cuda", "--out", str(tmp_path / "o")], capsys, monkeypatch)
    assert status == 2 and "--device" in one_line(output) and "no CUDA" in output


def test_missing_and_unknown_are_one_line(tmp_path, capsys, monkeypatch):
    status, output = run_main(["finetune-lm", "--data", "x"], capsys, monkeypatch)
    assert status == 2 and "--out: required" in one_line(output) and "--model: required" in output
    status, output = run_main(["nonsense"], capsys, monkeypatch)
    assert status == 2 and "No such command" in one_line(output)


# --- 1: --force replaces only synthq artifacts, never an input ---


def eval_argv(tmp_path, encoder: Path, beir: Path, out: Path, *extra: str) -> list[str]:
    return ["eval", "--untrained", str(encoder), "--datasets", str(beir), "--no-bm25", "--device", "cpu",
            "--out", str(out), *extra]  # fmt: skip


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
        writer.privacy = Guarantee(epsilon=8.0, delta=1e-5, mechanism="dp-adam")
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
    assert status == 0 and one_line(output).startswith("eval written to")  # -q keeps the result
    assert open_artifact(out, stage="eval")


# --- 6 and 7: interrupted, disk full, read-only ---


@pytest.mark.parametrize(
    ("error", "status", "words"),
    [
        (KeyboardInterrupt(), 130, "interrupted; nothing was written"),
        (
            OSError(errno.ENOSPC, "No space left on device", "/d/out"),
            1,
            "/d/out: No space left on device; free",
        ),
        (
            PermissionError(errno.EACCES, "Permission denied", "/ro/out"),
            1,
            "/ro/out: Permission denied; choose",
        ),
        (OSError(errno.EROFS, "Read-only file system", "/ro"), 1, "read-only"),
    ],
)
def test_interrupt_and_file_system_errors(
    error, status, words, tmp_path, tiny_encoder_dir, tiny_beir, capsys, monkeypatch
):
    def fail(*args, **kwargs):
        raise error

    monkeypatch.setattr(artifacts, "_finish", fail)
    out = tmp_path / "ev"
    code, output = run_main(
        ["-q", *eval_argv(tmp_path, tiny_encoder_dir, tiny_beir, out)], capsys, monkeypatch
    )
    assert code == status
    assert words in one_line(output)
    assert not out.exists() and not artifacts.partial_dir(out).exists()


def test_quiet_still_prints_errors(tmp_path, capsys, monkeypatch):
    argv = ["-q", "eval", "--retriever", str(tmp_path / "nope"), "--out", str(tmp_path / "o")]
    status, output = run_main(argv, capsys, monkeypatch)
    assert status == 2 and "no such artifact directory" in one_line(output)


# --- 2: full hashes ---


def test_edits_inside_large_files_are_seen_and_hashes_cached(tmp_path, monkeypatch):
    from synthq.data import store

    monkeypatch.setattr(artifacts, "LARGE_FILE_BYTES", 1024)
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


# --- 3: the output lock ---


def test_second_writer_on_the_same_out_is_refused(tmp_path):
    out = tmp_path / "a"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\nfrom synthq.artifacts import output_lock\n"
         f"with output_lock({str(out)!r}):\n    print('locked', flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE, text=True, cwd=REPO,
    )  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "locked"
        refused = pytest.raises(ArtifactError, match=f"being written by synthq pid {holder.pid} on ")
        with refused, create_artifact(out, "eval", {}) as writer:
            writer.privacy = Guarantee.public()
        assert not out.exists()
    finally:
        holder.kill()
        holder.wait()
    with create_artifact(out, "eval", {}) as writer:  # a killed holder leaves no stale lock
        writer.privacy = Guarantee.public()
    assert open_artifact(out) and not artifacts.lock_path(out).exists()


def test_lock_is_exclusive_within_a_process(tmp_path):
    refused = pytest.raises(ArtifactError, match=f"pid {os.getpid()}")
    with output_lock(tmp_path / "o"), refused, output_lock(tmp_path / "o"):
        pass


# --- 10: pipelines ---


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("stages:\n  - {name: ../../escape8, stage: eval}", "not a valid name"),
        ("stages:\n  - {name: 'a/b', stage: eval}", "not a valid name"),
        ("outt: x\nstages:\n  - {name: a, stage: eval}", "unknown key.*outt"),
        ("stages:\n  - {name: a, stage: eval, expect_secnds: 3}", "unknown key.*expect_secnds"),
        ("stages:\n  - {name: a, stage: eval, config: {datasetz: [x]}}", "datasetz: unknown option"),
        ("defaults: {evall: {}}\nstages:\n  - {name: a, stage: eval}", "unknown stage 'evall'"),
        (
            "stages:\n  - {name: a, stage: eval}\n"
            "expected:\n  - {stage: b, metric: x, value: 1, tolerance: 0}",
            "'b' is not a stage",
        ),
        (
            "stages:\n  - {name: a, stage: eval}\nexpected:\n  - {stage: a, metric: x, value: 1}",
            "needs a tolerance",
        ),
    ],
)
def test_bad_pipelines_are_one_line_errors(text, message, tmp_path, capsys, monkeypatch):
    path = tmp_path / "p.yaml"
    path.write_text(f"out: {tmp_path / 'runs'}\n{text}\n")
    status, output = run_main(["run", str(path), "--dry-run"], capsys, monkeypatch)
    assert status == 2 and re.search(message, one_line(output))
    assert not (tmp_path / "runs").exists() and not (tmp_path.parent / "escape8").exists()


# --- 11: progress in logs ---


def test_progress_prints_plain_lines_when_not_a_terminal(capsys, monkeypatch):
    from synthq.runtime import console

    monkeypatch.setenv("SYNTHQ_PROGRESS_INTERVAL", "0")
    monkeypatch.setattr(console.console, "_force_terminal", False)
    bar = console.progress()
    assert isinstance(bar, console.LoggedProgress)
    with bar:
        task = bar.add_task("finetune-lm", total=4, eps="0")
        for step in range(4):
            bar.update(task, advance=1, eps=f"{0.5 * (step + 1):.2f}", loss=1.0 / (step + 1))
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("finetune-lm")]
    assert len(lines) == 4
    assert lines[1].startswith("finetune-lm: 2/4 (50%) eps=1.00 loss=0.5 | ") and "/s elapsed=" in lines[1]
    assert "eta=" in lines[1] and "elapsed=" in lines[-1]


# --- 14: model cards ---


def test_model_artifacts_carry_a_model_card(tmp_path):
    guarantee = Guarantee(
        epsilon=7.93, delta=1e-5, unit="query", mechanism="dp-adam", accountant="rdp",
        details={"noise_multiplier": 0.91}, derived_from=["ab" * 32],
    )  # fmt: skip
    with create_artifact(tmp_path / "gen", "finetune-lm", {"epsilon": 8}) as writer:
        (writer.dir / "model.safetensors").write_bytes(b"w")
        writer.privacy = guarantee
    card = (tmp_path / "gen" / "README.md").read_text()
    for fact in ("| ε | 7.93 |", "| δ | 1e-05 |", "query", "dp-adam", "| accountant | rdp |",
                 "noise_multiplier | 0.91", "abababab"):  # fmt: skip
        assert fact in card
    assert open_artifact(tmp_path / "gen").manifest["files"]["README.md"]  # hashed and verified
    with create_artifact(tmp_path / "ret", "train-retriever", {}) as writer:
        (writer.dir / "README.md").write_text("---\nlibrary_name: sentence-transformers\n---\n# ST card\n")
        writer.privacy = Guarantee.non_private("trained on private queries without DP")
    card = (tmp_path / "ret" / "README.md").read_text()
    assert card.startswith("---\nlibrary_name: sentence-transformers") and "# ST card" in card
    assert "| ε | ∞ (no differential privacy) |" in card and "Not private" in card
    with create_artifact(tmp_path / "ev", "eval", {}) as writer:
        writer.privacy = Guarantee.public()
    assert not (tmp_path / "ev" / "README.md").exists()


# --- 13: search ---


def test_search_prints_top_k_with_scores(tiny_encoder_dir, tiny_beir, capsys, monkeypatch):
    import numpy as np

    from synthq.models.encoder import load_encoder
    from tests.helpers import corpus_records

    query = "how long to boil an egg"
    argv = ["search", "--retriever", str(tiny_encoder_dir), "--corpus", str(tiny_beir), "--top-k", "3",
            "--json", "--device", "cpu", query]  # fmt: skip
    status, output = run_main(argv, capsys, monkeypatch)
    assert status == 0, output
    hits = [json.loads(line) for line in output.splitlines() if line.startswith("{")]
    # independent: cosine similarity of the encoder's own embeddings over the whole corpus
    records = corpus_records()
    ids = sorted(records)
    model = load_encoder(str(tiny_encoder_dir), device="cpu")
    docs = model.encode(
        [f"{records[i]['title']} {records[i]['text']}" for i in ids], normalize_embeddings=True
    )
    q = model.encode([query], normalize_embeddings=True)[0]
    scores = docs @ q
    best = [ids[i] for i in np.argsort(-scores)[:3]]
    assert [h["doc_id"] for h in hits] == best and [h["rank"] for h in hits] == [1, 2, 3]
    assert np.allclose([h["score"] for h in hits], np.sort(scores)[::-1][:3], atol=1e-4)


# --- #15: options derived from the config models ---


@pytest.mark.parametrize(
    ("command", "config_class"),
    [
        ("finetune-lm", FinetuneConfig),
        ("generate", GenerateConfig),
        ("train-retriever", TrainRetrieverConfig),
        ("eval", EvalConfig),
    ],  # fmt: skip
)
def test_every_config_field_is_an_option_with_help(command, config_class):
    from typer.testing import CliRunner

    from synthq.cli.options import flag_name

    result = CliRunner().invoke(cli.app, [command, "--help"], terminal_width=200)
    assert result.exit_code == 0
    text = result.output.split("\nOptions:\n")[1]
    assert "<bool>" not in text and "list[" not in text
    for name, field in config_class.model_fields.items():
        if (field.json_schema_extra or {}).get("cli", {}).get("hidden"):
            continue
        entries = ("\n" + text).split("\n  -")  # one option (and its wrapped help) per entry
        line = " ".join(
            next(e for e in entries if re.match(re.escape(flag_name(name, field)[1:]) + r"[ ,]", e)).split()
        )
        assert field.description and " ".join(field.description.split()[:3]) in line
        default = field.get_default(call_default_factory=True)
        if isinstance(default, int | float | str) and not isinstance(default, bool) and default != "":
            assert f"[default: {default}]" in line


def test_old_batch_size_names_still_work():
    assert GenerateConfig(out="o", generator="g", batch_size=3).generation_batch_size == 3
    assert EvalConfig(out="o", batch_size=5).encode_batch_size == 5
    from synthq.cli.options import build

    assert (
        build(
            GenerateConfig, {"out": "o", "generator": "g", "generation_batch_size": "7"}
        ).generation_batch_size
        == 7
    )


# --- 12: the README's forms and library warnings ---


def test_merge_takes_several_shards_after_one_flag(tmp_path, capsys, monkeypatch):
    from synthq.stages import generate

    seen = {}

    def merge(shards, out, force=False):
        seen.update(shards=shards, out=out, force=force)
        raise ArtifactError("stop here")

    monkeypatch.setattr(generate, "merge", merge)
    argv = ["generate", "--merge", "runs/syn-0", "runs/syn-1", "runs/syn-2", "--out", "runs/syn"]
    status, output = run_main(argv, capsys, monkeypatch)
    assert status == 2 and "stop here" in one_line(output)
    assert seen == {
        "shards": [Path(f"runs/syn-{i}") for i in range(3)],
        "out": Path("runs/syn"),
        "force": False,
    }
    status, output = run_main(["generate", "runs/syn-0", "--out", "x"], capsys, monkeypatch)
    assert status == 2 and "after --merge" in one_line(output)


def test_library_warnings_are_one_synthq_line(capsys, monkeypatch):
    from synthq import search

    def noisy(*args, **kwargs):
        warnings.warn("`resume_download` is deprecated\nand more text", FutureWarning, stacklevel=1)
        warnings.warn("a library has\nsomething to say", UserWarning, stacklevel=1)
        return [[]]

    monkeypatch.setattr(search, "search", noisy)
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        status, output = run_main(["search", "--retriever", "x", "q"], capsys, monkeypatch)
    assert status == 0
    assert "resume_download" not in output  # deprecations only with -v
    assert one_line(output.replace("q\n", "")) == "warning: a library has (UserWarning)"
