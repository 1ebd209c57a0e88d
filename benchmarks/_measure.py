"""Shared helpers for benchmarks: step time and peak RSS of configurations, each in a fresh process,
or timed side by side (:func:`measure_interleaved`) so that a ratio survives a shared CPU."""

from __future__ import annotations

import json
import multiprocessing
import os
import resource
import statistics
import time
from unittest.mock import patch


def as_a_stage() -> int:
    """synthq's thread rule and heap setting, as a stage applies them
    (:func:`synthq.runtime.distributed.setup`); returns torch's thread count."""
    from synthq.runtime.malloc import keep_freed_memory
    from synthq.runtime.threads import configure_threads

    threads = configure_threads()
    keep_freed_memory()
    return threads


def _child(function, args, steps, warmup, queue):
    as_a_stage()
    setup = function(*args)
    times = []
    for index in range(warmup + steps):
        started = time.perf_counter()
        setup()
        if index >= warmup:
            times.append(time.perf_counter() - started)
    queue.put(
        {
            "median_step_seconds": statistics.median(times),
            "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6,
        }
    )


# glibc's malloc keeps freed blocks in its heap once its adaptive mmap threshold has risen, so a
# process's peak RSS also counts memory that was already free (measured: a LoRA step 3.5 GB with
# the default, 2.7 GB with a fixed 1 MiB threshold). With this threshold every tensor over 1 MiB
# is its own mapping, returned when freed, and peak RSS follows the live tensors; it costs page
# faults (a full SmolLM2 step 6.0 -> 9.0 s), so only the memory processes use it.
LIVE_MEMORY_ENV = {"MALLOC_MMAP_THRESHOLD_": str(1 << 20)}


def measure(function, *args, steps: int = 3, warmup: int = 1, env: dict | None = None) -> dict:
    """``function(*args)`` returns a zero-argument step; it runs in its own process (with ``env``
    added to its environment) so that peak memory belongs to that configuration alone."""
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    process = context.Process(target=_child, args=(function, args, steps, warmup, queue))
    with patch.dict(os.environ, env or {}):
        process.start()  # the spawned interpreter reads its environment (and malloc's) at start
    result = queue.get()
    process.join()
    return result


def _interleaved_child(function, configurations, steps, warmup, queue):
    import torch

    as_a_stage()
    built = {name: function(*args) for name, args in configurations.items()}
    times = {name: [] for name in built}
    for index in range(warmup + steps):
        for name, step in built.items():  # round robin: load changes hit every configuration
            started = time.perf_counter()
            step()
            if index >= warmup:
                times[name].append(time.perf_counter() - started)
    medians = {name: statistics.median(values) for name, values in times.items()}
    queue.put({**medians, "_threads": torch.get_num_threads()})


def measure_interleaved(
    function, configurations: dict[str, tuple], steps: int = 2, warmup: int = 1, memory: bool = True
) -> dict:
    """Step times of several configurations built in ONE process and run in turn (A, B, A, B …),
    so a change in load from other work on the machine reaches both sides of a ratio alike; peak
    memory of each comes from its own process (one step). ``function(*args)`` returns a step."""
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    process = context.Process(
        target=_interleaved_child, args=(function, configurations, steps, warmup, queue)
    )
    process.start()
    medians = queue.get()
    process.join()
    results = {}
    for name, args in configurations.items():
        peak = live = None
        if memory:
            peak = measure(function, *args, steps=1, warmup=0)["peak_rss_gb"]
            live = measure(function, *args, steps=1, warmup=0, env=LIVE_MEMORY_ENV)["peak_rss_gb"]
        results[name] = {
            "median_step_seconds": medians[name],
            "peak_rss_gb": peak,
            "peak_live_gb": live,
            "threads": medians["_threads"],
        }
    return results


def add_ratios(results: dict, baselines: dict[str, str]) -> None:
    """``time_ratio`` / ``memory_ratio`` of each row against its baseline row (``baselines``:
    row -> baseline row), measured in the same run."""
    for key, value in results.items():
        base = results[baselines[key]]
        value["baseline"] = baselines[key]
        value["time_ratio"] = round(value["median_step_seconds"] / base["median_step_seconds"], 3)
        if value["peak_rss_gb"] and base["peak_rss_gb"]:
            value["memory_ratio"] = round(value["peak_rss_gb"] / base["peak_rss_gb"], 3)
        if value.get("peak_live_gb") and base.get("peak_live_gb"):
            value["live_memory_ratio"] = round(value["peak_live_gb"] / base["peak_live_gb"], 3)


def emit(payload: dict, show: bool = True) -> None:
    """Print a benchmark's JSON (unless ``show`` is false); with ``SYNTHQ_BENCH_JSON`` set
    (``make bench``) also append it to that file, one JSON document per line, for
    :mod:`benchmarks.collect`. The load average at the end of the run is recorded: above the core
    count, other work shared the CPU."""
    import torch

    threads = payload.pop("threads", torch.get_num_threads())
    load = payload.pop("load_average", os.getloadavg())  # a payload read from an earlier run brings its own
    payload = {**payload, "torch_threads": threads, "load_average": load}
    if show:
        print(json.dumps(payload, indent=2, ensure_ascii=False))
    path = os.environ.get("SYNTHQ_BENCH_JSON")
    if path:
        with open(path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(payload, ensure_ascii=False) + "\n")
