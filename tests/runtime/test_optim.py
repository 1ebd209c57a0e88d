"""synthq.runtime.optim: the stages' Adam / AdamW are torch's fused kernels where the device has one, and
update the weights as torch's default implementation does (to rounding); the factory builds each
optimizer by name."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from synthq.runtime.optim import OPTIMIZERS, AdamBC, adam, make_optimizer


def adam_bc_reference(theta, grads, lr, phi, beta1=0.9, beta2=0.999, floor=1e-8, weight_decay=0.0):
    """Algorithm 1 of Tang et al. (DP-AdamBC, AAAI 2024), written out in numpy float64."""
    theta, m, v = theta.astype(np.float64), np.zeros_like(theta, np.float64), np.zeros_like(theta, np.float64)
    for t, g in enumerate(grads, start=1):
        g = g + weight_decay * theta
        m = beta1 * m + (1 - beta1) * g
        v = beta2 * v + (1 - beta2) * g * g
        m_hat, v_hat = m / (1 - beta1**t), v / (1 - beta2**t)
        theta = theta - lr * m_hat / np.sqrt(np.maximum(v_hat - phi, floor))
    return theta


@pytest.mark.parametrize(("phi", "weight_decay"), [(0.0, 0.0), (0.04, 0.0), (0.04, 0.1), (25.0, 0.0)])
def test_adam_bc_follows_the_papers_update_rule(phi, weight_decay):
    rng = np.random.default_rng(0)
    start = rng.normal(size=(6, 4))
    grads = [rng.normal(scale=0.5, size=(6, 4)) for _ in range(7)]
    weight = torch.nn.Parameter(torch.tensor(start, dtype=torch.float64))
    optimizer = AdamBC([weight], lr=0.01, noise_variance=phi, weight_decay=weight_decay)
    for g in grads:
        weight.grad = torch.tensor(g)
        optimizer.step()
    expected = adam_bc_reference(start, grads, 0.01, phi, weight_decay=weight_decay)
    np.testing.assert_allclose(weight.detach().numpy(), expected, rtol=1e-10, atol=1e-12)
    if phi == 25.0:  # every second moment below Φ: the floor divides, so the step is lr·m̂/√γ
        assert np.abs(weight.detach().numpy() - start).max() > 100


def test_adam_bc_gives_back_the_adaptivity_that_dp_noise_takes_from_adam():
    """Two coordinates whose true gradients differ 100-fold, under DP noise of std 1: Adam's
    second moment is the noise's, so it moves both at the same rate (SGD); AdamBC's is the
    signal's, so each coordinate moves at about lr per step, the small one included."""
    torch.manual_seed(0)
    true = torch.tensor([1.0, 0.01], dtype=torch.float64)
    moved = {}
    makers = {
        "adam": lambda w: torch.optim.Adam([w], lr=1e-3),
        "adam-bc": lambda w: AdamBC([w], lr=1e-3, noise_variance=1.0, floor=1e-6),
    }
    for name, make in makers.items():
        weight = torch.nn.Parameter(torch.zeros(2, dtype=torch.float64))
        optimizer = make(weight)
        generator = torch.Generator().manual_seed(1)
        for _ in range(3000):
            weight.grad = true + torch.randn(2, generator=generator, dtype=torch.float64)
            optimizer.step()
        moved[name] = -weight.detach()
    ratio_adam = moved["adam"][1] / moved["adam"][0]
    assert abs(ratio_adam - 0.01) < 0.01  # Adam under noise: steps proportional to the gradient
    assert moved["adam-bc"][1] > 10 * moved["adam"][1]  # the small coordinate moves far more


def test_adam_bc_refuses_a_negative_noise_variance():
    with pytest.raises(ValueError, match="noise_variance"):
        AdamBC([torch.nn.Parameter(torch.zeros(1))], lr=0.1, noise_variance=-1.0)


@pytest.mark.parametrize(("decoupled", "reference"), [(False, torch.optim.Adam), (True, torch.optim.AdamW)])
def test_adam_is_fused_on_cpu_and_updates_as_the_default_implementation(decoupled, reference):
    torch.manual_seed(0)
    weights = [torch.nn.Parameter(torch.randn(5, 3)), torch.nn.Parameter(torch.randn(7))]
    copies = [torch.nn.Parameter(w.detach().clone()) for w in weights]
    initial = [w.detach().clone() for w in weights]
    ours = adam(weights, lr=0.1, weight_decay=0.05, decoupled=decoupled)
    theirs = reference(copies, lr=0.1, weight_decay=0.05)
    assert type(ours) is reference and ours.defaults["fused"] is True and not theirs.defaults["fused"]
    for _ in range(4):
        for weight, copy in zip(weights, copies, strict=True):
            weight.grad = torch.randn_like(weight)
            copy.grad = weight.grad.clone()
        ours.step()
        theirs.step()
    for weight, copy, start in zip(weights, copies, initial, strict=True):
        torch.testing.assert_close(weight, copy)
        assert (weight - start).abs().min() > 1e-3  # every weight moved


def test_parameters_on_a_device_without_a_fused_kernel_get_the_default():
    weight = torch.nn.Parameter(torch.randn(3, device="meta"))
    assert not adam([weight], lr=0.1).defaults["fused"]


@pytest.mark.parametrize(
    ("name", "kind", "fused"),
    [
        ("adam", "Adam", True),
        ("adam-bc", "AdamBC", False),
        ("adamw", "AdamW", True),
        ("adafactor", "Adafactor", False),
        ("sgd", "SGD", False),
    ],
)
def test_the_factory_builds_each_optimizer_by_name(name, kind, fused):
    weight = torch.nn.Parameter(torch.randn(4, 2))
    optimizer = make_optimizer(name, [weight], lr=0.01, weight_decay=0.1)
    assert type(optimizer).__name__ == kind and name in OPTIMIZERS
    assert optimizer.defaults["lr"] == 0.01 and optimizer.defaults["weight_decay"] == 0.1
    assert bool(optimizer.defaults.get("fused")) is fused
    weight.grad = torch.ones_like(weight)
    before = weight.detach().clone()
    optimizer.step()
    assert not torch.equal(weight, before)


def test_the_factory_refuses_an_unknown_name():
    with pytest.raises(ValueError, match="adamax"):
        make_optimizer("adamax", [torch.nn.Parameter(torch.randn(2))], lr=0.1)
