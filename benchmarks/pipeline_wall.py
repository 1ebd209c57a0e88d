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
bench-pipelines`` runs both (about 10 + 60 minutes on 2 cores). Nothing else should use the CPU.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks._measure import emit  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]

# The README's canary-audit command (section 6), kept equal to it by tests/test_pipeline_wall.py.
AUDIT_ARGUMENTS = [
    "--data", "embedded", "--model", "smollm2-135m", "--method", "one-run", "--epsilons", "inf,8",
    "--canaries", "200", "--private-pairs", "120", "--retriever-documents", "30",
    "--finetune", "epochs=8", "--finetune", "batch_size=32", "--finetune", "physical_batch_size=16",
    "--finetune", "lr=5e-4", "--finetune", "max_source_length=32", "--finetune", "max_target_length=16",
    "--finetune", "delta=1e-5", "--retriever", "epochs=3", "--retriever", "lr=0.0001",
    "--retriever", "batch_size=16",
]  # fmt: skip
AUDIT_AIM_SECONDS, DEMO_AIM_SECONDS, POWER_AIM = 15 * 60, 12 * 60, 3.0


def _synthq(*arguments: str) -> tuple[float, int]:
    """Run ``synthq ARGUMENTS`` in a fresh process; its wall seconds and exit status."""
    started = time.perf_counter()
    status = subprocess.run([sys.executable, "-m", "synthq", *arguments], cwd=ROOT).returncode
    return time.perf_counter() - started, status


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


def stage_seconds(run: Path) -> dict:
    """Wall seconds of a finished pipeline's stages, summed by stage kind (with their count), from
    each artifact's own timings: the manifest's, or the private diagnostics' for stages that keep
    their timings there (the demo's data ships with synthq, so its times are no secret)."""
    kinds: dict[str, dict] = {}
    for manifest_path in sorted(run.glob("*/manifest.json")):
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
        seconds = manifest.get("timings", {}).get("wall_seconds")
        diagnostics = manifest_path.parent / "diagnostics" / "metrics.json"
        if seconds is None and diagnostics.exists():
            seconds = (
                json.loads(diagnostics.read_text(encoding="utf-8")).get("timings", {}).get("wall_seconds")
            )
        if seconds is None:
            continue
        kind = kinds.setdefault(manifest["stage"], {"stages": 0, "seconds": 0.0})
        kind["stages"] += 1
        kind["seconds"] = round(kind["seconds"] + seconds, 1)
    return dict(sorted(kinds.items(), key=lambda item: -item[1]["seconds"]))


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
            seconds, status = _synthq("run", "pipelines/demo.yaml", f"out={out}")
            if status:
                raise SystemExit(f"the demo failed (exit {status})")
            _, check = _synthq("run", "pipelines/demo.yaml", f"out={out}", "--check")
            record = {
                "wall_seconds": round(seconds, 1),
                "timed": "around the process",
                "aim_seconds": DEMO_AIM_SECONDS,
                "check": "passed" if check == 0 else f"failed (exit {check})",
                "stage_seconds": stage_seconds(out),
            }
    payload = {"benchmark": "pipeline_wall", "model": args.run, "results": record}
    if args.finished is not None:
        payload["load_average"] = [None]  # not known: the run is over
    emit(payload)


if __name__ == "__main__":
    main()
