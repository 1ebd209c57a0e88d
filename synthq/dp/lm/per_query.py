"""``per-query``: a generator's DP-SGD / DP-Adam with every pair clipped and a query's pairs
weighted ``1/k`` (the step: :mod:`synthq.dp.lm.step`)."""

from __future__ import annotations

from synthq.dp.engine import Mechanism, register_mechanism


@register_mechanism("per-query")
class PerQueryClipping(Mechanism):
    """DP-SGD / DP-Adam for a query generator: every training pair's gradient clipped, a query's
    pairs weighted so that the whole query contributes at most ``C``.

    Args:
        clip_norm: ``C``.

    Requirements:
        The loss is reduced per sequence (one value per pair) *before* clipping, so each pair's
        gradient is a function of that pair alone.

    Inputs:
        A Poisson sample of queries (:class:`~synthq.dp.privacy_units.PrivacyUnits`) expanded to their
        pairs, each with weight ``1/k`` (``k`` = the query's pair count).

    Privacy unit:
        One query id with all of its (document, query) pairs, add/remove adjacency; or, under
        ``--privacy-unit user``, one user with all the pairs of their (at most K) kept queries
        (:meth:`~synthq.dp.privacy_units.PrivacyUnits.by_user`): the same proof with ``k`` = the user's
        pair count, since every pair's loss reads only that pair.

    Sensitivity:
        ``C``. The released sum is ``Σ_i w_i · clip_C(∇ℓ_i)``. Adding or removing a query adds
        or removes its ``k`` terms, each of norm ≤ ``C/k``, and changes no other term (pair
        ``j``'s loss reads only pair ``j``): together ≤ ``C``. With one pair per query this is
        the usual per-example clipping of Abadi et al.

    References:
        Abadi et al., "Deep learning with differential privacy" (2016); Carranza et al., section 4.
    """

    sensitivity_rule = "C: a query's k pairs are clipped to C and weighted 1/k, together ≤ C"

    def __init__(self, clip_norm: float):
        self.clip_norm = clip_norm

    def sensitivity(self, batch_cap: int | None) -> float:
        return self.clip_norm
