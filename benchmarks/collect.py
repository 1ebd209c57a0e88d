"""Merge the JSON lines the benchmarks appended (``SYNTHQ_BENCH_JSON``) into one results file with
the machine described, then regenerate the performance table of the docs site from it.

    python benchmarks/collect.py benchmarks/results.jsonl benchmarks/results.json [--page docs/performance.md]

Each document is keyed ``name[model, batch B]``; a later run with the same key replaces the
earlier one, so re-running one script refreshes its rows only. ``--keep NAMES`` drops the earlier
rows of every other benchmark (``make bench`` keeps ``pipeline_wall``'s and ``first_hour``'s).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def machine() -> dict:
    """CPU model, cores this process may use, memory, OS, Python and torch versions."""
    import torch

    from synthq.runtime.threads import available_cores

    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    memory_gb = None
    with contextlib.suppress(ValueError, OSError, AttributeError):
        memory_gb = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9, 1)
    return {
        "cpu": model,
        "cores": available_cores(),
        "memory_gb": memory_gb,
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "os": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
    }


def key(payload: dict) -> str:
    """``name[model, batch B]``: one entry per benchmark, model and batch size."""
    tags = [str(payload["model"])] if "model" in payload else []
    tags += [f"batch {payload['batch']}"] if "batch" in payload else []
    return f"{payload['benchmark']}[{', '.join(tags)}]" if tags else payload["benchmark"]


def merge(lines_path: Path, results_path: Path, keep: tuple[str, ...] | None = None) -> dict:
    """``results_path`` updated with the documents of ``lines_path``; with ``keep``, only the earlier
    rows whose benchmark is named in it survive (``make bench`` keeps the long runs that
    ``make bench-pipelines`` measured, and drops the rest of any earlier run)."""
    results = json.loads(results_path.read_text(encoding="utf-8")) if results_path.is_file() else {}
    benchmarks = results.get("benchmarks", {})
    if keep is not None:
        benchmarks = {k: v for k, v in benchmarks.items() if v.get("benchmark") in keep}
    # Rows kept from an earlier run keep the machine and time they were measured on.
    earlier = {"at": results.get("collected"), "cpu": results.get("machine", {}).get("cpu")}
    for payload in benchmarks.values():
        payload.setdefault("measured", earlier)
    now = {"at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "cpu": machine()["cpu"]}
    for line in lines_path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            payload = json.loads(line)
            payload["measured"] = now
            benchmarks[key(payload)] = payload
    merged = {
        "machine": machine(),
        "collected": now["at"],
        "benchmarks": dict(sorted(benchmarks.items())),
    }
    results_path.write_text(json.dumps(merged, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return merged


def main() -> None:
    from benchmarks.readme_table import DEFAULT_PAGE, update_page

    parser = argparse.ArgumentParser()
    parser.add_argument("lines", type=Path)
    parser.add_argument("results", type=Path)
    parser.add_argument(
        "--page", type=Path, default=DEFAULT_PAGE, help="the page whose bench-table block is regenerated"
    )
    parser.add_argument(
        "--keep", help="comma-separated benchmarks whose earlier rows survive; the others are dropped"
    )
    args = parser.parse_args()
    merged = merge(args.lines, args.results, tuple(args.keep.split(",")) if args.keep else None)
    if args.page.is_file():
        update_page(merged, args.page)
    print(f"{len(merged['benchmarks'])} benchmarks -> {args.results}")


if __name__ == "__main__":
    main()
