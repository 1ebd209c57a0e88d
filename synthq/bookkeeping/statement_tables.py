"""The tables of the privacy statement (:mod:`synthq.bookkeeping.statement`): each release as recorded,
each release recomputed at other δ, the PRV releases' RDP comparison, and a canary audit's lower
bounds; and the cell formats they share with the statement's prose.

A cell a mechanism has no use for is "—" (not applicable: report-noisy-max has no q, steps, σ or
clip norm; Private Evolution's votes have L2 norm 1, no clip norm); "not recorded" is kept for a
value the mechanism has but its record does not store.
"""

from __future__ import annotations

import json
import math

from synthq.artifacts.manifest import Artifact
from synthq.bookkeeping.reaccounting import (
    NOT_RECORDED,
    REFERENCE_DELTA,
    DatasetStatement,
    ReleaseRow,
    cached_epsilon_for,
)
from synthq.privacy.accounting import ACCOUNTANTS
from synthq.privacy.events import NoisyMaxSelections, SampledGaussian, gaussian, release_event
from synthq.privacy.guarantee import Guarantee, fixed_epsilon

NOT_APPLICABLE = "—"
# The mechanism parameters shown per release, and the mechanisms that have no use for each.
PARAMETERS = ("sample_rate", "steps", "noise_multiplier", "clip_norm")
WITHOUT = {
    "report-noisy-max": set(PARAMETERS),
    "private-evolution": {"clip_norm"},  # each unit's vote is scaled to L2 norm 1
}


def eps(value: float) -> str:
    """ε in the statement: three decimals, two significant digits for a positive ε that three
    decimals would print as 0.000 (never a public artifact's figure), whole numbers from 1000."""
    if math.isinf(value):
        return "∞"
    return fixed_epsilon(value, 3) if value < 1000 else f"{value:.0f}"


def claim(guarantee: Guarantee | None) -> str:
    """``ε = 8.003 at δ = 1.00e-05`` (``ε = ∞``)."""
    if guarantee is None:
        return "not available"
    if not guarantee.is_private:
        return "ε = ∞"
    return f"ε = {eps(guarantee.epsilon)} at δ = {guarantee.delta:.2e}"


def short(value) -> str:
    return f"{float(value):.4g}"


def cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def recorded(details: dict, key: str, shown=None) -> str:
    value = details.get(key)
    if value is None:
        return NOT_RECORDED
    return shown(value) if shown else str(value)


def sampling(guarantee: Guarantee) -> str:
    if not guarantee.is_private:
        return "none (read without DP)"
    event = release_event(guarantee)
    if guarantee.mechanism == "report-noisy-max":
        selections = event.selections if isinstance(event, NoisyMaxSelections) else NOT_RECORDED
        return f"none: report-noisy-max, {selections} selection(s)"
    if not isinstance(event, SampledGaussian):
        return NOT_RECORDED
    if not event.subsampled:
        return "none: every unit in every step (q = 1)"
    cap = event.max_batch_size
    capped = f"; batch cap {cap} (an over-full batch becomes empty)" if cap else ""
    return f"Poisson (the accountant's model; the sampler is not recorded){capped}"


def parameter_cells(guarantee: Guarantee) -> list[str]:
    """q, steps, σ, clip norm: as recorded, "—" where the mechanism has none."""
    details, skip = guarantee.details or {}, WITHOUT.get(guarantee.mechanism, set())
    shown = {"sample_rate": short, "noise_multiplier": short}
    return [NOT_APPLICABLE if key in skip else recorded(details, key, shown.get(key)) for key in PARAMETERS]


def sensitivity_cell(details: dict) -> str:
    """The recorded sensitivity and, for a Gaussian, the noise std it was calibrated to."""
    sensitivity, std = details.get("sensitivity"), details.get("noise_std")
    if sensitivity is None:
        return NOT_RECORDED
    return f"{short(sensitivity)} ({short(std)})" if std is not None else short(sensitivity)


def release_claim(row: ReleaseRow) -> str:
    g = row.guarantee
    if not g.is_private:
        return "ε = ∞"
    if row.recomputed:
        return f"ε = {eps(row.epsilon)} at δ = {g.delta:.2e}"
    return f"{claim(g)} (recorded; no parameters to recompute it from)"


def release_table(statement: DatasetStatement) -> list[str]:
    lines = [
        "| # | stage | artifact | mechanism | accountant | sampling | q | steps | σ | clip norm "
        "| sensitivity (noise std) | ε at its δ |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in statement.rows:
        g = row.guarantee
        if g.is_private:
            mechanism, parameters = g.mechanism, [*parameter_cells(g), sensitivity_cell(g.details or {})]
        else:
            mechanism, parameters = g.mechanism + " — read WITHOUT DP", [NOT_APPLICABLE] * 5
        cells = [
            row.label, row.release["stage"], f"`{row.release['path']}`", mechanism,
            g.accountant or NOT_APPLICABLE, sampling(g), *parameters, release_claim(row),
        ]  # fmt: skip
        lines.append("| " + " | ".join(cell(c) for c in cells) + " |")
    return lines


def recomputed_table(statement: DatasetStatement) -> list[str]:
    lines = [
        f"| # | ε at δ = {REFERENCE_DELTA:g} | n (units the accountant assumed) | ε at δ = 1/n² "
        "| Gaussian-DP μ |",
        "|---|---|---|---|---|",
    ]
    for row in statement.rows:
        needs_n = row.guarantee.is_private and row.guarantee.accountant in ACCOUNTANTS
        n = str(row.n) if row.n else (NOT_RECORDED if needs_n else NOT_APPLICABLE)
        at_n = claim(row.at_n_squared) if (row.n or not needs_n) else f"skipped (n {NOT_RECORDED})"
        mu = str(row.mu) if row.mu is not None else "not available (not a Gaussian mechanism)"
        lines.append(f"| {row.label} | {claim(row.at_reference)} | {n} | {at_n} | {mu} |")
    return lines


def prv_comparisons(statement: DatasetStatement) -> list[str]:
    lines = []
    for row in statement.rows:
        g, event = row.guarantee, gaussian(row.guarantee)
        if g.accountant == "prv" and event is not None:
            sigma, delta, rate, steps = event.noise_multiplier, event.delta, event.sample_rate, event.steps
            rdp = cached_epsilon_for(sigma, delta, rate, steps, "rdp").epsilon
            lines.append(f"- {row.label} (PRV): RDP gives ε = {eps(rdp)} at the same δ = {delta:.2e}.")
    return lines


AUDIT_INTRO = [
    "## Empirical audit (lower bounds)",
    "",
    "A canary audit of the **same recipe** (generators fine-tuned by the real `finetune-lm` at each "
    "audited ε), **not of this very generator**: an empirical lower bound below the proven ε is "
    "consistent with the guarantee; it does not prove it.",
    "",
]


def num(value) -> str:
    if value is None:
        return NOT_APPLICABLE
    value = float(value)
    return "∞" if math.isinf(value) else f"{value:.3f}"


def audit_heading(audit: Artifact) -> str:
    """What the audit audited: its data, model, unit, method, confidence and δ."""
    config, delta = audit.config, NOT_RECORDED
    report = audit.path / "audit.json"
    if report.is_file() and "audit.json" in audit.manifest.get("files", {}):
        delta = f"{float(json.loads(report.read_text(encoding='utf-8'))['delta']):.2e}"
    return (
        f"`{audit.path}`: data {config.get('data')}, model {config.get('model')}, unit "
        f"{config.get('privacy_unit', 'query')}, method {config.get('method')}, confidence "
        f"{config.get('confidence')}, δ = {delta}."
    )


def exceeds(bound, proven: str) -> bool:
    try:
        proven_value = math.inf if proven in ("∞", "inf") else float(proven)
    except ValueError:
        return False
    return bound is not None and float(bound) > proven_value


def audit_row(key: str, values: dict) -> str:
    """One audited ε: the empirical lower bounds, flagged when one exceeds the proven ε."""
    what, proven = key.rsplit("/eps=", 1) if "/eps=" in key else (key, "?")
    if key.startswith("exposure/"):
        what = "exposure " + key.split("/rep=")[-1] + " repetitions"
        proven = key.split("eps=")[1].split("/")[0]
    bound = values.get("epsilon_lower_bound", values.get("pair_epsilon_lower_bound"))
    flag = " **exceeds the proven ε: do not sign**" if exceeds(bound, proven) else ""
    shown = [
        what.removeprefix("one-run/"), proven, num(bound) + flag,
        num(values.get("gdp_epsilon_lower_bound")), num(values.get("auroc")),
    ]  # fmt: skip
    return "| " + " | ".join(cell(c) for c in shown) + " |"


def audit_lines(audits: list[Artifact]) -> list[str]:
    if not audits:
        return []
    lines = list(AUDIT_INTRO)
    for audit in audits:
        lines += [
            audit_heading(audit),
            "",
            "| audited | proven ε | empirical ε lower bound | GDP ε lower bound | AUROC |",
            "|---|---|---|---|---|",
        ]
        for key, values in audit.metrics.items():
            if key.startswith(("one-run/", "exposure/")) and isinstance(values, dict):
                lines.append(audit_row(key, values))
        lines.append("")
    return lines
