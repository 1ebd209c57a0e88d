"""Per-group parameter gradients from ONE backward pass (book-keeping style).

Group clipping (DP-GCL) needs ``∇θ L_g`` for every group ``g`` of a batch. The groups' losses are
independent (a group's loss reads only its own members' embeddings), so all of them come out of
a single forward and a single backward pass over the whole batch: every layer with trainable
weights records its input ``x`` and, after ``autograd.grad(Σ_g L_g, outputs)``, its output
gradient ``δ``; a layer's weight gradient is a sum over rows (examples) and tokens of a product of
``δ`` and ``x``, so summing only the rows that belong to group ``g`` gives that group's gradient
exactly. This costs what one ordinary backward pass costs (the weight-gradient products are the
same flops, split by group) and keeps ``K`` gradient copies, one per group.

Supported layers: those of the one registry of layer rules (:mod:`synthq.dp.layer_rules`),
``nn.Linear``, ``nn.Embedding`` and ``nn.LayerNorm`` — every trainable layer of BERT/MiniLM-style
encoders — and RMS norms that compute exactly ``F.rms_norm`` (the encoders cut from SmolLM2). A
layer whose output does not carry the examples on dimension 0 (e.g. T5's relative attention bias)
raises :class:`UnsupportedLayer`; callers then fall back to one backward pass per group.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

from synthq.dp.layer_rules import REGISTRY, rule_for
from synthq.runtime.precision import as_fp32, full_precision


class UnsupportedLayer(RuntimeError):
    """The model has a trainable layer the one-pass per-group engine cannot attribute to rows."""


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
