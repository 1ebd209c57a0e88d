"""``per-user``: a generator's DP-SGD / DP-Adam at the user level, each user's combined gradient
clipped (the step: :mod:`synthq.dp.lm.step`)."""

from __future__ import annotations

from synthq.dp.engine import Mechanism, register_mechanism

USER_CLIPPING = ("per-example", "per-user")


@register_mechanism("per-user")
class PerUserClipping(Mechanism):
    """DP-SGD / DP-Adam for a query generator at the user level, clipping each user's *combined*
    gradient (user-level sampling with per-user clipping, "ULS" in Charles et al.).

    Args:
        clip_norm: ``C``.

    Inputs:
        A Poisson sample of users (:meth:`~synthq.dp.privacy_units.PrivacyUnits.by_user`), each brought
        whole into one micro-batch with its rows weighted ``1/k``.

    Privacy unit:
        One user with all the pairs of their (at most K) kept queries, add/remove adjacency.

    Sensitivity:
        ``C``. The released sum is ``Σ_u min(1, C/‖G_u‖) G_u`` with
        ``G_u = Σ_{i∈u} w_i ∇ℓ_i``: adding or removing a user adds or removes one term of norm
        ≤ ``C`` and changes no other (pair ``j``'s loss reads only pair ``j``, and a user's
        factor reads only their own rows). Unlike per-example clipping weighted ``1/k``
        (:class:`PerQueryClipping`), a user whose rows agree keeps up to ``C`` of signal instead
        of ``C/k`` per row, and rows that disagree can cancel before the clip.

    References:
        Charles et al., "Fine-tuning large language models with user-level differential privacy"
        (2024); Chua et al., "Mind the privacy unit!" (2024).
    """

    sensitivity_rule = "C: a user's rows are summed (weighted 1/k) and the sum clipped to C"

    def __init__(self, clip_norm: float):
        self.clip_norm = clip_norm

    def sensitivity(self, batch_cap: int | None) -> float:
        return self.clip_norm
