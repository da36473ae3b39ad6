"""Every registered model: timm's parameter layout, forward shape, gradients to every parameter, backends agree.

A family added to the registry is covered here automatically; it only needs an entry in SMALL saying how to shrink
it for a quick forward/backward while keeping the variant's width, heads and patch.
"""

import pytest
import timm
import torch

import vitkit
from vitkit.layers import set_attention_backend
from vitkit.models.registry import model_entry

SMALL = {
    "vit": lambda c: dict(img_size=2 * c.patch_size, depth=1),
    "swin": lambda c: dict(img_size=c.patch_size * 8 * 2, depths=(1,) * len(c.depths)),
    "botnet": lambda c: dict(img_size=64),
}

ALL = vitkit.list_models()


def test_registry_is_not_empty():
    assert len(ALL) >= 14


@pytest.mark.parametrize("name", ALL)
def test_parameter_layout_equals_timm(name):
    if name not in timm.list_models():
        pytest.skip(f"timm has no {name}")
    with torch.device("meta"):
        ours = vitkit.create_model(name).state_dict()
        theirs = timm.create_model(name, pretrained=False).state_dict()
    assert {k: tuple(v.shape) for k, v in ours.items()} == {k: tuple(v.shape) for k, v in theirs.items()}


@pytest.mark.parametrize("name", ALL)
def test_small_forward_backward_reaches_every_parameter(name):
    entry = model_entry(name)
    assert entry.family in SMALL, f"add shrink overrides for family {entry.family!r} to SMALL"
    torch.manual_seed(0)
    model = vitkit.create_model(name, num_classes=5, **SMALL[entry.family](entry.config))
    size = model.config.img_size
    x = torch.randn(2, model.config.in_chans, *((size, size) if isinstance(size, int) else size))
    model.train()
    out = model(x)
    assert out.shape == (2, 5)
    out.square().mean().backward()
    no_grad = [n for n, p in model.named_parameters() if p.requires_grad and (p.grad is None or not p.grad.any())]
    assert no_grad == []

    model.eval()
    with torch.no_grad():
        fast = model(x)
        slow = set_attention_backend(model, "math")(x)
    torch.testing.assert_close(fast, slow, atol=1e-5, rtol=1e-5)
