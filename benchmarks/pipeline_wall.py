"""Wall time of the two long runs the README promises: the canary audit and the demo.

    python benchmarks/pipeline_wall.py audit [--out DIR]     # the README's audit command, timed
    python benchmarks/pipeline_wall.py audit --from DIR      # record a finished run of it
    python benchmarks/pipeline_wall.py demo [--out DIR]      # `synthq run pipelines/demo.yaml`
                                                             # from nothing, then `--check`

Each is run as a user runs it (a fresh ``synthq`` process) and timed around the process; the
record also carries what makes the time meaningful: the audit's power (the ε = ∞ generator's
95 % lower bound, aim ≥ 3 with 200 canaries) and its phases, the demo's ``--check`` outcome and
its stage times by kind (:func:`stage_seconds`).
``--from`` reads a finished audit directory instead (its own ``wall_seconds``), after checking that
it ran the README's command. Neither fits ``make bench``'s quarter of an hour: ``make
bench-pipelines`` runs both (about 15 + 10 minutes on 2 cores). Nothing else should use the CPU.
A demo run that passes its check is also snapshotted for the README's results table
(``benchmarks/demo_results.py``).
"""

from __future__ import annotations

import argparse
import json
import math
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks._measure import emit  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]

# The README's canary-audit command (section 6), kept equal to it by tests/benchmarks/test_pipeline_wall.py.
AUDIT_ARGUMENTS = [
    "--data", "embedded", "--model", "smollm2-135m", "--method", "one-run", "--epsilons", "inf,8",
    "--canaries", "200", "--private-pairs", "120", "--retriever-documents", "30",
    "--finetune", "epochs=8", "--finetune", "batch_size=32", "--finetune", "physical_batch_size=16",
    "--finetune", "lr=5e-4", "--finetune", "max_source_length=32", "--finetune", "max_target_length=16",
    "--finetune", "delta=1e-5", "--retriever", "epochs=3", "--retriever", "lr=0.0001",
    "--retriever", "batch_size=16",
]  # fmt: skip
AUDIT_AIM_SECONDS, DEMO_AIM_SECONDS, POWER_AIM = 15 * 60, 10 * 60, 3.0


def _synthq(*arguments: str, lines: list[str] | None = None) -> tuple[float, int]:
    """Run ``synthq ARGUMENTS`` in a fresh process; its wall seconds and exit status. With
    ``lines``, its output is echoed and kept there, line by line."""
    started = time.perf_counter()
    command = [sys.executable, "-m", "synthq", *arguments]
    if lines is None:
        status = subprocess.run(command, cwd=ROOT).returncode
        return time.perf_counter() - started, status
    with subprocess.Popen(
        command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1
    ) as process:
        for line in process.stdout:
            sys.stdout.write(line)
            lines.append(line.rstrip("\n"))
    return time.perf_counter() - started, process.returncode


def _options(arguments: list[str]) -> dict:
    """``--name value`` pairs as {name: value}, repeated options (``--finetune k=v``) as dicts."""
    options: dict = {}
    for name, value in zip(arguments[::2], arguments[1::2], strict=True):
        name = name.removeprefix("--").replace("-", "_")
        if name in ("finetune", "retriever", "generate"):
            key, _, setting = value.partition("=")
            options.setdefault(name, {})[key] = setting
        else:
            options[name] = value
    return options


def _same_command(config: dict) -> list[str]:
    """The options of a finished audit's config that differ from :data:`AUDIT_ARGUMENTS`."""
    expected = _options(AUDIT_ARGUMENTS)
    differ = []
    for name, value in expected.items():
        found = config.get(name)
        if isinstance(value, dict):
            found = {k: str(v) for k, v in (found or {}).items()}
            if found != value:
                differ.append(name)
        elif name == "epsilons":
            if [str(e) if isinstance(e, str) else f"{e:g}" for e in found or []] != value.split(","):
                differ.append(name)
        elif str(found) != value:
            differ.append(name)
    return differ


def audit_record(directory: Path, wall_seconds: float | None) -> dict:
    """The audit's wall time, phases and power, read from its finished artifact."""
    manifest = json.loads((directory / "manifest.json").read_text(encoding="utf-8"))
    if manifest.get("stage") != "canary-audit":
        raise SystemExit(f"{directory} is not a canary-audit artifact")
    differ = _same_command(manifest["config"])
    if differ:
        raise SystemExit(
            f"{directory} did not run the README's audit command (differs in: {', '.join(differ)})"
        )
    rows = json.loads((directory / "audit.json").read_text(encoding="utf-8"))["one_run"]
    generator = next(
        r for r in rows if r["audited"] == "generator" and math.isinf(float(r["proven_epsilon"]))
    )
    timings = manifest.get("timings", {})
    return {
        "wall_seconds": round(wall_seconds if wall_seconds is not None else timings["wall_seconds"], 1),
        "timed": "around the process" if wall_seconds is not None else "the stage's own wall_seconds",
        "aim_seconds": AUDIT_AIM_SECONDS,
        "phases": {k: v for k, v in timings.items() if k != "wall_seconds"},
        "power": {
            "generator_inf_lower_bound": round(generator["epsilon_lower_bound"], 2),
            "correct": f"{generator['correct']}/{generator['guesses']}",
            "auroc": generator["auroc"],
            "aim": POWER_AIM,
        },
    }


STAGE_DONE = re.compile(r"^\[\d+/\d+\] (\S+) \S+ done in ([\d.]+) (s|min)")


def stage_seconds(output: list[str]) -> dict:
    """Seconds of a pipeline's stages summed by stage kind (with their count), read from what
    ``synthq run`` prints as each stage ends (``[5/71] train-retriever NAME done in 32 s``): the
    run's own clock around each stage, so the kinds add up to the run's time (to the printed
    rounding: a second, or a tenth of a minute)."""
    from synthq.pipeline.progress import seconds_by_kind

    stage_times = [
        (found.group(1), float(found.group(2)) * (60 if found.group(3) == "min" else 1))
        for found in map(STAGE_DONE.match, output)
        if found
    ]
    return {
        kind: {"stages": total["stages"], "seconds": round(total["seconds"], 1)}
        for kind, total in seconds_by_kind(stage_times).items()
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("run", choices=["audit", "demo"])
    parser.add_argument(
        "--out", type=Path, help="where the run writes (default: a fresh temporary directory)"
    )
    parser.add_argument("--from", dest="finished", type=Path, help="audit: record this finished run")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix=f"synthq-{args.run}-") as scratch:
        out = args.out or Path(scratch) / args.run
        if args.run == "audit":
            if args.finished is not None:
                record = audit_record(args.finished, None)
            else:
                seconds, status = _synthq("canary-audit", *AUDIT_ARGUMENTS, "--out", str(out))
                if status:
                    raise SystemExit(f"the audit failed (exit {status})")
                record = audit_record(out, seconds)
        else:
            output: list[str] = []
            seconds, status = _synthq("run", "pipelines/demo.yaml", f"out={out}", lines=output)
            if status:
                raise SystemExit(f"the demo failed (exit {status})")
            _, check = _synthq("run", "pipelines/demo.yaml", f"out={out}", "--check")
            if check == 0:
                from benchmarks.demo_results import SNAPSHOT
                from benchmarks.demo_results import record as snapshot

                SNAPSHOT.write_text(
                    json.dumps(snapshot(out, seconds), indent=2, ensure_ascii=False) + "\n", encoding="utf-8"
                )
            record = {
                "wall_seconds": round(seconds, 1),
                "timed": "around the process",
                "aim_seconds": DEMO_AIM_SECONDS,
                "check": "passed" if check == 0 else f"failed (exit {check})",
                "stage_seconds": stage_seconds(output),
            }
    payload = {"benchmark": "pipeline_wall", "model": args.run, "results": record}
    if args.finished is not None:
        payload["load_average"] = [None]  # not known: the run is over
    emit(payload)


if __name__ == "__main__":
    main()
