"""Tiny data and tiny models built from configs, so every code path runs in seconds offline."""

from __future__ import annotations

import contextlib
import functools
import json
import math
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

from benchmarks.tiny import (  # noqa: F401 - the tiny data and models, re-exported for the tests
    DEV_QUERIES,
    TEST_QUERIES,
    TOPICS,
    TRAIN_QUERIES,
    all_texts,
    build_tokenizer,
    corpus_records,
    tiny_causal,
    tiny_sentence_encoder,
    tiny_t5,
    write_tiny_beir,
)
from synthq.cli.errors import main
from synthq.config.generator import EvolveConfig, FinetuneConfig
from synthq.config.retriever import TrainRetrieverConfig
from synthq.privacy.accounting import epsilon_for
from synthq.privacy.guarantee import Guarantee
from synthq.stages import finetune_lm


@functools.lru_cache(maxsize=64)
def _gaussian_noise_for(epsilon: float, delta: float) -> float | None:
    """σ at which one unsampled Gaussian step costs ``epsilon`` at ``delta`` under Opacus' RDP
    accountant, to a relative 1e-10 (bisection on log σ; ε falls as σ grows); ``None`` below the
    smallest ε the accountant gives one step (about 0.1 at δ = 1e-5)."""
    low, high = math.log(1e-2), math.log(1e4)
    if epsilon_for(math.exp(high), delta, 1.0, 1, "rdp").epsilon > epsilon:
        return None
    while high - low > 1e-12:
        middle = (low + high) / 2
        if epsilon_for(math.exp(middle), delta, 1.0, 1, "rdp").epsilon > epsilon:
            low = middle
        else:
            high = middle
    return math.exp(high)


def accounted(epsilon: float, delta: float = 1e-5, **fields) -> Guarantee:
    """A private guarantee of ``epsilon`` that records the mechanism behind it, as every release a
    writer accepts must: the test's exact ε, and parameters
    :func:`~synthq.privacy.accounting.check_recorded_epsilon` recomputes it from — one Gaussian
    step whose σ the accountant turns back into ``epsilon``, or below what one step can give, one
    report-noisy-max selection of pure ``epsilon``. ``fields`` are the other :class:`Guarantee`
    fields (``details`` merged)."""
    if not epsilon > 0:
        raise ValueError(f"accounted(ε = {epsilon}): a private guarantee has ε > 0; use Guarantee.public()")
    if fields.pop("accountant", "rdp") != "rdp":
        raise ValueError("accounted() computes ε with Opacus' RDP accountant; it records no other")
    extra = fields.pop("details", {})
    sigma = _gaussian_noise_for(float(epsilon), float(delta))
    if sigma is None:
        if fields.get("mechanism", "report-noisy-max") != "report-noisy-max":
            raise ValueError(f"ε = {epsilon} is below what one Gaussian step gives: only a noisy-max release")
        details = {"epsilon_per_selection": epsilon, "selections": 1, **extra}
        fields["mechanism"] = "report-noisy-max"
        return Guarantee(epsilon=epsilon, delta=delta, details=details, **fields)
    fields.setdefault("mechanism", "dp-test")
    details = {"noise_multiplier": sigma, "sample_rate": 1.0, "steps": 1, **extra}
    return Guarantee(epsilon=epsilon, delta=delta, accountant="rdp", details=details, **fields)


def tiny_retriever_artifact(out: Path, encoder_dir: Path, privacy, config: dict | None = None):
    """A ``train-retriever`` artifact holding a copy of a tiny sentence-transformers encoder with
    the given :class:`synthq.privacy.guarantee.Guarantee` (for stages that read retrievers, e.g. eval)."""
    import shutil

    from synthq.artifacts.create import create_artifact
    from synthq.artifacts.manifest import open_artifact

    with create_artifact(
        Path(out), "train-retriever", config or {"encoder": "tiny", "data": "tiny"}
    ) as writer:
        shutil.copytree(encoder_dir, writer.dir, dirs_exist_ok=True)
        writer.privacy = privacy
    return open_artifact(out, stage="train-retriever")


def comparable(guarantee) -> dict:
    """A guarantee without the ids of its releases (fresh random ids in every run), for comparing
    two runs that should state the same claim."""
    dumped = guarantee.model_dump(mode="json")
    dumped["details"] = {k: v for k, v in dumped["details"].items() if k not in ("releases", "sharing")}
    return dumped


def finetune(tmp_path, beir, model, name, **options):
    defaults = dict(batch_size=8, epochs=2, physical_batch_size=4, lr=1e-2, max_source_length=48)
    config = FinetuneConfig(data=str(beir), model=str(model), out=tmp_path / name, **{**defaults, **options})
    return finetune_lm.run(config)


def retriever_config(out, beir, encoder, **options) -> TrainRetrieverConfig:
    base = dict(max_steps=1, batch_size=4, max_query_length=16, max_doc_length=32, seed=0)
    return TrainRetrieverConfig(data=str(beir), encoder=str(encoder), out=out, **{**base, **options})


def released_text(artifact) -> str:
    """Everything a release of the artifact contains, as text (manifest + payload, no diagnostics)."""
    texts = [(artifact.path / "manifest.json").read_text()]
    for relative in artifact.manifest["files"]:
        path = artifact.path / relative
        if path.suffix in (".json", ".jsonl", ".md", ".txt", ".tsv"):
            texts.append(path.read_text(errors="ignore"))
    return "\n".join(texts)


def private_copy(tmp_path, tiny_beir, name="private", public=("test",)):
    """tiny_beir with a split declaration: train and dev private, ``public`` splits public."""
    root = tmp_path / name
    shutil.copytree(tiny_beir, root)
    private = [s for s in ("train", "dev", "test") if s not in public]
    (root / "privacy.json").write_text(json.dumps({"private_splits": private, "public_splits": list(public)}))
    return root


def _synthq(*arguments: str, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "synthq", *arguments], capture_output=True, text=True, timeout=300, cwd=cwd
    )


def run_main(argv: list[str], capsys, monkeypatch) -> tuple[int, str]:
    """``synthq ARGV`` in this process through the real entry point; (exit status, stderr+stdout)."""
    monkeypatch.setattr(sys, "argv", ["synthq", *argv])
    monkeypatch.setattr(warnings, "showwarning", warnings.showwarning)  # main() replaces it
    from synthq.runtime import console

    monkeypatch.setitem(console._state, "verbosity", console._state["verbosity"])  # -q must not leak
    capsys.readouterr()
    try:
        main()
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


def eval_argv(tmp_path, encoder: Path, beir: Path, out: Path, *extra: str) -> list[str]:
    return ["eval", "--untrained", str(encoder), "--datasets", str(beir), "--no-bm25", "--device", "cpu",
            "--out", str(out), *extra]  # fmt: skip


def evolve_config(out, data, model, embedder, **options) -> EvolveConfig:
    """A Private Evolution run small enough for a test: two candidates per document, two votes."""
    base = dict(
        data=str(data), corpus=str(data), model=str(model), embedder=str(embedder), epsilon=4.0,
        iterations=2, population=2, max_new_tokens=6, max_source_length=32, seed=3, device="cpu",
    )  # fmt: skip
    return EvolveConfig(out=out, **{**base, **options})


@contextlib.contextmanager
def output_held_by_another_process(out):
    """Another process holding ``out``'s output lock (as a running stage does) until the block
    ends; yields that process, whose pid the refusal must name."""
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\nfrom synthq.artifacts.locking import output_lock\n"
         f"with output_lock({str(out)!r}):\n    print('locked', flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parents[1],
    )  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "locked"
        yield holder
    finally:
        holder.kill()
        holder.wait()
