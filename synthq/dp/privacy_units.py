"""Privacy units and their Poisson sampling: who one DP guarantee protects, and how a batch is drawn.

Training pairs are grouped by query id (:class:`PrivacyUnits`): the unit is the query, with all
of its (query, document) pairs; ``n`` counts queries, δ defaults to ``1/(2n)``. Under
``--privacy-unit user`` the unit is one user with all the pairs of their (at most K) kept queries
(:meth:`PrivacyUnits.by_user`). Each step Poisson-samples units at ``q = B / n``
(:func:`poisson_units`) with the run's secret randomness; a mechanism whose sensitivity grows with
the batch gets a cap ``B_max`` (:func:`batch_cap`), and a batch over the cap is replaced by an
*empty* batch, so no tail probability is added to δ.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch
from scipy import stats

from synthq.dp.noise import SecretRandomness
from synthq.privacy.unit_sets import link_text, query_links


@dataclass(frozen=True)
class PrivacyUnits:
    """Training rows grouped by privacy unit: one query id with all of its pairs (``kind``
    ``"query"``), or one user with all of their kept queries' pairs (``"user"``).

    ``rows[u]`` are the row indices of unit ``u``. A unit with ``k`` rows has row weight ``1/k``:
    mechanisms that clip rows scale each clipped row by its weight, so a whole unit contributes
    at most ``C`` (see :meth:`expand`), whatever the unit. The user unit is the same structure
    one level up (:meth:`by_user`); every mechanism's proof is written for "a unit with ``k``
    rows of weight ``1/k``" and holds for both.
    """

    rows: list[list[int]]
    keys: list[str] = field(default_factory=list)
    kind: str = "query"
    max_queries: int | None = None  # the user unit's bound K on each user's queries
    row_keys: dict[int, str] = field(default_factory=dict, repr=False)  # row -> its unit's key
    # the user unit's links: the ids and texts of the kept queries (synthq.privacy.unit_sets)
    links: dict[str, list[str]] = field(default_factory=dict, repr=False)

    @classmethod
    def from_keys(cls, keys: Sequence[str]) -> PrivacyUnits:
        grouped: dict[str, list[int]] = {}
        for row, key in enumerate(keys):
            grouped.setdefault(key, []).append(row)
        return cls(rows=list(grouped.values()), keys=list(grouped))

    @classmethod
    def by_user(
        cls, query_ids: Sequence[str], users: Sequence[str], max_queries: int, randomness: SecretRandomness
    ) -> PrivacyUnits:
        """Rows grouped by user, each user bounded to at most ``max_queries`` (K) of their queries.

        Which K queries a user keeps is decided by the secret key and the user's own query ids
        alone (the K smallest :meth:`SecretRandomness.keyed_choice` values), never by position,
        content or any other user: neighbouring datasets (one user added or removed) give bounded
        datasets that differ in that one user, with at most K queries. The rows of dropped
        queries belong to no unit and are never sampled.

        Args:
            query_ids: the query id of each training row.
            users: the user id of each training row (:func:`synthq.data.users.query_users`).
            max_queries: K, the bound on each user's queries.
            randomness: the run's secret randomness (its key decides which queries are kept).
        """
        by_user: dict[str, dict[str, list[int]]] = {}
        for row, (query_id, user) in enumerate(zip(query_ids, users, strict=True)):
            by_user.setdefault(user, {}).setdefault(query_id, []).append(row)
        rows, row_keys = [], {}
        for user, queries in by_user.items():
            kept = sorted(queries, key=lambda q: (randomness.keyed_choice(2**62, "user-bound", user, q), q))
            members = sorted(row for query in kept[:max_queries] for row in queries[query])
            rows.append(members)
            row_keys.update(dict.fromkeys(members, user))
        return cls(rows=rows, keys=list(by_user), kind="user", max_queries=max_queries, row_keys=row_keys)

    def key_of(self, row: int, default: str) -> str:
        """The unit key of a training row (``default``, its query id, for the query unit)."""
        return self.row_keys.get(row, default)

    @property
    def kept_rows(self) -> int:
        return sum(len(r) for r in self.rows)

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def max_rows(self) -> int:
        return max((len(r) for r in self.rows), default=0)

    def expand(self, units: Sequence[int]) -> tuple[list[int], list[float]]:
        """The rows of ``units`` and each row's weight ``1/k`` (``k`` = its unit's row count)."""
        rows, weights = [], []
        for unit in units:
            members = self.rows[unit]
            rows += members
            weights += [1.0 / len(members)] * len(members)
        return rows, weights

    def positions(self, units: Sequence[int]) -> list[int]:
        """For the rows :meth:`expand` gives, the position of each row's unit in ``units``
        (per-unit clipping groups a unit's rows by it)."""
        return [place for place, unit in enumerate(units) for _ in self.rows[unit]]


def describe_units(units: PrivacyUnits) -> str:
    """``"412 queries"`` or ``"97 users (≤ 8 queries each)"``: the n a run samples from."""
    if units.kind == "user":
        return f"{len(units):,} users (≤ {units.max_queries} queries each)"
    return f"{len(units):,} queries"


def unit_details(units: PrivacyUnits) -> dict:
    """What a guarantee records about its unit (public: n is recorded anyway, K is a setting)."""
    return {"privacy_unit": units.kind, "max_queries_per_user": units.max_queries}


def public_count_assumption(units: PrivacyUnits) -> str:
    noun = "users" if units.kind == "user" else "queries"
    return f"the number of training {noun} n (recorded to recompute ε) is public"


def unit_diagnostics(units: PrivacyUnits, pairs: int) -> dict:
    """Un-noised statistics of the private units: for the private diagnostics only (ε = ∞)."""
    stats = {"pairs": pairs, "pairs_per_unit_max": units.max_rows, "pairs_kept": units.kept_rows}
    if units.kind == "user":
        stats["pairs_dropped_by_user_bound"] = pairs - units.kept_rows
    return stats


def poisson_units(
    num_units: int, sample_rate: float, generator: torch.Generator, cap: int | None = None
) -> list[int]:
    """One Poisson-sampled batch of unit indices; an empty batch when more than ``cap`` are drawn.

    Why an over-full batch becomes empty (and needs no δ term): let ``f`` be a mechanism's clipped
    sum and ``g(S) = f(S)`` if ``|S| ≤ cap`` else ``0``. For neighbouring datasets the sampled
    batches are ``S`` and ``S ∪ {x}`` (Poisson sampling, add/remove). If ``|S| < cap`` both are
    under the cap: ``‖g(S ∪ {x}) − g(S)‖ ≤ Δ(cap)``. If ``|S| > cap`` both are empty: 0. If
    ``|S| = cap`` the difference is ``‖f(S)‖``, which each capped mechanism bounds by
    ``Δ(cap)`` too (its sensitivity takes the maximum of both, see its docstring). So ``g`` has
    sensitivity ``Δ(cap)`` for *every* pair of neighbours and the subsampled-Gaussian accountant
    applies unchanged. (Cutting an over-full batch down to ``cap`` instead is within total
    variation η of such a mechanism and would cost ``(1 + e^ε)η`` extra δ.)
    """
    chosen = torch.nonzero(torch.rand(num_units, generator=generator) < sample_rate).flatten().tolist()
    if cap is not None and len(chosen) > cap:
        return []
    return chosen


def batch_cap(num_units: int, sample_rate: float, steps: int, expected_lost_steps: float = 1e-3) -> int:
    """The smallest cap ``b`` with ``steps · P(Binomial(n + 1, q) > b) ≤ expected_lost_steps``.

    Privacy does not depend on this choice (over-full batches are emptied, :func:`poisson_units`);
    it trades noise (the sensitivity grows with ``b``) against the expected number of wasted steps.
    """
    distribution = stats.binom(num_units + 1, sample_rate)
    cap = max(1, int(distribution.mean()))
    while steps * distribution.sf(cap) > expected_lost_steps and cap < num_units + 1:
        cap += 1
    return cap


def training_units(pairs, root: Path, unit: str, max_queries: int | None, randomness, links: bool = True):
    """The privacy units of a private training set of pairs (a :class:`~synthq.data.pairs.PairList`):
    one per query id, or one per user (``unit="user"``: user ids from the dataset at ``root``,
    each user bounded to ``max_queries`` queries chosen with ``randomness``'s secret key). At the
    user unit ``links`` keeps the ids and texts of the users' queries for the release's link sets;
    ``synthq plan`` counts without them (it reads no query text)."""
    from synthq.data.users import query_users

    query_ids = [pairs.queries.id_at(int(row)) for row in pairs.query_rows]
    if unit == "query":
        units = PrivacyUnits.from_keys(query_ids)
        if not links:
            return units
        rows = list(dict.fromkeys(int(row) for row in pairs.query_rows))
        ids, texts = [pairs.queries.id_at(r) for r in rows], [pairs.queries.text_at(r) for r in rows]
        return replace(units, links=query_links(ids, texts))  # its own queries (synthq.privacy.unit_sets)
    users = query_users(root, pairs.queries, pairs.query_rows)
    units = PrivacyUnits.by_user(query_ids, users, max_queries, randomness)
    if not links:
        return units
    # every query of the dataset, all splits (the same people however a later export splits or
    # renames the log; the sets are keyed and never released)
    every = range(len(pairs.queries))
    links = {
        "query": [pairs.queries.id_at(row) for row in every],
        "text": [link_text(pairs.queries.text_at(row)) for row in every],
    }
    return replace(units, links=links)
