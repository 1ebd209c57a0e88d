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

from synthq.cli.errors import main
from synthq.config.generator import EvolveConfig, FinetuneConfig
from synthq.config.retriever import TrainRetrieverConfig
from synthq.privacy.accounting import epsilon_for
from synthq.privacy.guarantee import Guarantee
from synthq.stages import finetune_lm

TOPICS = {
    "egg": [
        "Boil eggs for nine minutes for a firm yolk and six minutes for a soft one.",
        "Poached eggs cook in simmering water with a splash of vinegar for three minutes.",
        "Scrambled eggs stay creamy when stirred slowly over low heat with butter.",
    ],
    "tax": [
        "A Roth account is funded with taxed income and withdrawals in retirement are tax free.",
        "A traditional account lowers taxable income now and withdrawals are taxed later.",
        "Capital gains on shares held over a year are taxed at a lower long term rate.",
    ],
    "sleep": [
        "Adults need seven to nine hours of sleep and a regular bedtime helps the body clock.",
        "Caffeine late in the afternoon delays sleep because it blocks adenosine receptors.",
        "Short naps of twenty minutes restore alertness without leaving you groggy.",
    ],
    "git": [
        "Git rebase replays your commits on top of another branch to keep history linear.",
        "Git merge joins two branches with a merge commit and keeps both histories intact.",
        "Git stash saves uncommitted changes so you can switch branches with a clean tree.",
    ],
}

TRAIN_QUERIES = {
    "egg-0": ["how long to boil an egg", "boiled egg minutes firm yolk"],
    "egg-1": ["poach egg vinegar", "how to poach eggs"],
    "egg-2": ["creamy scrambled eggs tips"],
    "tax-0": ["roth withdrawals tax free", "what is a roth account"],
    "tax-1": ["traditional account tax now or later"],
    "tax-2": ["long term capital gains rate"],
    "sleep-0": ["how many hours of sleep do adults need", "regular bedtime body clock"],
    "sleep-1": ["does caffeine delay sleep"],
    "sleep-2": ["how long should a nap be"],
    "git-0": ["git rebase linear history", "what does rebase do"],
    "git-1": ["git merge commit"],
    "git-2": ["save changes without commit git"],
}
TEST_QUERIES = {
    "egg-0": "hard cooked egg timing",
    "tax-1": "pre-tax retirement savings",
    "sleep-1": "coffee keeps me awake at night",
    "git-2": "put away work in progress before switching",
}
DEV_QUERIES = {"egg-2": "soft fluffy eggs in a pan", "git-0": "replay commits onto main"}


def corpus_records() -> dict[str, dict[str, str]]:
    return {
        f"{topic}-{i}": {"title": topic, "text": text}
        for topic, texts in TOPICS.items()
        for i, text in enumerate(texts)
    }


def write_tiny_beir(root: Path) -> Path:
    """A 12-document BEIR directory with train, dev and test splits."""
    root = Path(root)
    (root / "qrels").mkdir(parents=True, exist_ok=True)
    with open(root / "corpus.jsonl", "w", encoding="utf-8") as handle:
        for doc_id, doc in corpus_records().items():
            handle.write(json.dumps({"_id": doc_id, **doc}) + "\n")
    queries, qrels = {}, {"train": [], "dev": [], "test": []}
    for doc_id, texts in TRAIN_QUERIES.items():
        for k, text in enumerate(texts):
            queries[f"tr-{doc_id}-{k}"] = text
            qrels["train"].append((f"tr-{doc_id}-{k}", doc_id))
    for split, mapping in (("dev", DEV_QUERIES), ("test", TEST_QUERIES)):
        for doc_id, text in mapping.items():
            queries[f"{split}-{doc_id}"] = text
            qrels[split].append((f"{split}-{doc_id}", doc_id))
    with open(root / "queries.jsonl", "w", encoding="utf-8") as handle:
        for query_id, text in queries.items():
            handle.write(json.dumps({"_id": query_id, "text": text}) + "\n")
    # like the embedded data: the training and dev queries are private, the test split public
    (root / "privacy.json").write_text(
        json.dumps({"private_splits": ["train", "dev"], "public_splits": ["test"]}), encoding="utf-8"
    )
    for split, rows in qrels.items():
        with open(root / "qrels" / f"{split}.tsv", "w", encoding="utf-8") as handle:
            handle.write("query-id\tcorpus-id\tscore\n")
            for query_id, doc_id in rows:
                handle.write(f"{query_id}\t{doc_id}\t1\n")
    return root


def all_texts() -> list[str]:
    texts = [d["text"] for d in corpus_records().values()]
    texts += [q for qs in TRAIN_QUERIES.values() for q in qs]
    texts += list(TEST_QUERIES.values()) + list(DEV_QUERIES.values())
    return texts


def build_tokenizer(directory: Path, vocab_size: int = 400):
    """A small byte-level BPE tokenizer trained on the tiny corpus, saved as a fast tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<pad>", "</s>", "<unk>", "<s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(all_texts() * 3, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, pad_token="<pad>", eos_token="</s>", unk_token="<unk>", bos_token="<s>"
    )
    fast.save_pretrained(directory)
    return fast


def tiny_t5(directory: Path) -> Path:
    """A 2-layer T5 (relative attention bias, tied embeddings) with the tiny tokenizer."""
    import torch
    from transformers import T5Config, T5ForConditionalGeneration

    directory = Path(directory)
    tokenizer = build_tokenizer(directory)
    torch.manual_seed(0)
    config = T5Config(
        vocab_size=len(tokenizer),
        d_model=32,
        d_kv=8,
        d_ff=64,
        num_layers=2,
        num_decoder_layers=2,
        num_heads=4,
        relative_attention_num_buckets=8,
        relative_attention_max_distance=32,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        decoder_start_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=True,
    )
    T5ForConditionalGeneration(config).save_pretrained(directory)
    return directory


def tiny_causal(directory: Path) -> Path:
    """A 2-layer Llama-architecture causal LM (like SmolLM2) with the tiny tokenizer."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    directory = Path(directory)
    tokenizer = build_tokenizer(directory)
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.bos_token_id,
        tie_word_embeddings=True,
    )
    LlamaForCausalLM(config).save_pretrained(directory)
    return directory


def tiny_sentence_encoder(directory: Path, dropout: float = 0.1) -> Path:
    """A 2-layer BERT with mean pooling saved as a sentence-transformers directory, using the
    packaged MiniLM vocabulary (so tokenisation is realistic). ``dropout = 0`` makes training
    deterministic across process layouts (the torchrun tests compare weights)."""
    import torch
    from sentence_transformers import SentenceTransformer, models
    from transformers import AutoTokenizer, BertConfig, BertModel

    from synthq.models.resolve import resolve_model

    directory = Path(directory)
    backbone_dir = directory.parent / (directory.name + "-backbone")
    tokenizer = AutoTokenizer.from_pretrained(resolve_model("minilm-l6"))
    tokenizer.save_pretrained(backbone_dir)
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=512,
        hidden_dropout_prob=dropout,
        attention_probs_dropout_prob=dropout,
    )
    BertModel(config).save_pretrained(backbone_dir)
    transformer = models.Transformer(str(backbone_dir), max_seq_length=64)
    pooling = models.Pooling(transformer.get_embedding_dimension(), pooling_mode="mean")
    SentenceTransformer(modules=[transformer, pooling], device="cpu").save(str(directory))
    return directory


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
