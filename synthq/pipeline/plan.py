"""Planning ``synthq run PIPELINE.yaml``: read the file, expand it into concrete stages, validate them.

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

It may end with an ``expected:`` block, the figures it reproduces (validated here, compared by
:mod:`synthq.pipeline.check`).

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

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from synthq.artifacts.freshness import is_still_up_to_date
from synthq.config.loading import apply_overrides, load_yaml, validation_message
from synthq.config.registry import stage_entry
from synthq.pipeline.expand import expand_sweep, resolve_references, substitute, unknown_variables
from synthq.runtime.errors import SynthqError

_IDENTIFIER = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
# "paper": the paper's figures, shared by YAML anchors (&paper) with report stages.
PIPELINE_KEYS = {"name", "out", "vars", "defaults", "stages", "expected", "paper"}
STAGE_KEYS = {"name", "stage", "sweep", "expect_seconds", "config"}
EXPECTED_KEYS = {"stage", "metric", "value", "tolerance", "min", "max"}


@dataclass
class PlannedStage:
    """One concrete stage of a pipeline, after sweeps, variables and references are resolved."""

    name: str
    stage: str
    config: Any
    depends_on: list[str] = field(default_factory=list)
    expect_seconds: float | None = None
    up_to_date: bool = False
    forced: bool = False  # by the user (--force NAME or all), not only stale: never resumed
    # An artifact is there but an input it recorded has moved: whether it is up to date is
    # decided when the stage runs and finds its inputs (it is reused if their content is the same).
    decided_at_run: bool = False

    @property
    def out(self) -> Path:
        return Path(self.config.out)


@dataclass
class Plan:
    """A pipeline ready to run: its concrete stages in order and its ``expected:`` figures."""

    name: str
    out: Path
    stages: list[PlannedStage]
    expected: list[dict] = field(default_factory=list)

    def stage(self, name: str) -> PlannedStage:
        for planned in self.stages:
            if planned.name == name:
                return planned
        raise SynthqError(f"pipeline {self.name!r} has no stage named {name!r}")


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
    forced = set(force or [])
    planned, known = _concrete_stages(entries, variables, defaults, root, forced, path)
    unknown_forced = forced - set(known) - {"all"}
    if unknown_forced:
        raise SynthqError(f"--force names unknown stages: {', '.join(sorted(unknown_forced))}")
    _mark_up_to_date(planned)
    expected = _expected_entries(data.get("expected") or [], known, path)
    return Plan(name=name, out=root, stages=planned, expected=expected)


def _concrete_stages(
    entries: list, variables: dict[str, Any], defaults: dict, root: Path, force: set[str], path: str | Path
) -> tuple[list[PlannedStage], dict[str, Path]]:
    """Every ``stages:`` entry, once per value of its sweep, with its config validated; also
    stage name -> output directory."""
    known: dict[str, Path] = {}
    planned: list[PlannedStage] = []
    for index, raw in enumerate(entries):
        if not isinstance(raw, dict) or "stage" not in raw or "name" not in raw:
            raise SynthqError(f"{path}: stages[{index}] needs 'name' and 'stage'")
        _check_keys(raw, STAGE_KEYS, f"{path}: stages[{index}]")
        if not isinstance(raw["name"], str | int | float) or isinstance(raw["name"], bool):
            raise SynthqError(f"{path}: stages[{index}] name: {_not_a_name(raw['name'])}")
        entry_point = stage_entry(raw["stage"])
        for entry, scope in expand_sweep(raw, variables):
            options = {**(defaults.get(entry["stage"]) or {}), **(entry.get("config") or {})}
            unknown = unknown_variables([entry["name"], options], scope)
            if unknown:
                defined = ", ".join(sorted(scope)) or "none (define them under vars: or the stage's sweep:)"
                raise SynthqError(
                    f"{path}: stages[{index}] ({raw['name']}): unknown variable(s) "
                    f"{', '.join('{' + name + '}' for name in dict.fromkeys(unknown))}; defined: {defined}"
                )
            stage_name = _identifier(str(substitute(entry["name"], scope)), f"{path}: stages[{index}] name")
            where = f"{path}: stage {stage_name!r}"
            if stage_name in known:
                raise SynthqError(f"{where}: duplicate stage name")
            options = substitute(options, scope)
            used: list[str] = []
            options = resolve_references(options, known, where, used)
            used += _named_by_path(options, known)
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
                    forced=options["force"],
                )
            )
    return planned, known


def _named_by_path(options: Any, known: dict[str, Path]) -> list[str]:
    """Earlier stages a config names by their output path rather than ``@stage`` (``data:
    runs/x/gen``): dependencies all the same, so that one rerun upstream is never followed by a
    skip of a stage that read the old output."""
    outputs = {path.resolve(): name for name, path in known.items()}
    found: list[str] = []

    def visit(value: Any) -> None:
        if isinstance(value, dict):
            for item in value.values():
                visit(item)
        elif isinstance(value, list | tuple):
            for item in value:
                visit(item)
        elif isinstance(value, str | Path) and str(value).strip():
            name = outputs.get(Path(value).expanduser().resolve())
            if name is not None:
                found.append(name)

    visit({k: v for k, v in options.items() if k != "out"})
    return found


def _mark_up_to_date(planned: list[PlannedStage]) -> None:
    """Which stages can be skipped: not forced, nothing upstream stale, and their artifact still
    matches their config and inputs. Every other stage runs; the pipeline owns its outputs, so a
    stale one is replaced without ``--force`` (:func:`synthq.pipeline.run.run_plan`), while the
    stage still reuses an artifact that is up to date for its inputs as they are now (a stage
    downstream of one that was rerun identically, or whose inputs moved but did not change)."""
    stale: set[str] = set()
    undecided: set[str] = set()
    for stage in planned:
        verdict: bool | None
        if stage.config.force or any(dep in stale for dep in stage.depends_on):
            verdict = False
        else:
            verdict = is_still_up_to_date(stage.out, stage.stage, stage.config)
            if verdict is True and any(dep in undecided for dep in stage.depends_on):
                verdict = None  # up to date only if the undecided stages upstream turn out so
        stage.up_to_date = verdict is True
        stage.decided_at_run = verdict is None
        if verdict is False:
            stale.add(stage.name)
        elif verdict is None:
            undecided.add(stage.name)


def _check_keys(mapping: dict, allowed: set[str], where: str) -> None:
    unknown = sorted(set(mapping) - allowed)
    if unknown:
        raise SynthqError(
            f"{where}: unknown key(s) {', '.join(unknown)} (allowed: {', '.join(sorted(allowed))})"
        )


def _not_a_name(name: Any) -> str:
    """Why a stage's ``name:`` that YAML read as a mapping or a list is not one, and what to
    write: most often a sweep written inside it (``name: {gen-{eps}: {sweep: ...}}``, or ``sweep:``
    indented under ``name:``), where it belongs beside it."""

    def flow(value: Any) -> str:
        return yaml.safe_dump(value, default_flow_style=True, width=10**6).strip()

    if isinstance(name, dict) and len(name) == 1:
        ((key, value),) = name.items()
        sweep = value.get("sweep", value) if isinstance(value, dict) else None
        if isinstance(sweep, dict) and sweep and all(isinstance(v, list) for v in sweep.values()):
            key = str(key) + "".join(f"-{{{var}}}" for var in sweep if f"{{{var}}}" not in str(key))
            return (
                f"{flow(name)} is a mapping, not a name: a sweep is written inside it; put it beside "
                f"the name, at the same indent: `name: {key}` and `sweep: {flow(sweep)}`"
            )
    kind = "mapping" if isinstance(name, dict) else "list" if isinstance(name, list) else type(name).__name__
    return (
        f"{flow(name)} is a {kind}, not a name; a name is text (letters, digits, '.', '_', '-'), and "
        "a sweep goes beside it as the entry's own key: `name: gen-{eps}` and `sweep: {eps: [1, 8]}`"
    )


def _identifier(name: str, where: str) -> str:
    if not _IDENTIFIER.fullmatch(name) or ".." in name:
        raise SynthqError(
            f"{where}: {name!r} is not a valid name (letters, digits, '.', '_', '-'; it becomes a directory)"
        )
    return name


def _expected_entries(entries: Any, known: dict[str, Path], path: str | Path) -> list[dict]:
    """The ``expected:`` block, validated: each figure names a stage of the pipeline, a metric
    (a key or a list of keys) and numeric bounds (value with tolerance, or min and/or max)."""
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
