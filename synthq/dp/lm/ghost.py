"""Ghost clipping's per-example norms and book-keeping for query generators, tied weights included.

Ghost clipping (Li et al., 2022; Bu et al., 2023) on the hooks of Opacus
``GradSampleModuleFastGradientClipping`` (:class:`TiedGhostClipping`): one backward pass that
computes layer output gradients only gives each example's gradient *norm*, layer by layer, from
activations and output gradients (``‖Σ_s g_s a_sᵀ‖² = Σ_{s,s'} (g_s·g_s')(a_s·a_s')`` for a
linear layer) without ever forming a per-example gradient; the clipped sum
``Σ_i min(1, C/‖∇ℓ_i‖) ∇ℓ_i`` is then one weighted matrix product per layer from the same records
(``Σ_{i,s} c_i g_{is} a_{is}ᵀ``) — no second backward.

Mixed ghost clipping (Bu et al., 2022): each Linear / Embedding layer takes whichever of the
ghost norm and an instantiated per-example gradient is cheaper for its shape and the batch's
sequence length (:func:`choose_norm_method`).

Tied weights (T5's ``shared`` used by the encoder, the decoder and ``lm_head``; SmolLM2's
``embed_tokens`` and ``lm_head``): each use is kept in factored form (activations and output
gradients) and the norm of their *sum* is computed exactly, cross terms included
(:func:`tied_squared_norms`), where Opacus itself refuses tied parameters;
:func:`unsupported_for_ghost` says when a model shares anything else.

The clipper that drives this module is :class:`synthq.dp.lm.hooks.GhostClipper`; privacy unit
and sensitivity are those of :mod:`synthq.dp.lm.per_query` (one pair; ``C``).
"""

from __future__ import annotations

from collections import Counter, defaultdict

import torch
from opacus.grad_sample import GradSampleModuleFastGradientClipping
from opacus.grad_sample.functorch import ft_compute_per_sample_gradient
from opacus.utils.module_utils import requires_grad
from torch import nn

from synthq.runtime.precision import as_fp32, full_precision


def tied_parameters(model: nn.Module) -> dict[int, nn.Parameter]:
    """Trainable parameters owned by more than one module (tied embeddings), by ``id``."""
    owners: Counter[int] = Counter()
    by_id = {}
    for module in model.modules():
        for parameter in module.parameters(recurse=False):
            if parameter.requires_grad:
                owners[id(parameter)] += 1
                by_id[id(parameter)] = parameter
    return {key: by_id[key] for key, count in owners.items() if count > 1}


def unsupported_for_ghost(model: nn.Module) -> list[str]:
    """Reasons ghost clipping cannot run exactly on ``model`` (empty = it can)."""
    tied = tied_parameters(model)
    problems = []
    for name, module in model.named_modules():
        own = [p for p in module.parameters(recurse=False) if p.requires_grad]
        if not any(id(p) in tied for p in own):
            continue
        if type(module) not in (nn.Linear, nn.Embedding) or len(own) != 1:
            problems.append(f"{name} ({type(module).__name__}) shares a parameter")
    return problems


def linear_per_sample_gradients(
    module: nn.Linear, activations: list[torch.Tensor], backprops: torch.Tensor
) -> dict[nn.Parameter, torch.Tensor]:
    """Per-example gradients of a Linear layer, ``∇W_i = Σ_s g_is a_isᵀ`` ``[b, out, in]`` (and the
    bias's ``Σ_s g_is``): Opacus' formula as one batched product laid out for the layer's shape.
    Opacus' ``einsum`` runs a LoRA adapter's ``B`` (``out`` = 576–1536, ``in`` = rank) about six
    times slower than ``[b, in, out]`` computed and read transposed; with ~30 tokens per example
    (query-only rows) these products were a quarter of a ghost DP step."""
    activation = activations[0].to(backprops.dtype)
    rows = backprops.shape[0]
    grad = backprops.reshape(rows, -1, backprops.shape[-1])
    activation = activation.reshape(rows, -1, activation.shape[-1])
    if grad.shape[-1] > activation.shape[-1]:
        weight = torch.bmm(activation.transpose(1, 2), grad).transpose(1, 2)
    else:
        weight = torch.bmm(grad.transpose(1, 2), activation)
    result = {}
    if module.weight.requires_grad:
        result[module.weight] = weight
    if module.bias is not None and module.bias.requires_grad:
        result[module.bias] = grad.sum(1)
    return result


def _factor(module: nn.Module, activation: torch.Tensor, backprop: torch.Tensor) -> tuple:
    """One use of a tied weight ``W [rows, cols]`` as per-example factors of its gradient.

    Linear ``y = x Wᵀ``: ``∇W = Σ_s g_s ⊗ x_s`` -> ``("linear", g [b,S,rows], x [b,S,cols])``.
    Embedding ``y = W[ids]``: ``∇W = Σ_t e_{ids_t} ⊗ g_t`` -> ``("embedding", ids [b,T], g [b,T,cols])``.
    """
    batch = backprop.shape[0]
    if isinstance(module, nn.Embedding):
        return "embedding", activation.reshape(batch, -1), backprop.reshape(batch, -1, backprop.shape[-1])
    return (
        "linear",
        backprop.reshape(batch, -1, backprop.shape[-1]),
        activation.to(backprop.dtype).reshape(batch, -1, activation.shape[-1]),
    )


def _inner(first: tuple, second: tuple) -> torch.Tensor:
    """Per-example Frobenius inner product ``⟨∇W¹_i, ∇W²_i⟩`` of two factored uses."""
    if first[0] == "embedding" and second[0] == "linear":
        first, second = second, first
    if first[0] == "linear" and second[0] == "linear":
        _, grad_a, act_a = first
        _, grad_b, act_b = second
        return (
            torch.einsum("bsv,btv->bst", grad_a, grad_b) * torch.einsum("bsd,btd->bst", act_a, act_b)
        ).sum((1, 2))
    if first[0] == "linear":  # linear × embedding: Σ_{s,t} g_s[ids_t] (x_s · h_t)
        _, grad, act = first
        _, ids, emb_grad = second
        picked = grad.gather(2, ids[:, None, :].expand(-1, grad.shape[1], -1))
        return (picked * torch.einsum("bsd,btd->bst", act, emb_grad)).sum((1, 2))
    _, ids_a, grad_a = first
    _, ids_b, grad_b = second
    same_row = ids_a[:, :, None] == ids_b[:, None, :]
    return (same_row * torch.einsum("btd,bud->btu", grad_a, grad_b)).sum((1, 2))


def tied_squared_norms(factors: list[tuple]) -> torch.Tensor:
    """``‖Σ_u ∇W^u_i‖²`` per example, exactly, from the factored uses (cross terms included)."""
    total = None
    for i, first in enumerate(factors):
        for j in range(i, len(factors)):
            term = _inner(first, factors[j]) * (1.0 if i == j else 2.0)
            total = term if total is None else total + term
    return total.clamp(min=0)


class GroupLayout:
    """Which examples of a micro-batch form one privacy unit, for per-unit clipping: the norm of a
    unit's weighted gradient ``‖Σ_{i∈u} w_i ∇ℓ_i‖`` is the norm of one "example" made of all its
    rows' tokens, each row's output gradients scaled by ``w_i``. For a linear layer,
    ``‖Σ_{i∈u} w_i Σ_s g_{is} a_{is}ᵀ‖² = Σ_{(i,s),(j,t)} w_i w_j (g_{is}·g_{jt})(a_{is}·a_{jt})``:
    the ghost norm over the unit's concatenated tokens, i.e. a per-unit Gram matrix across its
    rows (cross-row terms included).

    Args:
        groups: ``[b]``, example ``i``'s unit in ``0 .. U-1``.
        weights: ``[b]`` row weights ``w_i`` (``None``: 1).
    """

    def __init__(self, groups: torch.Tensor, weights: torch.Tensor | None = None):
        self.groups = groups
        self.weights = weights
        self.count = int(groups.max()) + 1 if groups.numel() else 0
        sizes = torch.bincount(groups, minlength=self.count)
        self.width = int(sizes.max()) if self.count else 0
        # index[u, j]: the j-th example of unit u, or b (a row of zeros) past the unit's size
        batch = groups.numel()
        order = torch.argsort(groups, stable=True)
        starts = torch.cumsum(sizes, 0) - sizes
        position = torch.arange(batch, device=groups.device) - starts[groups[order]]
        self.index = torch.full((self.count, self.width), batch, dtype=torch.long, device=groups.device)
        self.index[groups[order], position] = order

    def rows(self, tensor: torch.Tensor, scale: bool = False) -> torch.Tensor:
        """``[b, ...]`` -> ``[U, width, ...]``: each unit's examples side by side, zeros after the
        last (``scale``: each example multiplied by its weight first)."""
        if scale and self.weights is not None:
            tensor = tensor * self.weights.to(tensor.dtype).view(-1, *[1] * (tensor.dim() - 1))
        padded = torch.cat([tensor, tensor.new_zeros(1, *tensor.shape[1:])])
        return padded[self.index]

    def tokens(self, tensor: torch.Tensor, scale: bool = False) -> torch.Tensor:
        """``[b, T, ...]`` -> ``[U, width·T, ...]`` (a ``[b, d]`` input -> ``[U, width, d]``): one
        sequence per unit, its rows' tokens concatenated. Padding rows are zeros (id 0 for an
        embedding's ids, whose output gradients are zeros there)."""
        grouped = self.rows(tensor, scale)
        return grouped if tensor.dim() == 2 and tensor.is_floating_point() else grouped.flatten(1, 2)

    def sums(self, per_example: torch.Tensor) -> torch.Tensor:
        """``[b, *shape]`` -> ``[U, *shape]``: ``Σ_{i∈u} w_i x_i``."""
        return self.rows(per_example, scale=True).sum(1)


NORM_METHODS = ("auto", "ghost", "instantiate")


def choose_norm_method(tokens: int, rows: int, columns: int, embedding: bool = False) -> str:
    """``ghost`` or ``instantiate`` for one layer's per-example gradient norm (mixed ghost clipping,
    Bu et al.), from the cost of each for a weight of ``rows × columns`` used at ``tokens``
    positions per example (Linear: ``rows × columns = out × in``; Embedding: ``vocabulary × dim``).

    Per example, with ``T = tokens``, ``p = rows``, ``d = columns``:

    * ghost: norm ``T²(d + p)`` flops from the ``[T, T]`` Gram matrices of output gradients and
      activations; the clipped sum later costs one ``T·d·p`` product from the recorded
      activations and output gradients, which are kept until the update (``T(d + p)`` numbers);
    * instantiate: the per-example gradient ``[p, d]`` costs ``T·d·p`` flops and ``d·p`` numbers;
      its norm is read off it, and it is kept, so the clipped sum is a weighted sum over the
      batch (``d·p``) and the records can be dropped.

    Instantiating is chosen when it keeps no more numbers than ghost's records
    (``d·p ≤ T(d + p)``); it is then also the faster of the two (``T²(d + p) ≥ d·p``). LoRA
    adapters (``d·p = 576·16`` at ``T ≈ 150`` in SmolLM2) instantiate; full-rank layers of a
    ~100-token batch (``d·p = 576·1536``) keep ghost norms, whose records cost less memory than
    ``b`` gradient copies (where ghost's extra ``T²(d + p)`` flops are what the memory saves).

    An embedding's records are its ``T`` ids and ``T × d`` output gradients and its ghost norm
    costs about as much (Opacus sorts the ids), so a table is instantiated only when
    ``vocabulary · d ≤ T(d + 1)``: tiny tables such as T5's relative-position buckets."""
    kept = tokens * (columns + 1) if embedding else tokens * (rows + columns)
    return "instantiate" if rows * columns <= kept else "ghost"


class TiedGhostClipping(GradSampleModuleFastGradientClipping):
    """Opacus' ghost-clipping hooks with book-keeping, a per-layer choice of norm method, and
    exact norms for tied parameters.

    During the single backward pass each trainable layer's hook computes its per-example
    gradient norms and keeps what the clipped sum needs:

    * ``Linear`` / ``Embedding`` layers use :func:`choose_norm_method` (or ``norm_method`` when it
      is forced): ghost norms (Opacus' norm samplers) keep the layer's input activations and
      output gradients; instantiated ones keep the per-example gradients ``[b, *shape]`` only;
    * small layers (RMS/layer norms, T5's relative bias) instantiate through their grad samplers;
    * shared weights keep every use in factored form (:func:`tied_squared_norms`).

    :meth:`clipped_gradients` then forms ``Σ_i c_i ∇_W ℓ_i`` from those records (book-keeping,
    Bu et al. 2023), so no second backward pass is needed. :attr:`methods` says which method each
    layer used in the last backward pass."""

    def __init__(self, model: nn.Module, max_grad_norm: float, norm_method: str = "auto"):
        if norm_method not in NORM_METHODS:
            raise ValueError(f"norm_method must be one of {NORM_METHODS}, not {norm_method!r}")
        self.norm_method = norm_method
        self._tied = tied_parameters(model)
        self._tied_modules = {
            id(m) for m in model.modules() for p in m.parameters(recurse=False) if id(p) in self._tied
        }
        self._names = {id(m): name for name, m in model.named_modules()}
        self._factors: dict[int, list[tuple]] = defaultdict(list)
        self._records: list[tuple[nn.Module, list[torch.Tensor], torch.Tensor]] = []
        self._instantiated: list[dict[nn.Parameter, torch.Tensor]] = []
        self._grams: dict[tuple, torch.Tensor] = {}  # a a^T of inputs shared by several layers
        self.methods: dict[str, str] = {}
        self.layout: GroupLayout | None = None  # per-unit clipping: norms of units, not examples
        super().__init__(
            model,
            batch_first=True,
            loss_reduction="sum",
            strict=False,
            max_grad_norm=max_grad_norm,
            use_ghost_clipping=True,
        )

    def reset(self) -> None:
        self._factors.clear()
        self._records.clear()
        self._instantiated.clear()
        self._grams.clear()
        for parameter in self.trainable_parameters:
            parameter._norm_sample = None

    def capture_activations_hook(self, module, forward_input, forward_output):
        if not (requires_grad(module) and module.training and torch.is_grad_enabled() and self.hooks_enabled):
            return
        if not hasattr(module, "activations"):
            module.activations = []
        module.activations.append([t.detach() for t in forward_input])

    def capture_backprops_hook(self, module, forward_input, forward_output, loss_reduction, batch_first):
        if not self.hooks_enabled:
            return
        with full_precision():
            self._capture_backprops(module, forward_output, loss_reduction, batch_first)

    def _capture_backprops(self, module, forward_output, loss_reduction, batch_first) -> None:
        """One layer's per-example norms (or gradients) and records. Under bf16 autocast the inputs
        and output gradients are bf16: the records keep them so (half the memory), and the norms
        here and the clipped sum later are both computed in fp32 from exact fp32 conversions of
        those same records, so each example's contribution is clipped by the norm of exactly the
        vector that is summed (:mod:`synthq.runtime.precision`)."""
        activations, recorded = self.rearrange_grad_samples(
            module=module,
            backprops=forward_output[0].detach(),
            loss_reduction=loss_reduction,
            batch_first=batch_first,
        )
        if not module.activations and hasattr(module, "max_batch_len"):
            del module.max_batch_len
        if isinstance(module, nn.Embedding) and module.padding_idx is not None:
            # autograd gives the padding row no gradient; the norms and the update must agree
            keep = (activations[0] != module.padding_idx).unsqueeze(-1)
            recorded = recorded * keep.to(recorded.dtype)
        backprops = as_fp32(recorded)  # fp32 for this layer's norms only; the records stay as they are
        full = [as_fp32(a) for a in activations]
        if id(module) in self._tied_modules:
            self._records.append((module, activations, recorded))
            (parameter,) = [p for p in module.parameters(recurse=False) if p.requires_grad]
            self._factors[id(parameter)].append(self._grouped(_factor(module, activations[0], backprops)))
            self.methods[self._names[id(module)]] = "tied"
            return
        method = self._method(module, backprops)
        self.methods[self._names[id(module)]] = method
        if method == "ghost":
            self._records.append((module, activations, recorded))
            if isinstance(module, nn.Linear) and backprops.dim() == 3:
                norms = self._linear_ghost_norms(module, activations[0], backprops)
            elif self.layout is not None:  # one "example" per unit: its rows' tokens, weighted
                grouped = [self.layout.tokens(a) for a in full]
                unit_backprops = self.layout.tokens(backprops, scale=True)
                norms = self.NORM_SAMPLERS[type(module)](module, grouped, unit_backprops)
            else:
                norms = self.NORM_SAMPLERS[type(module)](module, full, backprops)
        else:
            if type(module) is nn.Linear:
                sampler = linear_per_sample_gradients
            else:
                sampler = self.GRAD_SAMPLERS.get(type(module), ft_compute_per_sample_gradient)
            grads = {p: g for p, g in sampler(module, full, backprops).items() if p.requires_grad}
            self._instantiated.append(grads)
            if self.layout is not None:
                norms = {p: self.layout.sums(g).flatten(1).norm(2, dim=1) for p, g in grads.items()}
            else:
                norms = {p: g.flatten(1).norm(2, dim=1) for p, g in grads.items()}
        for parameter, norm in norms.items():
            if not parameter.requires_grad:
                continue
            if getattr(parameter, "_norm_sample", None) is not None:
                raise NotImplementedError(
                    f"{type(module).__name__} ran twice in one forward pass; use --grad-sample-mode hooks"
                )
            parameter._norm_sample = norm

    def _linear_ghost_norms(
        self, module: nn.Linear, activations: torch.Tensor, backprops: torch.Tensor
    ) -> dict[nn.Parameter, torch.Tensor]:
        """Opacus' ghost norm of a Linear layer over ``[b, T, ·]`` sequences,
        ``‖∇W_i‖² = ⟨g_i g_iᵀ, a_i a_iᵀ⟩``, with each input's Gram matrix ``a aᵀ`` computed once:
        the query/key/value projections read one input, and so do an MLP's gate and up
        projections. The records keep every input alive until the update, so its storage
        address identifies it for the whole backward pass. Under per-unit clipping
        (:class:`GroupLayout`) both Gram matrices are taken over each unit's concatenated rows."""
        key = (activations.data_ptr(), activations.shape, activations.stride())
        if self.layout is not None:  # per-unit clipping: Gram matrices across each unit's rows
            backprops = self.layout.tokens(backprops, scale=True)
            if self._unit_gradient_is_cheaper(module, backprops.shape[1]):
                return self._unit_gradient_norms(module, self.layout.tokens(activations), backprops)
        gram = self._grams.get(key)
        if gram is None:
            activations = activations.to(backprops.dtype)
            if self.layout is not None:
                activations = self.layout.tokens(activations)
            gram = self._grams[key] = torch.bmm(activations, activations.transpose(1, 2))
        output_gram = torch.bmm(backprops, backprops.transpose(1, 2))
        norms = {}
        if module.weight.requires_grad:
            norms[module.weight] = (output_gram * gram).sum((1, 2)).clamp(min=0).sqrt()
        if module.bias is not None and module.bias.requires_grad:
            norms[module.bias] = output_gram.sum((1, 2)).clamp(min=0).sqrt()
        return norms

    def _unit_gradient_is_cheaper(self, module: nn.Linear, unit_tokens: int) -> bool:
        """Under per-unit clipping (``auto`` only), whether forming each unit's gradient
        ``G_uᵀ A_u`` (``L·d·p`` flops for ``L`` = the unit's tokens) costs less than its ghost norm
        (``L²(d + p)``): a unit of several rows multiplies the ghost norm's cost by its rows
        squared, the gradient's only by its rows. The gradients are dropped after the norm; the
        update still comes from the records."""
        rows, columns = module.weight.shape
        return self.norm_method == "auto" and rows * columns < unit_tokens * (rows + columns)

    @staticmethod
    def _unit_gradient_norms(
        module: nn.Linear, activations: torch.Tensor, backprops: torch.Tensor
    ) -> dict[nn.Parameter, torch.Tensor]:
        """``‖G_uᵀ A_u‖`` per unit from its concatenated rows (``[U, L, ·]``), one unit at a time."""
        activations = activations.to(backprops.dtype)
        norms = {}
        if module.weight.requires_grad:
            norms[module.weight] = torch.stack(
                [torch.linalg.matrix_norm(g.T @ a) for g, a in zip(backprops, activations, strict=True)]
            )
        if module.bias is not None and module.bias.requires_grad:
            norms[module.bias] = backprops.sum(1).norm(2, dim=1)
        return norms

    def _method(self, module: nn.Module, backprops: torch.Tensor) -> str:
        """``ghost`` or ``instantiate`` for this call of ``module`` (see :func:`choose_norm_method`)."""
        if type(module) not in self.NORM_SAMPLERS:
            return "instantiate"  # no ghost norm: norms and small layers have tiny gradients
        if self.norm_method != "auto":
            return self.norm_method
        tokens = backprops[0].numel() // backprops.shape[-1]
        rows, columns = module.weight.shape
        return choose_norm_method(tokens, rows, columns, embedding=isinstance(module, nn.Embedding))

    def _grouped(self, factor: tuple) -> tuple:
        """A tied use's factors as one example per unit (per-unit clipping), else unchanged."""
        layout = self.layout
        if layout is None:
            return factor
        if factor[0] == "embedding":
            _, ids, grad = factor
            return "embedding", layout.tokens(ids), layout.tokens(grad, scale=True)
        _, grad, act = factor
        return "linear", layout.tokens(grad, scale=True), layout.tokens(act)

    def get_norm_sample(self) -> torch.Tensor:
        for key, parameter in self._tied.items():
            factors = self._factors.pop(key, [])
            if factors:
                parameter._norm_sample = tied_squared_norms(factors).sqrt()
        missing = [p for p in self.trainable_parameters if getattr(p, "_norm_sample", None) is None]
        if missing:
            raise RuntimeError(f"ghost clipping saw no gradient for {len(missing)} trainable parameters")
        norms = super().get_norm_sample()
        for parameter in self.trainable_parameters:
            parameter._norm_sample = None
        self._grams.clear()
        return norms

    def clipped_gradients(self, factors: torch.Tensor) -> dict[int, torch.Tensor]:
        """``{id(param): Σ_i factors_i · ∇ℓ_i}`` from the records of the last backward pass (fp32)."""
        with full_precision():
            return self._clipped_gradients(factors)

    def _clipped_gradients(self, factors: torch.Tensor) -> dict[int, torch.Tensor]:
        summed: dict[int, torch.Tensor] = {}

        def add(parameter: nn.Parameter, value: torch.Tensor) -> None:
            if parameter.requires_grad:
                key = id(parameter)
                summed[key] = value if key not in summed else summed[key] + value

        instantiated, self._instantiated = self._instantiated, []
        while instantiated:  # Σ_i c_i g_i of the kept per-example gradients
            for parameter, value in instantiated.pop().items():
                add(parameter, torch.tensordot(factors.to(value.dtype), value, dims=1))
        records, self._records = self._records[::-1], []  # popped in backward order: a tied
        inputs = _ScaledInputs(records, factors)  # output projection comes before its embedding
        while records:  # ghost and tied layers; each record is freed once it is used
            module, activations, backprops = records.pop()
            batch = backprops.shape[0]
            outputs = as_fp32(backprops).reshape(batch, -1, backprops.shape[-1])  # as the norms saw them
            if isinstance(module, nn.Linear):
                add(module.weight, inputs.weighted_product(outputs, activations[0]))
                if module.bias is not None:
                    add(module.bias, factors.to(outputs.dtype) @ outputs.sum(1))
                continue
            weight = module.weight  # nn.Embedding: Σ_i c_i Σ_t e_{ids_t} ⊗ g_t, rows added in place
            scaled = (outputs * factors.to(outputs.dtype).view(-1, 1, 1)).reshape(-1, weight.shape[1])
            ids = activations[0].reshape(-1)
            if id(weight) in summed:
                summed[id(weight)].index_add_(0, ids, scaled.to(weight.dtype))
            else:
                add(weight, torch.zeros_like(weight).index_add_(0, ids, scaled.to(weight.dtype)))
        return summed


class _ScaledInputs:
    """``Σ_i c_i g_iᵀ a_i`` for the recorded Linear layers of one backward pass, scaling whichever
    factor is narrower: the per-example clip factors ``c`` multiply the output gradients
    ``g [b, T, p]`` or the inputs ``a [b, T, d]``. An input read by several layers (attention's
    query/key/value projections, an MLP's gate and up projections) is scaled once and dropped
    after its last use."""

    def __init__(self, records: list[tuple], factors: torch.Tensor):
        self.factors = factors
        self.uses: Counter[tuple] = Counter(
            self._key(activations[0]) for module, activations, _ in records if isinstance(module, nn.Linear)
        )
        self.scaled: dict[tuple, torch.Tensor] = {}

    @staticmethod
    def _key(tensor: torch.Tensor) -> tuple:
        return tensor.data_ptr(), tensor.shape, tensor.stride()

    def _weighted(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor * self.factors.to(tensor.dtype).view(-1, *[1] * (tensor.dim() - 1))

    def weighted_product(self, outputs: torch.Tensor, activations: torch.Tensor) -> torch.Tensor:
        """``Σ_i c_i g_iᵀ a_i`` as one ``[p, d]`` matrix (``outputs``: ``[b, T, p]``)."""
        key = self._key(activations)
        self.uses[key] -= 1
        shared = key in self.scaled or self.uses[key] > 0
        inputs = activations.to(outputs.dtype).reshape(outputs.shape[0], outputs.shape[1], -1)
        if shared or inputs.shape[-1] < outputs.shape[-1]:
            scaled = self.scaled.get(key)
            if scaled is None:
                scaled = self._weighted(inputs)
            if self.uses[key] > 0:
                self.scaled[key] = scaled
            else:
                self.scaled.pop(key, None)
            return outputs.flatten(0, 1).T @ scaled.flatten(0, 1)
        return self._weighted(outputs).flatten(0, 1).T @ inputs.flatten(0, 1)
