"""What a privacy statement says about each release, recomputed: ε at other δ, Gaussian-DP μ.

:mod:`synthq.bookkeeping.statement` renders these numbers; this module computes them from the sealed
release records, before anything is rendered:

* :func:`guarantee_at` — one release's ε recomputed by its own accountant
  (:func:`~synthq.privacy.accounting.epsilon_for`) at another δ (and, at the user unit, its
  per-query guarantee derived again at that δ);
* :func:`composed_at` — the releases composed exactly as the ledger composes them
  (:func:`~synthq.privacy.guarantee.compose_releases` over
  :func:`~synthq.privacy.unit_sets.sharing_groups`, or one group with ``--compose sum``), each
  recomputed at its δ;
* :func:`gaussian_mu` — the Gaussian-DP μ, stated only where it is exact: ``√T/σ`` for the
  Gaussian without subsampling (Private Evolution's votes, q = 1; σ is noise std / sensitivity).
  For a subsampled release (q < 1) no μ is stated: the CLT approximation is not a bound (it can
  understate the loss about 2× in ε, and overstate it at T = 1). :func:`composed_mu` composes
  ``√(Σ μ²)`` per unit only when every release has an exact μ;
* :func:`dataset_statement` — all of it for one private dataset of a ledger.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

from synthq.bookkeeping.releases import DatasetCost
from synthq.privacy.accounting import ACCOUNTANTS, epsilon_for, per_query, recomputed_epsilon
from synthq.privacy.events import gaussian
from synthq.privacy.guarantee import (
    Guarantee,
    compose_releases,
    release_guarantee,
    weakest_unit,
)

REFERENCE_DELTA = 1e-6
NOT_RECORDED = "not recorded"
# One answer per (σ, δ, q, T, accountant): the statement asks for a release at a δ once per table
# and once per composition (PRV takes about a second).
cached_epsilon_for = functools.lru_cache(maxsize=512)(epsilon_for)

# ---------------------------------------------------------------------------------------------
# Recomputation: one release at another δ, a composition at another δ, μ


def guarantee_at(guarantee: Guarantee, delta: float | None) -> Guarantee | None:
    """The release's guarantee with ε recomputed by its own accountant at ``delta`` (and, at the
    user unit, its per-query guarantee derived again at that δ); unchanged when its ε does not
    depend on δ (ε = ∞, public, pure ε); ``None`` when it cannot be recomputed (no mechanism
    parameters, or ``delta`` unknown)."""
    details = guarantee.details or {}
    if not guarantee.is_private or guarantee.mechanism in ("none", "public"):
        return guarantee
    if guarantee.accountant not in ACCOUNTANTS:  # pure ε (report-noisy-max): the same at any δ
        return guarantee if guarantee.delta == 0 else None
    event = gaussian(guarantee)
    if delta is None or event is None:
        return None
    calibration = cached_epsilon_for(
        event.noise_multiplier, delta, event.sample_rate, event.steps, guarantee.accountant
    )
    moved = guarantee.model_copy(
        update={
            "epsilon": calibration.epsilon, "delta": delta, "accountant": calibration.accountant,
            "details": {**details, "accountant_delta": delta},
        }
    )  # fmt: skip
    recorded = details.get("per_query")
    if recorded is None:
        return moved
    derived = per_query(moved, recorded.get("rule", ""))
    if derived is None:
        return None
    return moved.model_copy(update={"details": {**moved.details, "per_query": derived}})


def unit_count(guarantee: Guarantee) -> int | None:
    """n, the number of units the release's accountant assumed, when its record states it."""
    n = (guarantee.details or {}).get("num_units")
    return int(n) if n else None


def composed_at(releases: list[dict], groups: list[list[str]], delta_of) -> Guarantee | None:
    """The ledger's composition (:func:`compose_releases` over ``groups``) with every release
    recomputed at ``delta_of(guarantee)``; ``None`` when one of them cannot be."""
    moved = []
    for release in releases:
        own = release_guarantee(release)
        at = guarantee_at(own, delta_of(own))
        if at is None:
            return None
        moved.append({**release, "guarantee": at.model_dump(mode="json")})
    return compose_releases(moved, groups, [])


SUBSAMPLED = "not stated: the CLT approximation for the subsampled Gaussian is not a guarantee"
NOT_GAUSSIAN = "not stated: a release here is not a Gaussian mechanism (no μ)"
NO_PER_QUERY = "not stated: no per-query μ for a user-level release's rule"


@dataclass(frozen=True)
class Mu:
    """A Gaussian-DP μ (exact), or why none is stated (``value`` None, ``method`` the reason)."""

    value: float | None
    method: str  # "exact", or the reason no μ is stated

    @property
    def stated(self) -> bool:
        return self.value is not None

    def __str__(self) -> str:
        if self.value is None:
            return self.method
        return "∞" if math.isinf(self.value) else f"{self.value:.4f} ({self.method})"


def gaussian_mu(guarantee: Guarantee) -> Mu | None:
    """μ of a Gaussian release: exact ``√T/σ`` without subsampling (q = 1; σ is the noise
    multiplier, noise std / sensitivity); not stated for Poisson subsampling (q < 1: the CLT
    approximation is no bound); ∞ for a read without DP; ``None`` for any other mechanism."""
    if not guarantee.is_private:
        return Mu(math.inf, "no DP")
    event = gaussian(guarantee)
    if guarantee.accountant not in ACCOUNTANTS or event is None:
        return None
    sigma, rate, steps = event.noise_multiplier, event.sample_rate, event.steps
    if sigma <= 0:
        return Mu(math.inf, "no noise")
    if rate != 1.0:
        return Mu(None, SUBSAMPLED)
    return Mu(math.sqrt(steps) / sigma, "exact")


def per_query_mu(guarantee: Guarantee, mu: Mu | None) -> Mu | None:
    """μ of a user-level release for one query: √2·μ for the Gaussian-substitution rule (exact),
    2μ for group privacy of 2 (μ-GDP is kμ-GDP for groups of k; Dong, Roth & Su 2022) and for the
    replace pair without subsampling (two Gaussians 2μ apart)."""
    if mu is None or not mu.stated or guarantee.unit != "user" or not math.isfinite(mu.value):
        return mu
    rule = ((guarantee.details or {}).get("per_query") or {}).get("rule")
    if rule == "gaussian-substitution":
        return Mu(math.sqrt(2.0) * mu.value, mu.method)
    if rule in ("group-of-2", "poisson-substitution"):  # at q = 1 both are the Gaussian at 2× the shift
        return Mu(2 * mu.value, mu.method)
    return Mu(None, NO_PER_QUERY)


def composed_mu(releases: list[dict], groups: list[list[str]]) -> Mu | None:
    """μ composed per unit like ε: ``√(Σ μ²)`` over each sharing group, the worst group's; a
    user-level release at a weaker unit counts at its per-query μ. Composed only when every
    release has an exact μ (or ∞); otherwise a :class:`Mu` saying why none is stated; ``None``
    without releases."""
    parts = {r["id"]: release_guarantee(r) for r in releases}
    if not parts:
        return None
    unit = weakest_unit([g.unit for g in parts.values()])
    mus = {}
    for key, guarantee in parts.items():
        mu = gaussian_mu(guarantee)
        mus[key] = per_query_mu(guarantee, mu) if unit != "user" else mu
        if mus[key] is None:
            return Mu(None, NOT_GAUSSIAN)
        if not mus[key].stated:
            return mus[key]
    worst = max(math.sqrt(sum(mus[key].value ** 2 for key in group)) for group in groups)
    return Mu(worst, "exact")


# ---------------------------------------------------------------------------------------------
# What the statement says, computed before it is rendered


@dataclass
class ReleaseRow:
    """One release as the statement shows it (``label`` R1, R2, ...)."""

    label: str
    release: dict
    guarantee: Guarantee
    epsilon: float  # at the run's δ, recomputed from its parameters (the recorded ε when it has none)
    recomputed: bool
    at_reference: Guarantee | None
    n: int | None
    at_n_squared: Guarantee | None
    mu: Mu | None
    per_query: dict | None  # user level: derived again from the record


@dataclass
class DatasetStatement:
    """What the statement says about one private dataset."""

    cost: DatasetCost
    rows: list[ReleaseRow]
    total: Guarantee  # the ledger's composition, at the run's δ
    at_reference: Guarantee | None
    at_n_squared: Guarantee | None
    mu: Mu | None
    units: list[int] = field(default_factory=list)


def dataset_statement(cost: DatasetCost, first_label: int = 1) -> DatasetStatement:
    """Every number the statement gives about one dataset, recomputed from its releases."""
    groups = cost.groups
    rows = []
    for index, release in enumerate(cost.releases, start=first_label):
        own = release_guarantee(release)
        again = recomputed_epsilon(own)
        n = unit_count(own)
        recorded = (own.details or {}).get("per_query")
        derived = per_query(own, recorded.get("rule", "")) if recorded else None
        rows.append(
            ReleaseRow(
                label=f"R{index}", release=release, guarantee=own,
                epsilon=own.epsilon if again is None else again, recomputed=again is not None,
                at_reference=guarantee_at(own, REFERENCE_DELTA), n=n,
                at_n_squared=guarantee_at(own, 1 / n**2 if n else None), mu=gaussian_mu(own),
                per_query=derived,
            )
        )  # fmt: skip
    counts = sorted({row.n for row in rows if row.n})
    return DatasetStatement(
        cost=cost,
        rows=rows,
        total=cost.total,
        at_reference=composed_at(cost.releases, groups, lambda g: REFERENCE_DELTA),
        at_n_squared=composed_at(
            cost.releases, groups, lambda g: 1 / unit_count(g) ** 2 if unit_count(g) else None
        ),
        mu=composed_mu(cost.releases, groups),
        units=counts,
    )
