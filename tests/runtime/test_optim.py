"""synthq.runtime.optim: the stages' Adam / AdamW are torch's fused kernels where the device has one, and
update the weights as torch's default implementation does (to rounding); the factory builds each
optimizer by name."""

from __future__ import annotations

import pytest
import torch

from synthq.runtime.optim import OPTIMIZERS, adam, make_optimizer


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
