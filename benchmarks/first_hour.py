"""A new user's first hour, timed: the guide's commands (docs/own-data.md), as written, on the shipped data.

    python benchmarks/first_hour.py [--out DIR]            # the whole run (about half an hour on 2 cores)
    python benchmarks/first_hour.py --quick [--out DIR]    # a smoke run: 2 steps, 32 documents
    python benchmarks/first_hour.py --data data/pylibs-long # the same on long documents

The commands are read from docs/own-data.md, "Your own data in the first hour" (its first
``bash`` block after that heading; the README links there), so the benchmark runs what a user
copies: ``mylog`` becomes the shipped ``embedded`` data (a query log of the guide's shape: 1,212
private queries of 475 users, 606 documents of p95 80 tokens), or ``--data``
(``data/pylibs-long``: 622 documents of p95 696 tokens, 402 private queries of 80 users), and
``runs/`` the output directory. Each runs as a user runs it, a fresh ``synthq`` process, under
``/usr/bin/time -v`` when it is there (its "Maximum resident set size" is that command's peak
RSS; without it, the children's ``getrusage`` peak so far, which can only grow). ``--quick`` adds
``--max-steps 2`` to training and ``--limit 32`` to generation.

The record: each command's wall seconds, peak RSS (GB) and exit status, against the aims (peak
≤ 4 GB each; the whole flow within 30 minutes on 2 idle cores).
"""

from __future__ import annotations

import argparse
import re
import resource
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks._measure import emit  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PEAK_AIM_GB, WALL_AIM_SECONDS = 4.0, 30 * 60
README = ROOT / "docs" / "own-data.md"  # the guide page (the README routes to it)
GUIDE_HEADING = "# Your own data in the first hour"
QUICK = {
    "finetune-lm": ["--max-steps", "2"],
    "generate": ["--limit", "32"],
    "train-retriever": ["--max-steps", "2"],
}


def guide_commands(readme: str) -> list[list[str]]:
    """The ``synthq`` commands of the guide's first ``bash`` block (continuation lines joined,
    comments dropped), each as its argument list without ``synthq``."""
    guide = readme[readme.index(GUIDE_HEADING) :]
    block = guide[guide.index("```bash\n") + len("```bash\n") :]
    block = block[: block.index("```")]
    joined = re.sub(r"\\\n\s*", " ", block)
    return [shlex.split(line)[1:] for line in joined.splitlines() if line.startswith("synthq ")]


def commands(
    out: str | Path, quick: bool = False, readme: str | None = None, data: str = "embedded"
) -> list[tuple[str, list[str]]]:
    """``(name, synthq arguments)`` of the guide's commands on the shipped data, writing under
    ``out``: ``mylog`` -> ``data``, ``runs/X`` -> ``out/X``."""
    readme = readme if readme is not None else README.read_text(encoding="utf-8")
    steps, names = [], {}
    for arguments in guide_commands(readme):
        arguments = [data if a == "mylog" else re.sub(r"^runs/", f"{out}/", a) for a in arguments]
        if quick:
            arguments += QUICK.get(arguments[0], [])
        count = names[arguments[0]] = names.get(arguments[0], 0) + 1
        steps.append((arguments[0] if count == 1 else f"{arguments[0]}-{count}", arguments))
    return steps


def _peak_from_time(report: str) -> float | None:
    match = re.search(r"Maximum resident set size \(kbytes\): (\d+)", report)
    return int(match.group(1)) / 1e6 if match else None


def run_step(arguments: list[str]) -> dict:
    """One ``synthq`` command in a fresh process: wall seconds, peak RSS (GB), exit status."""
    command = [sys.executable, "-m", "synthq", *arguments]
    timer = shutil.which("time") or ("/usr/bin/time" if Path("/usr/bin/time").exists() else None)
    with tempfile.NamedTemporaryFile("r", suffix=".time") as report:
        if timer:
            command = [timer, "-v", "-o", report.name, *command]
        started = time.perf_counter()
        status = subprocess.run(command, cwd=ROOT).returncode
        wall = time.perf_counter() - started
        peak = _peak_from_time(Path(report.name).read_text()) if timer else None
    if peak is None:  # the children's peak so far (Linux: kilobytes)
        peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1e6
    return {"wall_seconds": round(wall, 1), "peak_rss_gb": round(peak, 3), "status": status}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="where the artifacts go (default: a temporary directory)")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 2 steps, 32 documents")
    parser.add_argument("--data", default="embedded", help="the log the guide runs on (name or directory)")
    options = parser.parse_args()
    out = options.out or Path(tempfile.mkdtemp(prefix="synthq-first-hour-"))
    results = {}
    for name, arguments in commands(out, options.quick, data=options.data):
        print(f"$ synthq {' '.join(arguments)}", file=sys.stderr, flush=True)
        stage = arguments[0] not in ("ledger", "info", "export", "search", "data")
        results[name] = run_step([*arguments, "--force"] if stage else arguments)
        if results[name]["status"] != 0:
            break
    total = sum(step["wall_seconds"] for step in results.values())
    emit(
        {
            "benchmark": "first_hour" + ("_quick" if options.quick else ""),
            **({} if options.data == "embedded" else {"model": Path(options.data).name}),  # its key's tag
            "steps": results,
            "total_wall_seconds": round(total, 1),
            "max_peak_rss_gb": max(step["peak_rss_gb"] for step in results.values()),
            "aims": {"peak_rss_gb": PEAK_AIM_GB, "total_wall_seconds": WALL_AIM_SECONDS},
            "within_aims": all(s["status"] == 0 and s["peak_rss_gb"] <= PEAK_AIM_GB for s in results.values())
            and len(results) == len(commands(out, data=options.data))
            and (options.quick or total <= WALL_AIM_SECONDS),
            "out": str(out),
        }
    )


if __name__ == "__main__":
    main()
