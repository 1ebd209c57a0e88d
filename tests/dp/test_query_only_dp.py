"""DP steps of a query-only generator (cached document prefix, adapters on the invocation and the
query): every clipping engine's clipped sum against a one-example-at-a-time ground truth, every
trainable parameter covered, and one DP step the same in every mode."""

from __future__ import annotations

import pytest
import torch

from synthq.dp.clipping import clip_and_sum
from synthq.dp.engine import PrivacyPlan
from synthq.dp.lm.clippers import make_clipper
from synthq.dp.lm.step import DPStep
from synthq.dp.noise import SecretRandomness
from synthq.models.generator import QueryGenerator, apply_lora
from synthq.models.query_only import CachedRows, QueryOnlyView, segment_batch
from synthq.models.sequence_loss import model_inputs, per_sequence_loss

DOCS = [
    "Boil eggs for nine minutes for a firm yolk.",
    "Git rebase replays your commits on top of another branch to keep history linear.",
    "Adults need seven to nine hours of sleep.",
    "Boil eggs for nine minutes for a firm yolk.",
]
QUERIES = ["how long to boil an egg", "what does rebase do", "hours of sleep adults", "egg minutes"]
MODES = ("ghost", "hooks", "vmap")
MODELS = {"causal": "tiny_causal_dir", "seq2seq": "tiny_t5_dir"}


def view_of(path, seed: int = 0) -> QueryOnlyView:
    """A tiny generator with non-zero LoRA adapters in query-only mode (a T5's on its decoder
    only), in train mode (the hooks run only in training) with dropout off, so the ground truth
    sees the same function."""
    generator = QueryGenerator.load(path, max_source_length=64)
    torch.manual_seed(seed)
    apply_lora(generator, rank=4, alpha=8, decoder_only=generator.kind == "seq2seq")
    for module in generator.model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
        if isinstance(getattr(module, "dropout", None), float):  # T5's attention-probability dropout
            module.dropout = 0.0
    with torch.no_grad():
        for name, parameter in generator.model.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0, 0.2)
    generator.enable_query_only("bfloat16")
    generator.model.train()
    return QueryOnlyView(generator)


def cached_batches(view: QueryOnlyView):
    """make_batch over DOCS/QUERIES reading a :class:`PrefixStore`, as finetune-lm does."""
    store, rows = view.store(DOCS)

    def make_batch(indices: list[int]) -> dict:
        states = [store.state(rows[i]) for i in indices]
        return view.batch(states, [QUERIES[i] for i in indices], 16)

    return make_batch


def ground_truth(view: QueryOnlyView, make_batch) -> list[dict[str, torch.Tensor]]:
    """Each example's gradient computed alone (its own prefix, no padding) by ordinary autograd,
    every position scored."""
    grads = []
    trainable = [(n, p) for n, p in view.model.named_parameters() if p.requires_grad]
    for row in range(len(DOCS)):
        example = make_batch([row])
        inputs = model_inputs(view.kind, example)
        inputs.pop("logits_to_keep", None)
        loss = per_sequence_loss(view.kind, view.model(**inputs).logits, example["labels"]).sum()
        values = torch.autograd.grad(loss, [p for _, p in trainable])
        grads.append({n: g for (n, _), g in zip(trainable, values, strict=True)})
    return grads


@pytest.mark.parametrize("kind", list(MODELS))
@pytest.mark.parametrize("mode", MODES)
def test_clipped_sum_matches_one_example_at_a_time_ground_truth(mode, kind, request):
    view = view_of(request.getfixturevalue(MODELS[kind]))
    make_batch = cached_batches(view)
    expected = ground_truth(view, make_batch)
    trainable = {n for n, p in view.model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    assert not any("encoder." in n for n in trainable)  # a T5's encoder is frozen: its output cached
    truth = {n: torch.stack([g[n] for g in expected]) for n in trainable}
    weights = torch.tensor([1.0, 0.5, 1.0, 0.5])
    clip = 0.05  # below every example's norm: each is clipped
    clipper = make_clipper(view, clip, mode)
    assert clipper.mode == mode and set(clipper.names) == trainable  # every trainable parameter
    batch = make_batch(list(range(len(DOCS))))  # the padded batch: prefixes and queries differ
    summed, norms, losses = clipper.clipped_sum(batch, weights)
    wanted, wanted_norms = clip_and_sum(truth, clip, weights)
    assert (wanted_norms > clip).all()
    torch.testing.assert_close(norms, wanted_norms, atol=1e-5, rtol=1e-4)
    assert set(summed) == trainable
    for name in trainable:
        torch.testing.assert_close(summed[name], wanted[name], atol=1e-6, rtol=1e-4, msg=name)
    # per-user clipping: each unit's weighted sum clipped once
    groups = torch.tensor([0, 1, 1, 0])
    summed, norms, _ = clipper.clipped_sum(batch, weights, groups)
    wanted, wanted_norms = clip_and_sum(truth, clip, weights, groups)
    torch.testing.assert_close(norms, wanted_norms, atol=1e-5, rtol=1e-4)
    for name in trainable:
        torch.testing.assert_close(summed[name], wanted[name], atol=1e-6, rtol=1e-4, msg=name)
    clipper.close()


@pytest.mark.parametrize("kind", list(MODELS))
def test_every_mode_gives_the_same_dp_step(kind, request):
    """One DP step (same Poisson batch, same noise) lands on the same adapters in every mode,
    micro-batches of two rows whose prefixes differ in length."""
    results = {}
    for mode in MODES:
        view = view_of(request.getfixturevalue(MODELS[kind]))
        trainable = [p for p in view.model.parameters() if p.requires_grad]
        optimizer = torch.optim.SGD(trainable, lr=1.0)
        plan = PrivacyPlan.with_noise(0.3, 0.05, expected_batch_size=4)
        step = DPStep(view, optimizer, plan, physical_batch_size=2, grad_sample_mode=mode)
        step.step(cached_batches(view), [0, 1, 2, 3], [1.0] * 4, SecretRandomness(seed=5))
        step.clipper.close()
        results[mode] = {n: p.detach().clone() for n, p in view.model.named_parameters() if p.requires_grad}
    for mode in ("hooks", "ghost"):
        for name, value in results["vmap"].items():
            torch.testing.assert_close(results[mode][name], value, atol=1e-6, rtol=1e-4, msg=f"{mode} {name}")


def test_segment_batch_holds_no_other_rows_data(tiny_causal_dir):
    """A row of a padded batch holds its own prefix cache (zeros where it is padded, masked) and
    its own tokens: what a neighbour wrote never enters it."""
    view = view_of(tiny_causal_dir)
    states = view.states(DOCS[:2])
    batch = segment_batch(states, view.generator.invocation_ids(), [[5, 6], [7]], 0)
    short = min(range(2), key=lambda i: states[i].shape[3])
    pad = batch["prefix_keys"].shape[3] - states[short].shape[3]
    assert pad > 0 and not batch["prefix_keys"][short, :, :, :pad].any()
    assert not batch["attention_mask"][short, :pad].any()
    torch.testing.assert_close(batch["prefix_keys"][short, :, :, pad:], states[short][0])


@pytest.mark.parametrize("user_clipping", ["per-example", "per-user"])
def test_rows_of_similar_length_share_a_micro_batch_and_the_step_is_the_same(user_clipping, tiny_causal_dir):
    """Query-only rows tell the DP step their lengths: micro-batches then hold rows of similar
    length (less padding), whole units under per-user clipping, and the update is unchanged."""
    queries = [*QUERIES, "a much longer query about boiling eggs for exactly nine minutes"]
    documents = [*DOCS, DOCS[1]]
    groups = [0, 1, 1, 2, 3]
    results = []
    for with_lengths in (True, False):
        view = view_of(tiny_causal_dir)
        rows = CachedRows(view, documents, queries, 32)
        rows.build(None)
        make_batch = rows if with_lengths else (lambda indices, rows=rows: rows(indices))
        trainable = [p for p in view.model.parameters() if p.requires_grad]
        plan = PrivacyPlan.with_noise(0.3, 0.05, expected_batch_size=5)
        mechanism = "per-user" if user_clipping == "per-user" else "per-example"
        step = DPStep(view, torch.optim.SGD(trainable, lr=1.0), plan, 2, "ghost", mechanism)
        if with_lengths:
            _, chunks = step._micro_batches(list(range(5)), [1.0] * 5, groups, rows.lengths)
            ordered = [rows.lengths[row] for chunk in chunks for row, _, _ in chunk]
            if user_clipping == "per-example":
                assert ordered == sorted(ordered)
            else:  # units whole (rows 1 and 2 are one user), ordered by their longest row
                assert any({row for row, _, _ in chunk} >= {1, 2} for chunk in chunks)
        step.step(make_batch, list(range(5)), [1.0] * 5, SecretRandomness(seed=5), groups=groups)
        step.clipper.close()
        results.append({n: p.detach().clone() for n, p in view.model.named_parameters() if p.requires_grad})
    for name, value in results[0].items():
        torch.testing.assert_close(results[1][name], value, atol=1e-6, rtol=1e-5, msg=name)
