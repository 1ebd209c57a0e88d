"""The DP engine: the privacy rules of every synthq training run, in one place.

A DP run (the generator's DP-SGD/DP-Adam in :mod:`synthq.dp.lm.step`, the retriever baselines in
:mod:`synthq.dp.contrastive`) is the sampled Gaussian mechanism of Abadi et al. (2016), repeated:

1. **Privacy units.** Training pairs are grouped by unit (:class:`~synthq.dp.privacy_units.PrivacyUnits`):
   a query with all of its (query, document) pairs, or at ``--privacy-unit user`` a user with all
   of their kept queries' pairs (at most K). ``n`` counts units, δ defaults to ``1/(2n)``.
2. **Poisson sampling** of units at ``q = B / n`` (:func:`~synthq.dp.privacy_units.poisson_units`), with
   the secret randomness of :class:`~synthq.dp.noise.SecretRandomness`. A mechanism whose
   sensitivity grows with the batch gets a cap ``B_max``; a batch over the cap is replaced by an
   *empty* batch (see :func:`~synthq.dp.privacy_units.poisson_units`), so no tail probability is added
   to δ.
3. **A clipped sum** computed by a registered mechanism (:func:`register_mechanism`), which
   states its sensitivity ``Δ`` (the most the sum can move when one unit is added or removed)
   and proves it in its docstring.
4. **Noise once**: ``N(0, (σΔ)²)`` on every coordinate of the sum
   (:func:`~synthq.dp.noise.add_noise`), divided by the expected batch ``q n``; the optimizer's
   update is post-processing. All gradient noise goes through :meth:`PrivacyPlan.privatize`.

:class:`PrivacyPlan` turns (n, B, steps, ε, δ, accountant, mechanism) into ``q``, σ (calibrated by
Opacus' accountant for exactly those ``q`` and steps), the batch cap, and the :class:`Guarantee`
whose ε the same accountant recomputes — the progress bar, the manifest and ``synthq info`` all
report ε from this one object.

Secret randomness (:mod:`synthq.dp.noise`): sampling and noise are drawn from the operating
system's secure randomness unless a reproducible ``seed`` is asked for, in which case the
guarantee says that an adversary who knows the seed is not covered. The secret state lives only
in private checkpoints (for ``--resume``), never in a released file.
"""

from __future__ import annotations

import abc
import importlib
import inspect
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import torch

from synthq.dp.noise import SecretRandomness, add_noise
from synthq.dp.privacy_units import PrivacyUnits, batch_cap, poisson_units
from synthq.privacy.accounting import (
    default_delta,
    epsilon_for,
    noise_multiplier_for,
    per_query,
    validate_budget,
)
from synthq.privacy.guarantee import UNIT_NOTES, Guarantee
from synthq.runtime.console import warn
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
    # How a user-level run's guarantee is derived per query (one of
    # synthq.privacy.accounting.PER_QUERY_RULES): the subsampled Gaussian's replace pair, which every
    # Poisson-sampled clipped sum satisfies, unless the mechanism proves less.
    per_query_rule: ClassVar[str] = "poisson-substitution"
    # Whether the sensitivity proof covers a unit of several rows (a query with several relevant
    # documents, a user with several queries); :func:`check_units_fit` refuses data that needs it.
    supports_multi_row_units: ClassVar[bool] = True

    @abc.abstractmethod
    def sensitivity(self, batch_cap: int | None) -> float:
        """The most the clipped sum can move when one unit is added or removed (batch ≤ cap)."""

    def describe(self) -> dict:
        """Extra accounting inputs for the guarantee's details."""
        return {}

    def advice(self, batch_cap: int | None) -> str | None:
        """A warning for settings where this mechanism gains nothing over a simpler one, or None."""
        return None


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
    "synthq.dp.lm.per_query",
    "synthq.dp.lm.per_user",
    "synthq.dp.contrastive.batch",
    "synthq.dp.contrastive.group",
    "synthq.dp.contrastive.sample",
    "synthq.dp.contrastive.logit",
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


def planned_steps(num_units: int, batch_size: int, epochs: float, max_steps: int | None) -> int:
    """Logical steps: ``epochs / q`` with ``q = B / n`` (capped by ``max_steps``), at least one."""
    steps = math.ceil(epochs * num_units / batch_size)
    if max_steps is not None:
        steps = min(steps, max_steps)
    return max(steps, 1)


def noise_to_signal(noise_multiplier: float, expected_batch_size: float) -> float:
    """σ / B: the noise-to-signal ratio of one DP step (McKenna et al., ICML 2025: the quantity
    that governs DP training). The optimizer receives the mean of B clipped unit gradients, whose
    norm is at most the clipping norm C (every unit pointing the same way), plus Gaussian noise of
    standard deviation σC/B in every coordinate. In the direction of the true gradient the noise's
    standard deviation is therefore at least σ/B times the largest possible signal; over d
    coordinates its norm is about √d times that."""
    return noise_multiplier / expected_batch_size


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
    per_query_rule: str = "poisson-substitution"

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
                f"the batch size {expected_batch_size} is larger than the {num_units} privacy units "
                f"({'queries' if unit == 'query' else unit + 's'}): pass --batch-size {num_units} or less "
                "(finetune-lm: --batch-size auto chooses one; synthq plan compares them)"
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
            per_query_rule=mechanism.per_query_rule,
        )

    @classmethod
    def for_stage(
        cls, config, *, num_units: int, expected_batch_size: int, steps: int, mechanism: Mechanism, unit: str
    ) -> PrivacyPlan | None:
        """The plan a DP stage makes from its config's ε, δ and accountant: ``None`` at ε = ∞ (the
        stage trains without DP); a fall back from PRV to RDP is said in one warning."""
        if not math.isfinite(config.epsilon):
            return None
        plan = cls.create(
            num_units=num_units, expected_batch_size=expected_batch_size, steps=steps, epsilon=config.epsilon,
            delta=config.delta, accountant=config.accountant, mechanism=mechanism, unit=unit,
        )  # fmt: skip
        if plan.fallback_reason:
            warn(f"accountant: {plan.fallback_reason}; using RDP")
        return plan

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

    @property
    def gradient_noise_variance(self) -> float:
        """Φ = (σΔ / B)²: the per-coordinate variance of the noise in the gradient the optimizer
        receives (:meth:`privatize` divides the noisy sum by the expected batch B)."""
        return (self.noise_std / self.expected_batch_size) ** 2

    @property
    def noise_to_signal(self) -> float:
        """σ / B (:func:`noise_to_signal`)."""
        return noise_to_signal(self.noise_multiplier, self.expected_batch_size)

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
        guarantee = Guarantee(
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
        if self.unit != "user":
            return guarantee
        # A user-level release also states what it guarantees per query, derived for that neighbour
        # (recomputed on open like ε; used when it composes with query-level releases).
        derived = per_query(guarantee, self.per_query_rule)
        if derived is None:
            raise PrivacyError(f"no per-query guarantee for {mechanism} by {self.per_query_rule}")
        return guarantee.model_copy(update={"details": {**guarantee.details, "per_query": derived}})


def check_units_fit(units: PrivacyUnits, mechanism: Mechanism) -> None:
    """Refuse a mechanism whose sensitivity proof assumes one row per unit
    (:attr:`Mechanism.supports_multi_row_units`) on data where a unit has several rows."""
    if not mechanism.supports_multi_row_units and units.max_rows > 1:
        if units.kind == "user":
            raise PrivacyError(
                f"--dp {mechanism.name} protects single (query, document) pairs and cannot protect a user "
                f"(a user here has up to {units.max_rows} pairs); use --dp sample, batch or group"
            )
        raise PrivacyError(
            f"--dp {mechanism.name} protects single (query, document) pairs, but a query in this data "
            f"has {units.max_rows} relevant documents; use --dp sample, batch or group, which protect "
            "a whole query"
        )
