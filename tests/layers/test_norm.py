"""Frozen batch normalisation against torchvision's, and folding it into the convolution before it."""

import torch
import torchvision
from torch import nn

from vitkit.layers.norm import FrozenBatchNorm2d, fold_frozen_norms


def test_frozen_batchnorm_puts_eps_inside_the_rsqrt():
    g = torch.Generator().manual_seed(0)
    ours, reference = FrozenBatchNorm2d(5), torchvision.ops.FrozenBatchNorm2d(5, eps=1e-5)
    for name in ("weight", "bias", "running_mean"):
        value = torch.randn(5, generator=g)
        getattr(ours, name).copy_(value)
        getattr(reference, name).copy_(value)
    var = torch.tensor([0.0, 1e-6, 0.5, 1.0, 2.0])  # a zero variance stays finite
    ours.running_var.copy_(var)
    reference.running_var.copy_(var)
    x = torch.randn(2, 5, 3, 3, generator=g)
    torch.testing.assert_close(ours(x), reference(x))
    assert list(dict(ours.named_parameters())) == []
    assert sorted(ours.state_dict()) == ["bias", "running_mean", "running_var", "weight"]


def test_folding_keeps_the_outputs_and_removes_the_norms():
    g = torch.Generator().manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 5, 3, padding=1), FrozenBatchNorm2d(5), nn.ReLU())
    for name in ("weight", "bias", "running_mean"):
        getattr(model[1], name).copy_(torch.randn(5, generator=g))
    model[1].running_var.copy_(torch.rand(5, generator=g) + 0.1)
    x = torch.randn(2, 3, 6, 6, generator=g)
    expected = model(x)
    assert fold_frozen_norms(model) == 1
    assert isinstance(model[1], nn.Identity) and model[0].bias is not None
    torch.testing.assert_close(model(x), expected)
    assert fold_frozen_norms(model) == 0  # nothing left to fold
