"""Pipeline planning and running with a fake, instant stage (the end-to-end run with real
stages lives in tests/test_end_to_end.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from synthq.artifacts.create import create_artifact
from synthq.artifacts.freshness import existing_result
from synthq.artifacts.manifest import open_artifact
from synthq.config import registry
from synthq.config.fields import StageConfig
from synthq.pipeline.plan import plan_pipeline
from synthq.pipeline.progress import describe_plan, time_by_kind
from synthq.pipeline.run import run_plan
from synthq.runtime.errors import SynthqError
from tests.helpers import accounted

CALLS: list[str] = []
REAL_GENERATE = registry.STAGES["generate"]


class FakeConfig(StageConfig):
    sources: list[str] = []
    value: float = 1.0
    fail: bool = False
    edit_code: str = ""  # a source file this stage rewrites, as a `git pull` mid-run would


def run(config: FakeConfig):
    inputs = [open_artifact(s).input_record() for s in config.sources]
    if (done := existing_result("generate", config, inputs)) is not None:
        return done
    CALLS.append(config.out.name)
    if config.edit_code:
        Path(config.edit_code).write_text("CHANGED = True  # a longer file than before\n")
    if config.fail:
        raise RuntimeError("synthetic failure")
    with create_artifact(config.out, "generate", config, inputs) as writer:
        (writer.dir / "value.txt").write_text(str(config.value))
        writer.metrics["scores"] = {"value": config.value, "double": 2 * config.value}
        writer.privacy = accounted(epsilon=config.value, delta=1e-5, mechanism="fake")
    return open_artifact(config.out)


@pytest.fixture(autouse=True)
def fake_stage(monkeypatch):
    CALLS.clear()
    monkeypatch.setitem(registry.STAGES, "generate", registry.StageEntry(__name__, FakeConfig))


PIPELINE = """
name: mini
out: {out}
vars: {{base: 2}}
defaults:
  generate: {{value: 5}}
stages:
  - name: first-{{eps}}
    stage: generate
    sweep: {{eps: [1, 3]}}
    expect_seconds: 2
    config: {{value: "{{eps}}"}}
  - name: second
    stage: generate
    config: {{sources: ["@first-*"], value: "{{base}}"}}
  - name: third
    stage: generate
    config: {{sources: ["@second"]}}
"""


def write(tmp_path, text=PIPELINE):
    path = tmp_path / "p.yaml"
    path.write_text(text.format(out=tmp_path / "runs"))
    return path


def test_plan_expands_sweeps_vars_defaults_and_references(tmp_path):
    plan = plan_pipeline(write(tmp_path))
    names = [s.name for s in plan.stages]
    assert names == ["first-1", "first-3", "second", "third"]
    assert plan.stage("first-3").config.value == 3
    assert plan.stage("second").config.value == 2  # vars
    assert plan.stage("third").config.value == 5  # defaults
    assert plan.stage("second").config.sources == [
        str(tmp_path / "runs" / "first-1"),
        str(tmp_path / "runs" / "first-3"),
    ]
    assert plan.stage("second").depends_on == ["first-1", "first-3"]
    assert not any(s.up_to_date for s in plan.stages)


def test_run_skip_force_and_dry_run(tmp_path):
    path = write(tmp_path)
    run_plan(plan_pipeline(path))
    assert CALLS == ["first-1", "first-3", "second", "third"]
    assert open_artifact(tmp_path / "runs" / "second").inputs[0]["stage"] == "generate"
    CALLS.clear()
    plan = plan_pipeline(path)
    assert all(s.up_to_date for s in plan.stages)
    assert "up to date, skip" in "\n".join(describe_plan(plan))
    run_plan(plan)
    assert CALLS == []
    # forcing one stage re-runs it and everything downstream of it (its inputs changed)
    plan = plan_pipeline(path, force=["second"])
    assert [s.name for s in plan.stages if not s.up_to_date] == ["second", "third"]
    run_plan(plan)
    assert CALLS == ["second", "third"]
    # an override changes a config: that stage and its dependants are stale
    plan = plan_pipeline(path, overrides=["stages.2.config.value=9"])
    assert [s.name for s in plan.stages if not s.up_to_date] == ["third"]
    # ... and is replaced without --force (the pipeline owns its outputs), its config unforced
    assert not plan.stage("third").config.force
    CALLS.clear()
    run_plan(plan)
    assert CALLS == ["third"]
    assert (tmp_path / "runs" / "third" / "value.txt").read_text() == "9.0"
    # the ownership ends with the run: a stage run by hand still needs --force to replace it
    with pytest.raises(SynthqError, match="pass --force to replace it"):
        run(plan.stage("third").config.model_copy(update={"value": 7.0}))


def test_moved_inputs_are_checked_when_the_stage_runs(tmp_path, monkeypatch):
    """Artifacts whose recorded inputs moved (a checkout renamed, a worktree removed) cannot be
    judged from their records alone; the stages then find their inputs as they are now and reuse
    the artifacts whose inputs' content is unchanged, instead of redoing the whole pipeline."""
    (tmp_path / "before").mkdir()
    monkeypatch.chdir(tmp_path / "before")
    path = Path("p.yaml")
    path.write_text(PIPELINE.format(out="runs"))
    run_plan(plan_pipeline(path))
    (tmp_path / "before").rename(tmp_path / "after")
    monkeypatch.chdir(tmp_path / "after")
    CALLS.clear()
    plan = plan_pipeline(path)
    assert [s.name for s in plan.stages if s.up_to_date] == ["first-1", "first-3"]
    assert [s.name for s in plan.stages if s.decided_at_run] == ["second", "third"]
    assert "decided when it runs" in "\n".join(describe_plan(plan))
    run_plan(plan)
    assert CALLS == []  # nothing redone: every input's content is the same
    # a real change upstream is still seen when the stage runs
    run_plan(plan_pipeline(path, overrides=["stages.0.config.value=4"]))
    assert CALLS == ["first-1", "first-3", "second", "third"]


def test_a_stage_named_by_its_output_path_is_a_dependency(tmp_path):
    """``sources: [<out>/second]`` instead of ``@second``: rerunning second must rerun third too,
    never skip it on the old output."""
    path = write(tmp_path, PIPELINE.replace('["@second"]', '["{out}/second"]'))
    plan = plan_pipeline(path)
    assert plan.stage("third").depends_on == ["second"]
    run_plan(plan)
    CALLS.clear()
    plan = plan_pipeline(path, overrides=["stages.1.config.value=7"])
    assert [s.name for s in plan.stages if not s.up_to_date] == ["second", "third"]
    run_plan(plan)
    assert CALLS == ["second", "third"]


def test_pipeline_ownership_stays_in_its_thread(tmp_path):
    """A pipeline may replace its stale outputs without --force; another thread's direct call on
    the same path may not, during the stage or after it."""
    import threading

    from synthq.artifacts.process_state import may_replace, owned_by_pipeline

    out = tmp_path / "runs" / "x"
    seen: list[bool] = []
    with owned_by_pipeline(out):
        assert may_replace(out, force=False)
        thread = threading.Thread(target=lambda: seen.append(may_replace(out, force=False)))
        thread.start()
        thread.join()
    assert seen == [False]
    assert not may_replace(out, force=False)
    assert may_replace(out, force=True)


def test_time_by_kind_adds_up_to_the_wall_time():
    line = time_by_kind([("train-retriever", 30.0), ("evolve", 300.0), ("train-retriever", 90.0)], 600.0)
    assert line == (
        "time by stage kind: evolve ×1 5.0 min (50 %), train-retriever ×2 2.0 min (20 %); "
        "between stages 3.0 min; 10.0 min in all"
    )


def test_dry_run_runs_nothing(tmp_path):
    from typer.testing import CliRunner

    from synthq.cli.app import app

    result = CliRunner().invoke(app, ["run", str(write(tmp_path)), "--dry-run"])
    assert result.exit_code == 0, result.output
    assert CALLS == [] and not (tmp_path / "runs").exists()
    assert "first-3 (generate): run, ~2 s" in result.output


def test_the_dry_run_plan_is_on_stdout(tmp_path, capsys, monkeypatch):
    """Fault pass round 4: `run --dry-run > plan.txt` wrote nothing (the plan went to stderr)."""
    from synthq.cli.errors import main

    monkeypatch.setattr("sys.argv", ["synthq", "run", str(write(tmp_path)), "--dry-run"])
    capsys.readouterr()
    main()  # returns normally on success
    captured = capsys.readouterr()
    assert "first-3 (generate): run, ~2 s" in captured.out
    assert "first-3" not in captured.err and CALLS == []


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        # an empty sweep list planned "0 stages" and exited 0: the stage and its dependants were gone
        ((r"{{eps: [1, 3]}}", r"{{eps: []}}"), r"stage 'first-\{eps\}': sweep eps lists no values"),
        # a misspelt variable reached the config as text and was reported as a bad number
        (
            ('value: "{{base}}"', 'value: "{{bsae}}"'),
            r"stages\[1\] \(second\): unknown variable\(s\) \{bsae\}; defined: base",
        ),
    ],
)
def test_an_empty_sweep_or_an_unknown_variable_is_refused(tmp_path, edit, message):
    path = write(tmp_path, PIPELINE.replace(*edit))
    with pytest.raises(SynthqError, match=message):
        plan_pipeline(path)


def test_failure_names_the_stage_and_keeps_earlier_artifacts(tmp_path):
    path = write(tmp_path)
    with pytest.raises(SynthqError, match="stopped at stage 'second'.*synthetic failure"):
        run_plan(plan_pipeline(path, overrides=["stages.1.config.fail=true"]))
    assert open_artifact(tmp_path / "runs" / "first-1").privacy.epsilon == 1
    assert not (tmp_path / "runs" / "second").exists()
    CALLS.clear()
    run_plan(plan_pipeline(path))  # resumes: only the failed stage onwards
    assert CALLS == ["second", "third"]


@pytest.fixture
def code_root(tmp_path, monkeypatch):
    """A stand-in for synthq's source tree, which the fake stage may edit mid-pipeline."""
    import synthq.pipeline.run as pipeline_run

    root = tmp_path / "code"
    (root / "dp").mkdir(parents=True)
    (root / "dp" / "engine.py").write_text("CHANGED = False\n")
    monkeypatch.setattr(pipeline_run, "_code_root", lambda: root)
    return root


def test_code_changed_between_stages_stops_the_pipeline_resumably(tmp_path, code_root):
    path = write(tmp_path)
    engine = code_root / "dp" / "engine.py"
    with pytest.raises(SynthqError, match=r"before stage 'first-3'.*code changed.*synthq/dp/engine\.py"):
        run_plan(plan_pipeline(path, overrides=[f"stages.0.config.edit_code={engine}"]))
    assert CALLS == ["first-1"]
    assert open_artifact(tmp_path / "runs" / "first-1").privacy.epsilon == 1  # kept
    CALLS.clear()
    run_plan(plan_pipeline(path))  # the rerun resumes with the new code
    assert CALLS == ["first-1", "first-3", "second", "third"]  # first-1's config changed back


def test_a_stage_failing_after_a_code_change_names_the_change(tmp_path, code_root):
    path = write(tmp_path)
    engine = code_root / "dp" / "engine.py"
    overrides = ["stages.1.config.fail=true", f"stages.1.config.edit_code={engine}"]
    with pytest.raises(
        SynthqError, match=r"stopped at stage 'second'.*synthetic failure.*dp/engine\.py.*likely"
    ):
        run_plan(plan_pipeline(path, overrides=overrides))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("stages:\n  - {name: a, stage: generate, config: {sources: ['@nope']}}", "names no earlier stage"),
        (
            "stages:\n  - {name: a, stage: generate, config: {sources: ['@b']}}\n"
            "  - {name: b, stage: generate}",
            "names no earlier stage",
        ),
        ("stages:\n  - {name: a, stage: nonsense}", "unknown stage 'nonsense'"),
        ("stages:\n  - {name: a, stage: generate}\n  - {name: a, stage: generate}", "duplicate stage name"),
        ("stages:\n  - {name: a, stage: generate, config: {value: abc}}", "invalid config.*value"),
        ("stages: []", "non-empty 'stages'"),
    ],
)
def test_bad_pipelines_fail_before_running(tmp_path, text, message):
    path = tmp_path / "bad.yaml"
    path.write_text(f"out: {tmp_path / 'runs'}\n{text}\n")
    with pytest.raises(SynthqError, match=message):
        plan_pipeline(path)
    assert CALLS == []


def test_unknown_forced_stage(tmp_path):
    with pytest.raises(SynthqError, match="unknown stages: zzz"):
        plan_pipeline(write(tmp_path), force=["zzz"])


REPO = Path(__file__).resolve().parents[2]
PIPELINE_FILES = sorted((REPO / "pipelines").rglob("*.yaml"))


@pytest.mark.parametrize("path", PIPELINE_FILES, ids=lambda p: p.name)
def test_shipped_pipelines_plan_and_start_with_their_command(path, monkeypatch):
    monkeypatch.setitem(registry.STAGES, "generate", REAL_GENERATE)  # undo the fake stage
    first_line = path.read_text(encoding="utf-8").splitlines()[0]
    assert first_line == f"# synthq run {path.relative_to(REPO).as_posix()}"
    plan = plan_pipeline(path)
    assert plan.stages


CHECKED = (
    PIPELINE
    + """
expected:
  - {{stage: second, metric: [scores, value], value: 2.0, tolerance: 0.01}}
  - {{stage: first-3, metric: [scores, double], min: 5.5, max: 6.5}}
"""
)


def test_run_check_passes_and_fails_loudly_on_a_regression(tmp_path):
    from typer.testing import CliRunner

    from synthq.cli.app import app

    path = write(tmp_path, CHECKED)
    result = CliRunner().invoke(app, ["run", str(path), "--check"])
    assert result.exit_code == 0, result.output
    assert "ok second: scores / value = 2" in result.output and "check passed: 2 expected" in result.output
    # the same pipeline with a changed figure: the stage reruns, and the check fails with exit 1
    result = CliRunner().invoke(app, ["run", str(path), "--check", "vars.base=2.5"])
    assert result.exit_code == 1
    assert "REGRESSION (expected 2 ± 0.01) second: scores / value = 2.5" in result.output
    assert "ok first-3" in result.output
    # a metric the artifact does not have fails too
    result = CliRunner().invoke(app, ["run", str(path), "--check", "expected.0.metric=nope"])
    assert result.exit_code == 1 and "FAILED second: nope: no such metric" in result.output
    # a glob names whichever key is there (one); several matches are ambiguous and fail
    result = CliRunner().invoke(app, ["run", str(path), "--check", "expected.1.metric=[scores, doub*]"])
    assert "ok first-3: scores / doub* = 6" in result.output, result.output
    result = CliRunner().invoke(app, ["run", str(path), "--check", "expected.1.metric=[scores, '*']"])
    assert result.exit_code == 1 and "FAILED first-3: scores / *: no such metric" in result.output
    assert "matches 2" in result.output


def test_the_pipeline_schema_accepts_the_shipped_pipelines_and_names_mistakes(monkeypatch):
    """``synthq run --schema``: every shipped pipeline validates; an unknown key, a misspelled
    stage option and a wrong type are errors an editor shows."""
    import json

    import jsonschema
    from typer.testing import CliRunner

    from synthq.cli.app import app
    from synthq.config.loading import load_yaml
    from synthq.pipeline.plan import EXPECTED_KEYS, PIPELINE_KEYS, STAGE_KEYS

    monkeypatch.setitem(registry.STAGES, "generate", REAL_GENERATE)
    printed = CliRunner().invoke(app, ["run", "--schema"])
    assert printed.exit_code == 0, printed.output
    schema = json.loads(printed.stdout)
    assert set(schema["properties"]) == PIPELINE_KEYS
    assert set(schema["properties"]["expected"]["items"]["properties"]) == EXPECTED_KEYS
    assert all(
        set(item["properties"]) == STAGE_KEYS for item in schema["properties"]["stages"]["items"]["oneOf"]
    )
    validator = jsonschema.Draft202012Validator(schema)
    for path in PIPELINE_FILES:
        errors = list(validator.iter_errors(load_yaml(path)))
        assert not errors, (path, errors[0].message)
    base = {"stages": [{"name": "g", "stage": "generate", "config": {"generator": "@x", "top_p": 0.9}}]}
    assert validator.is_valid(base)
    assert not validator.is_valid({**base, "stagez": []})
    typo = {"stages": [{"name": "g", "stage": "generate", "config": {"top-p": 0.9}}]}
    assert not validator.is_valid(typo)
    wrong_type = {"stages": [{"name": "g", "stage": "generate", "config": {"top_p": [0.9]}}]}
    assert not validator.is_valid(wrong_type)


class PrecisionConfig(FakeConfig):
    precision: str = "auto"
    device: str = "cpu"


def test_the_dry_run_warns_of_bf16_on_a_cpu_without_bf16_arithmetic(tmp_path, capsys, monkeypatch):
    """Faults round 5: the warning came only when the stage started, perhaps hours in."""
    from synthq.cli.errors import main
    from synthq.runtime import precision

    monkeypatch.setitem(registry.STAGES, "generate", registry.StageEntry(__name__, PrecisionConfig))
    monkeypatch.setattr(precision.platform, "machine", lambda: "x86_64")
    text = PIPELINE.replace('config: {{value: "{{eps}}"}}', 'config: {{value: "{{eps}}", precision: bf16}}')
    monkeypatch.setattr("sys.argv", ["synthq", "run", str(write(tmp_path, text)), "--dry-run"])
    monkeypatch.setattr(precision, "native_bf16_cpu", lambda: False)
    capsys.readouterr()
    main()
    err = capsys.readouterr().err
    assert err.count("without bf16 arithmetic") == 2, err
    assert "stage 'first-1' (generate): --precision bf16 on a CPU" in " ".join(err.split())
    assert "'second'" not in err and CALLS == []
    monkeypatch.setattr(precision, "native_bf16_cpu", lambda: True)  # bf16 arithmetic: nothing to say
    main()
    assert "bf16 arithmetic" not in capsys.readouterr().err


@pytest.mark.parametrize(
    ("name", "advice"),
    [
        (
            "\n      gen-{{eps}}:\n        sweep: {{eps: [1, 3]}}",
            "`name: gen-{eps}` and `sweep: {eps: [1, 3]}`",
        ),
        ("{{gen: {{eps: [1, 3]}}}}", "`name: gen-{eps}` and `sweep: {eps: [1, 3]}`"),
        ("[gen, 1]", "[gen, 1] is a list, not a name"),
    ],
)
def test_a_sweep_written_inside_a_name_is_named_with_where_it_goes(tmp_path, name, advice):
    """Faults round 5: `name: {gen-{eps}: {sweep: ...}}` was refused as "not a valid name (letters,
    digits...)", the mapping's text quoted as the name, nothing said of the sweep."""
    text = PIPELINE.replace("name: first-{{eps}}", f"name: {name}")
    with pytest.raises(SynthqError) as refused:
        plan_pipeline(write(tmp_path, text))
    message = str(refused.value)
    assert "stages[0] name: " in message and advice in message, message
    if "sweep" in name or "eps" in name:
        assert "a sweep is written inside it; put it beside the name, at the same indent" in message
