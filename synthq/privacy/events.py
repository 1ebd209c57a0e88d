"""What a release's ε is computed from, typed: its accounting event.

A :class:`~synthq.privacy.guarantee.Guarantee` stores its mechanism's parameters as the JSON
``details`` of the manifest (the stored form, unchanged since the first manifests, so every
recorded fingerprint and seal stays valid). :func:`release_event` reads a guarantee into one of
the events below — the one reader for old and new manifests alike — so the accountant, the
re-accounting at other δ, μ and the statement's tables choose what to compute by the event's type
(dp-accounting's ``DpEvent`` classes are the anchor), not by mechanism names and key lookups.

* :class:`NotPrivate` — computed from private data without DP (ε = ∞);
* :class:`Public` — read nothing private (ε = 0);
* :class:`SampledGaussian` — T compositions of a Poisson-subsampled Gaussian mechanism (q = 1:
  no subsampling), accounted by Opacus' RDP or PRV accountant at the recorded δ;
* :class:`NoisyMaxSelections` — k report-noisy-max selections of pure ε each;
* :class:`Composed` — releases composed into one (``details.components``);
* :class:`Unaccounted` — a private guarantee that records none of the above (nothing to
  recompute it from).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from synthq.privacy.guarantee import Guarantee

GAUSSIAN_KEYS = ("noise_multiplier", "sample_rate", "steps")


@dataclass(frozen=True)
class NotPrivate:
    """Computed from private data without a DP mechanism: ε = ∞ whatever δ."""


@dataclass(frozen=True)
class Public:
    """Nothing private read: ε = 0."""


@dataclass(frozen=True)
class SampledGaussian:
    """``steps`` compositions of the Gaussian mechanism on a Poisson sample of rate
    ``sample_rate`` (1: every unit every step), noise std ``noise_multiplier`` × sensitivity.
    ``delta`` is the δ the accountant was run at; ``accountant`` is the recorded one (``rdp``,
    ``prv``; anything else cannot be recomputed)."""

    noise_multiplier: float
    sample_rate: float
    steps: int
    delta: float
    accountant: str
    sensitivity: float | None = None
    max_batch_size: int | None = None

    @property
    def subsampled(self) -> bool:
        return self.sample_rate != 1.0


@dataclass(frozen=True)
class NoisyMaxSelections:
    """``selections`` report-noisy-max selections, each ``epsilon_per_selection``-DP (pure ε)."""

    epsilon_per_selection: float
    selections: int


@dataclass(frozen=True)
class Composed:
    """Releases composed into one record (``details.components``)."""

    parts: tuple[Guarantee, ...]


@dataclass(frozen=True)
class Unaccounted:
    """A private guarantee whose record holds no mechanism parameters."""


Event = NotPrivate | Public | SampledGaussian | NoisyMaxSelections | Composed | Unaccounted


def release_event(guarantee: Guarantee) -> Event | None:
    """The guarantee's accounting event, read from its recorded ``details``; ``None`` for a
    non-private guarantee that is neither a read without DP nor public (nothing to account)."""
    from synthq.privacy.guarantee import Guarantee

    details = guarantee.details or {}
    if guarantee.mechanism == "none":
        return NotPrivate()
    if guarantee.mechanism == "public":
        return Public()
    if not guarantee.is_private:
        return None
    if guarantee.mechanism == "report-noisy-max":  # without its two numbers: KeyError, a malformed record
        return NoisyMaxSelections(float(details["epsilon_per_selection"]), int(details["selections"]))
    if "components" in details:
        return Composed(tuple(Guarantee.from_manifest(c) for c in details["components"]))
    if not all(key in details for key in GAUSSIAN_KEYS):
        return Unaccounted()
    sensitivity, cap = details.get("sensitivity"), details.get("max_batch_size")
    return SampledGaussian(
        noise_multiplier=float(details["noise_multiplier"]),
        sample_rate=float(details["sample_rate"]),
        steps=int(details["steps"]),
        delta=float(details.get("accountant_delta", guarantee.delta)),
        accountant=guarantee.accountant,
        sensitivity=float(sensitivity) if sensitivity is not None else None,
        max_batch_size=int(cap) if cap else None,
    )


def gaussian(guarantee: Guarantee) -> SampledGaussian | None:
    """The guarantee's sampled-Gaussian event, or ``None`` when it is another kind of release."""
    event = release_event(guarantee)
    return event if isinstance(event, SampledGaussian) else None
