"""Whether synthq's DP steps are correct and fast on this GPU: one command, one JSON file, one table.

    make gpu-check                                   # on a GPU machine: installs .whl/ first if there
    python benchmarks/gpu_check.py [--out benchmarks/gpu_check.json] [--sections norms,steps]
    python benchmarks/gpu_check.py --cpu-smoke       # tiny sizes on a CPU (the test suite runs this)

Every model is built from its architecture's config with random weights and a small BPE tokenizer
(no download, no packaged weights): SmolLM2-135M (Llama, 30 layers, tied embeddings), T5-Base
(12 + 12 layers, relative attention bias) and MiniLM-L6 (BERT, 6 layers, mean pooling) at their
real sizes on a GPU, two-layer versions of the same architectures with ``--cpu-smoke``.

Sections (each writes its part of the JSON as soon as it ends; one that fails records its error
and the others still run; ``--budget-s`` skips what would start after the budget):

* ``environment``: GPU, driver, CUDA, torch, transformers, Opacus, peft, sentence-transformers.
* ``norms``: per-example gradient norms of the ``ghost`` and ``hooks`` engines against the
  one-example-at-a-time autograd ground truth, fp32 and bf16, for both generators; each
  example's clipped contribution (≤ C); the retriever's ``--dp group`` and ``--dp sample``
  sums on neighbouring batches (≤ the stated sensitivity), fp32 and bf16.
* ``steps``: step time and peak GPU memory, DP against non-private in the same process: full and
  LoRA SmolLM2, full T5-Base, MiniLM ``--dp group`` and ``--dp sample``.
* ``generation``: queries per second, synthq's sampler against Hugging Face ``generate`` on the
  same batches, both warmed on the largest batch first (the random model never stops early, so
  every query runs ``--new-tokens``); its parts: greedy decoding, the nucleus draw with and
  without its ``topk`` tiers on flat and on sharpened logits, the rows' own uniform numbers.
* ``stages``: finetune-lm (DP), generate and train-retriever under ``torchrun --nproc_per_node 1``
  (NCCL), then a DP retriever and eval, on tiny data with ``--device cuda`` (``--cpu-smoke``:
  the same chain with ``--device cpu``, no torchrun): artifacts written, ε, wall time per stage.
* ``profile``: one profiled full-SmolLM2 bf16 step, DP (ghost) and non-private: wall against
  device time, kernel launches, the operators of most device time.

``--step-batch N`` sets the generators' batch of ``steps`` and ``profile`` (default 32). The
first GPU rows (one H200, 2026-11-27) are in ``benchmarks/gpu_check_h200.json`` and
docs/performance.md#gpu-check.

Aims (from the issue that asked for this check): DP step ≤ 1.10× non-private for full SmolLM2
(ghost), ≤ 1.05× with LoRA, at bf16; ≥ 1,000 generated queries per second with SmolLM2-135M on
one H100; bf16 norms within 1 % (relative) of the fp32 ground truth, fp32 within 1e-5.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SECTIONS = ("environment", "norms", "steps", "generation", "stages", "profile")
AIMS = {
    "fp32_norm_error": 1e-5,
    "bf16_norm_error": 1e-2,
    "dp_step_ratio_full_smollm2_bf16": 1.10,
    "dp_step_ratio_lora_smollm2_bf16": 1.05,
    "queries_per_second_smollm2": 1000.0,
}


@dataclass(frozen=True)
class Sizes:
    """How big each part of the check is: real sizes on a GPU, tiny with ``--cpu-smoke``."""

    real_models: bool
    norm_batch: int
    norm_tokens: int
    step_batch: int
    step_tokens: int
    retriever_batch: int
    timed_steps: int
    generate_documents: int
    generate_batch: int
    new_tokens: int


GPU = Sizes(True, 4, 128, 32, 128, 64, 5, 2048, 512, 24)
SMOKE = Sizes(False, 3, 32, 4, 32, 6, 1, 8, 4, 4)


# ----------------------------------------------------------------------------- models from configs
def build_models(root: Path, sizes: Sizes) -> dict[str, Path]:
    """SmolLM2-135M-, T5-Base- and MiniLM-L6-shaped models with random weights and one small BPE
    tokenizer, saved as directories synthq loads like any model (two layers with --cpu-smoke)."""
    import torch
    from sentence_transformers import SentenceTransformer, models
    from transformers import (
        BertConfig,
        BertModel,
        LlamaConfig,
        LlamaForCausalLM,
        T5Config,
        T5ForConditionalGeneration,
    )

    from benchmarks.tiny import build_tokenizer

    real = sizes.real_models
    paths = {name: root / name for name in ("smollm2-135m", "t5-base", "minilm-l6")}
    special = build_tokenizer(paths["smollm2-135m"])
    special.save_pretrained(paths["t5-base"])
    torch.manual_seed(0)
    ids = dict(pad_token_id=special.pad_token_id, eos_token_id=special.eos_token_id)
    llama = LlamaConfig(
        vocab_size=49152 if real else len(special), hidden_size=576 if real else 32,
        intermediate_size=1536 if real else 64, num_hidden_layers=30 if real else 2,
        num_attention_heads=9 if real else 4, num_key_value_heads=3 if real else 2,
        max_position_embeddings=8192, rms_norm_eps=1e-5, rope_theta=100000.0, tie_word_embeddings=True,
        bos_token_id=special.bos_token_id, **ids,
    )  # fmt: skip
    LlamaForCausalLM(llama).save_pretrained(paths["smollm2-135m"])
    t5 = T5Config(
        vocab_size=32128 if real else len(special), d_model=768 if real else 32, d_kv=64 if real else 8,
        d_ff=3072 if real else 64, num_layers=12 if real else 2, num_decoder_layers=12 if real else 2,
        num_heads=12 if real else 4, decoder_start_token_id=special.pad_token_id, tie_word_embeddings=True,
        **ids,
    )  # fmt: skip
    T5ForConditionalGeneration(t5).save_pretrained(paths["t5-base"])
    bert = BertConfig(
        vocab_size=30522 if real else len(special), hidden_size=384 if real else 32,
        num_hidden_layers=6 if real else 2, num_attention_heads=12 if real else 4,
        intermediate_size=1536 if real else 64, max_position_embeddings=512,
        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, pad_token_id=special.pad_token_id,
    )  # fmt: skip
    backbone = paths["minilm-l6"].with_name("minilm-l6-backbone")
    special.save_pretrained(backbone)
    BertModel(bert).save_pretrained(backbone)
    transformer = models.Transformer(str(backbone), max_seq_length=256)
    pooling = models.Pooling(transformer.get_embedding_dimension(), pooling_mode="mean")
    SentenceTransformer(modules=[transformer, pooling], device="cpu").save(str(paths["minilm-l6"]))
    return paths


def texts(count: int, words: int, seed: int = 0) -> list[str]:
    """``count`` different documents of about ``words`` words, from the tiny corpus' vocabulary."""
    import random

    from benchmarks.tiny import all_texts

    vocabulary = sorted({w for t in all_texts() for w in t.lower().split()})
    rng = random.Random(seed)
    return [" ".join(rng.choice(vocabulary) for _ in range(words)) for _ in range(count)]


# ----------------------------------------------------------------------------- the check's frame
class Check:
    """The results so far, written to ``out`` after every section."""

    def __init__(self, out: Path, budget_s: float, smoke: bool):
        self.out, self.budget_s, self.started = out, budget_s, time.perf_counter()
        self.results: dict = {"check": "gpu_check", "cpu_smoke": smoke, "sections": {}}

    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    @contextlib.contextmanager
    def section(self, name: str):
        entry: dict = {}
        self.results["sections"][name] = entry
        if self.elapsed() > self.budget_s:
            entry["skipped"] = f"over the {self.budget_s:.0f} s budget"
            yield None
            self.write()
            return
        started = time.perf_counter()
        try:
            yield entry
        except Exception as error:  # one broken part must not lose the others' results
            entry["error"] = f"{type(error).__name__}: {error}"
            entry["traceback"] = traceback.format_exc(limit=-6)  # the innermost frames
        entry["seconds"] = round(time.perf_counter() - started, 1)
        self.write()

    def write(self) -> None:
        self.results["wall_seconds"] = round(self.elapsed(), 1)
        self.out.parent.mkdir(parents=True, exist_ok=True)
        self.out.write_text(json.dumps(self.results, indent=2, default=str) + "\n", encoding="utf-8")


def synchronize(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def peak_memory_reset(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def peak_memory_gib(device: str) -> float | None:
    import torch

    return round(torch.cuda.max_memory_allocated() / 2**30, 2) if device.startswith("cuda") else None


# ----------------------------------------------------------------------------- sections
def environment(device: str) -> dict:
    import torch

    env = {"python": platform.python_version(), "torch": torch.__version__, "device": device}
    for name in ("transformers", "opacus", "peft", "sentence_transformers", "pydantic"):
        try:
            env[name] = __import__(name).__version__
        except Exception as error:
            env[name] = f"missing ({type(error).__name__})"
    if device.startswith("cuda"):
        properties = torch.cuda.get_device_properties(0)
        capability = ".".join(map(str, torch.cuda.get_device_capability(0)))
        env.update(
            gpu=torch.cuda.get_device_name(0), cuda=torch.version.cuda,
            memory_gib=round(properties.total_memory / 2**30, 1), capability=capability,
            bf16=torch.cuda.is_bf16_supported(), tf32_matmul=torch.backends.cuda.matmul.allow_tf32,
        )  # fmt: skip
        with contextlib.suppress(Exception):
            query = ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]
            env["driver"] = subprocess.run(query, capture_output=True, text=True, timeout=20).stdout.strip()
    return env


def generator_norms(path: Path, device: str, sizes: Sizes) -> list[dict]:
    """``ghost`` and ``hooks`` per-example norms at fp32 and bf16 against the fp32 ground truth."""
    import torch

    from benchmarks.tiny import ground_truth
    from benchmarks.tiny import load_for_ground_truth as load
    from synthq.dp.clipping import norm
    from synthq.dp.lm.clippers import make_clipper
    from synthq.runtime.precision import use_precision

    generator = load(path)
    generator.model.to(device)
    documents = texts(sizes.norm_batch, sizes.norm_tokens, seed=1)
    queries = texts(sizes.norm_batch, 8, seed=2)
    batch = {k: v.to(device) for k, v in generator.training_batch(documents, queries, 16).items()}
    truth = ground_truth(generator, batch)
    true_norms = torch.stack([norm(list(t.values())) for t in truth])
    del truth
    generator.model.zero_grad(set_to_none=True)
    clip_norm = float(true_norms.min()) / 2  # every example is clipped: the worst case for the bound
    rows = []
    for mode in ("ghost", "hooks"):
        clipper = make_clipper(generator, clip_norm, mode)
        try:
            for precision in ("fp32", "bf16"):
                with use_precision(precision, device):
                    _, norms, _ = clipper.clipped_sum(batch)
                    contributions = []
                    for row in range(len(documents)):
                        alone = torch.zeros(len(documents), device=device)
                        alone[row] = 1.0
                        part, _, _ = clipper.clipped_sum(batch, alone)
                        contributions.append(float(norm(list(part.values()))) / clip_norm)
                error = float(((norms - true_norms).abs() / true_norms).max())
                aim = AIMS[f"{precision}_norm_error"]
                rows.append({
                    "mode": mode, "precision": precision, "max_relative_norm_error": error, "aim": aim,
                    "max_contribution_over_c": max(contributions),
                    "ok": error <= aim and max(contributions) <= 1 + 1e-5,
                })  # fmt: skip
        finally:
            clipper.close()
    return rows


def retriever_sensitivities(path: Path, device: str, sizes: Sizes) -> list[dict]:
    """``--dp group`` and ``--dp sample`` on neighbouring batches (each pair removed in turn)."""
    from synthq.dp.clipping import norm
    from synthq.dp.contrastive.examples import Example
    from synthq.dp.contrastive.group import GroupClipping
    from synthq.dp.contrastive.sample import SampleClipping
    from synthq.dp.noise import SecretRandomness
    from synthq.models.encoder import embed, load_encoder
    from synthq.runtime.precision import use_precision

    encoder = load_encoder(path, device=device)
    encoder.eval()  # no dropout: neighbouring batches must see the same function
    parameters = [p for p in encoder.parameters() if p.requires_grad]
    count = min(sizes.retriever_batch, 8)
    documents, queries = texts(count, 64, seed=3), texts(count, 8, seed=4)
    batch = [Example(queries[i], documents[i], f"d{i}", f"q{i}") for i in range(count)]
    clip_norm = 1e-3

    def mechanism(mode: str):
        if mode == "sample":
            return SampleClipping(clip_norm, 0.05)
        group = GroupClipping(clip_norm, 0.05, 3, count, randomness=SecretRandomness(seed=1), model=encoder)
        group.one_pass = True
        return group

    def encode(strings, side):
        return embed(encoder, strings, 32 if side == "query" else 128)

    rows = []
    for mode in ("group", "sample"):
        for precision in ("fp32", "bf16"):
            with use_precision(precision, device):
                full, _ = mechanism(mode).clipped_sum(encode, batch, parameters)
                moved = []
                for removed in range(count):
                    smaller, _ = mechanism(mode).clipped_sum(
                        encode, batch[:removed] + batch[removed + 1 :], parameters
                    )
                    moved.append(float(norm([a - b for a, b in zip(full, smaller, strict=True)])))
            sensitivity = mechanism(mode).sensitivity(count)
            rows.append({
                "mode": mode, "precision": precision, "max_change_over_sensitivity": max(moved) / sensitivity,
                "ok": max(moved) <= sensitivity * (1.05 if precision == "bf16" else 1 + 1e-4),
            })  # fmt: skip
    return rows


def timed(step, device: str, steps: int) -> tuple[float, float | None]:
    """Seconds per step (after two untimed steps) and the peak GPU memory of the timed steps."""
    for _ in range(2):
        step()
    synchronize(device)
    peak_memory_reset(device)
    started = time.perf_counter()
    for _ in range(steps):
        step()
    synchronize(device)
    return (time.perf_counter() - started) / steps, peak_memory_gib(device)


def step_times(paths: dict[str, Path], device: str, sizes: Sizes) -> list[dict]:
    """DP against non-private step time and memory; each side built, timed and freed in turn."""
    import gc

    from benchmarks import finetune_step, retriever_step
    from synthq.runtime.precision import use_precision

    rows = []
    plans = [  # (label, model, lora, dp mode, precision, aim)
        ("full SmolLM2-135M", "smollm2-135m", 0, "ghost", "bf16", AIMS["dp_step_ratio_full_smollm2_bf16"]),
        ("full SmolLM2-135M", "smollm2-135m", 0, "ghost", "fp32", None),
        (
            "LoRA r = 16 SmolLM2-135M",
            "smollm2-135m",
            16,
            "ghost",
            "bf16",
            AIMS["dp_step_ratio_lora_smollm2_bf16"],
        ),
        ("full T5-Base", "t5-base", 0, "ghost", "bf16", None),
        ("MiniLM-L6 --dp group", "minilm-l6", 0, "group", "bf16", None),
        ("MiniLM-L6 --dp sample", "minilm-l6", 0, "sample", "bf16", None),
    ]
    for label, model, lora, mode, precision, aim in plans:
        row = {"work": label, "precision": precision,
               "batch": sizes.retriever_batch if model == "minilm-l6" else sizes.step_batch}  # fmt: skip
        sides = {}
        try:  # one failing pair must not lose the other rows
            with use_precision(precision, device):
                for side in ("non_private", "dp"):
                    if model == "minilm-l6":
                        step = retriever_step.make_step(
                            mode if side == "dp" else "non_private", sizes.retriever_batch, 32, 128,
                            encoder_spec=str(paths[model]), device=device,
                        )  # fmt: skip
                    else:
                        step = finetune_step.make_step(
                            str(paths[model]), mode if side == "dp" else None, lora, sizes.step_batch,
                            sizes.step_tokens, device=device,
                        )  # fmt: skip
                    sides[side] = timed(step, device, sizes.timed_steps)
                    del step
                    gc.collect()
        except Exception as error:
            rows.append({**row, "error": f"{type(error).__name__}: {error}",
                         "traceback": traceback.format_exc(limit=-4), "ok": False})  # fmt: skip
            continue
        ratio = sides["dp"][0] / sides["non_private"][0]
        aim = aim if sizes.real_models else None  # tiny models' ratios say nothing about the aims
        rows.append({
            **row, "non_private_s": round(sides["non_private"][0], 4), "dp_s": round(sides["dp"][0], 4),
            "ratio": round(ratio, 3), "non_private_peak_gib": sides["non_private"][1],
            "dp_peak_gib": sides["dp"][1],
            "aim": aim, "ok": None if aim is None else ratio <= aim,
        })  # fmt: skip
    return rows


def generation(path: Path, device: str, sizes: Sizes) -> dict:
    """Queries per second: synthq's batched sampler against ``generate`` on the same batches."""
    import torch

    from synthq.models.generator import QueryGenerator
    from synthq.models.sampling import Request, length_sorted_batches, sample_queries
    from synthq.runtime.precision import forward_autocast, use_precision

    generator = QueryGenerator.load(path, device=device, max_source_length=128)
    generator.model.eval()
    documents = texts(sizes.generate_documents, 100, seed=5)
    requests = [Request(f"d{i}", text, 0) for i, text in enumerate(documents)]
    batches = length_sorted_batches(requests, generator, sizes.generate_batch)
    result = {"documents": len(requests), "batch": sizes.generate_batch, "new_tokens": sizes.new_tokens}
    with use_precision("auto", device) as precision:
        result["precision"] = precision

        def ours():
            for batch in batches:
                sample_queries(generator, batch, 0, 0.8, 1.0, sizes.new_tokens)

        tokenizer = generator.tokenizer

        def hugging_face():
            for batch in batches:
                inputs = generator.generation_batch([r.document for r in batch]).to(device)
                with torch.inference_mode(), forward_autocast():
                    generator.model.generate(
                        **inputs, do_sample=True, top_p=0.8, top_k=0, max_new_tokens=sizes.new_tokens,
                        pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
                    )  # fmt: skip

        # warm-up: both paths once on the largest batch (kernel choices, the allocator's blocks),
        # so neither timing pays first-use costs the other does not
        sample_queries(generator, batches[0], 0, 0.8, 1.0, sizes.new_tokens)
        inputs = generator.generation_batch([r.document for r in batches[0]]).to(device)
        with torch.inference_mode(), forward_autocast():
            generator.model.generate(
                **inputs, do_sample=True, top_p=0.8, top_k=0, max_new_tokens=sizes.new_tokens,
                pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
            )  # fmt: skip
        for name, run in (("synthq", ours), ("hf_generate", hugging_face)):
            synchronize(device)
            started = time.perf_counter()
            run()
            synchronize(device)
            result[f"{name}_queries_per_second"] = round(len(requests) / (time.perf_counter() - started), 1)
        result["parts"] = sampling_parts(generator, batches, device, sizes)
    result["speedup"] = round(
        result["synthq_queries_per_second"] / result["hf_generate_queries_per_second"], 2
    )
    result["aim"] = AIMS["queries_per_second_smollm2"] if sizes.real_models else None
    result["ok"] = None if result["aim"] is None else result["synthq_queries_per_second"] >= result["aim"]
    return result


def sampling_parts(generator, batches, device: str, sizes: Sizes) -> dict:
    """Where synthq's decoding time goes: the same batches decoded greedily (the model's passes and
    the loop, no sampling), and per step on one batch's first-step logits: the nucleus draw with
    its ``topk`` tiers and with a plain sort, on the model's logits and on logits 8× sharper (a
    trained generator's peaked distribution), and the rows' uniform numbers from their own streams."""
    import torch

    from synthq.models.sampling import NUCLEUS_CANDIDATES, nucleus_draw, sample_queries
    from synthq.runtime.precision import forward_autocast

    def clock(work, repeats: int = 1) -> float:
        synchronize(device)
        started = time.perf_counter()
        for _ in range(repeats):
            work()
        synchronize(device)
        return (time.perf_counter() - started) / repeats

    parts: dict = {}
    queries = sum(len(batch) for batch in batches)
    seconds = clock(
        lambda: [sample_queries(generator, b, 0, 0.8, 1.0, sizes.new_tokens, greedy=True) for b in batches]
    )
    parts["greedy_queries_per_second"] = round(queries / seconds, 1)
    batch = batches[0]
    inputs = generator.generation_batch([r.document for r in batch]).to(device)
    with torch.inference_mode(), forward_autocast():
        logits = generator.model(**inputs, logits_to_keep=1).logits[:, -1].float()
    uniforms = torch.rand(len(batch), dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    for name, scaled in (("model", logits), ("sharpened_x8", logits * 8)):
        probabilities = scaled.softmax(-1)
        held = probabilities.topk(min(NUCLEUS_CANDIDATES[0], probabilities.shape[-1]), -1)[0].sum(-1) >= 0.8
        parts[f"{name}_rows_within_first_tier"] = round(held.float().mean().item(), 3)
        for how, candidates in (("tiers", NUCLEUS_CANDIDATES), ("sort", ())):
            step_s = clock(lambda: nucleus_draw(scaled, uniforms, 0.8, candidates), 10)  # noqa: B023
            parts[f"{name}_nucleus_{how}_ms_per_step"] = round(1000 * step_s, 3)
    streams = [torch.Generator().manual_seed(i) for i in range(len(batch))]
    draw_s = clock(lambda: torch.cat([torch.rand(1, generator=s, dtype=torch.float64) for s in streams]), 10)
    parts["row_uniforms_ms_per_step"] = round(1000 * draw_s, 3)
    parts["batch"] = len(batch)
    return parts


def profile(path: Path, device: str, sizes: Sizes) -> dict:
    """Where a full SmolLM2-135M bf16 step's time goes, DP (ghost clipping) and non-private: the
    operators of most self device time in one profiled step (after two untimed ones), and the
    step's device time against its wall time (a step far longer than its device time is bound by
    kernel launches and synchronisation, not by arithmetic)."""
    import gc

    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    from benchmarks import finetune_step
    from synthq.runtime.precision import use_precision

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    result = {}
    with use_precision("bf16", device):
        for side, mode in (("non_private", None), ("dp_ghost", "ghost")):
            step = finetune_step.make_step(
                str(path), mode, 0, sizes.step_batch, sizes.step_tokens, device=device
            )
            for _ in range(2):
                step()
            synchronize(device)
            started = time.perf_counter()
            with torch_profile(activities=activities) as profiler:
                step()
                synchronize(device)
            wall = time.perf_counter() - started
            # host-side operators only (kernels are their children): an operator's self device
            # time is the kernels it launched itself, so the sum counts each kernel once; on a CPU
            # the operators' own CPU time stands in
            events = [e for e in profiler.key_averages() if str(e.device_type).endswith("CPU")]
            field = "self_device_time_total" if device == "cuda" else "self_cpu_time_total"

            def own_us(event, field=field) -> float:
                return float(getattr(event, field, 0.0) or 0.0)

            result[side] = {
                "wall_ms": round(1000 * wall, 1),
                "device_ms": round(sum(own_us(e) for e in events) / 1000, 1),
                "kernel_launches": int(sum(e.count for e in events if e.key.startswith("cudaLaunchKernel"))),
                "top": [
                    {"op": e.key[:80], "calls": e.count, "ms": round(own_us(e) / 1000, 2)}
                    for e in sorted(events, key=own_us, reverse=True)[:15]
                ],
            }
            del step
            gc.collect()
    return result


def stage_chain(root: Path, device: str, use_torchrun: bool) -> list[dict]:
    """The demo's stage chain on tiny data and tiny models, each stage a fresh process."""
    from benchmarks.tiny import tiny_causal, write_tiny_beir

    data = write_tiny_beir(root / "beir")
    generator = tiny_causal(root / "tiny-causal")
    encoder = build_models(root / "tiny", SMOKE)["minilm-l6"]
    launcher = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes",
        "1",
        "--nproc_per_node",
        "1",
        "-m",
        "synthq",
    ]
    plain = [sys.executable, "-m", "synthq"]
    out = root / "runs"
    private = ["--epsilon", "8", "--delta", "1e-3", "--epochs", "1", "--batch-size", "4"]
    stages = [
        ("finetune-lm", True,
         ["--data", data, "--model", generator, "--out", out / "gen", *private, "--max-source-length", "48"]),
        ("generate", True,
         ["--generator", out / "gen", "--corpus", data, "--out", out / "syn", "--max-new-tokens", "8"]),
        ("train-retriever", True,
         ["--data", out / "syn", "--encoder", encoder, "--out", out / "ret", "--max-steps", "2",
          "--batch-size", "4"]),
        ("train-retriever", False,
         ["--data", data, "--encoder", encoder, "--out", out / "ret-dp", "--dp", "group", *private]),
        ("eval", False,
         ["--retriever", out / "ret", "--retriever", out / "ret-dp", "--datasets", data,
          "--out", out / "eval", "--no-bm25"]),
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    rows = []
    for stage, distributed, arguments in stages:
        command = (launcher if distributed and use_torchrun else plain) + [stage, *map(str, arguments)]
        command += ["--device", device]
        started = time.perf_counter()
        finished = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)
        seconds = round(time.perf_counter() - started, 1)
        row = {
            "stage": stage,
            "torchrun": distributed and use_torchrun,
            "seconds": seconds,
            "exit": finished.returncode,
        }
        target = Path(arguments[arguments.index("--out") + 1])
        manifest = target / "manifest.json"
        if manifest.is_file():
            written = json.loads(manifest.read_text())
            row.update(artifact=True, epsilon=written["privacy"].get("epsilon"),
                       precision=written["environment"].get("precision"))  # fmt: skip
        else:
            row.update(artifact=False, stderr=finished.stderr[-1500:])
        row["ok"] = finished.returncode == 0 and row["artifact"]
        rows.append(row)
        if not row["ok"]:
            break
    return rows


# ----------------------------------------------------------------------------- the table
def table(results: dict) -> str:
    """The check as a Markdown table: what was checked, the figure, the aim, pass or fail."""
    from synthq.privacy.guarantee import format_epsilon

    sections = results["sections"]
    env = sections.get("environment", {})
    lines = [
        f"gpu_check on {env.get('gpu', 'CPU (smoke)')} · torch {env.get('torch')} · "
        f"CUDA {env.get('cuda', '—')} · driver {env.get('driver', '—')} · "
        f"transformers {env.get('transformers')} · opacus {env.get('opacus')}",
        "",
        "| check | figure | aim | ok |",
        "|---|---|---|---|",
    ]

    def verdict(value):
        return "—" if value is None else ("yes" if value else "**NO**")

    for model, rows in sections.get("norms", {}).get("generators", {}).items():
        for row in rows:
            lines.append(
                f"| {model} {row['mode']} norms, {row['precision']} | "
                f"max rel. error {row['max_relative_norm_error']:.1e}, "
                f"max contribution {row['max_contribution_over_c']:.6f} C | "
                f"≤ {row['aim']:.0e}, ≤ C | {verdict(row['ok'])} |"
            )
    for row in sections.get("norms", {}).get("retriever", []):
        lines.append(
            f"| MiniLM-L6 --dp {row['mode']} neighbours, {row['precision']} | "
            f"{row['max_change_over_sensitivity']:.4f} × sensitivity | ≤ 1 | {verdict(row['ok'])} |"
        )
    for row in sections.get("steps", {}).get("rows", []):
        if "error" in row:
            lines.append(
                f"| {row['work']} DP step vs non-private, {row['precision']} | {row['error']} | — | **NO** |"
            )
            continue
        memory = (
            f", peak {row['non_private_peak_gib']} → {row['dp_peak_gib']} GiB" if row["dp_peak_gib"] else ""
        )
        aim = f"≤ {row['aim']:.2f}×" if row["aim"] else "—"
        lines.append(
            f"| {row['work']} DP step vs non-private, {row['precision']}, batch {row['batch']} | "
            f"{row['ratio']:.2f}× "
            f"({row['non_private_s']:.3f} → {row['dp_s']:.3f} s{memory}) | {aim} | {verdict(row['ok'])} |"
        )
    gen = sections.get("generation", {})
    if "synthq_queries_per_second" in gen:
        aim = f"≥ {gen['aim']:,.0f} q/s" if gen["aim"] else "—"
        lines.append(
            f"| generate, {gen['documents']} documents, batch {gen['batch']}, "
            f"{gen['new_tokens']} new tokens, {gen['precision']} | "
            f"{gen['synthq_queries_per_second']:,.1f} q/s (HF generate "
            f"{gen['hf_generate_queries_per_second']:,.1f}, {gen['speedup']:.2f}×) | "
            f"{aim} | {verdict(gen['ok'])} |"
        )
    if "parts" in gen:
        parts = gen["parts"]
        lines.append(
            f"| generate's parts, batch {parts['batch']}: greedy decoding; nucleus draw with tiers / "
            f"with a sort on the model's logits and on 8× sharper ones; rows' uniforms | "
            f"{parts['greedy_queries_per_second']:,.1f} q/s; "
            f"{parts['model_nucleus_tiers_ms_per_step']} / {parts['model_nucleus_sort_ms_per_step']} ms, "
            f"{parts['sharpened_x8_nucleus_tiers_ms_per_step']} / "
            f"{parts['sharpened_x8_nucleus_sort_ms_per_step']} ms; "
            f"{parts['row_uniforms_ms_per_step']} ms a step | — | — |"
        )
    for row in sections.get("stages", {}).get("rows", []):
        how = "torchrun, 1 rank" if row["torchrun"] else "one process"
        epsilon = "—" if row.get("epsilon") is None else format_epsilon(float(row["epsilon"]))
        figure = (
            f"{row['seconds']} s, ε = {epsilon}, precision {row.get('precision')}"
            if row["artifact"]
            else f"exit {row['exit']}, no artifact: {row['stderr'].strip().splitlines()[-1:]}"
        )
        lines.append(f"| {row['stage']} ({how}) | {figure} | artifact written | {verdict(row['ok'])} |")
    for side, entry in sections.get("profile", {}).items():
        if isinstance(entry, dict) and "wall_ms" in entry:
            lines.append(
                f"| profile: full SmolLM2-135M {side} step, bf16 | wall {entry['wall_ms']} ms, device "
                f"{entry['device_ms']} ms, {entry['kernel_launches']} kernel launches | — | — |"
            )
    for name, entry in sections.items():
        if "error" in entry or "skipped" in entry:
            lines.append(f"| {name} | {entry.get('error') or entry.get('skipped')} | — | **NO** |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "gpu_check.json")
    parser.add_argument(
        "--sections", default=",".join(SECTIONS), help="comma-separated: " + ", ".join(SECTIONS)
    )
    parser.add_argument(
        "--cpu-smoke", action="store_true", help="tiny sizes on a CPU; CUDA-only parts skipped"
    )
    parser.add_argument(
        "--budget-s", type=float, default=420.0, help="start no section after this many seconds"
    )
    parser.add_argument(
        "--step-batch", type=int, default=None, help="the generators' batch in the steps section (default 32)"
    )
    args = parser.parse_args(argv)
    import torch

    wanted = [s for s in args.sections.split(",") if s]
    unknown = set(wanted) - set(SECTIONS)
    if unknown:
        parser.error(f"unknown sections {sorted(unknown)}; choose from {SECTIONS}")
    if not args.cpu_smoke and not torch.cuda.is_available():
        parser.error("no CUDA GPU visible: run with --cpu-smoke for the CPU check")
    device = "cpu" if args.cpu_smoke else "cuda"
    sizes = SMOKE if args.cpu_smoke else GPU
    if args.step_batch:
        sizes = replace(sizes, step_batch=args.step_batch)
    check = Check(args.out, args.budget_s, args.cpu_smoke)
    with tempfile.TemporaryDirectory(prefix="synthq-gpu-check-") as scratch:
        root = Path(scratch)
        paths = build_models(root / "models", sizes) if set(wanted) - {"environment", "stages"} else {}
        for name in wanted:
            with check.section(name) as entry:
                if entry is None:
                    continue
                if name == "environment":
                    entry.update(environment(device))
                elif name == "norms":
                    entry["generators"] = {
                        model: generator_norms(paths[model], device, sizes)
                        for model in ("smollm2-135m", "t5-base")
                    }
                    entry["retriever"] = retriever_sensitivities(paths["minilm-l6"], device, sizes)
                elif name == "steps":
                    entry["rows"] = step_times(paths, device, sizes)
                elif name == "generation":
                    entry.update(generation(paths["smollm2-135m"], device, sizes))
                elif name == "profile":
                    entry.update(profile(paths["smollm2-135m"], device, sizes))
                elif name == "stages":
                    entry["torchrun"] = (
                        "used" if device == "cuda" else "skipped (no CUDA: the chain runs on CPU)"
                    )
                    entry["rows"] = stage_chain(root / "stages", device, use_torchrun=device == "cuda")
    rendered = table(check.results)
    check.results["table"] = rendered
    check.write()
    print(rendered)
    failed = [
        name for name, entry in check.results["sections"].items() if "error" in entry or "skipped" in entry
    ]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
