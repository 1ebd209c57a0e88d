"""How many threads torch's CPU kernels use: the machine's cores, shared by the ranks on a node.

torch's default is every physical core of the process, whatever else runs there; ``torchrun``
instead sets ``OMP_NUM_THREADS=1`` for every rank (when it is unset), which leaves all but
``nproc_per_node`` cores idle. :func:`thread_count` gives each process its share of the cores it
may run on::

    threads = max(1, cores // local_world_size)

where ``cores`` is the smallest of the CPUs in the process' affinity mask, the container's CPU
quota (cgroup v2 ``cpu.max``) and the physical cores (hyper-threads do not speed up matmuls), and
``local_world_size`` the ranks on this node (``LOCAL_WORLD_SIZE``, set by torchrun; 1 otherwise).

On a machine whose cores are already busy (other jobs, other agents), more threads than free
cores is much worse than one: every parallel region waits for a descheduled thread, and the
small kernels of a decoding step or a per-layer hook pay that wait hundreds of times (measured:
a SmolLM2 decoding step of 32 rows took 22 s with 2 threads and 2 s with 1 on 2 cores at load
12). :func:`oversubscribed` detects it with a short burst of decoding-sized matrix products; the
count then drops to one thread.

The probe makes the thread count depend on the machine's load, and with it the order of float
reductions: two runs with the same ``--seed`` then agree to rounding, not bit for bit.
``SYNTHQ_LOAD_PROBE=0`` keeps the core-share rule without the probe (the test suite sets it, as it
compares seeded runs exactly).

Overrides, strongest first: an explicit ``threads``; ``SYNTHQ_THREADS`` (what ``synthq --threads N``
sets); ``OMP_NUM_THREADS`` — except torchrun's own default of ``1`` under a multi-rank launch, which is
not a choice anyone made (set ``SYNTHQ_THREADS=1`` to really want one thread per rank).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

import torch

from synthq.runtime.errors import SettingError


def available_cores(cpu_max: Path = Path("/sys/fs/cgroup/cpu.max")) -> int:
    """CPUs this process may use: affinity mask, container quota and physical cores, the least."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    try:
        quota, period = cpu_max.read_text().split()[:2]
        if quota != "max":
            cores = min(cores, max(1, int(quota) // int(period)))
    except (OSError, ValueError):
        pass
    try:
        import psutil

        physical = psutil.cpu_count(logical=False)
        if physical:
            cores = min(cores, physical)
    except ImportError:
        pass
    return max(1, cores)


def oversubscribed(threads: int, repeats: int = 20) -> bool:
    """True if ``threads`` threads run a burst of small matrix products (a decoding step's size)
    no faster than one thread: the cores are busy with other work. Costs ~20 ms when idle."""
    if threads <= 1:
        return False
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(32, 576, generator=generator)
    w = torch.randn(576, 1536, generator=generator)
    before = torch.get_num_threads()

    def burst(count: int) -> float:
        torch.set_num_threads(count)
        started = time.perf_counter()
        for _ in range(repeats):
            torch.nn.functional.gelu(x @ w)
        return time.perf_counter() - started

    try:
        burst(threads)  # warm-up: thread pool start, kernel choice
        many, one = burst(threads), burst(1)
    finally:
        torch.set_num_threads(before)
    return many > 0.9 * one


def thread_count(
    threads: int | None = None,
    environ: dict | None = None,
    cores: int | None = None,
    busy: Callable[[int], bool] = oversubscribed,
) -> int:
    """The intra-op thread count for this process (see the module docstring for the rule);
    ``busy(count)`` says whether ``count`` threads would be oversubscribed."""
    environ = os.environ if environ is None else environ
    if threads is not None:
        if threads < 1:
            raise SettingError(f"threads must be at least 1, not {threads}")
        return threads
    for name in ("SYNTHQ_THREADS", "OMP_NUM_THREADS"):
        value = environ.get(name, "").strip()
        if not value:
            continue
        local_ranks = int(environ.get("LOCAL_WORLD_SIZE", "1") or 1)
        if name == "OMP_NUM_THREADS" and value == "1" and local_ranks > 1:
            continue  # torchrun's default for every multi-rank launch, not a user's choice
        if not value.isdigit() or int(value) < 1:
            raise SettingError(f"{name} must be a positive integer, not {value!r}")
        return int(value)
    cores = available_cores() if cores is None else cores
    count = max(1, cores // max(1, int(environ.get("LOCAL_WORLD_SIZE", "1") or 1)))
    if environ.get("SYNTHQ_LOAD_PROBE", "1").strip() == "0":
        return count  # no load probe: the thread count, and so float rounding, is fixed
    return 1 if count > 1 and busy(count) else count


def configure_threads(threads: int | None = None) -> int:
    """Apply :func:`thread_count` to torch and return it."""
    count = thread_count(threads)
    if torch.get_num_threads() != count:
        torch.set_num_threads(count)
    return count
