"""``synthq plan``: the DP plan of both routes for a log of this size, before any training
(:mod:`synthq.dp.route_plans`). Reads counts only; imports torch for the accountant."""

from __future__ import annotations

import json
import math

import typer

from synthq.config.fields import DEFAULT_EPSILON, DEFAULT_MAX_QUERIES_PER_USER
from synthq.pipeline.progress import minutes as format_minutes
from synthq.runtime.console import result


def plan_command(
    data: str | None = typer.Option(
        None,
        "--data",
        help="The private log (BEIR directory or pylibs, pydocs, embedded): its units are counted.",
    ),
    units: int | None = typer.Option(
        None, "--units", min=1, help="The number of privacy units, instead of counting them (reads nothing)."
    ),
    split: str = typer.Option("train", "--split", help="The private training split."),
    privacy_unit: str = typer.Option(
        "user", "--privacy-unit", help="user (each person, ≤ K queries) or query."
    ),
    max_queries_per_user: int = typer.Option(
        DEFAULT_MAX_QUERIES_PER_USER,
        "--max-queries-per-user",
        min=1,
        help="K: rows a user contributes at most.",
    ),
    epsilon: float = typer.Option(DEFAULT_EPSILON, "--epsilon", help="Target ε of each route."),
    delta: float | None = typer.Option(None, "--delta", help="δ; default 1/(2n), as the stages."),
    accountant: str = typer.Option("rdp", "--accountant", help="rdp or prv."),
    generator_batch_size: str = typer.Option(
        "64",
        "--generator-batch-size",
        metavar="INT/auto",
        help="finetune-lm --batch-size (the README recipe's 64; auto: as finetune-lm --batch-size auto).",
    ),
    generator_epochs: float = typer.Option(
        1.0, "--generator-epochs", help="finetune-lm --epochs (the README recipe's 1)."
    ),
    generator_max_steps: int | None = typer.Option(
        None, "--generator-max-steps", help="finetune-lm --max-steps."
    ),
    retriever_batch_size: str = typer.Option(
        "64",
        "--retriever-batch-size",
        metavar="INT/auto",
        help="train-retriever --dp group --batch-size (the recipe's 64; auto: the least noise per "
        "clipped group among batches that leave 16 steps).",
    ),
    retriever_group_size: int = typer.Option(
        8, "--retriever-group-size", min=1, help="train-retriever --group-size (its default 8)."
    ),
    retriever_epochs: float = typer.Option(
        1.0, "--retriever-epochs", help="train-retriever --epochs, both routes (the recipe's 1)."
    ),
    documents: int | None = typer.Option(
        None, "--documents", min=1, help="Public documents to write queries for (default: the log's corpus)."
    ),
    num_queries: int = typer.Option(3, "--num-queries", min=1, help="generate --num-queries."),
    as_json: bool = typer.Option(False, "--json", help="Print the plans as JSON."),
) -> None:
    """Before training: each route's DP plan, its noise-to-signal, minutes, and what measured runs say.

    Reads only counts: the number of privacy units in the training split, counted as the DP
    stages count them (the count every DP stage records and assumes public), and the size of the
    public corpus; with --units and --documents, nothing at all. Its defaults are the README
    recipe's settings, not the stages' own defaults: every setting used is printed.
    """
    from synthq.dp import route_plans

    if privacy_unit not in ("user", "query"):
        raise typer.BadParameter(f"--privacy-unit must be user or query, not {privacy_unit!r}")
    if accountant not in ("rdp", "prv"):
        raise typer.BadParameter(f"--accountant must be rdp or prv, not {accountant!r}")
    if data is None and (units is None or documents is None):
        raise typer.BadParameter("give --data, or both --units and --documents")
    if not math.isfinite(epsilon) or epsilon <= 0:
        raise typer.BadParameter(f"synthq plan needs a finite ε > 0, not {epsilon}")
    read = "nothing (--units, --documents)"
    if units is None or documents is None:
        read_parts = []
        if units is None:
            units, what = route_plans.count_units(data, split, privacy_unit, max_queries_per_user)
            read_parts.append(what)
        if documents is None:
            documents, what = route_plans.count_documents(data)
            read_parts.append(what)
        read = "; ".join(read_parts) + " (no query or document text)"
    if not as_json:
        result(f"synthq plan reads {read}", markup=False)
    rows = max_queries_per_user if privacy_unit == "user" else 1
    budget = (units, privacy_unit, epsilon, delta, accountant)
    chosen = {
        "synthetic": _batch(generator_batch_size, "--generator-batch-size", budget, generator_epochs,
                            generator_max_steps),
        "direct-dp": _batch(retriever_batch_size, "--retriever-batch-size", budget, retriever_epochs, None,
                            group_size=retriever_group_size),
    }  # fmt: skip
    settings = {
        "synthetic": route_plans.route_settings(
            "synthetic", chosen["synthetic"][0], generator_epochs, generator_max_steps
        ),
        "direct-dp": route_plans.route_settings(
            "direct-dp", chosen["direct-dp"][0], retriever_epochs, group_size=retriever_group_size
        ),
    }
    if not as_json:
        for _, line in chosen.values():
            if line:
                result(line, markup=False)
    plans = {
        name: route_plans.plan_route(s, units, epsilon, delta, accountant, privacy_unit)
        for name, s in settings.items()
    }  # a batch larger than the units is refused here, as the stages refuse it
    minutes = {
        name: route_plans.route_minutes(plan, rows, documents, num_queries, retriever_epochs)
        for name, plan in plans.items()
    }
    runs = route_plans.reference_runs()
    if as_json:
        payload = {
            "reads": read, "units": units, "unit": privacy_unit, "epsilon": epsilon, "documents": documents,
            "routes": {name: route_plans.describe(plan, minutes[name]) for name, plan in plans.items()},
            "verdict": route_plans.verdict(plans, runs, accountant),
        }  # fmt: skip
        typer.echo(json.dumps(payload, indent=2, ensure_ascii=False))
        return
    noun = "users" if privacy_unit == "user" else "queries"
    result(
        f"{units:,} {noun} (unit: {privacy_unit}), target ε = {epsilon:g}, {documents:,} public documents",
        markup=False,
    )
    for name, plan in plans.items():
        stage = (
            "finetune-lm (then generate, train-retriever)"
            if name == "synthetic"
            else "train-retriever --dp group"
        )
        scaled = ", ".join(f"{factor}× the {noun}: {ratio:.3g}" for factor, ratio in plan.scaled.items())
        result(
            f"{name} [{stage}]: B = {plan.settings.batch_size}, epochs = {plan.settings.epochs:g}"
            + (f" (at most {plan.settings.max_steps} steps)" if plan.settings.max_steps else "")
            + (f", groups of {plan.settings.group_size}" if plan.settings.group_size > 1 else "")
            + f": q = {plan.sample_rate:.4f}, {plan.steps} steps, "
            f"σ = {plan.noise_multiplier:.3f} ({plan.accountant}, δ = {plan.delta:.2g}), "
            f"noise/signal {plan.noise_to_signal:.3g} ({scaled}); "
            f"≤ {format_minutes(60 * minutes[name])} on 2 CPU cores at 128 document tokens",
            markup=False,
        )
    for line in route_plans.verdict(plans, runs, accountant):
        result(line, markup=False)


def _batch(
    value: str, option: str, budget: tuple, epochs: float, max_steps: int | None, group_size: int = 1
) -> tuple[int, str | None]:
    """A route's expected batch as given, or chosen for ``auto``
    (:func:`~synthq.dp.batch_choice.choose_batch_size`, with direct DP's groups of S clipped to
    Δ = 2C), and the line that says how."""
    from synthq.config.fields import batch_size_or_auto
    from synthq.dp.batch_choice import choose_batch_size
    from synthq.privacy.accounting import default_delta

    try:
        size = batch_size_or_auto(value)
    except ValueError as error:
        raise typer.BadParameter(f"{option} {error}") from None
    if size != "auto":
        return size, None
    units, unit, epsilon, delta, accountant = budget
    delta = default_delta(units) if delta is None else delta
    factor = 2.0 if group_size > 1 else 1.0
    choice = choose_batch_size(
        units, epochs, max_steps, epsilon, delta, accountant, sensitivity_factor=factor, group_size=group_size
    )
    return choice.batch_size, f"{option} {choice.line(unit).removeprefix('--batch-size ')}"
