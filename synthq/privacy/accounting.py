"""The accountants behind every ε: σ calibrated to a target ε, and a recorded ε recomputed.

A DP stage asks :func:`noise_multiplier_for` for the noise multiplier σ that meets its target ε, at
δ = 1/(2n) unless told otherwise (:func:`default_delta`; :func:`validate_budget` refuses budgets that
mean nothing), and reports the ε its accountant computes for the *actual* sampling rate, noise
multiplier and number of steps (:func:`epsilon_for`). synthq never trusts an ε it did not compute:
when an artifact is opened, every recorded ε is recomputed from the mechanism parameters its
guarantee records (:func:`recomputed_epsilon`, :func:`check_recorded_epsilon`), through the memo of
the accountant's answers (:mod:`synthq.privacy.memo`) so that opening stays instant.

The accountants are Opacus' ``rdp`` (Rényi DP) and ``prv`` (privacy random variables, tighter);
where PRV is unreliable (ε above :data:`PRV_EPSILON_LIMIT`, or it fails) RDP answers and the
fallback is recorded. Opacus (torch, scipy) is imported only when an accountant is called.
"""

from __future__ import annotations

import functools
import math
import warnings
from dataclasses import dataclass

from synthq.privacy.events import (
    Composed,
    NoisyMaxSelections,
    NotPrivate,
    Public,
    SampledGaussian,
    gaussian,
    release_event,
)
from synthq.privacy.guarantee import Guarantee
from synthq.runtime.errors import PrivacyError

ACCOUNTANTS = ("rdp", "prv")


# The largest δ synthq accepts at all: (ε, δ)-DP is allowed to publish a unit's data outright with
# probability δ, so above one in ten the statement means nothing whatever ε says (one
# private query trained at the default δ = 1/(2n) = 0.5 and printed "ε=8.00 δ=5.0e-01"). With the
# default δ = 1/(2n) it needs at least 5 privacy units; the embedded data and the test fixtures
# (17 queries, 9 users) are above it.
MAX_DELTA = 0.1


def default_delta(num_examples: int) -> float:
    """δ = 1/(2n): comfortably below the 1/n at which (ε, δ)-DP stops meaning anything."""
    if num_examples <= 0:
        raise PrivacyError("cannot choose δ for an empty dataset")
    return 1.0 / (2 * num_examples)


def validate_budget(epsilon: float, delta: float, num_examples: int | None = None) -> None:
    """Reject impossible budgets and meaningless ones, with a one-line error.

    The rule: δ must be in (0, 1), below 1/n (at δ ≥ 1/n "publish one unit in full" satisfies the
    definition) and at most :data:`MAX_DELTA` (a guarantee that may fail one time in ten is none).
    So a private split of fewer than 5 units is refused at the default δ = 1/(2n)."""
    if not (epsilon > 0):
        raise PrivacyError(f"ε must be > 0 (use 'inf' for non-private training), got {epsilon}")
    if math.isinf(epsilon):
        return
    if not (0 < delta < 1):
        raise PrivacyError(f"δ must be in (0, 1), got {delta}")
    if delta > MAX_DELTA:
        units = f" (n = {num_examples} privacy units)" if num_examples else ""
        raise PrivacyError(
            f"δ={delta:g}{units} is above {MAX_DELTA:g}: a guarantee that may publish a unit's data "
            "outright with probability δ means nothing; train on at least "
            f"{math.ceil(1 / (2 * MAX_DELTA))} privacy units (at the default δ = 1/(2n)) or pass a "
            "smaller --delta"
        )
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
) -> tuple[float, float]:
    """``(σ, ε)``: the σ whose RDP ε is in ``[target − tolerance, target]``, by bisection in log σ
    between the limits above (Opacus' ``get_noise_multiplier`` loops forever on a target above
    every reachable ε, and its absolute tolerance lets a target of 1e-6 end at a negative ε). The
    tolerance is at most 1 % of the target; the search stops after 200 halvings, returning the σ
    found (whose ε is ≤ the target).

    The bisection's comparisons read the vectorised sums of
    :mod:`synthq.privacy.sampled_gaussian` (milliseconds where Opacus takes 0.1–0.3 s), and
    Opacus' accountant wherever the two could disagree (within :func:`_guide_margin` of the
    target or of target − tolerance), so the search takes the steps it took with Opacus alone and
    ends at the same σ. That σ is then checked by Opacus' own functions
    (:func:`~synthq.privacy.sampled_gaussian.exact_epsilon`, an upper bound on the accountant's
    ε): above the target (never seen), the whole search is repeated on Opacus' accountant."""
    from synthq.privacy import sampled_gaussian

    try:
        sigma = _bisect_noise(target, delta, sample_rate, steps, tolerance, guided=True)
        epsilon = sampled_gaussian.exact_epsilon(sigma, delta, sample_rate, steps)
        if epsilon <= target:
            return sigma, epsilon
    except ImportError:  # Opacus' analysis module is not where it used to be: its accountant
        pass
    sigma = _bisect_noise(target, delta, sample_rate, steps, tolerance, guided=False)
    return sigma, _epsilon(sigma, delta, sample_rate, steps, "rdp")


def _guide_margin(target: float, steps: int) -> float:
    """How far the vectorised ε may be from Opacus' (measured: 1.4e-12 per step at most on the
    test grid; 10× that, and 1e-9 relative)."""
    return 1e-11 * steps + 1e-9 * max(1.0, target)


def _bisect_noise(
    target: float, delta: float, sample_rate: float, steps: int, tolerance: float, guided: bool
) -> float:
    from synthq.privacy.sampled_gaussian import fast_epsilon

    tolerance = min(tolerance, target / 100)
    margin = _guide_margin(target, steps)
    known: dict[float, float] = {}

    def epsilon(sigma: float) -> float:
        if sigma not in known:
            guide = fast_epsilon(sigma, delta, sample_rate, steps) if guided else math.nan
            near = abs(guide - target) <= margin or abs(guide - (target - tolerance)) <= margin
            exact = not guided or near or not math.isfinite(guide)
            known[sigma] = _epsilon(sigma, delta, sample_rate, steps, "rdp") if exact else guide
        return known[sigma]

    where = f"at δ={delta:g} with sampling rate {sample_rate:g} over {steps} steps"
    low, high = MIN_NOISE_MULTIPLIER, 10.0
    if epsilon(low) <= target:
        least = _epsilon(low, delta, sample_rate, steps, "rdp")  # printed: the accountant's own
        raise PrivacyError(
            f"ε={target:g} is beyond any meaningful guarantee {where} (the least noise synthq adds, "
            f"σ={MIN_NOISE_MULTIPLIER}, already gives ε={least:.4g}); use --epsilon inf to train "
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
    return _prv_or_rdp(noise_multiplier, delta, sample_rate, steps, rdp, lambda: rdp)


def _prv_or_rdp(
    noise_multiplier: float, delta: float, sample_rate: float, steps: int, rdp_guide: float, rdp_exact
) -> Calibration:
    """PRV's ε, or RDP's (``rdp_exact()``, the accountant's) where PRV is unreliable: its RDP ε
    (``rdp_guide``, the accountant's or the σ search's guide, which is exact near the limit)
    above :data:`PRV_EPSILON_LIMIT`, or PRV fails."""
    if rdp_guide > PRV_EPSILON_LIMIT:
        rdp = rdp_exact()
        reason = f"ε ≈ {rdp:.0f} is beyond PRV's reliable range (> {PRV_EPSILON_LIMIT:.0f})"
        return Calibration(noise_multiplier, rdp, "rdp", fallback_reason=reason)
    try:
        eps = _epsilon(noise_multiplier, delta, sample_rate, steps, "prv")
        if math.isfinite(eps):
            return Calibration(noise_multiplier, eps, "prv")
        reason = "PRV returned a non-finite ε"
    except (Exception, MemoryError) as error:  # PRV's domain errors at large ε
        reason = f"PRV failed ({type(error).__name__}: {error})"
    return Calibration(noise_multiplier, rdp_exact(), "rdp", fallback_reason=reason)


def _prv_search_epsilon(noise_multiplier: float, delta: float, sample_rate: float, steps: int) -> Calibration:
    """:func:`epsilon_for` with PRV, for the σ search: whether PRV answers is decided by the
    vectorised RDP ε (the accountant's within :func:`_guide_margin` of the limit), and the RDP ε
    of a fallback is the accountant's."""
    from synthq.privacy.sampled_gaussian import fast_epsilon

    guide = fast_epsilon(noise_multiplier, delta, sample_rate, steps)
    if not math.isfinite(guide) or abs(guide - PRV_EPSILON_LIMIT) <= _guide_margin(PRV_EPSILON_LIMIT, steps):
        guide = _epsilon(noise_multiplier, delta, sample_rate, steps, "rdp")
    return _prv_or_rdp(
        noise_multiplier, delta, sample_rate, steps, guide,
        lambda: _epsilon(noise_multiplier, delta, sample_rate, steps, "rdp"),
    )  # fmt: skip


def noise_multiplier_for(
    target_epsilon: float,
    delta: float,
    sample_rate: float,
    steps: int,
    accountant: str = "rdp",
    epsilon_tolerance: float = 0.01,
) -> Calibration:
    """The smallest noise multiplier (to within the tolerance) whose ε is ≤ ``target_epsilon``.

    RDP bisects in log σ (:func:`_rdp_noise_multiplier`, bounded where Opacus'
    ``get_noise_multiplier`` is not). PRV (tighter, so it needs less noise) searches below the
    RDP answer with PRV's accountant (:func:`_prv_search`), guarded against PRV's memory blow-up
    at large ε as :func:`epsilon_for` is. The returned ε is the accountant's for the returned σ
    (RDP: Opacus' functions at the orders that decide it, equal to what an independent
    accountant call gives; PRV: Opacus' PRV accountant). Every DP stage calibrates here once,
    before its first step.
    """
    validate_budget(target_epsilon, delta)
    _validate_accounting(sample_rate, steps, accountant)
    if math.isinf(target_epsilon):
        return Calibration(0.0, math.inf, accountant)
    sigma_rdp, rdp = _rdp_noise_multiplier(target_epsilon, delta, sample_rate, steps, epsilon_tolerance)
    if accountant == "rdp":
        return Calibration(sigma_rdp, rdp, "rdp")
    high = _prv_or_rdp(sigma_rdp, delta, sample_rate, steps, rdp, lambda: rdp)
    if high.accountant != "prv":
        return high
    return _prv_search(high, target_epsilon, delta, sample_rate, steps, epsilon_tolerance)


# PRV needs less noise than RDP: its σ search first tries this share of RDP's σ, then halves.
PRV_FIRST_STEP = 0.8


def _prv_search(
    high: Calibration, target: float, delta: float, sample_rate: float, steps: int, tolerance: float
) -> Calibration:
    """The least σ (within ``tolerance`` of the target ε, or 1e-4 of σ) whose PRV ε is ≤ the
    target, below ``high`` (RDP's σ, whose PRV ε is ≤ the target). Each probe is Opacus' PRV
    accountant; only a σ it puts at or below the target becomes ``high``, the answer. A bracket
    [low, high] is found by trying 0.8 × σ, then halving; it is then narrowed at the point where
    log ε, interpolated linearly in log σ between the bracket's ends, meets the middle of the
    tolerance window (regula falsi; a halving instead when the same end moved twice running, or
    an end has no PRV ε): about four PRV calls where halving alone took ten."""
    low_sigma, low_epsilon = high.noise_multiplier * PRV_FIRST_STEP, None
    for _ in range(7):  # find a σ whose PRV ε is above the target
        low = _prv_search_epsilon(low_sigma, delta, sample_rate, steps)
        if low.accountant != "prv" or low.epsilon > target:
            low_epsilon = low.epsilon if low.accountant == "prv" else None
            break
        high, low_sigma = low, low_sigma / 2
    high_sigma, last_side, repeats = high.noise_multiplier, "", 0
    aim = target - tolerance / 2
    while target - high.epsilon > tolerance and high_sigma - low_sigma > 1e-4:
        middle_sigma = (low_sigma + high_sigma) / 2
        if low_epsilon is not None and high.epsilon > 0 and aim > 0 and repeats < 2:
            share = math.log(low_epsilon / aim) / math.log(low_epsilon / high.epsilon)
            guess = math.exp(math.log(low_sigma) + share * math.log(high_sigma / low_sigma))
            margin = (high_sigma - low_sigma) / 50
            middle_sigma = min(max(guess, low_sigma + margin), high_sigma - margin)
        middle = _prv_search_epsilon(middle_sigma, delta, sample_rate, steps)
        if middle.accountant != "prv" or middle.epsilon > target:
            side, low_sigma = "low", middle.noise_multiplier
            low_epsilon = middle.epsilon if middle.accountant == "prv" else None
        else:
            side, high, high_sigma = "high", middle, middle.noise_multiplier
        repeats = repeats + 1 if side == last_side else 1
        last_side = side
    return high


def recomputed_epsilon(guarantee: Guarantee) -> float | None:
    """ε recomputed from the mechanism parameters the guarantee records (σ, q, steps, δ of the
    accountant), or the sum over ``details.components``; ``None`` when it records none (public,
    ε = ∞, post-processing copies carry their source's details and are recomputed the same way).

    Used when an artifact is opened, so that an edited ε in a manifest is refused. Chooses by the
    release's typed event (:func:`synthq.privacy.events.release_event`)."""
    match release_event(guarantee):
        case NotPrivate():  # computed from private data without DP: ∞ and nothing else
            return math.inf
        case Public():
            return 0.0
        case NoisyMaxSelections(epsilon_per_selection=epsilon, selections=selections):
            return epsilon * selections  # pure ε per selection, basic composition
        case Composed(parts=parts):
            epsilons = [_component_epsilon(part, guarantee.unit) for part in parts]
            return None if any(e is None for e in epsilons) else sum(epsilons)
        case SampledGaussian() as event if event.accountant in ACCOUNTANTS:
            return _cached_epsilon(
                event.noise_multiplier, event.delta, event.sample_rate, event.steps, event.accountant
            )
        case _:  # not private, or nothing recorded to recompute it from
            return None


def _component_epsilon(component: Guarantee, unit: str) -> float | None:
    """A composed part's ε at the composition's unit: a private user-level part composed at a weaker
    unit counts at its per-query ε, derived again here (∞ when it records no rule)."""
    if unit == "user" or component.unit != "user" or not component.is_private:
        return recomputed_epsilon(component)
    recorded = (component.details or {}).get("per_query")
    if not recorded:
        return math.inf
    derived = per_query(component, recorded.get("rule", ""))
    return None if derived is None else float(derived["epsilon"])


@functools.lru_cache(maxsize=256)
def _cached_epsilon(noise_multiplier: float, delta: float, sample_rate: float, steps: int, accountant: str):
    from synthq.privacy.memo import remembered

    return remembered(_accountant_epsilon, noise_multiplier, delta, sample_rate, steps, accountant)


def _group_of_two(sigma: float, delta: float, rate: float, steps: int) -> float:
    """Group privacy of 2 over the add/remove RDP guarantee, δ split in two (``group-of-2``)."""
    first = _cached_epsilon(sigma, delta / 2, rate, steps, "rdp")
    rest = delta / (2 * math.exp(first)) if first < 700 else 0.0
    return first + (_cached_epsilon(sigma, rest, rate, steps, "rdp") if rest > 0 else math.inf)


# The memo's tag for the replace-pair PLD; a new version of its algorithm takes a new tag.
SUBSTITUTION_MEMO_TAG = "poisson-substitution-pld-2"  # -1 could round losses above ~354 down


@functools.lru_cache(maxsize=256)
def remembered_substitution(noise_multiplier: float, delta: float, sample_rate: float, steps: int) -> float:
    """:func:`synthq.privacy.substitution.substitution_epsilon`, through the accountant's memo."""
    from synthq.privacy.memo import remembered

    return remembered(_substitution, noise_multiplier, delta, sample_rate, steps, SUBSTITUTION_MEMO_TAG)


def _substitution(noise_multiplier: float, delta: float, sample_rate: float, steps: int, _tag: str) -> float:
    from synthq.privacy.substitution import substitution_epsilon

    return substitution_epsilon(noise_multiplier, sample_rate, steps, delta)


def _accountant_epsilon(
    noise_multiplier: float, delta: float, sample_rate: float, steps: int, accountant: str
) -> float:
    return epsilon_for(noise_multiplier, delta, sample_rate, steps, accountant).epsilon


# The least ε a noisy-max release written by synthq spends: --select-epsilon ≥ 0.001 in total.
MIN_SELECTION_EPSILON = 0.999e-3  # (ε / k) · k may round below ε
# The mechanism parameters a Gaussian release records, checked as numbers before they are read.
_GAUSSIAN_DETAILS = ("noise_multiplier", "sample_rate", "steps")


def _check_gaussian_parameters(event: SampledGaussian, guarantee: Guarantee, refuse, *, sealed: bool) -> None:
    """A Gaussian release's recorded parameters (already finite numbers: :func:`_check_ranges`)
    must be in range, and, in a manifest sealed elsewhere, at a δ synthq would write: a δ near 1
    recomputes to ε = 0 from real σ, q and T."""
    if event.noise_multiplier <= 0 or not 0 < event.sample_rate <= 1 or event.steps < 0:
        refuse("a Gaussian release with σ ≤ 0, a sampling rate outside (0, 1] or negative steps")
    if not sealed and guarantee.delta > MAX_DELTA:
        refuse(f"δ = {guarantee.delta:g} is above {MAX_DELTA:g}, which synthq never writes")


def _check_ranges(guarantee: Guarantee, where: str, *, sealed: bool) -> None:
    """The ranges :func:`check_recorded_epsilon` requires, of ``guarantee`` and of its parts."""

    def refuse(why: str) -> None:
        raise PrivacyError(f"{where}: {why}; the manifest was edited or is corrupt")

    if math.isnan(guarantee.epsilon) or guarantee.epsilon < 0:
        refuse(f"ε = {guarantee.epsilon:g} is negative or not a number")
    if not 0 <= guarantee.delta <= 1:  # NaN fails this too
        refuse(f"δ = {guarantee.delta:g} is not in [0, 1]")
    details = guarantee.details or {}
    # before release_event reads them (int(steps) of ∞ raises; a NaN σ makes Opacus' RDP loop forever)
    raw = [details[k] for k in _GAUSSIAN_DETAILS if details.get(k) is not None]
    if any(isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x) for x in raw):
        refuse("a σ, sampling rate or step count that is not a finite number")
    if details.get("steps") is not None and details["steps"] != int(details["steps"]):
        refuse(f"{details['steps']} steps, not a whole number")
    event = release_event(guarantee)
    if isinstance(event, SampledGaussian):
        _check_gaussian_parameters(event, guarantee, refuse, sealed=sealed)
    if isinstance(event, Public) and not sealed:
        refuse("a release recorded as public in a manifest whose seal is not this installation's")
    if isinstance(event, NoisyMaxSelections) and (event.epsilon_per_selection < 0 or event.selections < 0):
        refuse("a noisy-max release with a negative ε per selection or count")
    if (
        isinstance(event, NoisyMaxSelections)
        and not sealed
        and not event.epsilon_per_selection * event.selections >= MIN_SELECTION_EPSILON
    ):
        # eval records no release when it chose nothing (every method had one candidate), and
        # --select-epsilon is at least 0.001 in total: a noisy-max release that spends less would
        # open at ε = 0.00 whatever the dev queries were read for
        refuse(
            "a noisy-max release that spends nothing (no selection or ε ≈ 0 each), which synthq never writes"
        )
    computed_at = float(details.get("accountant_delta", guarantee.delta))
    if isinstance(event, SampledGaussian) and not _same(computed_at, guarantee.delta):
        refuse(f"δ = {guarantee.delta:g} is not the δ its ε was computed at ({computed_at:g})")
    if isinstance(event, Composed):
        # compose_all writes a composition of two or more parts, none public; anything else could
        # state ε = 0 (no parts: an empty sum) or hide a part's cost behind a public label
        if len(event.parts) < 2 or any(part.mechanism == "public" for part in event.parts):
            refuse("a composition of fewer than two parts, or with a public part, which synthq never writes")
        for part in event.parts:  # each part in full: its ε and its per-query guarantee recomputed
            check_recorded_epsilon(part, f"{where} (a composed part)", sealed=sealed)
        _check_composition(guarantee, event, refuse)


def _check_composition(guarantee: Guarantee, event: Composed, refuse) -> None:
    """A composed release's unit and δ must be what basic composition of its parts gives
    (:func:`synthq.privacy.guarantee.compose_all`): the weakest part's unit, and the sum of the
    parts' δ, each user-level part at its per-query δ when the unit is weaker. Its ε is
    recomputed by :func:`recomputed_epsilon`; without this an edited record could state a
    stronger unit or a smaller δ than its parts give."""
    from synthq.privacy.guarantee import per_query_view, weakest_unit

    unit = weakest_unit([part.unit for part in event.parts])
    if guarantee.unit != unit:
        refuse(f"a composition stated per {guarantee.unit} whose parts give per {unit}")
    counted = [per_query_view(part) for part in event.parts] if unit != "user" else list(event.parts)
    if all(part.is_private for part in counted):
        delta = sum(part.delta for part in counted)
        if not _same(delta, guarantee.delta):
            refuse(f"a composition with δ = {guarantee.delta:g} whose parts' δ add to {delta:g}")


def _same(expected: float, recorded: float) -> bool:
    return expected == recorded or math.isclose(expected, recorded, rel_tol=1e-6, abs_tol=1e-9)


def check_recorded_epsilon(guarantee: Guarantee, where: str, *, sealed: bool) -> None:
    """Refuse a guarantee whose ε differs from what its recorded parameters give, and a user-level
    release whose per-query guarantee (``details.per_query``) is not what :func:`per_query` derives.

    Every guarantee, and each of its composed parts, must also be in range: ε ≥ 0, 0 ≤ δ ≤ 1, a
    noisy-max release's per-selection ε and count ≥ 0, and a Gaussian release's accountant δ equal
    to its δ (synthq writes them equal; an edited δ beside an ε computed at another one would print
    a guarantee nobody computed).

    ``sealed=False`` (a manifest whose seal this installation cannot verify: written elsewhere,
    or edited without the key) also refuses a private guarantee that records nothing to recompute
    its ε from (its ε would be read, not recomputed, so such a manifest could claim any ε), and a
    release recorded as public (synthq records a public input as an assumption, never as a
    release: a release relabelled public would open at ε = 0). ``sealed`` has no default: a
    caller says which check it wants."""
    _check_ranges(guarantee, where, sealed=sealed)
    expected = recomputed_epsilon(guarantee)
    gaussian = isinstance(release_event(guarantee), SampledGaussian)
    if not sealed and gaussian and expected is not None and expected <= 0:
        # the accountant clamps at 0 only where δ is large for σ, q and T (an edited δ within 0.1
        # gets a real release there); a run synthq writes (δ ≤ 1/(2n)) never recomputes to 0
        raise PrivacyError(
            f"{where}: a Gaussian release whose recorded parameters recompute to ε = 0, which prints "
            "as 0.00; synthq refuses a foreign private release it would print as public"
        )
    if expected is None and guarantee.is_private and not sealed:
        raise PrivacyError(
            f"{where}: the recorded ε = {guarantee.epsilon:g} ({guarantee.mechanism}) comes with no "
            "mechanism parameters to recompute it from (σ, sampling rate, steps and a known "
            "accountant, or its parts'); synthq refuses an ε it cannot recompute: the manifest was "
            "edited, is corrupt or was not written by synthq, and its seal is not this installation's"
        )
    if expected is not None and not _same(expected, guarantee.epsilon):
        raise PrivacyError(
            f"{where}: the recorded ε = {guarantee.epsilon:g} does not match its mechanism's "
            f"parameters (the accountant gives {expected:g}); the manifest was edited or is corrupt"
        )
    recorded = (guarantee.details or {}).get("per_query")
    if recorded is None:
        return
    derived = per_query(guarantee, recorded.get("rule", ""))
    if not sealed and derived is not None and float(derived["epsilon"]) <= 0:
        raise PrivacyError(
            f"{where}: a user-level release whose per-query ε = {derived['epsilon']:g} prints as 0.00; "
            "synthq refuses a foreign private release it would print as public"
        )
    if derived is None or not (
        _same(float(derived["epsilon"]), float(recorded.get("epsilon", math.nan)))
        and _same(float(derived["delta"]), float(recorded.get("delta", math.nan)))
        and derived["rule"] == recorded.get("rule")
    ):
        shown = "does not apply" if derived is None else f"derives {derived['epsilon']:g}"
        raise PrivacyError(
            f"{where}: the recorded per-query ε = {recorded.get('epsilon')} of a user-level release "
            f"does not match its mechanism's parameters (the rule {recorded.get('rule')!r} {shown}); "
            "the manifest was edited or is corrupt"
        )


# ---------------------------------------------------------------------------------------------
# A user-level guarantee seen per query (or per pair): derived for that neighbour, never assumed

# The rules by which a user-level release's per-query guarantee is derived (details.per_query.rule).
# "gaussian-substitution": Private Evolution's votes (no subsampling, q = 1): any change inside one
#   user's data moves that user's vote between two unit vectors with non-negative entries, so by
#   at most √2 (‖a − b‖² = 2 − 2⟨a, b⟩ ≤ 2); removing the user's last query moves it by 1. The
#   per-query ε is the Gaussian mechanism's at sensitivity √2 with the same noise: the accountant
#   at noise multiplier σ/√2, q = 1, the same T and δ (exact up to PRV's discretisation).
# "group-of-2": DP-SGD on users (Poisson-sampled, clipped so a user adds at most C). Removing one
#   of a user's queries is NOT the removal of a unit: with weights 1/k the user's other rows are
#   reweighted, and with --max-queries-per-user K a dropped query may be promoted into the kept K.
#   Either way the user's contribution is *replaced*, whether or not K truncated anything (which
#   is private and not asked). A replacement D → D' is two add/remove steps D → D∖{u} → D', so
#   group privacy of 2 over the add/remove guarantee bounds it: if M is (ε₁, δ₁)- and
#   (ε₂, δ₂)-DP for add/remove neighbours, it is (ε₁ + ε₂, δ₁ + e^{ε₁} δ₂)-DP for D, D'. synthq
#   takes δ₁ = δ/2 and δ₂ = δ/(2 e^{ε₁}), so the per-query guarantee keeps the release's δ, and
#   computes ε₁, ε₂ with Opacus' RDP accountant, whose bound on the sampled Gaussian holds in both
#   directions (adding and removing a unit; Mironov, Talwar and Zhang 2019), for the release's
#   own σ, q and T. It is a sound upper bound, far from tight; releases written before
#   "poisson-substitution" carry it, and it stays valid for them.
# "poisson-substitution": the same neighbour, accounted directly. When the user is sampled, the
#   noised sum is f(D∖u) + a on D and f(D∖u) + b on D' with ‖a‖, ‖b‖ ≤ the sensitivity the noise was
#   calibrated to; when not, both are f(D∖u). Per step that is dominated by the Poisson-subsampled
#   Gaussian *replace* pair, whose T-fold composition synthq.privacy.substitution bounds with a
#   pessimistic numerical privacy loss distribution. Removing a user's only query removes the user:
#   the add/remove ε (PRV, RDP where PRV fails). The per-query ε is the larger of the two, and never
#   more than "group-of-2" gives (both are bounds; the smaller is kept): 24.5 → 6.4 at the pylibs
#   generator's σ = 0.48, q = 0.046, T = 11.
PER_QUERY_RULES = ("gaussian-substitution", "group-of-2", "poisson-substitution")
# The mechanisms whose per-user sensitivity argument the √2 rule rests on (unit votes); a DP-SGD
# release claiming it would be unsound (a substitution moves a clipped sum by 2C, not √2·C).
GAUSSIAN_SUBSTITUTION_MECHANISMS = ("private-evolution",)
SUBSTITUTION_SENSITIVITY = math.sqrt(2.0)


def per_query(guarantee: Guarantee, rule: str) -> dict | None:
    """The per-query (and per-pair) guarantee of a private user-level release, derived by ``rule``
    (see :data:`PER_QUERY_RULES`) from the σ, q, T and δ it records; ``None`` when it records no
    mechanism parameters or the rule does not apply to it (the release then counts as ε = ∞ at
    the query unit, :func:`synthq.privacy.guarantee.compose_releases`)."""
    event = gaussian(guarantee)
    if guarantee.unit != "user" or event is None:
        return None
    sigma, rate, steps, delta = event.noise_multiplier, event.sample_rate, event.steps, event.delta
    votes = guarantee.mechanism.split(" ")[0] in GAUSSIAN_SUBSTITUTION_MECHANISMS
    if rule == "gaussian-substitution" and votes and rate == 1.0 and guarantee.accountant in ACCOUNTANTS:
        epsilon = _cached_epsilon(sigma / SUBSTITUTION_SENSITIVITY, delta, 1.0, steps, guarantee.accountant)
        note = (
            "per query: any change inside one user's data moves the user's unit vote by at most √2, "
            "so the Gaussian mechanism at sensitivity √2 with the same noise"
        )
    elif rule == "group-of-2":
        epsilon = _group_of_two(sigma, delta, rate, steps)
        note = (
            "per query: removing one query of a user replaces the user's clipped contribution (weights "
            "1/k; a query dropped by K may take its place), bounded by group privacy of 2 over the "
            "add/remove guarantee (RDP, δ split in two)"
        )
    elif rule == "poisson-substitution" and not votes:
        replaced = remembered_substitution(sigma, delta, rate, steps)
        removed = _cached_epsilon(sigma, delta, rate, steps, "prv")
        epsilon = min(max(replaced, removed), _group_of_two(sigma, delta, rate, steps))
        note = (
            "per query: removing one query of a user replaces the user's clipped contribution (weights "
            "1/k; a query dropped by K may take its place): the Poisson-subsampled Gaussian replace "
            "pair, by a pessimistic numerical privacy loss distribution; removing a user's only query "
            "removes the user (add/remove, PRV)"
        )
    else:
        return None
    return {"rule": rule, "epsilon": epsilon, "delta": delta, "note": note}
