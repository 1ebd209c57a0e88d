"""How many threads torch's CPU kernels use: the machine's cores, shared by the ranks on a node.

torch's default is every physical core of the process, whatever else runs there; ``torchrun``
instead sets ``OMP_NUM_THREADS=1`` for every rank (when it is unset), which leaves all but
``nproc_per_node`` cores idle. :func:`thread_count` gives each process its share of the cores it
may run on::

    threads = max(1, cores // local_world_size)

where ``cores`` is the smallest of the CPUs in the process' affinity mask, the container's CPU
quota (cgroup v2 ``cpu.max``) and the physical cores (hyper-threads do not speed up matmuls), and
``local_world_size`` the ranks on this node (``LOCAL_WORLD_SIZE``, set by torchrun; 1 otherwise).

Overrides, strongest first: an explicit ``threads`` (the CLI's ``--threads``); ``SYNTHQ_THREADS``;
``OMP_NUM_THREADS`` — except torchrun's own default of ``1`` under a multi-rank launch, which is
not a choice anyone made (set ``SYNTHQ_THREADS=1`` to really want one thread per rank).
"""

from __future__ import annotations

import os
from pathlib import Path

import torch


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


def thread_count(threads: int | None = None, environ: dict | None = None, cores: int | None = None) -> int:
    """The intra-op thread count for this process (see the module docstring for the rule)."""
    environ = os.environ if environ is None else environ
    if threads is not None:
        if threads < 1:
            raise ValueError(f"threads must be at least 1, not {threads}")
        return threads
    for name in ("SYNTHQ_THREADS", "OMP_NUM_THREADS"):
        value = environ.get(name, "").strip()
        if not value:
            continue
        local_ranks = int(environ.get("LOCAL_WORLD_SIZE", "1") or 1)
        if name == "OMP_NUM_THREADS" and value == "1" and local_ranks > 1:
            continue  # torchrun's default for every multi-rank launch, not a user's choice
        if not value.isdigit() or int(value) < 1:
            raise ValueError(f"{name} must be a positive integer, not {value!r}")
        return int(value)
    cores = available_cores() if cores is None else cores
    return max(1, cores // max(1, int(environ.get("LOCAL_WORLD_SIZE", "1") or 1)))


def configure_threads(threads: int | None = None) -> int:
    """Apply :func:`thread_count` to torch and return it."""
    count = thread_count(threads)
    if torch.get_num_threads() != count:
        torch.set_num_threads(count)
    return count
