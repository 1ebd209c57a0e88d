"""``synthq plan``: the DP plan of both routes for a log of this size, before any training
(:mod:`synthq.dp.route_plans`). Its options are the fields of
:class:`synthq.config.plan.PlanConfig` (registered in :mod:`synthq.cli.app` with
:func:`synthq.cli.options.config_command`), checked before anything is read.

It answers first, in at most six lines: what was counted, each route's noise-to-signal and
minutes on this machine, the verdict; ``--details`` adds each route's plan in full and the
measured runs behind the verdict. It reads counts only and loads no torch (the accountant's RDP
sums run in numpy, :mod:`synthq.privacy.sampled_gaussian`) unless ``auto`` batches or a fresh
machine probe need it."""

from __future__ import annotations

import json
import math

import typer

from synthq.cli.options import ConfigOptions
from synthq.runtime.console import result

DETAILS = "the plans in full and the measured runs behind the verdict"
# the head line's note when the split holds fewer rows than K × users (the minutes' bound)
CAPPED = (
    "; minutes bounded by the split's judged queries, fewer than K × users: a count no release "
    "records, keep them to yourself"
)
STAGES = {
    "synthetic": "finetune-lm, then generate and train-retriever",
    "direct-dp": "train-retriever --dp group",
}


def plan_command(options: ConfigOptions) -> None:
    """Before training: each route's noise-to-signal, its minutes on this machine and the verdict
    of the measured runs (--details: the plans in full and the runs behind the verdict).

    Reads only counts: the number of privacy units in the training split, counted as the DP
    stages count them (the count every DP stage records and assumes public), and the size of the
    public corpus; with --units and --documents, nothing at all. Its defaults are the README
    recipe's settings, not the stages' own defaults."""
    config = options.config()  # every value is checked before anything is read or loaded
    from synthq.dp import route_plans
    from synthq.models.stage_costs import machine_speed

    units, documents, read = config.units, config.documents, "nothing (--units, --documents)"
    rows = None  # the split's training rows, when counted
    if units is None or documents is None:
        parts = []
        if units is None:
            units, rows, what = route_plans.count_training(config.data, config.split, config.privacy_unit)
            parts.append(what)
        if documents is None:
            documents, what = route_plans.count_documents(config.data)
            parts.append(what)
        read = "; ".join(parts) + " (no query or document text)"
    budget = (units, config.privacy_unit, config.epsilon, config.delta, config.accountant)
    chosen = {
        "synthetic": _batch(config.generator_batch_size, "--generator-batch-size", budget,
                            config.generator_epochs, config.generator_max_steps),
        "direct-dp": _batch(config.retriever_batch_size, "--retriever-batch-size", budget,
                            config.retriever_epochs, None, group_size=config.retriever_group_size),
    }  # fmt: skip
    settings = {
        "synthetic": route_plans.route_settings(
            "synthetic", chosen["synthetic"][0], config.generator_epochs, config.generator_max_steps
        ),
        "direct-dp": route_plans.route_settings(
            "direct-dp",
            chosen["direct-dp"][0],
            config.retriever_epochs,
            group_size=config.retriever_group_size,
        ),
    }
    plans = {
        name: route_plans.plan_route(
            s, units, config.epsilon, config.delta, config.accountant, config.privacy_unit
        )
        for name, s in settings.items()
    }  # a batch larger than the units is refused here, as the stages refuse it
    # K × users past the split's rows is no bound at all (--max-queries-per-user 100000: 20,000
    # minutes): a step reads at most its share of the rows there are (never printed: an exact
    # count no release records)
    rows_per_unit = config.rows_per_unit
    capped = rows is not None and config.privacy_unit == "user" and rows < rows_per_unit * units
    if capped:
        rows_per_unit = rows / units
    minutes = {
        name: route_plans.route_minutes(
            plan, rows_per_unit, documents, config.num_queries, config.retriever_epochs
        )
        for name, plan in plans.items()
    }
    speed = machine_speed(max_age=math.inf)  # a probe of any age: a plan is a rough guide
    runs = route_plans.reference_runs()
    recorded = config.privacy_unit == "user" and config.split == "train"
    if config.as_json:
        routes = {name: route_plans.describe(plan, minutes[name]) for name, plan in plans.items()}
        for name, route in routes.items():
            route["minutes_on_this_machine"] = None if speed is None else minutes[name] * speed.factor
        payload = {
            "reads": read, "units": units, "unit": config.privacy_unit, "split": config.split,
            "count_recorded_by_the_recipe": recorded, "epsilon": config.epsilon, "documents": documents,
            "machine": None if speed is None else {"factor": speed.factor, "basis": speed.basis},
            "routes": routes,
            "verdict": route_plans.verdict(plans, runs, config.accountant),
        }  # fmt: skip
        typer.echo(json.dumps(payload, indent=2, ensure_ascii=False))
        return
    noun = "users" if config.privacy_unit == "user" else "queries"
    first = plans["synthetic"]
    where = f" in {config.data} {config.split}" if config.data and config.units is None else ""
    head = (
        f"{units:,} {noun}{where} (unit: {config.privacy_unit}"
        + (f", ≤ {config.max_queries_per_user} queries each" if config.privacy_unit == "user" else "")
        + (CAPPED if capped else "")
        + f"), target ε = {config.epsilon:g} ({first.accountant}, δ = {first.delta:.2g}), "
        f"{documents:,} public documents"
    )
    if not recorded:
        head += (
            f"; {units:,} is an exact count of the private {config.split} split that no release of the "
            "recipe records (its DP stages record the train split's users): keep it to yourself"
        )
    lines = [head]
    for name, plan in plans.items():
        lines.append(
            f"{name} ({STAGES[name]}): noise/signal {plan.noise_to_signal:.3g} "
            f"(σ = {plan.noise_multiplier:.3f}, B = {plan.settings.batch_size}, {plan.steps} steps); "
            f"{_minutes(minutes[name], speed)}"
        )
    lines.append(route_plans.short_verdict(plans, runs, config.accountant))
    lines.append(
        "minutes: " + (
            "the reference machine's (2 CPU cores; SYNTHQ_MACHINE_PROBE=0 leaves out this machine's probe)"
            if speed is None else
            f"this machine takes {speed.factor:.2g}× the reference machine's time (2 CPU cores; "
            f"{speed.basis}), at 128 document tokens, "
            + ("the split's rows" if capped else "K rows per user")
        )
        + ("" if config.details else f"; --details: {DETAILS}")
    )  # fmt: skip
    for line in lines:
        result(line, markup=False)
    if config.details:
        _details(config, read, chosen, plans, minutes, runs)


def _minutes(minutes: float, speed) -> str:
    from synthq.models.stage_costs import duration

    if speed is None:
        return f"≤ {duration(60 * minutes)} on the reference machine"
    here, there = duration(60 * minutes * speed.factor), duration(60 * minutes)
    return f"≤ {here} on this machine ({there} on the reference)"


def _details(config, read: str, chosen: dict, plans: dict, minutes: dict, runs: list) -> None:
    """``--details``: what was read, how an auto batch was chosen, each route's plan in full and
    the measured runs behind the verdict (:func:`synthq.dp.route_plans.verdict`)."""
    from synthq.dp import route_plans
    from synthq.pipeline.progress import minutes as format_minutes

    result(f"synthq plan read {read}", markup=False)
    for _, line in chosen.values():
        if line:
            result(line, markup=False)
    noun = "users" if config.privacy_unit == "user" else "queries"
    for name, plan in plans.items():
        scaled = ", ".join(f"{factor}× the {noun}: {ratio:.3g}" for factor, ratio in plan.scaled.items())
        result(
            f"{name} [{STAGES[name]}]: B = {plan.settings.batch_size}, epochs = {plan.settings.epochs:g}"
            + (f" (at most {plan.settings.max_steps} steps)" if plan.settings.max_steps else "")
            + (f", groups of {plan.settings.group_size}" if plan.settings.group_size > 1 else "")
            + f": q = {plan.sample_rate:.4f}, {plan.steps} steps, "
            f"σ = {plan.noise_multiplier:.3f} ({plan.accountant}, δ = {plan.delta:.2g}), "
            f"noise/signal {plan.noise_to_signal:.3g} ({scaled}); "
            f"≤ {format_minutes(60 * minutes[name])} on the reference machine's 2 CPU cores",
            markup=False,
        )
    for line in route_plans.verdict(plans, runs, config.accountant):
        result(line, markup=False)


def _batch(
    value, option: str, budget: tuple, epochs: float, max_steps: int | None, group_size: int = 1
) -> tuple[int, str | None]:
    """A route's expected batch as given, or chosen for ``auto``
    (:func:`~synthq.dp.batch_choice.choose_batch_size`, with direct DP's groups of S clipped to
    Δ = 2C), and the line that says how."""
    if value != "auto":
        return value, None
    from synthq.dp.batch_choice import choose_batch_size
    from synthq.privacy.accounting import default_delta

    units, unit, epsilon, delta, accountant = budget
    delta = default_delta(units) if delta is None else delta
    factor = 2.0 if group_size > 1 else 1.0
    choice = choose_batch_size(
        units, epochs, max_steps, epsilon, delta, accountant, sensitivity_factor=factor, group_size=group_size
    )
    return choice.batch_size, f"{option} {choice.line(unit).removeprefix('--batch-size ')}"
