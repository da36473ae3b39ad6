"""The exponential moving average of weights, against the formula."""

from __future__ import annotations

import pytest
import torch

from vitkit.train import ModelEma


def test_ema_follows_the_formula_and_copies_integer_buffers():
    model = torch.nn.BatchNorm1d(3)
    ema = ModelEma(model, decay=0.9)
    expected = {k: v.clone() for k, v in model.state_dict().items()}
    for step in range(3):
        with torch.no_grad():
            model.weight.add_(step + 1.0)
            model.running_mean.add_(0.5)
        model.num_batches_tracked += 1
        ema.update(model)
        for name, value in model.state_dict().items():
            if value.is_floating_point():
                expected[name] = 0.9 * expected[name] + 0.1 * value
            else:
                expected[name] = value.clone()
    for name, value in ema.state_dict().items():
        torch.testing.assert_close(value, expected[name])
    assert not any(p.requires_grad for p in ema.module.parameters()) and not ema.module.training
    with pytest.raises(ValueError, match="decay"):
        ModelEma(model, 1.0)
