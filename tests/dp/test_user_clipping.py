"""Per-user clipping (``--user-clipping per-user``): each sampled user's combined gradient
``G_u = Σ_{i∈u} w_i ∇ℓ_i`` is clipped to ``C``, in every clipping mode, against a ground truth
computed one user at a time with ordinary autograd; and its sensitivity, by brute force."""

from __future__ import annotations

import pytest
import torch

from synthq.config.audit import CanaryAuditConfig
from synthq.config.generator import FinetuneConfig
from synthq.dp.clipping import clip_and_sum
from synthq.dp.engine import PrivacyPlan
from synthq.dp.lm.ghost import GroupLayout
from synthq.dp.lm.hooks import GhostClipper, HookClipper
from synthq.dp.lm.per_user import USER_CLIPPING, PerUserClipping
from synthq.dp.lm.step import DPStep, unit_chunks
from synthq.models.sequence_loss import model_inputs, per_sequence_loss
from tests.dp.test_lm_hooks import MODELS, load

DOCS = [
    "Boil eggs for nine minutes for a firm yolk.",
    "Git rebase replays your commits on top of another branch to keep history linear.",
    "Adults need seven to nine hours of sleep.",
    "The array module defines an object type for compact arrays of basic values.",
    "Return the number of items in a container.",
]
QUERIES = [
    "how long to boil an egg",
    "what does rebase do",
    "hours of sleep adults",
    "compact arrays of numbers",
    "length of a list",
]
GROUPS = torch.tensor([0, 1, 0, 2, 0])  # user 0 has three rows, users 1 and 2 one each
WEIGHTS = torch.tensor([1 / 3, 1.0, 1 / 3, 1.0, 1 / 3])


def user_ground_truth(generator, batch, groups, weights) -> list[dict[str, torch.Tensor]]:
    """``G_u = ∇ Σ_{i∈u} w_i ℓ_i`` for each user, by one backward pass per user."""
    users = []
    for user in range(int(groups.max()) + 1):
        rows = torch.nonzero(groups == user).flatten()
        example = {k: v[rows] for k, v in batch.items()}
        generator.model.zero_grad(set_to_none=True)
        inputs = model_inputs(generator.kind, example)
        inputs.pop("logits_to_keep", None)
        logits = generator.model(**inputs).logits
        losses = per_sequence_loss(generator.kind, logits, example["labels"])
        (losses * weights[rows]).sum().backward()
        users.append({n: p.grad.clone() for n, p in generator.model.named_parameters() if p.requires_grad})
    generator.model.zero_grad(set_to_none=True)
    return users


def clipped_user_sum(users: list[dict], clip_norm: float) -> tuple[dict, torch.Tensor]:
    norms = torch.stack([torch.sqrt(sum(g.pow(2).sum() for g in user.values())) for user in users])
    total = {
        n: sum(user[n] * min(1.0, clip_norm / float(norm)) for user, norm in zip(users, norms, strict=True))
        for n in users[0]
    }
    return total, norms


def test_group_layout_places_each_unit_side_by_side():
    layout = GroupLayout(GROUPS, WEIGHTS)
    assert layout.index.tolist() == [[0, 2, 4], [1, 5, 5], [3, 5, 5]]  # 5 = the zero row
    x = torch.arange(5.0).view(5, 1, 1).expand(5, 2, 1)  # [b, T, d]
    tokens = layout.tokens(x, scale=True)
    assert tokens.shape == (3, 6, 1)
    assert tokens[0].flatten().tolist() == pytest.approx([0, 0, 2 / 3, 2 / 3, 4 / 3, 4 / 3])
    assert tokens[1].flatten().tolist() == [1, 1, 0, 0, 0, 0]
    sums = layout.sums(torch.arange(5.0).view(5, 1))
    assert sums.flatten().tolist() == pytest.approx([2.0, 1.0, 3.0])


@pytest.mark.parametrize("kind", ["seq2seq", "causal"])
@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
@pytest.mark.parametrize("mode", ["ghost", "hooks"])
def test_per_user_clipped_sum_matches_one_user_at_a_time(kind, lora, mode, request):
    """Full fine-tuning covers ghost Gram matrices across a user's rows and tied embeddings
    (cross-row and cross-use terms); LoRA covers the instantiated adapters."""
    generator = load(request.getfixturevalue(MODELS[kind]), lora=lora)
    batch = generator.training_batch(DOCS, QUERIES, max_target_length=16)
    users = user_ground_truth(generator, batch, GROUPS, WEIGHTS)
    clip_norm = 0.05
    true_sum, true_norms = clipped_user_sum(users, clip_norm)
    assert (true_norms > clip_norm).all()  # every user is really clipped
    clipper = (GhostClipper if mode == "ghost" else HookClipper)(generator, clip_norm)
    summed, norms, _ = clipper.clipped_sum(batch, WEIGHTS, GROUPS)
    torch.testing.assert_close(norms, true_norms, atol=1e-6, rtol=1e-4)
    for name in true_sum:
        torch.testing.assert_close(summed[name], true_sum[name], atol=1e-6, rtol=1e-4, msg=name)
    assert all(p.grad is None for p in generator.model.parameters())
    # and the same clipper, without groups, is per-example clipping again
    per_example, example_norms, _ = clipper.clipped_sum(batch, WEIGHTS)
    assert example_norms.shape == (5,)
    clipper.close()


@pytest.mark.parametrize("method", ["ghost", "instantiate"])
def test_each_norm_method_gives_the_users_norms(method, tiny_causal_dir):
    generator = load(tiny_causal_dir, lora=True)
    for parameter in generator.model.parameters():
        parameter.requires_grad_(True)
    batch = generator.training_batch(DOCS, QUERIES, max_target_length=16)
    users = user_ground_truth(generator, batch, GROUPS, WEIGHTS)
    true_sum, true_norms = clipped_user_sum(users, 0.05)
    clipper = GhostClipper(generator, clip_norm=0.05, norm_method=method)
    summed, norms, _ = clipper.clipped_sum(batch, WEIGHTS, GROUPS)
    torch.testing.assert_close(norms, true_norms, atol=1e-6, rtol=1e-4)
    for name in true_sum:
        torch.testing.assert_close(summed[name], true_sum[name], atol=1e-6, rtol=1e-4, msg=name)
    clipper.close()


def test_sensitivity_by_brute_force_removing_any_user_moves_the_sum_by_at_most_c():
    """Random per-row gradients, far larger than C, in random users: removing any one user
    changes the per-user clipped sum by at most C (rows of the others are untouched); the
    per-example clipped sum with the same rows reaches C only through the 1/k weights."""
    generator = torch.Generator().manual_seed(0)
    clip_norm = 0.3
    for _ in range(50):
        rows = int(torch.randint(2, 12, (1,), generator=generator))
        groups = torch.randint(0, 4, (rows,), generator=generator)
        groups = torch.unique(groups, return_inverse=True)[1]
        counts = torch.bincount(groups)
        weights = 1.0 / counts[groups].float()
        grads = {
            "a": 10 * torch.randn(rows, 3, 2, generator=generator),
            "b": torch.randn(rows, 4, generator=generator),
        }
        full, _ = clip_and_sum(grads, clip_norm, weights, groups)
        for user in range(int(groups.max()) + 1):
            keep = groups != user
            if not keep.any():
                continue
            rest_groups = torch.unique(groups[keep], return_inverse=True)[1]
            rest, _ = clip_and_sum(
                {k: v[keep] for k, v in grads.items()}, clip_norm, weights[keep], rest_groups
            )
            change = torch.sqrt(sum((full[k] - rest[k]).pow(2).sum() for k in full))
            assert float(change) <= clip_norm * (1 + 1e-5)


def test_unit_chunks_never_split_a_unit():
    assert unit_chunks([0, 0, 0, 1, 2], 2) == [[0, 1, 2], [3, 4]]
    assert unit_chunks([0, 1, 1, 2, 3, 3, 3], 3) == [[0, 1, 2], [3], [4, 5, 6]]
    assert unit_chunks([5, 5, 7], 1) == [[0, 1], [2]]
    assert unit_chunks([], 4) == []


def test_dp_step_clips_each_user_whole_across_micro_batches(tiny_causal_dir):
    """A DP step with noise 0 and per-user clipping over micro-batches of 2 rows is the
    one-user-at-a-time clipped sum (user 0's three rows share one micro-batch), and differs from
    per-example clipping on the same rows."""
    generator = load(tiny_causal_dir, lora=True)
    trainable = {n: p for n, p in generator.model.named_parameters() if p.requires_grad}
    rows, groups = [0, 2, 4, 1, 3], [0, 0, 0, 1, 2]  # as PrivacyUnits.expand/positions give them
    weights = [1 / 3, 1 / 3, 1 / 3, 1.0, 1.0]
    batch = generator.training_batch(
        [DOCS[i] for i in rows], [QUERIES[i] for i in rows], max_target_length=16
    )
    users = user_ground_truth(generator, batch, torch.tensor(groups), torch.tensor(weights))
    true_sum, _ = clipped_user_sum(users, 0.05)
    plan = PrivacyPlan.with_noise(0.0, 0.05, expected_batch_size=3)

    def make_batch(indices):
        return generator.training_batch([DOCS[i] for i in indices], [QUERIES[i] for i in indices], 16)

    sums = {}
    for clipping in USER_CLIPPING:
        step = DPStep(generator, torch.optim.SGD(trainable.values(), lr=1.0), plan, 2, "ghost", clipping)
        sums[clipping], result = step.clipped_sum(make_batch, rows, weights, groups=groups)
        step.clipper.close()
    for name, value in true_sum.items():
        torch.testing.assert_close(sums["per-user"][name], value, atol=1e-6, rtol=1e-4, msg=name)
    difference = sum((sums["per-user"][n] - sums["per-example"][n]).pow(2).sum() for n in true_sum)
    assert float(difference) > 1e-8


@pytest.mark.parametrize("kind", ["seq2seq", "causal"])
@pytest.mark.parametrize("mode", ["ghost", "hooks", "vmap"])
def test_a_user_larger_than_a_micro_batch_is_summed_in_parts_then_clipped_once(kind, mode, request):
    """Micro-batches of one row: user 0's three rows go through three forward/backward passes
    (one row's activations in memory), and the step's sum is still the one-user-at-a-time
    clipped sum — user 0 contributes min(1, C/‖G_0‖)·G_0, not three parts clipped to C each —
    with the clipper's hooks left as they were for the next micro-batch."""
    generator = load(request.getfixturevalue(MODELS[kind]), lora=False)
    trainable = {n: p for n, p in generator.model.named_parameters() if p.requires_grad}
    rows, groups = [0, 2, 4, 1, 3], [0, 0, 0, 1, 2]
    weights = [1 / 3, 1 / 3, 1 / 3, 1.0, 1.0]
    batch = generator.training_batch(
        [DOCS[i] for i in rows], [QUERIES[i] for i in rows], max_target_length=16
    )
    users = user_ground_truth(generator, batch, torch.tensor(groups), torch.tensor(weights))
    clip_norm = 0.05
    true_sum, true_norms = clipped_user_sum(users, clip_norm)
    assert (true_norms > clip_norm).all()
    plan = PrivacyPlan.with_noise(0.0, clip_norm, expected_batch_size=3)
    seen = []

    def make_batch(indices):
        seen.append(list(indices))
        return generator.training_batch([DOCS[i] for i in indices], [QUERIES[i] for i in indices], 16)

    step = DPStep(generator, torch.optim.SGD(trainable.values(), lr=1.0), plan, 1, mode, "per-user")
    summed, result = step.clipped_sum(make_batch, rows, weights, groups=groups)
    assert seen == [[0], [2], [4], [1], [3]]  # never more than one row per pass
    for name, value in true_sum.items():
        torch.testing.assert_close(summed[name], value, atol=1e-6, rtol=1e-4, msg=name)
    assert result.mean_grad_norm == pytest.approx(float(true_norms.mean()), rel=1e-4)
    contribution = torch.sqrt(sum(users[0][n].pow(2).sum() for n in users[0]))
    assert float(contribution) > 3 * clip_norm  # clipped in parts, user 0 would have moved it further
    # the hooks are back on: with micro-batches of three, user 0 goes through the clipper whole
    step.physical_batch_size = 3
    seen.clear()
    again, _ = step.clipped_sum(make_batch, rows, weights, groups=groups)
    assert seen == [[0, 2, 4], [1, 3]]
    for name, value in true_sum.items():
        torch.testing.assert_close(again[name], value, atol=1e-6, rtol=1e-4, msg=name)
    assert all(p.grad is None for p in generator.model.parameters())
    step.clipper.close()


def test_per_user_clipping_needs_the_user_unit():
    with pytest.raises(ValueError, match="needs --privacy-unit user"):
        FinetuneConfig(data="embedded", model="m", out="x", user_clipping="per-user")
    config = FinetuneConfig(
        data="embedded", model="m", out="x", user_clipping="per-user", privacy_unit="user"
    )
    assert config.user_clipping == "per-user"


def test_rows_of_one_user_given_apart_are_still_clipped_together(tiny_causal_dir):
    """``groups`` out of order (user 0's rows first and last) must not split user 0 over two
    micro-batches, each clipped to C: the sum equals the one with the rows given adjacent."""
    generator = load(tiny_causal_dir, lora=True)
    trainable = [p for p in generator.model.parameters() if p.requires_grad]
    plan = PrivacyPlan.with_noise(0.0, 0.05, expected_batch_size=2)
    step = DPStep(generator, torch.optim.SGD(trainable, lr=1.0), plan, 2, "ghost", "per-user")

    def make_batch(indices):
        return generator.training_batch([DOCS[i] for i in indices], [QUERIES[i] for i in indices], 16)

    apart, _ = step.clipped_sum(make_batch, [0, 1, 2], [0.5, 1.0, 0.5], groups=[0, 1, 0])
    together, _ = step.clipped_sum(make_batch, [0, 2, 1], [0.5, 0.5, 1.0], groups=[0, 0, 1])
    for name, value in together.items():
        torch.testing.assert_close(apart[name], value, atol=1e-7, rtol=1e-5, msg=name)
    step.clipper.close()


def test_per_user_clipping_needs_a_finite_epsilon_and_the_audit_accepts_it():
    with pytest.raises(ValueError, match="needs a finite --epsilon"):
        FinetuneConfig(
            data="embedded", model="m", out="x", user_clipping="per-user", privacy_unit="user", epsilon="inf"
        )
    audit = CanaryAuditConfig(
        data="embedded", model="m", out="x", privacy_unit="user", finetune={"user_clipping": "per-user"}
    )
    assert audit.finetune["user_clipping"] == "per-user"


def test_a_step_refuses_clipping_other_than_its_plans_mechanism(tiny_causal_dir):
    """The sensitivity rule the guarantee records is the clipping that runs."""
    generator = load(tiny_causal_dir, lora=True)
    trainable = [p for p in generator.model.parameters() if p.requires_grad]
    plan = PrivacyPlan.create(
        num_units=10, expected_batch_size=3, steps=2, epsilon=8.0, delta=1e-3, accountant="rdp",
        mechanism=PerUserClipping(0.1), unit="user",
    )  # fmt: skip
    with pytest.raises(ValueError, match="clips per-user, not per-example"):
        DPStep(generator, torch.optim.SGD(trainable, lr=1.0), plan, 2, "ghost", "per-example")
    DPStep(generator, torch.optim.SGD(trainable, lr=1.0), plan, 2, "ghost", "per-user").clipper.close()
