"""What a long stage is expected to take, said before it starts.

Every long stage (``finetune-lm``'s warm start and its DP phase, ``generate``, ``train-retriever``)
prints one line before its first step: the expected minutes on synthq's reference machine (2 CPU
cores), from the per-row costs ``make bench`` measured there (``reference_costs.json``: SmolLM2-135M
+ LoRA 16 training at 128 document tokens, nucleus sampling with 66 prompt tokens, MiniLM-L6 at 128
document tokens), scaled linearly by the model's parameters and the document tokens this run reads
(a transformer's work per row at these lengths). ``synthq plan`` adds the same costs over whole
routes (:mod:`synthq.dp.route_plans`).

The figure reads only what the stage already prints or records as public: the steps and expected
batch of its DP plan, K, the chosen lengths (from the public corpus), the model's size and the
number of public documents. It never reads how many queries a user actually has: at the user unit
the rows are counted at K per user (more rows than most users have, which roughly offsets what the
per-user path costs beyond the benchmark's step: docs/performance.md compares the figures with the
measured stages). A stage that autocasts to bf16 on a CPU with bf16 arithmetic (``--precision bf16``)
scales its figure by the time ratio ``benchmarks/cpu_precision.py`` measured there against fp32
(:func:`precision_ratio`); bf16 on a CPU without it is slower, by a ratio never measured, so its
figure stays fp32's.

    >>> expected_line(seconds=600.0)
    'expected about 10 min on 2 CPU cores (synthq\\'s reference machine; a GPU takes far less)'
"""

from __future__ import annotations

import functools
import json
from importlib import resources

REFERENCE_COSTS = "reference_costs.json"
REFERENCE_GENERATOR_PARAMETERS = 134_515_008  # SmolLM2-135M, the costs' generator
REFERENCE_ENCODER_PARAMETERS = 22_713_216  # all-MiniLM-L6-v2, the costs' encoder
REFERENCE_DOCUMENT_TOKENS = 128  # the training benchmarks' document length
REFERENCE_PROMPT_TOKENS, REFERENCE_NEW_TOKENS = 66, 24  # the generation benchmark's lengths
RETRIEVER_COSTS = {  # --dp (None: in-batch softmax without DP) -> its measured cost per pair
    None: "retriever_seconds_per_pair",
    "group": "retriever_dp_group_seconds_per_pair",
    "sample": "retriever_dp_sample_seconds_per_pair",
}


PRECISION_RATIOS = {  # kind of work -> bf16's measured time ratio against fp32 on a CPU with bf16
    "generation": "cpu_bf16_generation_ratio",
    "generator_training": "cpu_bf16_generator_training_ratio",
    "retriever_training": "cpu_bf16_retriever_training_ratio",
}


@functools.cache
def reference_costs() -> dict[str, float]:
    """Seconds of each kind of work on the reference machine (2 CPU cores; see the JSON)."""
    table = json.loads(resources.files("synthq.models").joinpath(REFERENCE_COSTS).read_text(encoding="utf-8"))
    return {name: entry["value"] for name, entry in table.items() if name != "about"}


def precision_ratio(work: str) -> float:
    """The running stage's time ratio against fp32 for ``work`` (a key of :data:`PRECISION_RATIOS`):
    the measured bf16 ratio when it autocasts to bf16 on a CPU with bf16 arithmetic, else 1."""
    from synthq.runtime.precision import on_native_bf16_cpu

    return reference_costs()[PRECISION_RATIOS[work]] if on_native_bf16_cpu() else 1.0


def generator_training_seconds(rows: float, document_tokens: int, parameters: int) -> float:
    """Seconds to train a generator on ``rows`` (document, query) rows of ``document_tokens``."""
    return (
        rows
        * reference_costs()["generator_dp_seconds_per_row"]
        * (document_tokens / REFERENCE_DOCUMENT_TOKENS)
        * (parameters / REFERENCE_GENERATOR_PARAMETERS)
        * precision_ratio("generator_training")
    )


def generation_seconds(queries: int, prompt_tokens: int, new_tokens: int, parameters: int) -> float:
    """Seconds to sample ``queries`` queries from prompts of up to ``prompt_tokens``."""
    length = (prompt_tokens + new_tokens) / (REFERENCE_PROMPT_TOKENS + REFERENCE_NEW_TOKENS)
    return (
        queries / reference_costs()["generated_queries_per_second"] * length
        * (parameters / REFERENCE_GENERATOR_PARAMETERS) * precision_ratio("generation")
    )  # fmt: skip


def retriever_training_seconds(
    pairs: float, document_tokens: int, parameters: int, dp: str | None, chunked: bool = False
) -> float | None:
    """Seconds to train an encoder on ``pairs`` pairs (``chunked``: in GradCache chunks, measured
    at about twice the whole-batch step), or ``None`` where ``dp``'s cost was never measured
    (``--dp batch``, ``--dp logit``): no figure is better than a guessed one."""
    if dp not in RETRIEVER_COSTS:
        return None
    costs = reference_costs()
    return (
        pairs
        * costs[RETRIEVER_COSTS[dp]]
        * (costs["retriever_gradcache_factor"] if chunked and dp is None else 1.0)
        * (document_tokens / REFERENCE_DOCUMENT_TOKENS)
        * (parameters / REFERENCE_ENCODER_PARAMETERS)
        * precision_ratio("retriever_training")
    )


def expected_line(seconds: float | None) -> str:
    """The line a stage prints before it starts: ``expected about 12 min on 2 CPU cores (…)``."""
    if seconds is None:
        return "expected time: no measured cost for this mechanism on the reference machine"
    size = f"{seconds / 60:.0f} min" if seconds >= 90 else f"{max(seconds, 1):.0f} s"
    return f"expected about {size} on 2 CPU cores (synthq's reference machine; a GPU takes far less)"


def parameter_count(model) -> int:
    """All parameters of ``model`` (frozen ones too: LoRA still runs the whole network)."""
    return sum(parameter.numel() for parameter in model.parameters())
