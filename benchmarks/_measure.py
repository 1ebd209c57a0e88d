"""Shared helpers for benchmarks: run a callable in a fresh process and report time and peak RSS."""

from __future__ import annotations

import json
import multiprocessing
import resource
import statistics
import time


def _child(function, args, steps, warmup, queue):
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


def measure(function, *args, steps: int = 3, warmup: int = 1) -> dict:
    """``function(*args)`` returns a zero-argument step; it runs in its own process so that peak
    memory belongs to that configuration alone."""
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    process = context.Process(target=_child, args=(function, args, steps, warmup, queue))
    process.start()
    result = queue.get()
    process.join()
    return result


def report(name: str, results: dict, baseline: str) -> None:
    base = results[baseline]
    for value in results.values():
        value["time_ratio_vs_" + baseline] = round(
            value["median_step_seconds"] / base["median_step_seconds"], 3
        )
        value["memory_ratio_vs_" + baseline] = round(value["peak_rss_gb"] / base["peak_rss_gb"], 3)
    print(json.dumps({"benchmark": name, "results": results}, indent=2))
