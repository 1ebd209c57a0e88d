"""The (ε, δ) guarantee an artifact carries, and how the guarantees of several releases compose.

Every ε synthq prints is a :class:`Guarantee`. The rules:

* A DP training stage reports the ε its accountant computes for the *actual* sampling rate,
  noise multiplier and number of steps (:func:`synthq.privacy.accounting.epsilon_for`), at
  δ = 1/(2n) unless told otherwise.
* A stage that only post-processes a private artifact (``generate`` reading a generator and
  public documents; ``train-retriever`` on synthetic data) inherits its guarantee unchanged
  (:meth:`Guarantee.inherit`). If it also reads private data it is not post-processing any more.
* Training on private data without DP gives ε = ∞ (:meth:`Guarantee.non_private`).
* Releases about the same private data compose per privacy unit (:func:`compose_releases`): a
  unit counts the releases whose data hold it.

Privacy units: ``query`` — everything one query id contributes (all its (query, document)
pairs together) is protected; this is what the DP stages guarantee by default, because they
sample and clip by query id (:mod:`synthq.dp.engine`). ``user`` (``--privacy-unit user``) — all
the queries one person wrote, each user bounded to K queries (``max_queries_per_user`` in the
details) and sampled and clipped as one unit. ``example`` — one (query, document) pair; for data
where a query has several relevant documents it is weaker than ``query``.

A user-level ε is **not** the same ε per query: removing one of a user's queries reweights the
user's other queries (weights 1/k) and, with K, may promote a dropped query into the kept K — a
*replacement* of the user's contribution, not the removal of a unit. So every private user-level
release records its own per-query guarantee, derived for that neighbour
(:func:`synthq.privacy.accounting.per_query`: the Gaussian at sensitivity √2 for Private
Evolution, the subsampled Gaussian's replace pair for DP-SGD) and recomputed when the artifact
is opened; it also holds per (query, document) pair. A query-level ε says only k·ε about a user with k queries
(group privacy), so releases of different units compose as the weakest unit, never as the
stronger, each user-level release counting at its derived per-query ε (:func:`compose_releases`).

A guarantee also lists its ``assumptions``: facts the ε relies on that the code cannot check
(a starting model that is assumed public, a judged-document set that is assumed public, a
reproducible seed that an adversary may know). They are printed wherever the ε is printed.
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_serializer

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
            f" δ={self.delta:.1e} ({self.unit_text})"
            if self.is_private and (self.epsilon > 0 or self.delta > 0)
            else ""
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
    pairs implies protecting each pair, not the other way round), and at a unit weaker than the
    user a user-level part counts at its derived per-query ε (:func:`per_query_view`; ∞ when it
    records none); ``derived_from`` and
    assumptions are the union. ``details.components`` keeps each part so the sum is recomputed
    when the artifact is opened."""
    assumptions = list(dict.fromkeys(a for g in guarantees for a in g.assumptions))
    derived = list(dict.fromkeys(h for g in guarantees for h in g.derived_from))
    parts = [g for g in guarantees if g.mechanism != "public"]
    if len(parts) < 2:
        only = parts[0] if parts else guarantees[-1]
        return only.model_copy(update={"assumptions": assumptions, "derived_from": derived})
    unit = weakest_unit([g.unit for g in parts])
    # at a weaker unit than the user, a user-level part counts at its derived per-query ε
    counted = [per_query_view(g) for g in parts] if unit != "user" else parts
    if not all(g.is_private for g in counted):
        infinite = next(g for g in counted if not g.is_private)
        return infinite.model_copy(update={"assumptions": assumptions, "derived_from": derived})
    return Guarantee(
        epsilon=sum(g.epsilon for g in counted),
        delta=sum(g.delta for g in counted),
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


def per_query_view(guarantee: Guarantee) -> Guarantee:
    """A release as seen per query (and per pair): a private user-level release at the per-query
    (ε, δ) it records (``details.per_query``, derived and recomputed by
    :func:`synthq.privacy.accounting.per_query`); ε = ∞ when it records none (fail closed: it was
    never derived). Every other release unchanged."""
    if guarantee.unit != "user" or not guarantee.is_private:
        return guarantee
    derived = (guarantee.details or {}).get("per_query")
    if not derived:
        return guarantee.model_copy(
            update={
                "epsilon": math.inf, "delta": 0.0, "mechanism": "none", "unit": "query",
                "note": "a user-level release with no derived per-query guarantee counts as ε = ∞ per query",
            }
        )  # fmt: skip
    epsilon, delta = float(derived["epsilon"]), float(derived["delta"])
    return guarantee.model_copy(update={"epsilon": epsilon, "delta": delta, "unit": "query"})


def compose_releases(releases: list[dict], sharing: list[list[str]], assumptions: list[str]) -> Guarantee:
    """An artifact's headline guarantee, recomputed from the releases in its lineage.

    Args:
        releases: every read of private data behind the artifact (its own and its inputs'), each
            ``{"id", "guarantee", "unit", ...}`` as recorded in manifests (:mod:`synthq.privacy.unit_sets`).
        sharing: groups of release ids whose data share at least one privacy unit (the maximal
            such groups, :func:`synthq.privacy.unit_sets.sharing_groups`); every release is in one at least.
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
    kinds = {g.unit for g in parts.values()}
    if unit != "user" and "user" in kinds:  # user-level releases count at their derived per-query ε
        users = sorted(key for key, g in parts.items() if g.unit == "user")
        parts = {key: per_query_view(g) for key, g in parts.items()}
        details["per_query"] = {key: parts[key].epsilon for key in users if parts[key].is_private}
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
    if unit == "user":  # every release protects users: the loosest bound K is the statement's
        bounds = [g.details.get("max_queries_per_user") for g in parts.values()]
        details["max_queries_per_user"] = max(bounds) if all(bounds) else None
    mixed = (
        f"; releases of different units ({', '.join(sorted(kinds, key=UNIT_STRENGTH.index))}) compose only "
        f"as the weakest, {unit} (a user-level total would need group privacy over each user's queries)"
        + ("; a user-level release counts at its per-query ε, derived for that neighbour" * ("user" in kinds))
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


def format_epsilon(epsilon: float) -> str:
    """``8.00``, ``1234``, ``0.0031`` or ``∞``: ε as tables and messages print it. A positive ε
    that two decimals would round to ``0.00`` keeps two significant digits, so a private release
    never prints like a public one."""
    if math.isinf(epsilon):
        return "∞"
    return fixed_epsilon(epsilon, 2) if epsilon < 100 else f"{epsilon:.0f}"


def fixed_epsilon(epsilon: float, decimals: int) -> str:
    """ε to ``decimals`` decimals, except a positive ε those would round to zero, which keeps two
    significant digits: a private release never prints like a public one."""
    if 0 < epsilon < 0.5 * 10**-decimals:
        return f"{epsilon:.2g}"
    return f"{epsilon:.{decimals}f}"
