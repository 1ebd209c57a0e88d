"""``synthq plan``: before any training, what DP can learn from a log of this size.

For a private training split of ``n`` privacy units (queries, or users with at most K queries
each) and a target (ε, δ), each route's DP plan is what its stage would compute — the same
:class:`~synthq.dp.engine.PrivacyPlan`, accountant and δ default: the generator of the
synthetic route (``finetune-lm``) and the retriever of direct DP (``train-retriever --dp
group``). Beside σ, q and the steps, the plan prints the noise-to-signal ratio σ/B
(:func:`~synthq.dp.engine.noise_to_signal`), the quantity that decides whether a DP step carries
any signal, and the same ratio at 10× and 100× the units (same sampling rate and epochs), so a
team sees how far a bigger log would move it.

The verdict places each route's σ/B beside the runs the project has measured
(``reference_runs.json``: dataset, size, the stage settings from which σ/B is recomputed here,
and the measured share of the non-private gain, with the page that reports it). It reads only
counts: ``n`` from the split's qrels and the user id of each judged query (the count every DP
stage records and assumes public), or nothing at all with ``--units``.
"""

from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from synthq.dp.engine import PrivacyPlan, noise_to_signal, planned_steps
from synthq.privacy.accounting import default_delta, noise_multiplier_for

REFERENCE_RUNS = "reference_runs.json"
SCALES = (10,)


@dataclass(frozen=True)
class RouteSettings:
    """What a route's stage would be run with: expected batch B (units), epochs, step cap."""

    route: str
    batch_size: int
    epochs: float
    max_steps: int | None = None


@dataclass(frozen=True)
class RoutePlan:
    """One route's DP plan at ``num_units`` and what σ/B becomes with more units."""

    settings: RouteSettings
    num_units: int
    sample_rate: float
    steps: int
    noise_multiplier: float
    delta: float
    accountant: str
    scaled: dict[int, float]

    @property
    def noise_to_signal(self) -> float:
        return noise_to_signal(self.noise_multiplier, self.settings.batch_size)


def plan_route(settings: RouteSettings, num_units: int, epsilon: float, delta: float | None, accountant: str):
    """The route's plan as its stage would make it (batch capped at ``num_units``), and σ/B at
    10× and 100× the units with the same sampling rate, epochs and step cap."""
    batch = min(settings.batch_size, num_units)
    settings = RouteSettings(settings.route, batch, settings.epochs, settings.max_steps)
    steps = planned_steps(num_units, batch, settings.epochs, settings.max_steps)
    delta = default_delta(num_units) if delta is None else delta
    plan = PrivacyPlan.create(
        num_units=num_units, expected_batch_size=batch, steps=steps, epsilon=epsilon, delta=delta,
        accountant=accountant, mechanism=_unit_sensitivity(), unit="query",
    )  # fmt: skip
    scaled = {factor: _scaled_ratio(settings, num_units, factor, epsilon, accountant) for factor in SCALES}
    return RoutePlan(
        settings,
        num_units,
        plan.sample_rate,
        steps,
        plan.noise_multiplier,
        plan.delta,
        plan.accountant,
        scaled,
    )


@functools.cache
def _scaled_ratio(
    settings: RouteSettings, num_units: int, factor: int, epsilon: float, accountant: str
) -> float:
    """σ/B with ``factor`` × the units and the batch (same q, epochs and step cap), δ = 1/(2n)."""
    more, bigger = num_units * factor, settings.batch_size * factor
    steps = planned_steps(more, bigger, settings.epochs, settings.max_steps)
    sigma = noise_multiplier_for(epsilon, default_delta(more), bigger / more, steps, accountant)
    return noise_to_signal(sigma.noise_multiplier, bigger)


@functools.cache
def _reference_ratio(settings: RouteSettings, num_units: int, epsilon: float, accountant: str) -> float:
    """σ/B of a measured run, as its stage planned it (calibrated once per process)."""
    batch = min(settings.batch_size, num_units)
    steps = planned_steps(num_units, batch, settings.epochs, settings.max_steps)
    sigma = noise_multiplier_for(epsilon, default_delta(num_units), batch / num_units, steps, accountant)
    return noise_to_signal(sigma.noise_multiplier, batch)


def _unit_sensitivity():
    """σ and q do not depend on the clipping rule; a unit-sensitivity mechanism stands in for it."""
    from synthq.dp.lm import PerQueryClipping

    return PerQueryClipping(1.0)


@dataclass(frozen=True)
class ReferenceRun:
    """A run the project measured: its log size and route settings (σ/B recomputed from them) and
    the share of the non-private gain over the public start it recovered."""

    name: str
    dataset: str
    unit: str
    num_units: int
    route: str
    settings: RouteSettings
    epsilon: float
    share_of_gain: float
    beats: str
    source: str

    def noise_to_signal(self, accountant: str = "rdp") -> float:
        return _reference_ratio(self.settings, self.num_units, self.epsilon, accountant)


def reference_runs() -> list[ReferenceRun]:
    """The measured runs shipped with synthq (``synthq/dp/reference_runs.json``)."""
    rows = json.loads(resources.files("synthq.dp").joinpath(REFERENCE_RUNS).read_text(encoding="utf-8"))
    return [
        ReferenceRun(
            name=row["name"],
            dataset=row["dataset"],
            unit=row["unit"],
            num_units=row["num_units"],
            route=row["route"],
            settings=RouteSettings(row["route"], **row["settings"]),
            epsilon=row["epsilon"],
            share_of_gain=row["share_of_gain"],
            beats=row["beats"],
            source=row["source"],
        )  # fmt: skip
        for row in rows["runs"]
    ]


def count_units(data: str, split: str, unit: str) -> tuple[int, str]:
    """``(n, what was read)``: the split's privacy units counted from its qrels (query ids) and,
    at the user unit, the user id of each judged query — no query or document text is used."""
    import numpy as np

    from synthq.data.beir_io import read_qrels, read_queries
    from synthq.data.sources import resolve_source
    from synthq.data.users import query_users

    root = resolve_source(data)
    qrels = read_qrels(Path(root) / "qrels" / f"{split}.tsv")
    query_ids = list(qrels.keys())
    if unit == "query":
        return len(query_ids), f"the query ids of {root}/qrels/{split}.tsv"
    queries = read_queries(Path(root) / "queries.jsonl")
    rows = np.array([queries.row(q) for q in query_ids], dtype=np.int64)
    users = query_users(root, queries, rows)
    return len(set(users)), f"the query ids of {root}/qrels/{split}.tsv and the user id of each"


GAINED = 0.10  # a measured run "gained" when it recovered at least this share of the gain


def verdict(plans: dict[str, RoutePlan], runs: list[ReferenceRun]) -> list[str]:
    """Each route's σ/B beside the measured runs of that route (nearest σ/B first), then what
    they say: no gain to expect when every route is noisier than twice the noisiest measured run
    that still recovered a tenth of the non-private gain."""
    lines = []
    for route, plan in plans.items():
        same = sorted(
            (run for run in runs if run.route == route),
            key=lambda run: abs(math.log(run.noise_to_signal() / plan.noise_to_signal)),
        )
        lines.append(f"{route}: your σ/B = {plan.noise_to_signal:.3g}; measured runs of this route:")
        lines += [
            f"  {run.name} ({run.num_units:,} {run.unit}s, ε = {run.epsilon:g}, "
            f"σ/B = {run.noise_to_signal():.3g}): "
            f"{100 * run.share_of_gain:.0f} % of the non-private gain; beats {run.beats} ({run.source})"
            for run in same
        ] or ["  none yet"]
    gained = [run for run in runs if run.share_of_gain >= GAINED]
    least_noisy = min(plan.noise_to_signal for plan in plans.values())
    if not gained:
        lines.append("no measured run recovered a tenth of the non-private gain yet: no verdict")
    else:
        noisiest = max(gained, key=lambda run: run.noise_to_signal())
        if least_noisy > 2 * noisiest.noise_to_signal():
            lines.append(
                f"verdict: expect no gain over the public start. Every route's σ/B is above twice that of "
                f"the noisiest measured run that still gained ({noisiest.name}, "
                f"{noisiest.noise_to_signal():.3g})."
            )
        else:
            best = min(plans.values(), key=lambda plan: plan.noise_to_signal)
            lines.append(
                f"verdict: DP can carry signal here: the {best.settings.route} route's σ/B "
                f"({best.noise_to_signal:.3g}) is within twice that of a measured run that gained "
                f"({noisiest.name}, {noisiest.noise_to_signal():.3g}). Compare both routes against the "
                "untrained public model on your own split before you release either."
            )
    return lines


def count_documents(data: str) -> tuple[int, str]:
    """``(documents, what was read)``: the size of the log's public corpus."""
    from synthq.data.beir_io import read_corpus
    from synthq.data.sources import resolve_source

    path = Path(resolve_source(data)) / "corpus.jsonl"
    return len(read_corpus(path)), f"the size of {path}"


def describe(plan: RoutePlan, minutes: float) -> dict:
    """A route's plan as JSON."""
    return {
        "batch_size": plan.settings.batch_size, "epochs": plan.settings.epochs, "steps": plan.steps,
        "sample_rate": plan.sample_rate, "noise_multiplier": plan.noise_multiplier, "delta": plan.delta,
        "accountant": plan.accountant, "noise_to_signal": plan.noise_to_signal,
        "noise_to_signal_with_more_units": {str(k): v for k, v in plan.scaled.items()},
        "minutes_on_2_cpu_cores": minutes,
    }  # fmt: skip


def costs() -> dict[str, float]:
    """Seconds of each kind of work on the reference machine (2 CPU cores; see the JSON)."""
    table = json.loads(resources.files("synthq.dp").joinpath(REFERENCE_RUNS).read_text(encoding="utf-8"))
    return {name: entry["value"] for name, entry in table["costs"].items() if name != "about"}


def route_minutes(plan: RoutePlan, rows_per_unit: int, documents: int, queries_per_document: int,
                  retriever_epochs: float) -> float:  # fmt: skip
    """Expected minutes of a route on the reference machine, an upper bound at ``rows_per_unit``
    rows per unit (K at the user unit). Synthetic: the DP generator's steps, generating
    ``queries_per_document`` for each public document, one retriever trained on them. Direct DP:
    the retriever's DP steps."""
    seconds = costs()
    rows = plan.steps * plan.settings.batch_size * rows_per_unit
    if plan.settings.route == "direct-dp":
        return rows * seconds["retriever_dp_group_seconds_per_pair"] / 60
    synthetic = documents * queries_per_document
    total = (
        rows * seconds["generator_dp_seconds_per_row"]
        + synthetic / seconds["generated_queries_per_second"]
        + synthetic * retriever_epochs * seconds["retriever_seconds_per_pair"]
    )
    return total / 60
