"""Run ``synthq`` under ``torchrun`` with CPU (gloo) ranks, as a user would."""

from __future__ import annotations

import os
import socket
import subprocess
import sys


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def torchrun(ranks: int, *arguments: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """``torchrun --nproc_per_node RANKS -m synthq ARGUMENTS`` on this machine; fails loudly."""
    command = [
        sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc_per_node", str(ranks),
        "--master_addr", "127.0.0.1", "--master_port", str(free_port()), "-m", "synthq", *arguments,
    ]  # fmt: skip
    environment = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    result = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=environment)
    if result.returncode != 0:
        raise AssertionError(f"torchrun failed ({result.returncode}):\n{result.stdout}\n{result.stderr}")
    return result
