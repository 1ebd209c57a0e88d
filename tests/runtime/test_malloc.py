import platform
import subprocess
import sys

import pytest

from synthq.runtime import malloc

# A "step" allocates, writes and frees tensors of 64, 48 and 12 MB; print whether the setting was
# applied and the minor page faults of three steps after three warm-up steps.
PROBE = """
import resource, sys, torch
from synthq.runtime.malloc import keep_freed_memory
applied = keep_freed_memory() if sys.argv[1] == "keep" else False
def step():
    a = torch.ones(16 << 20)
    b = torch.ones(12 << 20) * a[: 12 << 20]
    c = torch.ones(3 << 20)
for _ in range(3):
    step()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(3):
    step()
print(applied, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def probe(mode: str, **environment: str) -> tuple[bool, int]:
    env = {"PATH": "/usr/bin:/bin", "SYNTHQ_LOAD_PROBE": "0", **environment}
    command = [sys.executable, "-c", PROBE, mode]
    out = subprocess.run(command, capture_output=True, text=True, env=env, check=True)
    applied, faults = out.stdout.split()
    return applied == "True", int(faults)


def test_a_freed_block_is_reused_without_page_faults():
    if sys.platform != "linux" or platform.libc_ver()[0] != "glibc":
        pytest.skip("glibc only")
    applied, kept_faults = probe("keep")
    assert applied
    _, default_faults = probe("default")
    assert default_faults > 50_000  # glibc maps fresh blocks each step and the kernel zeroes their pages
    assert kept_faults < default_faults / 10  # the freed blocks came back from the heap


def test_the_environment_keeps_its_own_malloc_settings():
    assert not malloc._user_tunes_malloc({})
    assert malloc._user_tunes_malloc({"SYNTHQ_MALLOC": "system"})
    assert malloc._user_tunes_malloc({"MALLOC_MMAP_THRESHOLD_": "1048576"})
    assert malloc._user_tunes_malloc({"LD_PRELOAD": "/usr/lib/libjemalloc.so.2"})
    assert not malloc._user_tunes_malloc({"MALLOC": "x", "SYNTHQ_THREADS": "2"})
    _, faults = probe("keep", MALLOC_MMAP_THRESHOLD_=str(1 << 20))  # the benchmarks' live-memory mode
    assert faults > 50_000
