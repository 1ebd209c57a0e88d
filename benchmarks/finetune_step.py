"""finetune-lm step time and peak memory: non-private vs DP (exact vmap per-example gradients),
full fine-tuning vs LoRA, on the packaged SmolLM2-135M and a T5-small-shaped model.

    python benchmarks/finetune_step.py [--batch 8] [--tokens 128] [--steps 3]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks._measure import measure, report  # noqa: E402


def make_step(model_spec: str, private: bool, lora: int, batch: int, tokens: int):
    import torch

    from synthq.dp.lm import DPStep, non_private_step, prepare_model_for_per_sample_gradients
    from synthq.models.generator import QueryGenerator
    from synthq.stages.finetune_lm import _apply_lora

    torch.manual_seed(0)
    if model_spec == "t5-small-shape":
        import tempfile

        from transformers import AutoTokenizer, T5Config, T5ForConditionalGeneration

        from synthq.models.resolve import resolve_model

        directory = Path(tempfile.mkdtemp())
        T5ForConditionalGeneration(T5Config()).save_pretrained(directory)  # T5-small shape, random
        AutoTokenizer.from_pretrained(resolve_model("smollm2-135m")).save_pretrained(directory)
        generator = QueryGenerator.load(directory, max_source_length=tokens)
    else:
        generator = QueryGenerator.load(model_spec, max_source_length=tokens)
    if lora:
        _apply_lora(generator, lora, None)
    if private:
        prepare_model_for_per_sample_gradients(generator)
    generator.model.train()
    words = " ".join(["retrieval"] * tokens)
    documents, queries = [words] * batch, ["a short user query about retrieval"] * batch
    optimizer = torch.optim.Adam([p for p in generator.model.parameters() if p.requires_grad], lr=1e-4)

    def make_batch(indices):
        return generator.training_batch([documents[i] for i in indices], [queries[i] for i in indices], 24)

    indices = list(range(batch))
    if private:
        dp = DPStep(generator, optimizer, 0.1, 1.0, batch, batch)
        noise = torch.Generator().manual_seed(0)
        return lambda: dp.step(make_batch, indices, noise)
    return lambda: non_private_step(generator, optimizer, make_batch, indices, batch)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--models", default="smollm2-135m,t5-small-shape")
    args = parser.parse_args()
    for model in args.models.split(","):
        results = {}
        for name, private, lora in (
            ("non_private_full", False, 0),
            ("dp_vmap_full", True, 0),
            ("non_private_lora16", False, 16),
            ("dp_vmap_lora16", True, 16),
        ):
            results[name] = measure(
                make_step, model, private, lora, args.batch, args.tokens, steps=args.steps
            )
        report(
            f"finetune_step[{model}, batch {args.batch} x {args.tokens} tokens]", results, "non_private_full"
        )


if __name__ == "__main__":
    main()
