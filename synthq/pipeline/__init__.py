"""``synthq run PIPELINE.yaml``: chain stages through their public ``run``, skipping what is done.

A pipeline file::

    # synthq run pipelines/demo.yaml
    name: demo
    out: runs/demo                  # every stage writes <out>/<stage name>
    vars: {limit: 400}              # {limit} is substituted in every string below
    defaults:                       # options shared by every stage of a type
      finetune-lm: {model: smollm2-135m, lora_rank: 8}
    stages:
      - name: gen-eps{eps}          # one entry per value of the sweep
        stage: finetune-lm
        sweep: {eps: [inf, 8]}
        expect_seconds: 300         # for the progress display's time estimate
        config: {data: embedded, epsilon: "{eps}"}
      - name: syn-eps{eps}
        stage: generate
        sweep: {eps: [inf, 8]}
        config: {generator: "@gen-eps{eps}", corpus: embedded}
      - name: results
        stage: eval
        config: {retrievers: ["@ret-*"]}   # a glob over earlier stage names

A pipeline may end with the figures it is expected to reproduce; ``synthq run --check``
compares them with the finished artifacts' metrics and fails (exit 1) on any figure outside its
tolerance::

    expected:
      - stage: results                     # a stage name
        metric: [embedded/ret-syn-eps8, ndcg@10]   # keys into that manifest's metrics
        value: 0.80
        tolerance: 0.03                    # |actual - value| <= tolerance (or min:, max:)

Stage names are identifiers (letters, digits, ``.``, ``_``, ``-``; they become directory names
under ``out``), and unknown keys anywhere in the file are errors, not silently ignored.
``@name`` is replaced by that stage's output directory, and must name an *earlier* stage, so
a bad reference fails at planning time, before anything trains. Every config is validated by
its stage's pydantic model during planning too. A stage whose output is up to date is skipped
(its own ``run`` would skip it as well; planning knows it in advance for ``--dry-run``). A
failing stage stops the run with its name; the artifacts already written stay valid, so a
rerun resumes at the failed stage.
"""

from __future__ import annotations

import fnmatch
import itertools
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from rich.markup import escape

from synthq.artifacts import is_artifact, is_still_up_to_date, open_artifact
from synthq.config import apply_overrides, load_yaml, validation_message
from synthq.config.registry import stage_entry
from synthq.runtime.console import console, info
from synthq.runtime.errors import SynthqError

_VARIABLE = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
_IDENTIFIER = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
# "paper": the paper's figures, shared by YAML anchors (&paper) with report stages.
PIPELINE_KEYS = {"name", "out", "vars", "defaults", "stages", "expected", "paper"}
STAGE_KEYS = {"name", "stage", "sweep", "expect_seconds", "config"}
EXPECTED_KEYS = {"stage", "metric", "value", "tolerance", "min", "max"}


def _check_keys(mapping: dict, allowed: set[str], where: str) -> None:
    unknown = sorted(set(mapping) - allowed)
    if unknown:
        raise SynthqError(
            f"{where}: unknown key(s) {', '.join(unknown)} (allowed: {', '.join(sorted(allowed))})"
        )


def _identifier(name: str, where: str) -> str:
    if not _IDENTIFIER.fullmatch(name) or ".." in name:
        raise SynthqError(
            f"{where}: {name!r} is not a valid name (letters, digits, '.', '_', '-'; it becomes a directory)"
        )
    return name


@dataclass
class PlannedStage:
    """One concrete stage of a pipeline, after sweeps, variables and references are resolved."""

    name: str
    stage: str
    config: Any
    depends_on: list[str] = field(default_factory=list)
    expect_seconds: float | None = None
    up_to_date: bool = False

    @property
    def out(self) -> Path:
        return Path(self.config.out)


@dataclass
class Plan:
    name: str
    out: Path
    stages: list[PlannedStage]
    expected: list[dict] = field(default_factory=list)

    def stage(self, name: str) -> PlannedStage:
        for planned in self.stages:
            if planned.name == name:
                return planned
        raise SynthqError(f"pipeline {self.name!r} has no stage named {name!r}")


def _substitute(value: Any, variables: dict[str, Any]) -> Any:
    """Replace ``{var}`` in strings (recursively); a string that is exactly one variable keeps
    the variable's type."""
    if isinstance(value, str):
        whole = _VARIABLE.fullmatch(value)
        if whole and whole.group(1) in variables:
            return variables[whole.group(1)]
        return _VARIABLE.sub(lambda m: str(variables.get(m.group(1), m.group(0))), value)
    if isinstance(value, dict):
        return {k: _substitute(v, variables) for k, v in value.items()}
    if isinstance(value, list):
        return [_substitute(v, variables) for v in value]
    return value


def _resolve_references(value: Any, known: dict[str, Path], where: str, used: list[str]) -> Any:
    if isinstance(value, str) and value.startswith("@"):
        pattern = value[1:]
        matches = [name for name in known if fnmatch.fnmatchcase(name, pattern)]
        if not matches:
            raise SynthqError(
                f"{where}: reference {value!r} names no earlier stage (known: {', '.join(known)})"
            )
        used.extend(matches)
        if any(ch in pattern for ch in "*?["):
            return [str(known[name]) for name in matches]
        return str(known[matches[0]])
    if isinstance(value, dict):
        return {k: _resolve_references(v, known, where, used) for k, v in value.items()}
    if isinstance(value, list):
        resolved = []
        for item in value:
            result = _resolve_references(item, known, where, used)
            is_glob = isinstance(item, str) and item.startswith("@") and any(ch in item for ch in "*?[")
            resolved.extend(result if is_glob else [result])
        return resolved
    return value


def _expand(entry: dict, variables: dict[str, Any]) -> list[tuple[dict, dict[str, Any]]]:
    sweep = entry.get("sweep") or {}
    if not isinstance(sweep, dict):
        raise SynthqError(f"stage {entry.get('name')!r}: sweep must be a mapping of variable -> list")
    keys = list(sweep)
    values = [v if isinstance(v, list) else [v] for v in sweep.values()]
    return [
        (entry, {**variables, **dict(zip(keys, combo, strict=True))}) for combo in itertools.product(*values)
    ]


def plan_pipeline(
    path: str | Path, overrides: list[str] | None = None, force: list[str] | None = None
) -> Plan:
    """Read, expand and validate a pipeline without running anything."""
    data = apply_overrides(load_yaml(path), overrides or [])
    _check_keys(data, PIPELINE_KEYS, str(path))
    name = _identifier(str(data.get("name") or Path(path).stem), f"{path}: name")
    root = Path(data.get("out") or Path("runs") / name)
    variables = dict(data.get("vars") or {})
    defaults = data.get("defaults") or {}
    if not isinstance(defaults, dict):
        raise SynthqError(f"{path}: defaults must map stage types to options")
    for stage_type in defaults:
        stage_entry(stage_type)
    entries = data.get("stages")
    if not isinstance(entries, list) or not entries:
        raise SynthqError(f"{path}: a pipeline needs a non-empty 'stages' list")
    force = set(force or [])
    known: dict[str, Path] = {}
    planned: list[PlannedStage] = []
    for index, raw in enumerate(entries):
        if not isinstance(raw, dict) or "stage" not in raw or "name" not in raw:
            raise SynthqError(f"{path}: stages[{index}] needs 'name' and 'stage'")
        _check_keys(raw, STAGE_KEYS, f"{path}: stages[{index}]")
        entry_point = stage_entry(raw["stage"])
        for entry, scope in _expand(raw, variables):
            stage_name = _identifier(str(_substitute(entry["name"], scope)), f"{path}: stages[{index}] name")
            where = f"{path}: stage {stage_name!r}"
            if stage_name in known:
                raise SynthqError(f"{where}: duplicate stage name")
            options = {**(defaults.get(entry["stage"]) or {}), **(entry.get("config") or {})}
            options = _substitute(options, scope)
            used: list[str] = []
            options = _resolve_references(options, known, where, used)
            options["out"] = str(root / stage_name)
            options["force"] = stage_name in force or "all" in force
            try:
                config = entry_point.config_type()(**options)
            except ValidationError as error:
                raise SynthqError(f"{where}: invalid config ({validation_message(error)})") from None
            known[stage_name] = root / stage_name
            planned.append(
                PlannedStage(
                    name=stage_name,
                    stage=entry["stage"],
                    config=config,
                    depends_on=sorted(set(used)),
                    expect_seconds=entry.get("expect_seconds"),
                )
            )
    unknown_forced = force - set(known) - {"all"}
    if unknown_forced:
        raise SynthqError(f"--force names unknown stages: {', '.join(sorted(unknown_forced))}")
    stale: set[str] = set()
    for stage in planned:
        upstream_stale = any(dep in stale for dep in stage.depends_on)
        stage.up_to_date = (
            not stage.config.force
            and not upstream_stale
            and is_still_up_to_date(stage.out, stage.stage, stage.config)
        )
        if not stage.up_to_date:
            stale.add(stage.name)
            # The pipeline owns its outputs: a stale one (changed config or inputs) is replaced.
            stage.config = stage.config.model_copy(update={"force": True})
    expected = _expected_entries(data.get("expected") or [], known, path)
    return Plan(name=name, out=root, stages=planned, expected=expected)


def _expected_entries(entries: Any, known: dict[str, Path], path: str | Path) -> list[dict]:
    if not isinstance(entries, list):
        raise SynthqError(f"{path}: expected must be a list of {{stage, metric, value, tolerance}}")
    checked = []
    for index, entry in enumerate(entries):
        where = f"{path}: expected[{index}]"
        if not isinstance(entry, dict):
            raise SynthqError(f"{where}: must be a mapping")
        _check_keys(entry, EXPECTED_KEYS, where)
        if entry.get("stage") not in known:
            raise SynthqError(f"{where}: stage {entry.get('stage')!r} is not a stage of this pipeline")
        metric = entry.get("metric")
        if not metric or not isinstance(metric, str | list):
            raise SynthqError(f"{where}: metric must be a key or a list of keys into the stage's metrics")
        bounds = {key: entry[key] for key in ("value", "tolerance", "min", "max") if key in entry}
        if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in bounds.values()):
            raise SynthqError(f"{where}: value, tolerance, min and max must be numbers")
        if "value" in entry and "tolerance" not in entry:
            raise SynthqError(f"{where}: a value needs a tolerance (0 for an exact figure)")
        if bounds.get("tolerance", 0) < 0 or not ({"value", "min", "max"} & set(bounds)):
            raise SynthqError(f"{where}: give value with tolerance >= 0, or min and/or max")
        checked.append({**entry, "metric": [metric] if isinstance(metric, str) else list(metric)})
    return checked


def _metric(metrics: Any, keys: list[str]) -> Any:
    """``metrics[k1][k2]…``; a key with glob characters must match exactly one key at its level
    (e.g. ``embedded/ret-x3-lr*``: whichever configuration dev selection sent to test)."""
    for key in keys:
        if isinstance(metrics, dict) and key not in metrics and any(ch in key for ch in "*?["):
            matches = [name for name in metrics if fnmatch.fnmatchcase(str(name), key)]
            if len(matches) > 1:
                raise KeyError(f"{key} matches {len(matches)}: {', '.join(map(str, matches))}")
            key = matches[0] if matches else key
        if not isinstance(metrics, dict) or key not in metrics:
            raise KeyError(key)
        metrics = metrics[key]
    return metrics


def check_expected(plan: Plan) -> tuple[list[str], bool]:
    """Compare the pipeline's ``expected:`` figures with its artifacts' metrics.

    Returns one line per figure (``ok`` or ``REGRESSION``) and whether any failed; a missing
    artifact or metric fails too."""
    lines, failed = [], False
    for entry in plan.expected:
        label = f"{entry['stage']}: {' / '.join(map(str, entry['metric']))}"
        try:
            metrics = open_artifact(plan.stage(entry["stage"]).out, verify=False).metrics
            actual = float(_metric(metrics, entry["metric"]))
        except (SynthqError, KeyError, TypeError, ValueError) as error:
            lines.append(f"FAILED {label}: no such metric ({error})")
            failed = True
            continue
        problems = []
        if "value" in entry and not abs(actual - entry["value"]) <= entry["tolerance"]:
            problems.append(f"expected {entry['value']:g} ± {entry['tolerance']:g}")
        if "min" in entry and not actual >= entry["min"]:
            problems.append(f"expected >= {entry['min']:g}")
        if "max" in entry and not actual <= entry["max"]:
            problems.append(f"expected <= {entry['max']:g}")
        failed = failed or bool(problems)
        verdict = f"REGRESSION ({'; '.join(problems)})" if problems else "ok"
        lines.append(f"{verdict} {label} = {actual:.4g}")
    return lines, failed


def _estimate(stage: PlannedStage) -> float | None:
    """Seconds a stage is expected to take: its previous run, else the pipeline's hint."""
    if is_artifact(stage.out):
        try:
            return float(open_artifact(stage.out, verify=False).timings.get("wall_seconds"))
        except (SynthqError, TypeError, ValueError):
            return stage.expect_seconds  # an unreadable old artifact: fall back to the hint
    return stage.expect_seconds


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} min" if seconds >= 60 else f"{seconds:.0f} s"


def seconds_by_kind(stage_times: list[tuple[str, float]]) -> dict[str, dict]:
    """``{kind: {"stages": n, "seconds": total}}`` of ``(stage kind, seconds)`` pairs, the kind
    with the most seconds first."""
    totals: dict[str, dict] = {}
    for kind, seconds in stage_times:
        total = totals.setdefault(kind, {"stages": 0, "seconds": 0.0})
        total["stages"] += 1
        total["seconds"] += seconds
    return dict(sorted(totals.items(), key=lambda item: -item[1]["seconds"]))


def time_by_kind(stage_times: list[tuple[str, float]], wall: float) -> str:
    """Where a run's wall time went: each stage kind's total (most first, with its count and
    share), then what lay between stages (planning, checks, imports), so the parts add up to
    ``wall``."""
    parts = [
        f"{kind} ×{total['stages']} {_minutes(total['seconds'])} ({100 * total['seconds'] / wall:.0f} %)"
        for kind, total in seconds_by_kind(stage_times).items()
    ]
    between = max(wall - sum(seconds for _, seconds in stage_times), 0.0)
    return (
        f"time by stage kind: {', '.join(parts)}; between stages {_minutes(between)}; {_minutes(wall)} in all"
    )


def describe_plan(plan: Plan) -> list[str]:
    lines = [f"pipeline {plan.name!r} -> {plan.out} ({len(plan.stages)} stages)"]
    for number, stage in enumerate(plan.stages, 1):
        status = "up to date, skip" if stage.up_to_date else "run"
        estimate = _estimate(stage)
        hint = f", ~{_minutes(estimate)}" if estimate and not stage.up_to_date else ""
        needs = f" <- {', '.join(stage.depends_on)}" if stage.depends_on else ""
        lines.append(f"  {number:2d}. {stage.name} ({stage.stage}): {status}{hint}{needs}")
    return lines


def _code_root() -> Path:
    import synthq

    return Path(synthq.__file__).parent


def code_fingerprint() -> dict[str, tuple[int, int]]:
    """Every source file of the installed synthq package -> (size, modification time in ns).

    Stages import their modules lazily (``synthq --help`` must not load torch), so a checkout
    edited or pulled while a long pipeline runs would otherwise mix module versions: the next
    stage imports new code next to old code already loaded, and fails with an ``ImportError``
    far from its cause, or worse, runs. Comparing this before each stage turns that into one
    clear stop (:func:`run_plan`)."""
    root = _code_root()
    fingerprint = {}
    for path in sorted(root.rglob("*.py")):
        stat = path.stat()
        fingerprint[str(path.relative_to(root))] = (stat.st_size, stat.st_mtime_ns)
    return fingerprint


def _code_changed(before: dict[str, tuple[int, int]]) -> list[str]:
    """The synthq source files added, removed or modified since ``before`` was taken."""
    after = code_fingerprint()
    return sorted(name for name in before.keys() | after.keys() if before.get(name) != after.get(name))


def _stop_on_changed_code(plan: Plan, before: dict[str, tuple[int, int]], stage: PlannedStage) -> None:
    changed = _code_changed(before)
    if changed:
        shown = ", ".join(f"synthq/{name}" for name in changed[:3]) + (" ..." if len(changed) > 3 else "")
        raise SynthqError(
            f"pipeline {plan.name!r} stopped before stage {stage.name!r}: synthq's code changed while "
            f"it ran ({shown}), and a stage must not mix the old modules already loaded with the new "
            "ones. Artifacts of earlier stages are intact; rerun the same command to resume."
        )


def run_plan(plan: Plan) -> dict[str, Path]:
    """Run every stage in order; returns stage name -> artifact path.

    The modules of every stage kind still to run are imported first, and the package's source
    files are fingerprinted; before each stage the fingerprint is compared, so a checkout that
    changes under a running pipeline stops it cleanly (resumable) instead of mixing code."""
    from synthq.config.registry import stage_entry as entry_for

    remaining = [s for s in plan.stages if not s.up_to_date]
    run_functions = {s.stage: entry_for(s.stage).run_function() for s in remaining}
    code = code_fingerprint()
    remaining_estimate = sum(_estimate(s) or 0.0 for s in remaining)
    started = time.perf_counter()
    results: dict[str, Path] = {}
    stage_times: list[tuple[str, float]] = []  # (stage kind, seconds) of the stages run
    for number, stage in enumerate(plan.stages, 1):
        header = escape(f"[{number}/{len(plan.stages)}] {stage.stage} {stage.name}")
        if stage.up_to_date:
            info(f"[green]{header}: up to date, skipped[/]")
            results[stage.name] = stage.out
            continue
        estimate = _estimate(stage) or 0.0
        elapsed = time.perf_counter() - started
        eta = f", pipeline ≈ {_minutes(remaining_estimate)} left" if remaining_estimate else ""
        console.rule(f"{header} (elapsed {_minutes(elapsed)}{eta})")
        _stop_on_changed_code(plan, code, stage)
        stage_started = time.perf_counter()
        try:
            artifact = run_functions[stage.stage](stage.config)
        except KeyboardInterrupt:
            raise
        except Exception as error:
            if changed := _code_changed(code):
                raise SynthqError(
                    f"pipeline {plan.name!r} stopped at stage {stage.name!r} ({stage.stage}): {error}. "
                    f"synthq's code changed while it ran ({', '.join(changed[:3])}), which is the likely "
                    "cause. Artifacts of earlier stages are intact; rerun the same command to resume."
                ) from error
            raise SynthqError(
                f"pipeline {plan.name!r} stopped at stage {stage.name!r} ({stage.stage}): {error}. "
                "Artifacts of earlier stages are intact; rerun the same command to resume."
            ) from error
        remaining_estimate = max(remaining_estimate - estimate, 0.0)
        results[stage.name] = Path(artifact.path)
        stage_times.append((stage.stage, time.perf_counter() - stage_started))
        info(f"{header} done in {_minutes(stage_times[-1][1])}: {artifact.privacy.describe()}")
    wall = time.perf_counter() - started
    info(f"[bold green]pipeline {plan.name!r} finished[/] in {_minutes(wall)}")
    if stage_times:
        info(escape(time_by_kind(stage_times, wall)))
    from synthq.privacy.ledger import ledger_lines

    for line in ledger_lines(list(results.values())):
        info(escape(line))
    return results


def _or_string(node: Any) -> Any:
    """``node`` (a JSON Schema) where every typed value may also be a string: a pipeline file
    writes ``{var}``, ``@stage`` and ``inf`` where numbers go, and they are substituted or parsed
    before the stage's model validates the config."""
    if isinstance(node, list):
        return [_or_string(item) for item in node]
    if not isinstance(node, dict):
        return node
    walked = {key: _or_string(value) for key, value in node.items()}
    if walked.get("type") not in (None, "string"):
        return {"anyOf": [walked, {"type": "string"}]}
    return walked


def _lenient(model: type) -> dict:
    """A stage config's JSON Schema as a pipeline file may write it: every field optional
    (``defaults:`` and the stage's own defaults fill them), under its name or an alias the model
    accepts (``batch_size``), any value possibly a string (:func:`_or_string`)."""
    from pydantic import AliasChoices

    schema = model.model_json_schema(ref_template="#/$defs/{model}")
    properties = {}
    for name, declared in schema.get("properties", {}).items():
        lenient = {"anyOf": [_or_string(declared), {"type": "string"}]}
        if "description" in declared:
            lenient["description"] = declared["description"]
        properties[name] = lenient
        alias = model.model_fields[name].validation_alias if name in model.model_fields else None
        for other in alias.choices if isinstance(alias, AliasChoices) else []:
            properties.setdefault(str(other), lenient)
    out = {"type": "object", "properties": properties, "additionalProperties": False}
    if "$defs" in schema:
        out["$defs"] = _or_string(schema["$defs"])
    return out


def pipeline_schema() -> dict:
    """The JSON Schema of a pipeline file (``synthq run --schema``), generated from the stage
    config models, so an editor validates a pipeline as it is typed (``# yaml-language-server:
    $schema=...``) with the same names and ranges the command line uses."""
    from synthq.config.registry import STAGES

    definitions: dict = {}
    stage_items = []
    defaults = {}
    for name, entry in STAGES.items():
        config = _lenient(entry.config_type())
        definitions.update(config.pop("$defs", {}))
        reference = f"config-{name}"
        definitions[reference] = config
        defaults[name] = {"$ref": f"#/$defs/{reference}"}
        stage_items.append(
            {
                "type": "object",
                "required": ["name", "stage"],
                "additionalProperties": False,
                "properties": {
                    "name": {"type": "string", "description": "An identifier; {var} from sweep allowed."},
                    "stage": {"const": name},
                    "sweep": {"type": "object", "additionalProperties": {"type": "array"}},
                    "expect_seconds": {"type": "number", "minimum": 0},
                    "config": {"$ref": f"#/$defs/{reference}"},
                },
            }
        )
    number = {"type": "number"}
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "synthq pipeline",
        "type": "object",
        "required": ["stages"],
        "additionalProperties": False,
        "properties": {
            "name": {"type": "string"},
            "out": {"type": "string", "description": "Every stage writes <out>/<stage name>."},
            "vars": {"type": "object", "description": "{name} is substituted in every string."},
            "defaults": {"type": "object", "properties": defaults, "additionalProperties": False},
            "stages": {"type": "array", "items": {"oneOf": stage_items}},
            "expected": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["stage", "metric"],
                    "additionalProperties": False,
                    "properties": {
                        "stage": {"type": "string"},
                        "metric": {
                            "anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]
                        },
                        "value": number,
                        "tolerance": number,
                        "min": number,
                        "max": number,
                    },
                },
            },
            "paper": {"description": "Free-form figures shared by YAML anchors."},
        },
        "$defs": definitions,
    }
