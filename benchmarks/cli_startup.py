"""How long the command line itself takes: each command in a fresh process, as a user runs it.

    python benchmarks/cli_startup.py [--repeats 5] [--artifact DIR]

Times (median wall seconds over ``--repeats`` fresh processes, interpreter start-up included)
``synthq --version``, ``synthq --help``, ``synthq info ART``, ``synthq ledger ART`` and
``synthq search`` on the embedded corpus with ``minilm-l6`` and its corpus embeddings cached.
``ART`` is a DP artifact: ``--artifact``, or one trained here first (``train-retriever --dp group``
on the embedded data for one step, not timed). One untimed run of each command comes first, so
the caches a second call finds (the accountant's memo, the corpus embeddings, the Arrow cache)
and search's ONNX query encoder (:mod:`synthq.models.onnx_encoder`) are warm, which is what a
user meets from the second call on; that first call's time is recorded too. Aims (issue 29): ``--help`` and
``--version`` < 0.3 s, ``info`` and ``ledger`` < 0.6 s, ``search`` < 3 s.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks._measure import emit  # noqa: E402

AIMS = {"version": 0.3, "help": 0.3, "info": 0.6, "ledger": 0.6, "search": 3.0}


def _synthq(*arguments: str) -> list[str]:
    return [sys.executable, "-m", "synthq", *arguments]


def _seconds(command: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run(command, check=True, capture_output=True)
    return time.perf_counter() - started


def _dp_artifact(workdir: Path) -> Path:
    out = workdir / "ret-dp"
    subprocess.run(
        _synthq(
            "-q",
            "train-retriever",
            "--data",
            "embedded",
            "--encoder",
            "minilm-l6",
            "--dp",
            "group",
            "--epsilon",
            "8",
            "--batch-size",
            "16",
            "--max-steps",
            "1",
            "--out",
            str(out),
        ),  # fmt: skip
        check=True,
    )
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--artifact", type=Path, default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as workdir:
        artifact = args.artifact or _dp_artifact(Path(workdir))
        commands = {
            "version": _synthq("--version"),
            "help": _synthq("--help"),
            "info": _synthq("info", str(artifact)),
            "ledger": _synthq("ledger", str(artifact)),
            "search": _synthq(
                "search",
                "--retriever",
                "minilm-l6",
                "--corpus",
                "embedded",
                "--top-k",
                "3",
                "how long to boil an egg",
            ),  # fmt: skip
        }
        results = {}
        for name, command in commands.items():
            first = _seconds(
                command
            )  # warms the caches a second call finds (and writes search's ONNX encoder)
            times = [_seconds(command) for _ in range(args.repeats)]
            median = statistics.median(times)
            results[name] = {
                "median_seconds": round(median, 3),
                "min_seconds": round(min(times), 3),
                "first_call_seconds": round(first, 3),
                "aim_seconds": AIMS[name],
                "met": median < AIMS[name],
            }
    emit(
        {
            "benchmark": "cli_startup",
            "repeats": args.repeats,
            "threads": int(os.environ.get("OMP_NUM_THREADS", 0)) or None,
            "results": results,
        }
    )


if __name__ == "__main__":
    main()
