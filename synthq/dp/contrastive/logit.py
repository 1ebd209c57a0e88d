"""Logit-DP (Kong et al., "DP-SGD for non-decomposable objective functions"): clip the gradient of
every query–document similarity, not of every loss term.

The batch loss is ``L = Σ_i ℓ_i(Z_i)`` with logits ``Z_ij = cos(q_i, d_j) / T`` and
``ℓ_i = −log softmax(Z_i)_i``. By the chain rule ``∇L = Σ_ij (∂ℓ_i/∂Z_ij) ∇Z_ij``; Logit-DP
releases ``Σ_ij (∂ℓ_i/∂Z_ij) · clip_C(∇Z_ij)`` plus Gaussian noise (the paper's eq. 5).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from synthq.dp.contrastive.examples import Encode, Example
from synthq.dp.engine import Mechanism, register_mechanism
from synthq.models.encoder import features, functional_embedding
from synthq.runtime import distributed


def logit_dp_constants(batch_size: int, temperature: float) -> dict[str, float]:
    """``G1``, ``G2``, ``L`` of Theorem 4.2 for the in-batch softmax over ``cos / T`` with at most
    ``batch_size`` pairs, and the multiplier ``G1 + G2 + (n − 1)L`` of the clip norm.

    Logits lie in ``[−s, s]`` with ``s = 1/T``. With ``p = softmax(z)``,
    ``∂ℓ_i/∂z_j = p_j − 1[i = j]``, and for a batch of ``n`` pairs (pair ``n`` the one removed):

    * ``G1 = max Σ_j |∂ℓ_n/∂z_nj| = 2(1 − p_nn) ≤ 2(1 − p_min)``, where the smallest probability
      of a positive is ``p_min = 1 / (1 + (n − 1)e^{2s})`` (own logit −s, all others +s).
    * ``G2 = max Σ_{i<n} |∂ℓ_i/∂z_in| = Σ_{i<n} p_in ≤ (n − 1)p_max``, where the largest
      probability of one negative column is ``p_max = e^{2s} / (e^{2s} + n − 1)``.
    * ``L = max_i Σ_{j<n} |p_ij(n) − p_ij(n − 1)| = p_in ≤ p_max`` (dropping column ``n`` rescales
      the others by ``1/(1 − p_in)``, so the ℓ1 change is exactly ``p_in``).

    So ``Δ ≤ (2(1 − p_min) + 2(n − 1)p_max) · C``, increasing in ``n`` (hence the batch cap).
    The paper's Lemma 4.5 writes ``2(1 + (n − 2)p_n)`` by using one ``p_n`` for the positive of
    row ``n`` and the negatives of the other rows; they are different probabilities, and the
    worst cases differ (own logit low vs. column ``n`` high), so we bound each separately, which
    is ``2p_max·C`` larger. At ``T = 1`` the multiplier tends to ``2(1 + e²) ≈ 16.8`` however large
    the batch; at ``T = 0.05``, ``e^{40}`` makes ``p_max ≈ 1`` and it is ``≈ 2n``: no better than
    per-query clipping. Logit-DP only pays off with a temperature near 1.
    """
    n, s = batch_size, 1.0 / temperature
    if n <= 1:
        return {"G1": 0.0, "G2": 0.0, "L": 0.0, "multiplier": 0.0}
    # e^{2s} overflows for small T: write both probabilities with e^{-2s} instead.
    shrink = math.exp(-2 * s)
    p_min = shrink / (shrink + (n - 1))
    p_max = 1.0 / (1.0 + (n - 1) * shrink)
    g1, g2, lipschitz = 2 * (1 - p_min), (n - 1) * p_max, p_max
    return {"G1": g1, "G2": g2, "L": lipschitz, "multiplier": g1 + g2 + (n - 1) * lipschitz}


class _EagerAttention:
    """Eager attention while inside: torch has no vmap rule for SDPA's CPU kernels (it falls back
    to a loop over pairs), eager attention has. Re-entrant; restores the model's own setting."""

    def __init__(self, backbone: torch.nn.Module):
        self.backbone = backbone
        self.saved: list[str] = []

    def __enter__(self):
        self.saved.append(self.backbone.config._attn_implementation)
        self.backbone.set_attn_implementation("eager")
        return self

    def __exit__(self, *exc):
        self.backbone.set_attn_implementation(self.saved.pop())


@register_mechanism("logit")
class LogitClipping(Mechanism):
    """Logit-DP: per-pair similarity gradients ``∇Z_ij`` clipped to ``C``, weighted by the loss
    derivatives ``∂ℓ_i/∂Z_ij = p_ij − 1[i = j]`` and summed.

    Args:
        clip_norm: ``C``, the bound on every ``‖∇Z_ij‖`` (``Z_ij = cos / T``, the logit).
        temperature: ``T``.
        model: the encoder (``Transformer → Pooling(mean) [→ Normalize]``), for per-pair
            gradients with ``torch.func``.
        max_query_length, max_doc_length: truncation, as in the rest of training.
        pair_chunk: pairs whose full gradients are held at once (memory ``pair_chunk × params``).

    Requirements:
        No masking of duplicate documents: the bound needs every row to be a softmax over all
        ``n`` columns, so a second query of the same document is a (rare) false negative here.
        The encoder runs without dropout, so that the clipping weights and the per-pair
        gradients come from one function.

    Inputs:
        A Poisson-sampled list of :class:`~synthq.dp.contrastive.examples.Example` pairs.

    Privacy unit:
        One query, add/remove adjacency under Poisson sampling. The bound below is for queries
        with one relevant document; data where a query has several is refused
        (:func:`synthq.dp.engine.check_units_fit`).

    Sensitivity:
        ``max(G1 + G2 + (B − 1)L, B·G1) · C``. The first term is Theorem 4.2 / Corollary 4.3 of
        Kong et al. with constants from :func:`logit_dp_constants` for the temperature and the
        batch cap ``B``: removing pair ``n`` removes row ``n`` (≤ G1·C), column ``n`` of the
        other rows (≤ G2·C), and changes the weights of the remaining ``(n − 1)²`` terms by ≤ L
        per row, each term ≤ C. The second covers the batch cap: a batch of ``B + 1`` queries is
        replaced by an empty one, so a neighbour with exactly ``B`` may move the sum by its whole
        norm, ``Σ_i Σ_j |p_ij − 1[i = j]| · C = Σ_i 2(1 − p_ii) C ≤ B·G1·C``. ``G1 → 2``, so this
        term is about ``2B·C`` — at ``T = 1`` above per-query clipping's ``(2B − 1)C`` for every
        ``B``: with a privacy-preserving batch cap Logit-DP does not beat per-query clipping
        (cutting an over-full batch down instead would avoid this term only by adding
        ``(1 + e^ε)·η`` to δ, which synthq does not do).

    Recommendations:
        Cost: ``2n²`` single-text forward and backward passes per step (``n²`` per-pair
        gradients, vmapped in chunks), i.e. about ``2n×`` a non-private step, and the noise only
        beats per-query clipping when ``T`` is near 1. Practical on CPU to batches of ~8–16 with
        MiniLM; beyond, prefer ``group``. Ghost norms of ``∇Z_ij`` (the paper's section 5.3)
        would remove the ``n²`` full gradients but need every layer's cross terms.

    References:
        Kong et al., "DP-SGD for non-decomposable objective functions", Algorithm 1, Lemma 4.5.
    """

    needs_batch_cap = True
    supports_multi_row_units = False  # the pair-level proof: one (query, document) row per unit
    sensitivity_rule = (
        "max(G1+G2+(B-1)L, B*G1)C: Kong et al. Theorem 4.2 for cos/T, and the emptied over-full batch"
    )

    def __init__(
        self,
        clip_norm: float,
        temperature: float,
        model: torch.nn.Module,
        max_query_length: int = 128,
        max_doc_length: int = 384,
        pair_chunk: int = 16,
    ):
        if model is None:
            raise ValueError("logit clipping needs the encoder for per-pair gradients")
        self.clip_norm = clip_norm
        self.temperature = temperature
        self.model = model
        self.lengths = {"query": max_query_length, "doc": max_doc_length}
        self.pair_chunk = pair_chunk
        self.params, self.embedding = functional_embedding(model)
        self._eager = _EagerAttention(model[0].auto_model)

    def sensitivity(self, batch_cap: int | None) -> float:
        constants = logit_dp_constants(batch_cap, self.temperature)
        return max(constants["multiplier"], batch_cap * constants["G1"]) * self.clip_norm

    def describe(self) -> dict:
        return {"temperature": self.temperature}

    def advice(self, batch_cap: int | None) -> str | None:
        """Per-query clipping's sensitivity is (2B − 1)·C: at a low temperature Logit-DP's is no better."""
        per_query = (2 * batch_cap - 1) * self.clip_norm if batch_cap is not None else None
        if per_query is not None and self.sensitivity(batch_cap) >= per_query:
            return (
                f"at temperature {self.temperature} Logit-DP's sensitivity {self.sensitivity(batch_cap):.4g} "
                f"is no better than per-query clipping's {per_query:.4g} (batch cap {batch_cap}); it pays "
                "off only at temperatures of several units (cosine / T with T ≳ 2–5)"
            )
        return None

    def _inputs(self, texts: list[str], side: str) -> list[torch.Tensor]:
        tokens = features(self.model, texts, self.lengths[side])
        keys = ["input_ids", "attention_mask"] + (["token_type_ids"] if "token_type_ids" in tokens else [])
        return [tokens[k] for k in keys]

    def per_pair_gradients(self, queries: list[torch.Tensor], docs: list[torch.Tensor], pairs):
        """Full gradients ``∇Z_ij`` for the ``(i, j)`` in ``pairs``: ``{name: [len(pairs), ...]}``."""
        from torch.func import grad, vmap

        embedding, temperature, width = self.embedding, self.temperature, len(queries)

        def similarity(params, *tensors):
            query = F.normalize(embedding(params, *tensors[:width]), dim=-1)
            doc = F.normalize(embedding(params, *tensors[width:]), dim=-1)
            return (query * doc).sum() / temperature

        rows = torch.tensor([i for i, _ in pairs], device=queries[0].device)
        cols = torch.tensor([j for _, j in pairs], device=docs[0].device)
        detached = {name: p.detach() for name, p in self.params.items()}
        inputs = [t[rows] for t in queries] + [t[cols] for t in docs]
        with self._eager:
            return vmap(grad(similarity), in_dims=(None, *[0] * len(inputs)))(detached, *inputs)

    def clipped_sum(
        self, encode: Encode, batch: list[Example], parameters: list
    ) -> tuple[list[torch.Tensor], float]:
        from torch.func import vmap

        total = [torch.zeros_like(p) for p in parameters]
        if not batch:
            return total, math.nan
        position = {id(p): k for k, p in enumerate(parameters)}
        training = self.model.training
        self.model.eval()
        try:
            with self._eager:
                queries = self._inputs([e.query for e in batch], "query")
                docs = self._inputs([e.document for e in batch], "doc")
                detached = {name: p.detach() for name, p in self.params.items()}
                with torch.no_grad():
                    many = vmap(self.embedding, in_dims=(None, *[0] * len(queries)))
                    q = F.normalize(many(detached, *queries), dim=-1)
                    d = F.normalize(many(detached, *docs), dim=-1)
                    logits = q @ d.T / self.temperature
                    target = torch.arange(len(batch), device=logits.device)
                    weights = logits.softmax(dim=1) - torch.eye(
                        len(batch), device=logits.device
                    )  # ∂ℓ_i/∂Z_ij
                    loss = F.cross_entropy(logits, target).item()
                # under torchrun each rank takes its share of the n² pairs
                pairs = distributed.shard([(i, j) for i in range(len(batch)) for j in range(len(batch))])
                for start in range(0, len(pairs), self.pair_chunk):
                    chunk = pairs[start : start + self.pair_chunk]
                    gradients = self.per_pair_gradients(queries, docs, chunk)
                    squared = sum(g.pow(2).flatten(1).sum(1) for g in gradients.values())
                    factors = torch.clamp(self.clip_norm / (squared.sqrt() + 1e-12), max=1.0)
                    scale = factors * weights[[i for i, _ in chunk], [j for _, j in chunk]]
                    for name, g in gradients.items():
                        k = position.get(id(self.params[name]))
                        if k is not None:
                            total[k].add_(torch.tensordot(scale.to(g.dtype), g, dims=1))
        finally:
            self.model.train(training)
        distributed.all_reduce_sum(total)
        return total, loss
