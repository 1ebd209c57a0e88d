"""The DP engine: the privacy rules of every synthq training run, in one place.

A DP run (the generator's DP-SGD/DP-Adam in :mod:`synthq.dp.lm`, the retriever baselines in
:mod:`synthq.dp.contrastive`) is the sampled Gaussian mechanism of Abadi et al. (2016), repeated:

1. **Privacy units.** Training pairs are grouped by query id (:class:`PrivacyUnits`): the unit is
   the query, with all of its (query, document) pairs. ``n`` counts queries, δ defaults to
   ``1/(2n)``.
2. **Poisson sampling** of units at ``q = B / n`` (:func:`poisson_units`), with the secret
   randomness of :class:`SecretRandomness`. A mechanism whose sensitivity grows with the batch
   gets a cap ``B_max``; a batch over the cap is replaced by an *empty* batch (see
   :func:`poisson_units`), so no tail probability is added to δ.
3. **A clipped sum** computed by a registered mechanism (:func:`register_mechanism`), which
   states its sensitivity ``Δ`` (the most the sum can move when one unit is added or removed)
   and proves it in its docstring.
4. **Noise once**: ``N(0, (σΔ)²)`` on every coordinate of the sum (:func:`add_noise`), divided by
   the expected batch ``q n``; the optimizer's update is post-processing.

:class:`PrivacyPlan` turns (n, B, steps, ε, δ, accountant, mechanism) into ``q``, σ (calibrated by
Opacus' accountant for exactly those ``q`` and steps), the batch cap, and the :class:`Guarantee`
whose ε the same accountant recomputes — the progress bar, the manifest and ``synthq info`` all
report ε from this one object.

Secret randomness: sampling and noise are drawn from the operating system's secure randomness
unless a reproducible ``seed`` is asked for, in which case the guarantee says that an adversary
who knows the seed is not covered. The secret state lives only in private checkpoints (for
``--resume``), never in a released file.
"""

from __future__ import annotations

import abc
import hashlib
import hmac
import importlib
import inspect
import math
import secrets
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import ClassVar

import torch
from scipy import stats

from synthq.privacy.guarantee import (
    UNIT_NOTES,
    Guarantee,
    default_delta,
    epsilon_for,
    noise_multiplier_for,
    validate_budget,
)
from synthq.runtime import distributed
from synthq.runtime.errors import PrivacyError

# ---------------------------------------------------------------------------------------------
# Mechanisms


class Mechanism(abc.ABC):
    """Base of every DP mechanism: what it clips, its sensitivity, and whether it needs a cap.

    Subclasses register themselves with :func:`register_mechanism` and document, in the style of
    sentence-transformers' losses, their *Privacy unit* and *Sensitivity* with a proof.
    """

    name: ClassVar[str] = ""
    needs_batch_cap: ClassVar[bool] = False
    sensitivity_rule: ClassVar[str] = ""

    @abc.abstractmethod
    def sensitivity(self, batch_cap: int | None) -> float:
        """The most the clipped sum can move when one unit is added or removed (batch ≤ cap)."""

    def describe(self) -> dict:
        """Extra accounting inputs for the guarantee's details."""
        return {}


MECHANISMS: dict[str, type[Mechanism]] = {}


def register_mechanism(name: str):
    """Class decorator: make a mechanism available as ``--dp NAME`` (Opacus-style registry)."""

    def decorator(cls: type[Mechanism]) -> type[Mechanism]:
        cls.name = name
        MECHANISMS[name] = cls
        return cls

    return decorator


# Modules whose mechanisms register themselves when imported (loaded on first lookup, as
# plugins: the engine depends on none of them).
MECHANISM_MODULES = (
    "synthq.dp.lm",
    "synthq.dp.contrastive",
    "synthq.dp.contrastive_logit",
    "synthq.dp.evolution",
)


def mechanism_class(name: str) -> type[Mechanism]:
    for module in MECHANISM_MODULES:
        importlib.import_module(module)
    if name not in MECHANISMS:
        raise PrivacyError(f"unknown DP mechanism {name!r}; known: {', '.join(sorted(MECHANISMS))}")
    return MECHANISMS[name]


def build_mechanism(name: str, **options: object) -> Mechanism:
    """The mechanism registered as ``name``, built from the options its constructor takes (the
    others are ignored, so a stage can pass all of its settings)."""
    cls = mechanism_class(name)
    accepted = inspect.signature(cls.__init__).parameters
    return cls(**{key: value for key, value in options.items() if key in accepted})


# ---------------------------------------------------------------------------------------------
# Units and sampling


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


# ---------------------------------------------------------------------------------------------
# Randomness


class SecretRandomness:
    """The randomness an adversary must not know: Poisson sampling, noise, keyed choices.

    Args:
        seed: ``None`` (default) draws every seed from the OS's secure randomness
            (:mod:`secrets`); an integer makes the run bit-reproducible, and
            :meth:`assumption` then says the guarantee does not hold against anyone who knows it.

    Under torchrun rank 0 draws the secrets and broadcasts them, so every rank samples the same
    global batch and adds the same noise once. :meth:`state_dict` is for private checkpoints only.
    """

    def __init__(self, seed: int | None = None):
        self.seed = seed
        if seed is None:
            drawn = distributed.broadcast(
                (secrets.randbits(63), secrets.randbits(63), secrets.token_bytes(32))
            )
            sampling_seed, noise_seed, self.key = drawn
        else:
            sampling_seed, noise_seed = seed, seed + 1
            self.key = hashlib.sha256(f"synthq-reproducible-seed-{seed}".encode()).digest()
        self.sampling = torch.Generator().manual_seed(sampling_seed)
        self.noise = torch.Generator().manual_seed(noise_seed)

    @property
    def reproducible(self) -> bool:
        return self.seed is not None

    def assumption(self) -> str | None:
        if self.seed is None:
            return None
        return (
            f"reproducible seed {self.seed}: sampling and noise can be replayed by anyone who knows it, "
            "so the guarantee does not hold against such an adversary"
        )

    def keyed_choice(self, modulo: int, *parts: object) -> int:
        """A uniform choice in ``[0, modulo)`` determined by the secret key and ``parts`` alone
        (an HMAC), so it depends on no other example and cannot be predicted without the key."""
        message = "\x1f".join(map(str, parts)).encode()
        digest = hmac.new(self.key, message, hashlib.sha256).digest()
        return int.from_bytes(digest[:8], "big") % modulo

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {
            "sampling": self.sampling.get_state(),
            "noise": self.noise.get_state(),
            "key": torch.tensor(list(self.key), dtype=torch.uint8),
        }

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.sampling.set_state(state["sampling"])
        self.noise.set_state(state["noise"])
        self.key = bytes(state["key"].tolist())


# ---------------------------------------------------------------------------------------------
# Noise


# The noise of one call is drawn by NOISE_STREAMS generators, each seeded from the run's secret
# noise generator and each covering a fixed contiguous span of the call's coordinates (the
# tensors taken in order, flattened), in chunks of NOISE_CHUNK. The streams run on torch's
# threads at once; since the spans depend only on the tensors' sizes, the noise is the same on
# any thread count and any rank. Measured alone on 2 cores for SmolLM2-135M's 135 M coordinates
# (benchmarks/finetune_step.py --noise, make bench 2026-11-25): 0.26 s, against 0.51 s for one
# generator (mt19937 is sequential) drawing a fresh ``torch.normal`` tensor per parameter.
NOISE_STREAMS = 8
NOISE_CHUNK = 1 << 22


def _noise_spans(sizes: list[int], streams: int) -> list[list[tuple[int, int, int]]]:
    """Each stream's pieces ``(tensor index, start, stop)`` in its tensors' flat coordinates."""
    total = sum(sizes)
    bounds = [total * s // streams for s in range(streams + 1)]
    offsets = [0]
    for size in sizes:
        offsets.append(offsets[-1] + size)
    spans = []
    for lo, hi in zip(bounds[:-1], bounds[1:], strict=True):
        pieces = []
        for index, size in enumerate(sizes):
            start, stop = max(lo, offsets[index]), min(hi, offsets[index] + size)
            while start < stop:
                end = min(stop, start + NOISE_CHUNK)
                pieces.append((index, start - offsets[index], end - offsets[index]))
                start = end
        spans.append(pieces)
    return spans


def add_noise(tensors: list[torch.Tensor], std: float, generator: torch.Generator) -> list[torch.Tensor]:
    """``tensor += N(0, std²)`` for every coordinate, **in place** (the tensors are returned).

    :data:`NOISE_STREAMS` generators, seeded by 63-bit draws from ``generator`` (the run's secret
    noise stream), each draw a fixed span of the coordinates, in parallel on torch's threads: the
    noise depends on ``generator`` and the tensors' sizes only (every rank of a torchrun job
    draws the same noise, on the CPU, and moves it to the tensor's device). Extra memory: one
    chunk of :data:`NOISE_CHUNK` coordinates per thread."""
    tensors = list(tensors)
    if std <= 0 or not tensors:
        return tensors
    seeds = torch.randint(0, 2**63 - 1, (NOISE_STREAMS,), generator=generator).tolist()
    flats = [t.view(-1) if t.is_contiguous() else t.contiguous().view(-1) for t in tensors]
    spans = _noise_spans([f.numel() for f in flats], NOISE_STREAMS)

    def draw(stream: int) -> None:
        stream_generator = torch.Generator().manual_seed(seeds[stream])
        buffer = torch.empty(max((b - a for _, a, b in spans[stream]), default=0))  # ≤ NOISE_CHUNK
        for index, start, stop in spans[stream]:
            noise = buffer[: stop - start].normal_(0.0, std, generator=stream_generator)
            flats[index][start:stop].add_(noise.to(flats[index].device, flats[index].dtype))

    workers = min(torch.get_num_threads(), NOISE_STREAMS)
    if workers > 1:
        with ThreadPoolExecutor(workers) as pool:
            list(pool.map(draw, range(NOISE_STREAMS)))
    else:
        for stream in range(NOISE_STREAMS):
            draw(stream)
    for tensor, flat in zip(tensors, flats, strict=True):
        if not tensor.is_contiguous():  # the noise went into a contiguous copy
            tensor.copy_(flat.view(tensor.shape))
    return tensors


def planned_steps(num_units: int, batch_size: int, epochs: float, max_steps: int | None) -> int:
    """Logical steps: ``epochs / q`` with ``q = B / n`` (capped by ``max_steps``), at least one."""
    steps = math.ceil(epochs * num_units / batch_size)
    if max_steps is not None:
        steps = min(steps, max_steps)
    return max(steps, 1)


# ---------------------------------------------------------------------------------------------
# The plan


@dataclass(frozen=True)
class PrivacyPlan:
    """Everything the accountant decides for one DP run, and the guarantee it backs.

    Build it with :meth:`create`; ``noise_multiplier`` is σ (noise std = σ · sensitivity).
    """

    num_units: int
    expected_batch_size: int
    sample_rate: float
    steps: int
    target_epsilon: float
    delta: float
    accountant: str
    noise_multiplier: float
    sensitivity: float
    batch_cap: int | None
    mechanism: str
    fallback_reason: str = ""
    unit: str = "query"

    @classmethod
    def create(
        cls,
        *,
        num_units: int,
        expected_batch_size: int,
        steps: int,
        epsilon: float,
        delta: float | None,
        accountant: str,
        mechanism: Mechanism,
        unit: str = "query",
    ) -> PrivacyPlan:
        if expected_batch_size > num_units:
            raise PrivacyError(
                f"the batch size {expected_batch_size} is larger than the {num_units} privacy units ({unit}s)"
            )
        delta = default_delta(num_units) if delta is None else delta
        validate_budget(epsilon, delta, num_units)
        sample_rate = expected_batch_size / num_units
        calibration = noise_multiplier_for(epsilon, delta, sample_rate, steps, accountant)
        cap = batch_cap(num_units, sample_rate, steps) if mechanism.needs_batch_cap else None
        return cls(
            num_units=num_units,
            expected_batch_size=expected_batch_size,
            sample_rate=sample_rate,
            steps=steps,
            target_epsilon=epsilon,
            delta=delta,
            accountant=calibration.accountant,
            noise_multiplier=calibration.noise_multiplier,
            sensitivity=mechanism.sensitivity(cap),
            batch_cap=cap,
            mechanism=mechanism.name,
            fallback_reason=calibration.fallback_reason,
            unit=unit,
        )

    @classmethod
    def with_noise(
        cls, noise_multiplier: float, sensitivity: float, expected_batch_size: int, num_units: int = 1_000_000
    ) -> PrivacyPlan:
        """A plan with a given σ instead of a target ε (benchmarks and tests of the noisy step);
        :meth:`guarantee` still reports the ε that σ gives."""
        return cls(
            num_units=num_units,
            expected_batch_size=expected_batch_size,
            sample_rate=expected_batch_size / num_units,
            steps=1,
            target_epsilon=math.nan,
            delta=default_delta(num_units),
            accountant="rdp",
            noise_multiplier=noise_multiplier,
            sensitivity=sensitivity,
            batch_cap=None,
            mechanism="fixed-noise",
        )

    @property
    def noise_std(self) -> float:
        return self.noise_multiplier * self.sensitivity

    def sample(self, randomness: SecretRandomness) -> list[int]:
        """The unit indices of the next logical batch."""
        return poisson_units(self.num_units, self.sample_rate, randomness.sampling, self.batch_cap)

    def privatize(self, clipped_sum: list[torch.Tensor], randomness: SecretRandomness) -> list[torch.Tensor]:
        """``(clipped sum + N(0, (σΔ)²)) / (q n)``: the gradient the optimizer may use. Computed in
        place: the clipped sum's tensors become the returned gradient (no second copy of the
        model's gradient in memory)."""
        return [
            g.div_(self.expected_batch_size) for g in add_noise(clipped_sum, self.noise_std, randomness.noise)
        ]

    def epsilon_after(self, steps_done: int) -> float:
        """ε spent after ``steps_done`` steps, by the plan's own accountant."""
        if steps_done < 1:
            return 0.0
        return epsilon_for(
            self.noise_multiplier, self.delta, self.sample_rate, steps_done, self.accountant
        ).epsilon

    def guarantee(
        self,
        *,
        mechanism: str,
        details: dict | None = None,
        assumptions: Sequence[str] = (),
        steps_done: int | None = None,
    ) -> Guarantee:
        """The guarantee of the run after ``steps_done`` (default: all planned) steps."""
        steps = self.steps if steps_done is None else steps_done
        final = epsilon_for(self.noise_multiplier, self.delta, self.sample_rate, steps, self.accountant)
        return Guarantee(
            epsilon=final.epsilon,
            delta=self.delta,
            unit=self.unit,
            mechanism=mechanism,
            accountant=final.accountant,
            details={
                "noise_multiplier": self.noise_multiplier,
                "sample_rate": self.sample_rate,
                "steps": steps,
                "sensitivity": self.sensitivity,
                "noise_std": self.noise_std,
                "expected_batch_size": self.expected_batch_size,
                "max_batch_size": self.batch_cap,
                "num_units": self.num_units,
                "target_epsilon": self.target_epsilon,
                "accountant_delta": self.delta,
                "accountant_fallback": final.fallback_reason or self.fallback_reason,
                **(details or {}),
            },
            note=UNIT_NOTES[self.unit]
            + "; "
            + (
                "an over-full Poisson batch (more than the cap) is replaced by an empty one"
                if self.batch_cap is not None
                else "no batch cap needed"
            ),
            assumptions=list(dict.fromkeys(a for a in assumptions if a)),
        )


def check_units_fit(units: PrivacyUnits, mechanism_name: str, supports_multi_row_units: bool) -> None:
    """Refuse a mechanism whose sensitivity proof assumes one row per unit on data where a query
    has several relevant documents."""
    if not supports_multi_row_units and units.max_rows > 1:
        if units.kind == "user":
            raise PrivacyError(
                f"--dp {mechanism_name} protects single (query, document) pairs and cannot protect a user "
                f"(a user here has up to {units.max_rows} pairs); use --dp sample, batch or group"
            )
        raise PrivacyError(
            f"--dp {mechanism_name} protects single (query, document) pairs, but a query in this data "
            f"has {units.max_rows} relevant documents; use --dp sample, batch or group, which protect "
            "a whole query"
        )
