"""The privacy ledger: what each artifact guarantees, and the accountants behind the numbers.

Every ε synthq prints comes from here. The rules of the ledger:

* A DP training stage reports the ε its accountant computes for the *actual* sampling rate,
  noise multiplier and number of steps (:func:`epsilon_for`), at δ = 1/(2n) unless told otherwise.
* A stage that only post-processes a private artifact (``generate`` reading a generator and
  public documents; ``train-retriever`` on synthetic data) inherits its guarantee unchanged
  (:meth:`Guarantee.inherit`). If it also reads private data it is not post-processing any more.
* Training on private data without DP gives ε = ∞ (:meth:`Guarantee.non_private`).

Privacy units: ``query`` — everything one query id contributes (all its (query, document)
pairs together) is protected; this is what the DP stages guarantee by default, because they
sample and clip by query id (:mod:`synthq.dp.engine`). ``user`` (``--privacy-unit user``) — all
the queries one person wrote, each user bounded to K queries (``max_queries_per_user`` in the
details) and sampled and clipped as one unit. ``example`` — one (query, document) pair; for data
where a query has several relevant documents it is weaker than ``query``. A user-level ε implies
the same ε per query; a query-level ε says only k·ε about a user with k queries (group privacy),
so releases of different units compose as the weakest unit, never as the stronger.

A guarantee also lists its ``assumptions``: facts the ε relies on that the code cannot check
(a starting model that is assumed public, a judged-document set that is assumed public, a
reproducible seed that an adversary may know). They are printed wherever the ε is printed.
"""

from __future__ import annotations

import functools
import math
import warnings
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_serializer

from synthq.runtime.errors import PrivacyError

PrivacyUnit = Literal["user", "query", "example"]
UNIT_NOTES = {
    "user": "privacy unit: one user with all of their queries and pairs",
    "query": "privacy unit: one query id with all of its (query, document) pairs",
    "example": "privacy unit: one (query, document) pair",
}
# Weakest first: protecting a user protects each of their queries, a query each of its pairs.
UNIT_STRENGTH = ("example", "query", "user")


def weakest_unit(units: list[str]) -> str:
    return min(units, key=UNIT_STRENGTH.index) if units else "query"


ACCOUNTANTS = ("rdp", "prv")


class Guarantee(BaseModel):
    """An (ε, δ) claim about one artifact.

    Args:
        epsilon: ε; ``math.inf`` for no privacy.
        delta: δ; 0 when ε is infinite.
        unit: what one "neighbouring dataset" step changes: ``user`` (all of one person's
            queries; ``details.max_queries_per_user`` is the bound K), ``query`` or ``example``.
        mechanism: how it was obtained, e.g. ``dp-adam`` or ``post-processing`` or ``none``.
        accountant: the accountant that computed ε (``rdp``/``prv``), ``None`` when not computed.
        derived_from: manifest hashes of the artifacts whose guarantee this one inherits.
        details: the accounting inputs (noise multiplier, sample rate, steps, clip norm,
            sensitivity, ...) so an independent accountant can reproduce ε.
        note: a human sentence, e.g. why ε is infinite.
        assumptions: what the claim relies on that synthq cannot check (e.g. "the starting model
            X is public"); shown beside ε by ``synthq info``, ``synthq ledger`` and reports.
    """

    model_config = ConfigDict(ser_json_inf_nan="strings", frozen=True)

    epsilon: float
    delta: float = 0.0
    unit: PrivacyUnit = "example"
    mechanism: str = "none"
    accountant: str | None = None
    derived_from: list[str] = Field(default_factory=list)
    details: dict = Field(default_factory=dict)
    note: str = ""
    assumptions: list[str] = Field(default_factory=list)

    @field_serializer("epsilon", "delta")
    def _finite_or_string(self, value: float) -> float | str:
        # Standard JSON has no Infinity: ε = ∞ is written as the string "inf".
        return value if math.isfinite(value) else ("inf" if value > 0 else "nan")

    @property
    def is_private(self) -> bool:
        return math.isfinite(self.epsilon)

    @classmethod
    def non_private(cls, reason: str, unit: PrivacyUnit = "example") -> Guarantee:
        """ε = ∞: the artifact was computed from private data without a DP mechanism."""
        return cls(epsilon=math.inf, delta=0.0, unit=unit, mechanism="none", note=reason)

    @classmethod
    def public(cls, reason: str = "computed from public data only") -> Guarantee:
        """An artifact that touched no private data (e.g. an untrained public model).

        Its ε is 0 in the sense that it reveals nothing about the private set."""
        return cls(epsilon=0.0, delta=0.0, unit="example", mechanism="public", note=reason)

    def assuming(self, *assumptions: str) -> Guarantee:
        """The same claim with more assumptions (kept once each, in order)."""
        merged = list(dict.fromkeys([*self.assumptions, *(a for a in assumptions if a)]))
        return self.model_copy(update={"assumptions": merged})

    def inherit(self, source_hash: str, via: str = "post-processing") -> Guarantee:
        """The guarantee of an artifact computed only from this one and public data."""
        return self.model_copy(
            update={
                "mechanism": via if self.mechanism in ("none", "public") else f"{self.mechanism}+{via}",
                "derived_from": [*self.derived_from, source_hash],
            }
        )

    @property
    def unit_text(self) -> str:
        """``query``, or ``user, ≤8 queries`` when a user-level claim records its bound K."""
        bound = (self.details or {}).get("max_queries_per_user")
        return f"user, ≤{bound} queries" if self.unit == "user" and bound else self.unit

    @property
    def per_unit(self) -> str:
        """``per query`` / ``per user (≤ 8 queries each)``: how a sentence states the unit."""
        bound = (self.details or {}).get("max_queries_per_user")
        if self.unit == "user":
            return f"per user (≤ {bound} queries each)" if bound else "per user"
        return f"per {self.unit}"

    def describe(self, with_assumptions: bool = False) -> str:
        """Short text for tables: ``ε=8.00 δ=2.1e-04 (query)`` or ``ε=∞``; with
        ``with_assumptions`` the assumptions follow (``assuming: ...``)."""
        text = f"ε={format_epsilon(self.epsilon)}" + (
            f" δ={self.delta:.1e} ({self.unit_text})" if self.is_private and self.epsilon > 0 else ""
        )
        if with_assumptions and self.assumptions:
            text += " assuming: " + "; ".join(self.assumptions)
        return text

    @classmethod
    def from_manifest(cls, data: dict) -> Guarantee:
        data = dict(data)
        data["epsilon"] = float(data["epsilon"])  # "inf" strings come back as floats
        return cls.model_validate(data)


def compose(first: Guarantee, second: Guarantee, mechanism: str | None = None) -> Guarantee:
    """Sequential (basic) composition of two releases about the same private data: ε and δ add.
    See :func:`compose_all`."""
    label = mechanism or f"composition of {first.mechanism} and {second.mechanism}"
    return compose_all([first, second], label)


def compose_all(guarantees: list[Guarantee], mechanism: str) -> Guarantee:
    """Sequential (basic) composition of releases about the same private data: ε and δ add.

    Public parts (ε = 0) add only their assumptions; an ε = ∞ part makes the result ∞. The
    weaker unit wins (``example`` is weaker than ``query``: protecting one query with all its
    pairs implies protecting each pair, not the other way round); ``derived_from`` and
    assumptions are the union. ``details.components`` keeps each part so the sum is recomputed
    when the artifact is opened."""
    assumptions = list(dict.fromkeys(a for g in guarantees for a in g.assumptions))
    derived = list(dict.fromkeys(h for g in guarantees for h in g.derived_from))
    parts = [g for g in guarantees if g.mechanism != "public"]
    if len(parts) < 2:
        only = parts[0] if parts else guarantees[-1]
        return only.model_copy(update={"assumptions": assumptions, "derived_from": derived})
    if not all(g.is_private for g in parts):
        infinite = next(g for g in parts if not g.is_private)
        return infinite.model_copy(update={"assumptions": assumptions, "derived_from": derived})
    unit = "example" if any(g.unit == "example" for g in parts) else "query"
    return Guarantee(
        epsilon=sum(g.epsilon for g in parts),
        delta=sum(g.delta for g in parts),
        unit=unit,
        mechanism=mechanism,
        accountant="basic-composition",
        derived_from=derived,
        details={"components": [g.model_dump(mode="json") for g in parts]},
        note=f"basic composition: all {len(parts)} releases read the same private data, so ε and δ add",
        assumptions=assumptions,
    )


def release_guarantee(release: dict) -> Guarantee:
    """The guarantee a recorded release (a manifest's ``releases`` entry) states."""
    return Guarantee.from_manifest(release["guarantee"])


def compose_releases(releases: list[dict], sharing: list[list[str]], assumptions: list[str]) -> Guarantee:
    """An artifact's headline guarantee, recomputed from the releases in its lineage.

    Args:
        releases: every read of private data behind the artifact (its own and its inputs'), each
            ``{"id", "guarantee", "unit", ...}`` as recorded in manifests (:mod:`synthq.privacy.units`).
        sharing: groups of release ids whose data share at least one privacy unit (the maximal
            such groups, :func:`synthq.privacy.units.sharing_groups`); every release is in one at least.
        assumptions: what the artifact relies on beyond the releases' own assumptions.

    Basic composition per unit: a unit in the data of releases ``R_u`` is protected at
    ``Σ_{r ∈ R_u} ε_r`` (and ``Σ δ_r``); the headline is the worst unit's, i.e. the largest sum
    over the sharing groups. Releases whose units are disjoint (a generator trained on D and a
    DP run on its synthetic set; train and dev queries) therefore do not add up, and releases on
    D and on D minus one query do. A post-processing of one release is that release, once.
    No release: public (ε = 0) under the stated assumptions; any read without DP in a group: ∞.
    """
    by_id = {r["id"]: r for r in releases}
    merged = list(
        dict.fromkeys([*(a for r in releases for a in release_guarantee(r).assumptions), *assumptions])
    )
    if not releases:
        return Guarantee.public().assuming(*merged)
    parts = {key: release_guarantee(r) for key, r in by_id.items()}
    unit = weakest_unit([g.unit for g in parts.values()])
    details = {"releases": sorted(by_id), "sharing": [sorted(group) for group in sharing]}
    if not all(g.is_private for g in parts.values()):
        reasons = list(dict.fromkeys(g.note for g in parts.values() if not g.is_private and g.note))
        return Guarantee(
            epsilon=math.inf, unit=unit, mechanism="none", details=details,
            note="; ".join(reasons) or "private data was read without DP", assumptions=merged,
        )  # fmt: skip
    if len(parts) == 1:
        (only,) = parts.values()
        return only.model_copy(update={"assumptions": merged, "details": {**only.details, **details}})
    totals = [(sum(parts[r].epsilon for r in group), sum(parts[r].delta for r in group)) for group in sharing]
    kinds = {g.unit for g in parts.values()}
    if unit == "user":  # every release protects users: the loosest bound K is the statement's
        bounds = [g.details.get("max_queries_per_user") for g in parts.values()]
        details["max_queries_per_user"] = max(bounds) if all(bounds) else None
    mixed = (
        f"; releases of different units ({', '.join(sorted(kinds, key=UNIT_STRENGTH.index))}) compose only "
        f"as the weakest, {unit} (a user-level total would need group privacy over each user's queries)"
        if len(kinds) > 1
        else ""
    )
    return Guarantee(
        epsilon=max(e for e, _ in totals),
        delta=max(d for _, d in totals),
        unit=unit,
        mechanism=f"per-unit composition of {len(parts)} releases",
        accountant="basic-composition",
        details=details,
        note="basic composition per privacy unit: a unit counts the releases whose data hold it "
        f"({len(sharing)} group(s) of releases sharing units); the worst unit's total is shown" + mixed,
        assumptions=merged,
    )


def recomputed_epsilon(guarantee: Guarantee) -> float | None:
    """ε recomputed from the mechanism parameters the guarantee records (σ, q, steps, δ of the
    accountant), or the sum over ``details.components``; ``None`` when it records none (public,
    ε = ∞, post-processing copies carry their source's details and are recomputed the same way).

    Used when an artifact is opened, so that an edited ε in a manifest is refused."""
    details = guarantee.details or {}
    if guarantee.mechanism == "none":  # computed from private data without DP: ∞ and nothing else
        return math.inf
    if guarantee.mechanism == "public":
        return 0.0
    if not guarantee.is_private:
        return None
    if guarantee.mechanism == "report-noisy-max":  # pure ε per selection, basic composition
        return float(details["epsilon_per_selection"]) * int(details["selections"])
    if "components" in details:
        parts = [recomputed_epsilon(Guarantee.from_manifest(c)) for c in details["components"]]
        return None if any(p is None for p in parts) else sum(parts)
    needed = ("noise_multiplier", "sample_rate", "steps")
    if not all(k in details for k in needed) or guarantee.accountant not in ACCOUNTANTS:
        return None
    delta = details.get("accountant_delta", guarantee.delta)
    return _cached_epsilon(
        float(details["noise_multiplier"]),
        float(delta),
        float(details["sample_rate"]),
        int(details["steps"]),
        guarantee.accountant,
    )


@functools.lru_cache(maxsize=256)
def _cached_epsilon(noise_multiplier: float, delta: float, sample_rate: float, steps: int, accountant: str):
    from synthq.privacy.memo import remembered

    return remembered(_accountant_epsilon, noise_multiplier, delta, sample_rate, steps, accountant)


def _accountant_epsilon(
    noise_multiplier: float, delta: float, sample_rate: float, steps: int, accountant: str
) -> float:
    return epsilon_for(noise_multiplier, delta, sample_rate, steps, accountant).epsilon


def check_recorded_epsilon(guarantee: Guarantee, where: str) -> None:
    """Refuse a guarantee whose ε differs from what its recorded parameters give."""
    expected = recomputed_epsilon(guarantee)
    if expected is not None and not (
        expected == guarantee.epsilon or math.isclose(expected, guarantee.epsilon, rel_tol=1e-6, abs_tol=1e-9)
    ):
        raise PrivacyError(
            f"{where}: the recorded ε = {guarantee.epsilon:g} does not match its mechanism's "
            f"parameters (the accountant gives {expected:g}); the manifest was edited or is corrupt"
        )


def format_epsilon(epsilon: float) -> str:
    if math.isinf(epsilon):
        return "∞"
    return f"{epsilon:.2f}" if epsilon < 100 else f"{epsilon:.0f}"


def default_delta(num_examples: int) -> float:
    """δ = 1/(2n): comfortably below the 1/n at which (ε, δ)-DP stops meaning anything."""
    if num_examples <= 0:
        raise PrivacyError("cannot choose δ for an empty dataset")
    return 1.0 / (2 * num_examples)


def validate_budget(epsilon: float, delta: float, num_examples: int | None = None) -> None:
    """Reject impossible budgets, and δ ≥ 1/n (meaningless: "publish one unit in full" satisfies
    it), with a clear error."""
    if not (epsilon > 0):
        raise PrivacyError(f"ε must be > 0 (use 'inf' for non-private training), got {epsilon}")
    if math.isinf(epsilon):
        return
    if not (0 < delta < 1):
        raise PrivacyError(f"δ must be in (0, 1), got {delta}")
    if num_examples and delta >= 1.0 / num_examples:
        raise PrivacyError(
            f"δ={delta:g} is not below 1/n = {1 / num_examples:g} (n = {num_examples} privacy units): "
            "such a guarantee allows publishing one unit's data outright; use δ ≤ 1/(2n) (the default)"
        )


def _validate_accounting(sample_rate: float, steps: int, accountant: str) -> None:
    if not (0 < sample_rate <= 1):
        raise PrivacyError(f"the sampling rate must be in (0, 1], got {sample_rate}")
    if steps < 1:
        raise PrivacyError(f"the number of steps must be ≥ 1, got {steps}")
    if accountant not in ACCOUNTANTS:
        raise PrivacyError(f"unknown accountant {accountant!r}; choose one of {', '.join(ACCOUNTANTS)}")


@dataclass(frozen=True)
class Calibration:
    """The outcome of an accountant call: the noise, the ε it gives, and who computed it."""

    noise_multiplier: float
    epsilon: float
    accountant: str
    fallback_reason: str = ""


# PRV's discretisation domain grows with ε: beyond this (RDP) ε it needs many GB of memory, so
# synthq falls back to RDP there instead of letting the process be killed.
PRV_EPSILON_LIMIT = 200.0


def _epsilon(noise_multiplier: float, delta: float, sample_rate: float, steps: int, accountant: str) -> float:
    import numpy as np
    from opacus.accountants import create_accountant

    acc = create_accountant(mechanism=accountant)
    acc.history = [(noise_multiplier, sample_rate, steps)]
    with warnings.catch_warnings(), np.errstate(divide="ignore", invalid="ignore"):
        # Opacus warns when the best RDP order is at the edge of its grid: the ε is then a valid but
        # looser bound. It happens for the extreme σ the calibration probes on every DP run, never
        # for the σ a run ends with at a sensible target, so it would only be noise in every log.
        # PRV at sampling rate 1 (Private Evolution's votes) takes log(1 - q) = -inf on the way
        # to the plain Gaussian mechanism: numpy's warning about it is noise too.
        warnings.filterwarnings("ignore", message="Optimal order is the")
        epsilon = float(acc.get_epsilon(delta=delta))
    # A conversion that lands below 0 (huge σ, large δ) still proves (0, δ)-DP: ε is never negative.
    return max(0.0, epsilon)


# The σ search's limits: above MAX the noise swamps any gradient (Opacus' own limit); below MIN
# the RDP ε is in the thousands even for one full-batch step, so a target that needs less noise
# is no privacy at all and is refused (train with ε = inf instead).
MIN_NOISE_MULTIPLIER = 0.01
MAX_NOISE_MULTIPLIER = 1e6


def _rdp_noise_multiplier(
    target: float, delta: float, sample_rate: float, steps: int, tolerance: float
) -> float:
    """The σ whose RDP ε is in ``[target − tolerance, target]``, by bisection in log σ between the
    limits above (Opacus' ``get_noise_multiplier`` loops forever on a target above every reachable
    ε, and its absolute tolerance lets a target of 1e-6 end at a negative ε). The tolerance is at
    most 1 % of the target; the search stops after 200 halvings, returning the σ found (whose ε
    is ≤ the target)."""
    tolerance = min(tolerance, target / 100)

    def epsilon(sigma: float) -> float:
        return _epsilon(sigma, delta, sample_rate, steps, "rdp")

    where = f"at δ={delta:g} with sampling rate {sample_rate:g} over {steps} steps"
    low, high = MIN_NOISE_MULTIPLIER, 10.0
    if epsilon(low) <= target:
        raise PrivacyError(
            f"ε={target:g} is beyond any meaningful guarantee {where} (the least noise synthq adds, "
            f"σ={MIN_NOISE_MULTIPLIER}, already gives ε={epsilon(low):.4g}); use --epsilon inf to train "
            "without DP"
        )
    while epsilon(high) > target:
        high *= 2
        if high > MAX_NOISE_MULTIPLIER:
            raise PrivacyError(f"ε={target:g} cannot be reached {where}: the noise would exceed σ = 1e6")
    for _ in range(200):
        if target - epsilon(high) <= tolerance:
            break
        middle = math.sqrt(low * high)
        if epsilon(middle) <= target:
            high = middle
        else:
            low = middle
    return high


def epsilon_for(
    noise_multiplier: float, delta: float, sample_rate: float, steps: int, accountant: str = "rdp"
) -> Calibration:
    """ε after ``steps`` Poisson-sampled Gaussian steps with this noise multiplier.

    ``noise_multiplier`` is the noise standard deviation divided by the sensitivity. PRV is
    known to fail for large ε (its discretisation domain overflows or exhausts memory); then
    RDP is used and the fallback is recorded in the returned :class:`Calibration`.
    """
    _validate_accounting(sample_rate, steps, accountant)
    if noise_multiplier <= 0:
        return Calibration(noise_multiplier, math.inf, accountant)
    rdp = _epsilon(noise_multiplier, delta, sample_rate, steps, "rdp")
    if accountant == "rdp":
        return Calibration(noise_multiplier, rdp, "rdp")
    if rdp > PRV_EPSILON_LIMIT:
        reason = f"ε ≈ {rdp:.0f} is beyond PRV's reliable range (> {PRV_EPSILON_LIMIT:.0f})"
        return Calibration(noise_multiplier, rdp, "rdp", fallback_reason=reason)
    try:
        eps = _epsilon(noise_multiplier, delta, sample_rate, steps, "prv")
        if math.isfinite(eps):
            return Calibration(noise_multiplier, eps, "prv")
        reason = "PRV returned a non-finite ε"
    except (Exception, MemoryError) as error:  # PRV's domain errors at large ε
        reason = f"PRV failed ({type(error).__name__}: {error})"
    return Calibration(noise_multiplier, rdp, "rdp", fallback_reason=reason)


def noise_multiplier_for(
    target_epsilon: float,
    delta: float,
    sample_rate: float,
    steps: int,
    accountant: str = "rdp",
    epsilon_tolerance: float = 0.01,
) -> Calibration:
    """The smallest noise multiplier (to within the tolerance) whose ε is ≤ ``target_epsilon``.

    RDP uses Opacus' ``get_noise_multiplier`` binary search. PRV (tighter, so it needs less
    noise) searches below the RDP answer with :func:`epsilon_for`, which guards PRV's memory
    blow-up at large ε. The returned ε is recomputed for the returned σ, exactly what an
    independent accountant call gives.
    """
    validate_budget(target_epsilon, delta)
    _validate_accounting(sample_rate, steps, accountant)
    if math.isinf(target_epsilon):
        return Calibration(0.0, math.inf, accountant)
    sigma_rdp = _rdp_noise_multiplier(target_epsilon, delta, sample_rate, steps, epsilon_tolerance)
    if accountant == "rdp":
        return epsilon_for(sigma_rdp, delta, sample_rate, steps, "rdp")
    high = epsilon_for(sigma_rdp, delta, sample_rate, steps, "prv")
    if high.accountant != "prv":
        return high
    low_sigma = sigma_rdp / 2
    for _ in range(6):  # find a σ whose PRV ε is above the target
        low = epsilon_for(low_sigma, delta, sample_rate, steps, "prv")
        if low.accountant != "prv" or low.epsilon > target_epsilon:
            break
        high, low_sigma = low, low_sigma / 2
    high_sigma = high.noise_multiplier
    while target_epsilon - high.epsilon > epsilon_tolerance and high_sigma - low_sigma > 1e-4:
        middle = epsilon_for((low_sigma + high_sigma) / 2, delta, sample_rate, steps, "prv")
        if middle.accountant != "prv" or middle.epsilon > target_epsilon:
            low_sigma = middle.noise_multiplier
        else:
            high, high_sigma = middle, middle.noise_multiplier
    return high
