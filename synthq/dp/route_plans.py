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
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path

from synthq.models import stage_costs
from synthq.privacy.accounting import default_delta, noise_multiplier_for, validate_budget
from synthq.runtime.errors import PrivacyError

REFERENCE_RUNS = "reference_runs.json"
SCALES = (10,)


def planned_steps(num_units: int, batch_size: int, epochs: float, max_steps: int | None) -> int:
    """The stages' logical steps (:func:`synthq.dp.engine.planned_steps`, whose module loads
    torch), written again so that ``synthq plan`` loads none; tests hold the two equal."""
    steps = math.ceil(epochs * num_units / batch_size)
    if max_steps is not None:
        steps = min(steps, max_steps)
    return max(steps, 1)


@dataclass(frozen=True)
class RouteSettings:
    """What a route's stage would be run with: expected batch B (units), epochs, step cap, and
    how its clipped sum is formed: ``group_size`` S units share one clipped term (1: every unit
    is clipped alone) and the sensitivity is ``sensitivity_factor`` × C."""

    route: str
    batch_size: int
    epochs: float
    max_steps: int | None = None
    group_size: int = 1
    sensitivity_factor: float = 1.0


GENERATOR = {"group_size": 1, "sensitivity_factor": 1.0}  # finetune-lm: each unit clipped to C, Δ = C
DIRECT_DP_GROUP = {"sensitivity_factor": 2.0}  # train-retriever --dp group: groups of S clipped to C, Δ = 2C


def route_noise_to_signal(noise_multiplier: float, settings: RouteSettings) -> float:
    """The noise's standard deviation per coordinate over the largest signal the clipped sum can
    carry: σΔ / (⌈B/S⌉ C). For finetune-lm (S = 1, Δ = C) that is σ/B
    (:func:`~synthq.dp.engine.noise_to_signal`); for direct DP group clipping (Δ = 2C, one clipped
    term per group of S) it is 2σ/⌈B/S⌉ — 16× σ/B at S = 8."""
    terms = math.ceil(settings.batch_size / settings.group_size)
    return noise_multiplier * settings.sensitivity_factor / terms


@dataclass(frozen=True)
class RoutePlan:
    """One route's DP plan at ``num_units`` and what its noise-to-signal becomes with more units."""

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
        return route_noise_to_signal(self.noise_multiplier, self.settings)


def plan_route(
    settings: RouteSettings,
    num_units: int,
    epsilon: float,
    delta: float | None,
    accountant: str,
    unit: str = "query",
):
    """The route's plan as its stage would make it (:meth:`synthq.dp.engine.PrivacyPlan.create`:
    the same refusals, δ and calibration; σ and q do not depend on the clipping rule; tests hold
    the two equal), and its noise-to-signal at 10× the units with the same sampling rate, epochs
    and step cap."""
    if settings.batch_size > num_units:
        raise PrivacyError(
            f"the batch size {settings.batch_size} is larger than the {num_units} privacy units "
            f"({'queries' if unit == 'query' else unit + 's'})"
        )
    steps = planned_steps(num_units, settings.batch_size, settings.epochs, settings.max_steps)
    delta = default_delta(num_units) if delta is None else delta
    validate_budget(epsilon, delta, num_units)
    sample_rate = settings.batch_size / num_units
    calibration = _calibrated(epsilon, delta, sample_rate, steps, accountant)
    scaled = {factor: _scaled_ratio(settings, num_units, factor, epsilon, accountant) for factor in SCALES}
    return RoutePlan(
        settings, num_units, sample_rate, steps, calibration.noise_multiplier, delta, calibration.accountant,
        scaled,
    )  # fmt: skip


@functools.cache
def _calibrated(epsilon: float, delta: float, sample_rate: float, steps: int, accountant: str):
    """:func:`~synthq.privacy.accounting.noise_multiplier_for`, once per budget in a process (the
    two routes of the recipe share one)."""
    return noise_multiplier_for(epsilon, delta, sample_rate, steps, accountant)


@functools.cache
def _scaled_ratio(
    settings: RouteSettings, num_units: int, factor: int, epsilon: float, accountant: str
) -> float:
    """Noise-to-signal with ``factor`` × the units and the batch (same q, epochs and step cap),
    at the default δ = 1/(2n) of that larger log."""
    more, bigger = num_units * factor, settings.batch_size * factor
    steps = planned_steps(more, bigger, settings.epochs, settings.max_steps)
    sigma = _calibrated(epsilon, default_delta(more), bigger / more, steps, accountant)
    return route_noise_to_signal(sigma.noise_multiplier, replace(settings, batch_size=bigger))


@functools.cache
def _reference_ratio(settings: RouteSettings, num_units: int, epsilon: float, accountant: str) -> float:
    """Noise-to-signal of a measured run, as its stage planned it (calibrated once per process)."""
    steps = planned_steps(num_units, settings.batch_size, settings.epochs, settings.max_steps)
    sigma = _calibrated(epsilon, default_delta(num_units), settings.batch_size / num_units, steps, accountant)
    return route_noise_to_signal(sigma.noise_multiplier, settings)


def route_settings(
    route: str, batch_size: int, epochs: float, max_steps: int | None = None, group_size: int = 8
):
    """A route's settings: the synthetic route's generator clips each unit (``group_size`` is for
    direct DP only), direct DP clips groups of ``group_size``."""
    if route == "synthetic":
        return RouteSettings(route, batch_size, epochs, max_steps, **GENERATOR)
    return RouteSettings(route, batch_size, epochs, max_steps, group_size=group_size, **DIRECT_DP_GROUP)


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
    control_share: float | None = None  # what its ε = 0 control (the public warm start alone) kept

    def noise_to_signal(self, accountant: str = "rdp") -> float:
        return _reference_ratio(self.settings, self.num_units, self.epsilon, accountant)

    @property
    def steps(self) -> int:
        return planned_steps(
            self.num_units, self.settings.batch_size, self.settings.epochs, self.settings.max_steps
        )


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
            settings=route_settings(row["route"], **row["settings"]),
            epsilon=row["epsilon"],
            share_of_gain=row["share_of_gain"],
            beats=row["beats"],
            source=row["source"],
            control_share=row.get("control_share"),
        )  # fmt: skip
        for row in rows["runs"]
    ]


def count_units(data: str, split: str, unit: str, max_queries_per_user: int) -> tuple[int, str]:
    """``(n, what was read)``: the split's privacy units exactly as the DP stages count them
    (:func:`~synthq.dp.privacy_units.training_units` over the pairs of relevance ≥ 1: one unit per
    query id, or per user id, whatever K keeps, since every user keeps at least one query), from
    the qrels and, at the user unit, the user id of each judged query; no text is decoded, and no
    torch is loaded (``dp.privacy_units`` loads it; tests hold the counts equal)."""
    units, _, what = count_training(data, split, unit)
    return units, what


def count_training(data: str, split: str, unit: str) -> tuple[int, int, str]:
    """``(n, rows, what was read)``: :func:`count_units`'s n and the split's training rows (its
    relevant judgements), which bound the rows a DP step reads whatever K is."""
    from synthq.data.pairs import training_pairs
    from synthq.data.sources import load_source

    dataset = load_source(data, splits=[split])
    pairs = training_pairs(dataset, split)
    where = f"{dataset.root}/qrels/{split}.tsv"
    if unit == "query":
        count = len({pairs.queries.id_at(int(row)) for row in pairs.query_rows})
        return count, len(pairs.query_rows), f"the relevant judgements of {where}"
    from synthq.data.users import query_users

    count = len(set(query_users(dataset.root, pairs.queries, pairs.query_rows)))
    rows = len(pairs.query_rows)
    return count, rows, f"the relevant judgements of {where} and the user id of each judged query"


GAINED = 0.10  # a measured run "gained" when it recovered at least this share of the gain


def verdict(plans: dict[str, RoutePlan], runs: list[ReferenceRun], accountant: str = "rdp") -> list[str]:
    """Each route's noise-to-signal beside the measured runs of that route (nearest first), then
    what they say. A route can be hoped for when its noise-to-signal is at most twice that of the
    noisiest measured run that still recovered a tenth of the non-private gain, with at least half
    that run's steps (fewer steps lower σ but train less); when no route can, expect no gain."""

    def ratio(run: ReferenceRun) -> float:
        return run.noise_to_signal(accountant)

    lines = []
    for route, plan in plans.items():
        same = sorted(
            (run for run in runs if run.route == route),
            key=lambda run: abs(math.log(ratio(run) / plan.noise_to_signal)),
        )
        lines.append(
            f"{route}: noise/signal {plan.noise_to_signal:.3g} in {plan.steps} steps; measured runs:"
        )
        lines += [
            f"  {run.name} ({run.num_units:,} {run.unit}s, ε = {run.epsilon:g}, noise/signal "
            f"{ratio(run):.3g} in {run.steps} steps): {100 * run.share_of_gain:.0f} % of the non-private "
            f"gain; beats {run.beats} ({run.source})"
            for run in same
        ] or ["  none yet"]
    judged = _judgement(plans, runs, accountant)
    if judged is None:
        lines.append(f"{NO_VERDICT}: no verdict")
        return lines
    noisiest, hopeful = judged
    reference = f"{noisiest.name}: noise/signal {ratio(noisiest):.3g} in {noisiest.steps} steps"
    if not hopeful:
        lines.append(
            "verdict: expect no gain over the public start. Every route is noisier than twice the "
            f"noisiest measured run that still gained, or takes fewer than half its steps ({reference})."
        )
    else:
        lines.append(
            f"verdict: DP can carry signal on the {' and '.join(hopeful)} route: within twice the noise "
            f"of a measured run that gained, with at least half its steps ({reference}). Compare against "
            "the untrained public model on your own split before you release either."
        )
        lines += _control_line([run for run in runs if run.route in hopeful])
    return lines


NO_VERDICT = "no measured run recovered a tenth of the non-private gain yet"


def _judgement(
    plans: dict[str, RoutePlan], runs: list[ReferenceRun], accountant: str
) -> tuple[ReferenceRun, list[str]] | None:
    """The noisiest measured run that still gained, and the routes within twice its
    noise-to-signal with at least half its steps; None when no measured run gained."""
    gained = [run for run in runs if run.share_of_gain >= GAINED]
    if not gained:
        return None
    noisiest = max(gained, key=lambda run: run.noise_to_signal(accountant))
    limit = 2 * noisiest.noise_to_signal(accountant)
    hopeful = [
        name
        for name, plan in plans.items()
        if plan.noise_to_signal <= limit and plan.steps >= noisiest.steps / 2
    ]
    return noisiest, hopeful


def short_verdict(plans: dict[str, RoutePlan], runs: list[ReferenceRun], accountant: str = "rdp") -> str:
    """The verdict of :func:`verdict` in one line (the measured runs behind it: ``--details``)."""
    judged = _judgement(plans, runs, accountant)
    if judged is None:
        return f"verdict: none yet ({NO_VERDICT})"
    noisiest, hopeful = judged
    reference = (
        f"{noisiest.name}, noise/signal {noisiest.noise_to_signal(accountant):.3g} in {noisiest.steps} steps"
    )
    if not hopeful:
        return (
            "verdict: expect no gain over the public start: every route is noisier than twice the noisiest "
            f"measured run that still gained, or takes under half its steps ({reference})"
        )
    line = (
        f"verdict: DP can carry signal on the {' and '.join(hopeful)} route (within twice the noise of a "
        f"measured run that gained, with at least half its steps: {reference})"
    )
    controlled = [run for run in runs if run.route in hopeful and run.control_share is not None]
    matched = [r for r in controlled if r.share_of_gain < r.control_share + CLEARLY_ABOVE_CONTROL]
    if controlled and len(matched) == len(controlled):
        line += (
            f"; but in all {len(controlled)} measured runs with an ε = 0 control the public warm start alone "
            f"kept within {100 * CLEARLY_ABOVE_CONTROL:.0f} points: train it first and spend ε only if it "
            "beats it on your own public test split"
        )
    elif controlled:
        clearly = len(controlled) - len(matched)
        line += f"; {clearly} of {len(controlled)} runs kept clearly more than their ε = 0 control"
    return line


# a run counts as clearly above its ε = 0 control when it kept this much more of the gain
CLEARLY_ABOVE_CONTROL = 0.10


def _control_line(runs: list[ReferenceRun]) -> list[str]:
    """What the ε = 0 controls measured beside ``runs`` say: where the public warm start alone
    kept within :data:`CLEARLY_ABOVE_CONTROL` of the DP run's share, the private log added less
    than that to what the public pairs gave."""
    controlled = [run for run in runs if run.control_share is not None]
    if not controlled:
        return []
    matched = [run for run in controlled if run.share_of_gain < run.control_share + CLEARLY_ABOVE_CONTROL]
    pairs = ", ".join(
        f"{100 * run.share_of_gain:.0f} % against {100 * run.control_share:.0f} % at {run.num_units:,} "
        f"{run.unit}s" for run in matched
    )  # fmt: skip
    if len(matched) < len(controlled):
        return [f"the ε = 0 control: {len(controlled) - len(matched)} of {len(controlled)} measured runs "
                f"with one kept clearly more than it; {len(matched)} did not ({pairs})."]  # fmt: skip
    points = f"{100 * CLEARLY_ABOVE_CONTROL:.0f} points"
    return [
        f"but in all {len(controlled)} measured runs with an ε = 0 control (the public warm start "
        f"alone, no private data) the control kept within {points} of the DP run ({pairs}): at every "
        f"size measured the private log added under {points} of the gain to what the public pairs "
        "gave (point estimates). Train the warm start first (finetune-lm "
        "--warm-start SOURCE:SPLIT --max-steps 0, ε = 0) and spend ε only if it beats that control "
        "on your own public test split."
    ]


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
        "group_size": plan.settings.group_size, "sensitivity_factor": plan.settings.sensitivity_factor,
        "sample_rate": plan.sample_rate, "noise_multiplier": plan.noise_multiplier, "delta": plan.delta,
        "accountant": plan.accountant, "noise_to_signal": plan.noise_to_signal,
        "noise_to_signal_with_more_units": {str(k): v for k, v in plan.scaled.items()},
        "minutes_on_2_cpu_cores": minutes,
    }  # fmt: skip


def route_minutes(plan: RoutePlan, rows_per_unit: int, documents: int, queries_per_document: int,
                  retriever_epochs: float) -> float:  # fmt: skip
    """Expected minutes of a route on the reference machine, an upper bound at ``rows_per_unit``
    rows per unit (K at the user unit, or the split's rows per unit when K × units is more).
    Synthetic: the DP generator's steps, generating ``queries_per_document`` for each public
    document, one retriever trained on them. Direct DP: the retriever's DP steps."""
    rows = plan.steps * plan.settings.batch_size * rows_per_unit
    tokens, encoder = stage_costs.REFERENCE_DOCUMENT_TOKENS, stage_costs.REFERENCE_ENCODER_PARAMETERS
    if plan.settings.route == "direct-dp":
        return stage_costs.retriever_training_seconds(rows, tokens, encoder, "group") / 60
    synthetic = documents * queries_per_document
    generator = stage_costs.REFERENCE_GENERATOR_PARAMETERS
    total = (
        stage_costs.generator_training_seconds(rows, tokens, generator)
        + stage_costs.generation_seconds(
            synthetic, stage_costs.REFERENCE_PROMPT_TOKENS, stage_costs.REFERENCE_NEW_TOKENS, generator
        )
        + stage_costs.retriever_training_seconds(synthetic * retriever_epochs, tokens, encoder, None)
    )
    return total / 60
