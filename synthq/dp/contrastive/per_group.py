"""Per-group parameter gradients from ONE backward pass (book-keeping style).

Group clipping (DP-GCL) needs ``∇θ L_g`` for every group ``g`` of a batch. The groups' losses are
independent (a group's loss reads only its own members' embeddings), so all of them come out of
a single forward and a single backward pass over the whole batch: every layer with trainable
weights records its input ``x`` and, after ``autograd.grad(Σ_g L_g, outputs)``, its output
gradient ``δ``; a layer's weight gradient is a sum over rows (examples) and tokens of a product of
``δ`` and ``x``, so summing only the rows that belong to group ``g`` gives that group's gradient
exactly. This costs what one ordinary backward pass costs (the weight-gradient products are the
same flops, split by group) and keeps ``K`` gradient copies, one per group.

Supported layers (a small registry, as in Opacus' ``register_grad_sampler``): ``nn.Linear``,
``nn.Embedding`` and ``nn.LayerNorm`` — every trainable layer of BERT/MiniLM-style encoders — and
RMS norms that compute exactly ``F.rms_norm`` (Llama's, checked numerically once per type, as
:mod:`synthq.dp.lm.grad_samplers` does for Opacus): the encoders cut from SmolLM2. A
layer whose output does not carry the examples on dimension 0 (e.g. T5's relative attention bias)
raises :class:`UnsupportedLayer`; callers then fall back to one backward pass per group.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn

from synthq.dp.lm.grad_samplers import is_plain_rms_norm
from synthq.runtime.precision import as_fp32, full_precision


class UnsupportedLayer(RuntimeError):
    """The model has a trainable layer the one-pass per-group engine cannot attribute to rows."""


GroupGradient = Callable[[nn.Module, torch.Tensor, torch.Tensor, list[torch.Tensor]], dict]
REGISTRY: dict[type, GroupGradient] = {}


def register(layer_type: type) -> Callable[[GroupGradient], GroupGradient]:
    def decorator(function: GroupGradient) -> GroupGradient:
        REGISTRY[layer_type] = function
        return function

    return decorator


@register(nn.Linear)
def _linear(module: nn.Linear, x: torch.Tensor, delta: torch.Tensor, rows: list[torch.Tensor]) -> list[dict]:
    x = x.reshape(x.shape[0], -1, x.shape[-1])
    delta = delta.reshape(delta.shape[0], -1, delta.shape[-1])
    out = []
    for index in rows:
        xg = x[index].reshape(-1, x.shape[-1])
        dg = delta[index].reshape(-1, delta.shape[-1])
        grads = {"weight": dg.T @ xg}
        if module.bias is not None:
            grads["bias"] = dg.sum(0)
        out.append(grads)
    return out


@register(nn.Embedding)
def _embedding(
    module: nn.Embedding, ids: torch.Tensor, delta: torch.Tensor, rows: list[torch.Tensor]
) -> list[dict]:
    out = []
    for index in rows:
        token_ids = ids[index].reshape(-1)
        values = delta[index].reshape(-1, delta.shape[-1])
        if module.padding_idx is not None:  # autograd never updates the padding row
            keep = token_ids != module.padding_idx
            token_ids, values = token_ids[keep], values[keep]
        weight = torch.zeros_like(module.weight)
        weight.index_add_(0, token_ids, values.to(weight.dtype))
        out.append({"weight": weight})
    return out


@register(nn.LayerNorm)
def _layer_norm(
    module: nn.LayerNorm, x: torch.Tensor, delta: torch.Tensor, rows: list[torch.Tensor]
) -> list[dict]:
    normalised = F.layer_norm(x, module.normalized_shape, None, None, module.eps)
    dims = len(module.normalized_shape)
    out = []
    for index in rows:
        product = (delta[index] * normalised[index]).reshape(-1, *normalised.shape[-dims:])
        grads = {}
        if module.weight is not None:
            grads["weight"] = product.sum(0)
        if module.bias is not None:
            grads["bias"] = delta[index].reshape(-1, *normalised.shape[-dims:]).sum(0)
        out.append(grads)
    return out


def _rms_norm(
    module: nn.Module, x: torch.Tensor, delta: torch.Tensor, rows: list[torch.Tensor]
) -> list[dict]:
    eps = getattr(module, "variance_epsilon", getattr(module, "eps", 1e-6))
    product = F.rms_norm(x.float(), (x.shape[-1],), eps=eps).to(delta.dtype) * delta
    return [{"weight": product[index].reshape(-1, product.shape[-1]).sum(0)} for index in rows]


def rule_for(module: nn.Module) -> GroupGradient | None:
    """The module's per-group gradient rule; an RMS norm type is registered when its first module
    passes the numerical check."""
    rule = REGISTRY.get(type(module))
    if rule is None and type(module).__name__.lower().endswith("rmsnorm") and is_plain_rms_norm(module):
        rule = REGISTRY[type(module)] = _rms_norm
    return rule


class PerGroupGradients:
    """Hooks a model so that one backward pass yields every group's parameter gradient.

    Usage::

        engine = PerGroupGradients(model, parameters)
        with engine.record(query_groups):   # group id of every row of this forward call
            queries = encode(query_texts)
        with engine.record(doc_groups):
            docs = encode(doc_texts)
        per_group = engine.gradients(sum_of_group_losses, num_groups)   # [K][len(parameters)]

    ``Σ_g per_group[g]`` equals ``autograd.grad(sum_of_group_losses, parameters)`` (tested).

    Args:
        model: the encoder; every module owning a trainable parameter must be in :data:`REGISTRY`.
        parameters: the trainable parameters, in the order gradients are returned.
    """

    def __init__(self, model: nn.Module, parameters: list[nn.Parameter]):
        self.parameters = parameters
        self.position = {id(p): k for k, p in enumerate(parameters)}
        covered: set[int] = set()
        self._handles = []
        for module in model.modules():
            own = [p for p in module.parameters(recurse=False) if p.requires_grad]
            if not own:
                continue
            if rule_for(module) is None:
                self.close()
                raise UnsupportedLayer(f"no per-group gradient rule for {type(module).__name__}")
            covered.update(id(p) for p in own)
            self._handles.append(module.register_forward_hook(self._hook))
        missing = [k for k, p in enumerate(parameters) if id(p) not in covered]
        if missing:
            self.close()
            raise UnsupportedLayer(f"{len(missing)} trainable parameters are outside the model's layers")
        self._rows: torch.Tensor | None = None
        self._calls: list[tuple[nn.Module, torch.Tensor, torch.Tensor, torch.Tensor]] = []

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def _hook(self, module, inputs, output):
        if self._rows is None:
            return None
        x = inputs[0]
        examples = self._rows.shape[0]
        if output.shape[0] == 1 and examples > 1 and x.shape[0] == 1:
            # A layer shared across rows by broadcasting (BERT's position embeddings): expanding
            # its output keeps the forward identical but gives every row its own gradient.
            output = output.expand(examples, *output.shape[1:])
            x = x.expand(examples, *x.shape[1:])
        if output.shape[0] != examples or x.shape[0] != examples:
            raise UnsupportedLayer(
                f"{type(module).__name__} output of shape {tuple(output.shape)} does not hold the "
                f"{examples} examples on dimension 0"
            )
        self._calls.append((module, x, output, self._rows))
        return output

    @contextmanager
    def record(self, groups: torch.Tensor) -> Iterator[None]:
        """Record the forward passes made inside; row ``r`` belongs to group ``groups[r]``."""
        self._rows = groups
        try:
            yield
        finally:
            self._rows = None

    def discard(self) -> None:
        self._calls = []

    def gradients(
        self,
        loss: torch.Tensor,
        num_groups: int,
        groups: torch.Tensor | None = None,
        into: list[list[torch.Tensor]] | None = None,
        keep: bool = False,
    ) -> list[list[torch.Tensor]]:
        """Every group's gradient of ``loss``: ``[num_groups][len(parameters)]``.

        ``groups`` replaces the group ids recorded with every forward pass (rows whose id is
        outside ``range(num_groups)`` belong to no group); ``into`` receives the gradients in
        place (one list of tensors per group) instead of new zero tensors; ``keep`` keeps the
        records and the graph for another call (other losses or groups on the same forward)."""
        calls = self._calls
        if not keep:
            self._calls = []
        if into is None:
            into = [[torch.zeros_like(p) for p in self.parameters] for _ in range(num_groups)]
        per_group = into
        if not calls:
            return per_group
        deltas = torch.autograd.grad(
            loss, [output for _, _, output, _ in calls], allow_unused=True, retain_graph=keep
        )
        names = {}
        # the recorded activations still carry the forward graph; under bf16 autocast they and
        # the output gradients are bf16: each group's gradient is formed in fp32 from them
        with torch.no_grad(), full_precision():
            for (module, x, _, recorded), delta in zip(calls, deltas, strict=True):
                if delta is None:  # an output that does not reach the loss (BERT's unused pooler)
                    continue
                owner = recorded if groups is None else groups
                rows = [torch.nonzero(owner == g).flatten() for g in range(num_groups)]
                if module not in names:
                    names[module] = dict(module.named_parameters(recurse=False))
                rule = REGISTRY[type(module)]
                for group, grads in enumerate(rule(module, as_fp32(x.detach()), as_fp32(delta), rows)):
                    for name, value in grads.items():
                        parameter = names[module][name]
                        if id(parameter) in self.position:
                            per_group[group][self.position[id(parameter)]].add_(value.to(parameter.dtype))
        return per_group
