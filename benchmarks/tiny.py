"""Tiny data and tiny models built from configs, and the one-example-at-a-time gradient ground
truth: what the test suite and the GPU check (``benchmarks/gpu_check.py``) both build, here so the
GPU check needs nothing of ``tests/`` (``tests/helpers.py`` re-exports them)."""

from __future__ import annotations

import json
from pathlib import Path

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


def ground_truth(generator, batch: dict) -> list[dict]:
    """Gradients of each example's loss, computed alone with ordinary autograd."""
    from synthq.models.sequence_loss import model_inputs, per_sequence_loss

    grads = []
    for row in range(batch["input_ids"].shape[0]):
        example = {k: v[row : row + 1] for k, v in batch.items()}
        generator.model.zero_grad()
        inputs = model_inputs(generator.kind, example)
        inputs.pop("logits_to_keep", None)  # the ground truth scores every position
        logits = generator.model(**inputs).logits
        per_sequence_loss(generator.kind, logits, example["labels"]).sum().backward()
        grads.append({n: p.grad.clone() for n, p in generator.model.named_parameters() if p.requires_grad})
    return grads


def load_for_ground_truth(path, lora: bool = False):
    """Train mode (Opacus hooks only run in training) with dropout off, so the ground truth, which
    runs the same modules, sees the same function."""
    import torch

    from synthq.models.generator import QueryGenerator

    generator = QueryGenerator.load(path, max_source_length=64)
    if lora:
        from synthq.models.generator import apply_lora as _apply_lora

        _apply_lora(generator, rank=4, alpha=8)
    for module in generator.model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
        if isinstance(getattr(module, "dropout", None), float):  # T5 attention-probability dropout
            module.dropout = 0.0
    generator.model.train()
    return generator
