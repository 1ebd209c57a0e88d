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

The reference machine is not the machine at hand: another CPU, or two cores shared with other
work, takes several times as long (a warm start said 4 minutes and took 25). So the figure is
scaled by this machine's speed (:func:`machine_speed`): a short probe (:func:`run_probe`, one
encoder layer of the retriever benchmark's model, forward and backward over 4 pairs: about 0.04 s
on the reference machine) timed here, over its time there, cached per machine (CPU model, cores,
threads, torch version) for an hour in the cache directory, since the load of a shared machine
changes. ``SYNTHQ_MACHINE_FACTOR`` sets the factor (tests inject it), ``SYNTHQ_MACHINE_PROBE=0``
leaves the reference machine's figure alone. Every figure says which it is:

    >>> expected_line(seconds=600.0, speed=None)
    "expected about 10 min on 2 CPU cores (synthq's reference machine; a GPU takes far less)"
    >>> expected_line(seconds=600.0, speed=MachineSpeed(4.1, "probe"))  # doctest: +ELLIPSIS
    'expected about 41 min on this machine (probe: 4.1× the reference machine, ... 10 min; ...)'
"""

from __future__ import annotations

import functools
import json
import math
import os
import platform
import time
from dataclasses import dataclass
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


@dataclass(frozen=True)
class MachineSpeed:
    """This machine's time for the reference machine's work, as a factor (4.1: 4.1× as long), and
    what it rests on (``probe``, ``SYNTHQ_MACHINE_FACTOR``)."""

    factor: float
    basis: str

    def minutes_line(self, seconds: float, note: str = "") -> str:
        """``about 41 min on this machine (probe: 4.1× the reference machine, ...)``."""
        return (
            f"about {duration(seconds * self.factor)} on this machine ({self.basis}: {self.factor:.2g}× the "
            f"reference machine, 2 CPU cores, where it takes {duration(seconds)}{note})"
        )


MACHINE_FACTOR = "SYNTHQ_MACHINE_FACTOR"
MACHINE_PROBE = "SYNTHQ_MACHINE_PROBE"
PROBE_FILE = "machine-probe.json"
PROBE_MAX_AGE = 3600.0  # seconds a probe stands for this machine (the load of shared cores changes)
PROBE_PAIRS, PROBE_LAYERS, PROBE_REPEATS = 4, 1, 3
# The probe's layer is torch's own encoder layer at MiniLM-L6's shape; the benchmark's step runs
# Hugging Face's BertModel, whose 6 layers took 1/0.86 as long as six of these on 16 pairs
# (interleaved, same process, AMD EPYC 2 cores, 2026-12-07): the probe's reference time is its
# share of the measured step.
PROBE_LAYER_SHARE = 0.86
REFERENCE_ENCODER_LAYERS = 6


def reference_probe_seconds() -> float:
    """The probe's time on the reference machine: its share of the measured retriever step."""
    per_pair = reference_costs()["retriever_seconds_per_pair"]
    return PROBE_PAIRS * per_pair * PROBE_LAYERS / REFERENCE_ENCODER_LAYERS * PROBE_LAYER_SHARE


def run_probe() -> float:
    """Seconds for the probe here (median of :data:`PROBE_REPEATS`, after a warm-up), at the
    threads of the stage that asks (torch's setting, which the stage made), or where torch is not
    loaded yet (``synthq plan``) at those a stage would take now
    (:func:`synthq.runtime.threads.thread_count`: one where the cores are busy; two threads on
    busy cores ran this probe up to 10× slower than one): one MiniLM-L6-shaped encoder layer,
    forward and
    backward over :data:`PROBE_PAIRS` pairs of a 32-token query and a 128-token document,
    in-batch softmax. Leaves torch's thread count as it found it."""
    import sys

    loaded = "torch" in sys.modules
    import torch

    from synthq.runtime.threads import thread_count

    before = torch.get_num_threads()
    torch.set_num_threads(before if loaded else thread_count())
    try:
        generator = torch.Generator().manual_seed(0)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            layer = torch.nn.TransformerEncoderLayer(384, 12, 1536, activation="gelu", batch_first=True)
        queries = torch.randn(PROBE_PAIRS, 32, 384, generator=generator)
        documents = torch.randn(PROBE_PAIRS, 128, 384, generator=generator)

        def once() -> float:
            started = time.perf_counter()
            with torch.random.fork_rng(devices=[]):  # dropout draws leave the caller's stream alone
                scores = layer(queries).mean(1) @ layer(documents).mean(1).T / 0.05
                torch.nn.functional.cross_entropy(scores, torch.arange(PROBE_PAIRS)).backward()
            layer.zero_grad(set_to_none=True)
            return time.perf_counter() - started

        once()  # warm-up: thread pool, kernel choice
        times = sorted(once() for _ in range(PROBE_REPEATS))
    finally:
        torch.set_num_threads(before)
    return times[len(times) // 2]


def _machine_key() -> str:
    from importlib import metadata

    try:
        torch_version = metadata.version("torch")
    except metadata.PackageNotFoundError:
        torch_version = "absent"
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    threads = os.environ.get("SYNTHQ_THREADS") or os.environ.get("OMP_NUM_THREADS") or ""
    return "|".join([_cpu_model(), str(cores), threads, torch_version])


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_speed(
    probe=None, now: float | None = None, max_age: float = PROBE_MAX_AGE
) -> MachineSpeed | None:
    """This machine's :class:`MachineSpeed`: ``SYNTHQ_MACHINE_FACTOR`` when set; None with
    ``SYNTHQ_MACHINE_PROBE=0``; else the probe's (``probe()``, default :func:`run_probe`) over
    :func:`reference_probe_seconds`, from the cache when this machine ran it in the last
    ``max_age`` seconds (a stage: an hour; ``synthq plan`` takes any, saying how old)."""
    given = os.environ.get(MACHINE_FACTOR, "").strip()
    if given:
        try:
            factor = float(given)
        except ValueError:
            factor = math.nan
        if not (math.isfinite(factor) and factor > 0):
            from synthq.runtime.errors import SettingError

            raise SettingError(f"{MACHINE_FACTOR} must be a number > 0, not {given!r}")
        return MachineSpeed(factor, MACHINE_FACTOR)
    if os.environ.get(MACHINE_PROBE, "1").strip() == "0":
        return None
    now = time.time() if now is None else now
    key = _machine_key()
    cached = _read_probe()
    entry = cached.get(key)
    recorded = isinstance(entry, dict) and all(
        isinstance(entry.get(name), int | float) and math.isfinite(entry[name]) for name in ("at", "seconds")
    )
    age = now - float(entry["at"]) if recorded else math.inf
    if recorded and entry["seconds"] > 0 and 0 <= age <= max_age:  # any age (inf) still needs an entry
        seconds = float(entry["seconds"])
    else:
        seconds, age = (probe or run_probe)(), 0.0
        cached[key] = {"seconds": seconds, "at": now}
        _write_probe(cached)
    basis = "probe" if age <= PROBE_MAX_AGE else f"probe {age / 3600:.0f} h ago"
    return MachineSpeed(seconds / reference_probe_seconds(), basis)


def _probe_path():
    from synthq.runtime.paths import cache_dir

    return cache_dir("machine") / PROBE_FILE


def _read_probe() -> dict:
    try:
        data = json.loads(_probe_path().read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _write_probe(data: dict) -> None:
    try:
        path = _probe_path()
        temporary = path.with_name(f".{path.name}.{os.getpid()}")
        temporary.write_text(json.dumps(data))
        os.replace(temporary, path)
    except OSError:  # a read-only cache costs a probe next time, nothing else
        return


@functools.cache
def _this_machine() -> MachineSpeed | None:
    """The stage's machine speed, once a process; none where a CUDA GPU is visible (the probe
    times the CPU, and the line says a GPU takes far less)."""
    import sys

    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        return None
    return machine_speed()


_THIS_MACHINE = object()


def expected_line(seconds: float | None, speed=_THIS_MACHINE) -> str:
    """The line a stage prints before it starts: ``expected about 41 min on this machine (probe:
    4.1× the reference machine, ...)``, or at the reference machine's costs when this machine's
    speed is not known (``speed=None``; default: :func:`machine_speed`, probed once a process)."""
    if seconds is None:
        return "expected time: no measured cost for this mechanism on the reference machine"
    if speed is _THIS_MACHINE:
        speed = _this_machine()
    if speed is None:
        return (
            f"expected about {duration(seconds)} on 2 CPU cores (synthq's reference machine; a GPU takes "
            "far less)"
        )
    return f"expected {speed.minutes_line(seconds, '; a GPU takes far less')}"


def duration(seconds: float) -> str:
    """``42 s``, ``12 min``, ``3.5 h``."""
    if seconds >= 3 * 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 60:.0f} min" if seconds >= 90 else f"{max(seconds, 1):.0f} s"


def parameter_count(model) -> int:
    """All parameters of ``model`` (frozen ones too: LoRA still runs the whole network)."""
    return sum(parameter.numel() for parameter in model.parameters())
