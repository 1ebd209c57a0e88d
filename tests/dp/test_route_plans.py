"""synthq plan: each route's DP plan is the one its stage computes (checked against Opacus'
accountant), σ/B falls with more units, units are counted without reading any text, the costs
and the measured runs are the ones the project recorded, and the command prints all of it."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from opacus.accountants import RDPAccountant
from typer.testing import CliRunner

from synthq.cli.app import app
from synthq.data.arrow_views import Queries
from synthq.data.sources import load_source
from synthq.data.summary import summarize
from synthq.dp import route_plans
from synthq.dp.engine import PrivacyPlan, planned_steps
from synthq.dp.lm.per_query import PerQueryClipping
from synthq.models.stage_costs import reference_costs
from synthq.privacy.accounting import default_delta
from synthq.runtime.errors import PrivacyError
from tests import helpers

ROOT = Path(__file__).resolve().parents[2]
runner = CliRunner()


def test_a_route_plan_is_the_stage_plan_and_an_independent_accountant_agrees():
    settings = route_plans.route_settings("synthetic", batch_size=16, epochs=3, max_steps=8)
    plan = route_plans.plan_route(settings, 44, 8.0, None, "rdp")
    stage = PrivacyPlan.create(
        num_units=44, expected_batch_size=16, steps=planned_steps(44, 16, 3, 8), epsilon=8.0, delta=None,
        accountant="rdp", mechanism=PerQueryClipping(0.1), unit="user",
    )  # fmt: skip
    assert (plan.steps, plan.sample_rate, plan.delta) == (8, 16 / 44, default_delta(44))
    assert plan.noise_multiplier == stage.noise_multiplier
    accountant = RDPAccountant()
    accountant.history = [(plan.noise_multiplier, plan.sample_rate, plan.steps)]
    assert 7.9 <= accountant.get_epsilon(delta=plan.delta) <= 8.0
    assert plan.noise_to_signal == pytest.approx(plan.noise_multiplier / 16)
    # ten times the users at the same q and epochs: σ barely moves, so σ/B falls about tenfold
    assert plan.scaled[10] < plan.noise_to_signal / 5


def test_a_batch_larger_than_the_units_is_refused_as_the_stages_refuse_it():
    with pytest.raises(PrivacyError, match="larger than the 20 privacy units"):
        route_plans.plan_route(route_plans.route_settings("direct-dp", 64, 1.0), 20, 8.0, None, "rdp")


def test_direct_dp_noise_to_signal_counts_groups_and_its_2c_sensitivity():
    """Group clipping adds noise of std 2σC (Δ = 2C) to a sum of ⌈B/S⌉ terms of norm ≤ C: its
    noise-to-signal is 2σ/⌈B/S⌉, 16× σ/B at S = 8."""
    direct = route_plans.plan_route(route_plans.route_settings("direct-dp", 16, 3.0), 44, 8.0, None, "rdp")
    assert direct.noise_to_signal == pytest.approx(2 * direct.noise_multiplier / 2)
    assert direct.noise_to_signal == pytest.approx(16 * direct.noise_multiplier / 16)
    odd = route_plans.plan_route(
        route_plans.route_settings("direct-dp", 20, 1.0, group_size=8), 44, 8.0, None, "rdp"
    )
    assert odd.noise_to_signal == pytest.approx(2 * odd.noise_multiplier / 3)


def test_units_are_counted_from_ids_without_reading_any_query_text(monkeypatch):
    def no_text(self, row):
        raise AssertionError("synthq plan read a query's text")

    monkeypatch.setattr(Queries, "text_at", no_text)
    users, read = route_plans.count_units("pylibs", "train", "user", 8)
    queries, _ = route_plans.count_units("pylibs", "train", "query", 8)
    monkeypatch.undo()
    summary = summarize(load_source("pylibs"))["splits"]["train"]
    assert users == summary["users"]["users"] and queries == summary["queries"]
    assert "user id" in read


def test_units_are_the_stages_units_when_a_judgement_is_not_relevant(tmp_path):
    """A qrels row of relevance 0 is no training pair: the stages do not count its query (nor its
    user, when it has no other), so neither does the plan."""
    root = helpers.write_tiny_beir(tmp_path / "log")
    queries = [json.loads(line) for line in (root / "queries.jsonl").read_text().splitlines()]
    with open(root / "queries.jsonl", "w") as handle:
        for number, record in enumerate(queries):
            handle.write(json.dumps({**record, "metadata": {"user_id": f"u{number % 5}"}}) + "\n")
    qrels = (root / "qrels" / "train.tsv").read_text().splitlines()
    train_users = {f"u{n % 5}" for n, r in enumerate(queries) if r["_id"].startswith("tr-")}
    first = qrels[1].split("\t")
    (root / "qrels" / "train.tsv").write_text("\n".join([*qrels, f"zero-judged\t{first[1]}\t0"]) + "\n")
    with open(root / "queries.jsonl", "a") as handle:
        handle.write(
            json.dumps({"_id": "zero-judged", "text": "x", "metadata": {"user_id": "u-zero"}}) + "\n"
        )
    assert route_plans.count_units(str(root), "train", "user", 8)[0] == len(train_users)
    assert route_plans.count_units(str(root), "train", "query", 8)[0] == len(qrels) - 1


def test_costs_are_the_benchmarks_measurements():
    """Each cost in reference_costs.json is the per-row figure of the benchmark it names."""
    measured = json.loads((ROOT / "benchmarks" / "results.json").read_text())["benchmarks"]
    table = json.loads((ROOT / "synthq" / "models" / "reference_costs.json").read_text())
    for name, entry in table.items():
        if name == "about":
            continue
        if "baseline" in entry:  # a whole command's wall time over the step cost of its rows
            wall = measured[entry["benchmark"]]["steps"][entry["entry"]]["wall_seconds"]
            step = table[entry["baseline"]]["value"] * entry["rows"] * entry["document_tokens"] / 128
            assert entry["value"] == pytest.approx(wall / step, rel=1e-3), name
            continue
        results = measured[entry["benchmark"]]["results"]
        if entry.get("ratio"):  # a time ratio measured in one run (bf16 against fp32)
            assert entry["value"] == pytest.approx(results[entry["entry"]]["time_ratio"]), name
        elif "/" in entry["entry"]:
            outer, inner = entry["entry"].split("/")
            assert entry["value"] == pytest.approx(results[outer][inner]["documents_per_second"]), name
        else:
            per_row = results[entry["entry"]]["median_step_seconds"] / entry["rows"]
            assert entry["value"] == pytest.approx(per_row, rel=1e-3), name


def test_the_pydocs_reference_runs_have_the_settings_of_their_pipeline():
    pipeline = yaml.safe_load((ROOT / "pipelines" / "pydocs-strong-start.yaml").read_text())
    generator = pipeline["defaults"]["finetune-lm"]
    direct = next(s for s in pipeline["stages"] if s["name"].startswith("ret-dp-group"))["config"]
    for run in route_plans.reference_runs():
        if run.dataset != "pydocs":
            continue
        source = generator if run.route == "synthetic" else direct
        assert run.settings.batch_size == source["batch_size"] and run.settings.epochs == source["epochs"]
        assert run.settings.group_size == source.get("group_size", 1)
        assert run.settings.max_steps == source.get("max_steps")
        assert run.epsilon == 8 and run.num_units == 44


def test_the_verdict_says_no_gain_when_every_route_is_far_noisier_than_any_run_that_gained():
    runs = route_plans.reference_runs()
    noisy = route_plans.plan_route(route_plans.route_settings("synthetic", 4, 1.0), 8, 1.0, None, "rdp")
    lines = route_plans.verdict({"synthetic": noisy}, runs)
    assert lines[-1].startswith("verdict: expect no gain")
    assert any("pydocs synthetic, round-trip filtered" in line for line in lines)


def test_minutes_add_the_routes_work_at_the_measured_costs():
    plan = route_plans.plan_route(route_plans.route_settings("synthetic", 16, 3.0, 8), 44, 8.0, None, "rdp")
    cost = reference_costs()
    expected = (
        8 * 16 * 8 * cost["generator_dp_seconds_per_row"]
        + 100 * 2 / cost["generated_queries_per_second"]
        + 100 * 2 * 1.0 * cost["retriever_seconds_per_pair"]
    ) / 60
    assert route_plans.route_minutes(plan, 8, 100, 2, 1.0) == pytest.approx(expected)


def test_the_command_reads_counts_only_and_prints_both_routes(tiny_beir):
    arguments = ["--units", "44", "--documents", "1839", "--generator-batch-size", "16"]
    arguments += [
        "--generator-epochs",
        "3",
        "--generator-max-steps",
        "8",
        "--retriever-batch-size",
        "16",
        "--json",
    ]
    result = runner.invoke(app, ["plan", *arguments])
    assert result.exit_code == 0, result.output
    payload = json.loads(result.output)  # stdout is the JSON alone
    assert payload["reads"] == "nothing (--units, --documents)"
    assert set(payload["routes"]) == {"synthetic", "direct-dp"} and payload["units"] == 44
    assert payload["routes"]["synthetic"]["steps"] == 8
    assert math.isfinite(payload["routes"]["direct-dp"]["noise_to_signal"])
    small = ["--generator-batch-size", "4", "--retriever-batch-size", "8"]
    counted = runner.invoke(
        app, ["plan", "--data", str(tiny_beir), "--privacy-unit", "query", "--details", *small]
    )
    assert counted.exit_code == 0, counted.output
    assert f"synthq plan read the relevant judgements of {tiny_beir}/qrels/train.tsv" in counted.output
    assert counted.output.startswith(f"17 queries in {tiny_beir} train (unit: query)")
    assert "noise/signal" in counted.output


SIZE = ["--units", "44", "--documents", "9"]


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--units", "44"], "give --data, or both --units and --documents"),
        (["--units", "44", "--documents", "9", "--privacy-unit", "person"], "'person' is not one of"),
        (["--units", "44", "--documents", "9", "--epsilon", "inf"], "finite ε"),
        (["--units", "44", "--documents", "9", "--epsilon", "nan"], "--epsilon: must be a finite number > 0"),
        (["--units", "44", "--documents", "9", "--epsilon", "0"], "--epsilon: must be greater than 0"),
        (["--units", "44", "--documents", "9", "--generator-batch-size", "big"], "whole number ≥ 1, or auto"),
        ([*SIZE, "--generator-epochs", "-1"], "--generator-epochs: must be greater"),
        ([*SIZE, "--retriever-epochs", "nan"], "--retriever-epochs: must be a finite"),
        ([*SIZE, "--generator-max-steps", "0"], "--generator-max-steps: must be"),
        (["--units", "0", "--documents", "9"], "--units: must be greater than or equal to 1"),
        (["--units", "44", "--documents", "9", "--delta", "2"], "--delta: must be less than 1"),
        (["--units", "44", "--documents", "9", "--retriever-group-size", "0"], "--retriever-group-size"),
        (["--units", "44", "--documents", "9", "--max-queries-per-user", "2", "--privacy-unit", "query"],
         "applies with --privacy-unit user"),
    ],
)  # fmt: skip
def test_the_command_refuses_bad_input_in_one_line(arguments, message):
    """Every value is checked by PlanConfig's field ranges, as every other command's are (before,
    --generator-epochs -1 printed a plan and a verdict after 37 s of CPU)."""
    from synthq.cli.options import OptionError

    result = runner.invoke(app, ["plan", *arguments])
    said = str(result.exception) if isinstance(result.exception, OptionError) else result.output
    assert result.exit_code != 0 and message in said, result.output
    # one line from the config (exit 2 through synthq's main), or typer's own choice check (exit 2)
    assert "\n" not in said.strip() if isinstance(result.exception, OptionError) else result.exit_code == 2
    assert "noise/signal" not in result.output


def test_a_bad_value_is_refused_before_torch_or_the_accountant_loads():
    """--epsilon nan (and any other refused value) exits 2 in one line before anything heavy is
    imported: before, it took 40 s."""
    code = (
        "import sys\n"
        "from synthq.cli.errors import main\n"
        "sys.argv = ['synthq', 'plan', '--data', 'pylibs', '--epsilon', 'nan']\n"
        "try:\n    main()\n"
        "except SystemExit as exit:\n    status = exit.code\n"
        "heavy = [m for m in ('torch', 'opacus', 'scipy', 'synthq.dp.route_plans') if m in sys.modules]\n"
        "print(status, heavy)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "2 []", done.stdout + done.stderr
    assert done.stderr.count("\n") == 1 and "--epsilon" in done.stderr, done.stderr


def test_auto_batches_are_the_stages_choice_and_the_plan_prints_it():
    """--generator-batch-size auto / --retriever-batch-size auto: the batch finetune-lm would
    choose (choose_batch_size at the route's own sensitivity and groups), planned and printed."""
    from synthq.dp.batch_choice import choose_batch_size

    arguments = ["--units", "300", "--documents", "50", "--generator-batch-size", "auto", "--details"]
    arguments += ["--retriever-batch-size", "auto", "--generator-epochs", "2"]
    result = runner.invoke(app, ["plan", *arguments])
    assert result.exit_code == 0, result.output
    generator = choose_batch_size(300, 2.0, None, 8.0, 1 / 600)
    retriever = choose_batch_size(300, 1.0, None, 8.0, 1 / 600, sensitivity_factor=2.0, group_size=8)
    assert f"--generator-batch-size auto: B = {generator.batch_size} users" in result.output
    assert f"--retriever-batch-size auto: B = {retriever.batch_size} users" in result.output
    assert (
        f"synthetic [finetune-lm, then generate and train-retriever]: B = {generator.batch_size},"
        in result.output
    )
    assert f"direct-dp [train-retriever --dp group]: B = {retriever.batch_size}," in result.output


def test_the_verdict_says_when_the_eps_0_controls_kept_as_much_as_the_dp_runs():
    """Where the public warm start alone (ε = 0) kept as much of the gain as the DP run beside it,
    the plan says the gain was the public pairs'; one run clearly above its control changes the
    line to a count."""
    runs = route_plans.reference_runs()
    settings = route_plans.route_settings("synthetic", 16, 3.0, 8)
    hopeful = route_plans.plan_route(settings, 44, 8.0, None, "rdp")
    lines = route_plans.verdict({"synthetic": hopeful}, runs)
    controlled = [run for run in runs if run.route == "synthetic" and run.control_share is not None]
    assert len(controlled) >= 5
    assert lines[-1].startswith(f"but in all {len(controlled)} measured runs with an ε = 0 control")
    assert "41 % against 36 % at 1,404 users" in lines[-1]
    better = replace(controlled[0], share_of_gain=controlled[0].control_share + 0.2)
    lines = route_plans.verdict({"synthetic": hopeful}, [better, *controlled[1:]])
    assert lines[-1].startswith(f"the ε = 0 control: 1 of {len(controlled)} measured runs")
    uncontrolled = [replace(run, control_share=None) for run in runs]
    assert not route_plans.verdict({"synthetic": hopeful}, uncontrolled)[-1].startswith(("but", "the ε = 0"))


def test_the_plans_steps_are_the_stages_steps():
    from synthq.dp.engine import planned_steps as stage_steps

    for units in (5, 44, 1404, 100_000):
        for batch in (1, 3, 64, 1000):
            for epochs in (0.01, 0.5, 1.0, 3.0):
                for cap in (None, 1, 8):
                    expected = stage_steps(units, batch, epochs, cap)
                    assert route_plans.planned_steps(units, batch, epochs, cap) == expected


@pytest.mark.parametrize("unit", ["query", "user"])
def test_units_are_counted_as_training_units_counts_them(tmp_path, unit):
    """The plan counts units without torch (one per query id, or per user id: K keeps at least one
    query of every user); the stages' training_units gives the same n."""
    from synthq.data.pairs import training_pairs
    from synthq.dp.noise import SecretRandomness
    from synthq.dp.privacy_units import training_units

    root = helpers.write_tiny_beir(tmp_path / "log")
    queries = [json.loads(line) for line in (root / "queries.jsonl").read_text().splitlines()]
    with open(root / "queries.jsonl", "w") as handle:
        for number, record in enumerate(queries):
            handle.write(json.dumps({**record, "metadata": {"user_id": f"u{number % 4}"}}) + "\n")
    for k in (1, 8):
        dataset = load_source(str(root), splits=["train"])
        units = training_units(
            training_pairs(dataset, "train"), dataset.root, unit, k, SecretRandomness(0), links=False
        )
        assert route_plans.count_units(str(root), "train", unit, k)[0] == len(units)


def test_the_plan_answers_first_in_at_most_six_lines_and_details_give_the_runs():
    arguments = ["plan", "--units", "1404", "--documents", "8962"]
    short = runner.invoke(app, arguments)
    assert short.exit_code == 0, short.output
    lines = short.output.splitlines()
    assert len(lines) <= 6, short.output
    assert lines[0].startswith("1,404 users (unit: user, ≤ 8 queries each), target ε = 8 (rdp, δ = 0.00036)")
    assert lines[1].startswith(
        "synthetic (finetune-lm, then generate and train-retriever): noise/signal 0.00815"
    )
    assert lines[2].startswith("direct-dp (train-retriever --dp group): noise/signal 0.13")
    assert any(line.startswith("verdict: DP can carry signal on the synthetic route") for line in lines)
    runs = route_plans.reference_runs()
    named = [run.name for run in runs if run.name in short.output]
    assert "--details" in lines[-1] and named == ["pydocs synthetic, round-trip filtered"]  # the verdict's
    full = runner.invoke(app, [*arguments, "--details"])
    assert full.exit_code == 0, full.output
    assert full.output.startswith(short.output.split("; --details")[0])
    assert all(run.name in full.output for run in runs) and len(full.output.splitlines()) > len(runs)
    assert "verdict: DP can carry signal" in full.output.splitlines()[-2]


def test_a_count_no_release_records_is_said_to_be_one():
    """At the user unit of the train split the plan's n is the count every DP stage of the recipe
    records (and assumes public); a count of queries, or of another split, is not: the first
    line says so (#71)."""
    recipe = runner.invoke(app, ["plan", "--units", "1404", "--documents", "9"])
    assert "no release" not in recipe.output
    for extra in (["--privacy-unit", "query"], ["--split", "dev"]):
        other = runner.invoke(app, ["plan", "--units", "1404", "--documents", "9", *extra])
        assert other.exit_code == 0, other.output
        first = other.output.splitlines()[0]
        assert "an exact count of the private" in first and "no release of the recipe records" in first
    payload = json.loads(runner.invoke(app, ["plan", "--units", "1404", "--documents", "9", "--json",
                                             "--privacy-unit", "query"]).output)  # fmt: skip
    assert payload["count_recorded_by_the_recipe"] is False


def test_minutes_are_this_machines_when_its_factor_is_known(monkeypatch):
    """The minutes on this machine are the reference machine's × its factor (injected here; a
    probe measures it otherwise), and the plan says what the factor rests on."""
    arguments = ["plan", "--units", "1404", "--documents", "8962"]
    reference = runner.invoke(app, arguments).output
    assert "≤ 16 min on the reference machine" in reference.splitlines()[2]
    monkeypatch.setenv("SYNTHQ_MACHINE_FACTOR", "4")
    here = runner.invoke(app, arguments).output
    assert "≤ 63 min on this machine (16 min on the reference)" in here.splitlines()[2]
    assert "this machine takes 4× the reference machine's time (2 CPU cores; SYNTHQ_MACHINE_FACTOR)" in here
    payload = json.loads(runner.invoke(app, [*arguments, "--json"]).output)
    direct = payload["routes"]["direct-dp"]
    assert direct["minutes_on_this_machine"] == pytest.approx(4 * direct["minutes_on_2_cpu_cores"])
    assert payload["machine"] == {"factor": 4.0, "basis": "SYNTHQ_MACHINE_FACTOR"}


def test_the_minutes_are_bounded_by_the_rows_the_split_holds_not_k_times_the_users():
    """Faults round 5: --max-queries-per-user 100000 printed ~20,854 minutes "as an upper bound"
    (K rows for each of 1,404 users). A step reads at most its share of the split's rows; the
    count behind that bound is not printed (no release records it), and the head line says so."""

    def minutes(k: int) -> dict:
        arguments = ["plan", "--data", "pylibs", "--documents", "9", "--max-queries-per-user", str(k)]
        payload = json.loads(runner.invoke(app, [*arguments, "--json"]).output)
        return {name: route["minutes_on_2_cpu_cores"] for name, route in payload["routes"].items()}

    absurd, large = minutes(100000), minutes(1000)
    assert absurd == pytest.approx(large)  # both past every row the split holds
    assert absurd["direct-dp"] <= minutes(8)["direct-dp"]
    head = runner.invoke(app, ["plan", "--data", "pylibs", "--documents", "9", "--max-queries-per-user",
                               "100000"]).output.splitlines()[0]  # fmt: skip
    assert (
        "≤ 100000 queries each; minutes bounded by the split's judged queries, fewer than K × users" in head
    )
    assert "keep them to yourself" in head
