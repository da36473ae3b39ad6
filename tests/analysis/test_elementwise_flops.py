"""Every registered model's FLOPs against a count at the dispatcher: its forward run (on the meta device) under a
mode that counts each aten operator it sees by the rule `vitkit.cost.tracer` counts with (`operator_flops`).

A trace states its kernels' rows itself (dense attention's and deformable sampling's paths). With the `math` backends
the dispatcher sees the reference formulas run, so the two totals agree only if each kernel's rows count what its
reference computes, and if the trace counts everything else once.
"""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import vitkit
from vitkit.analysis import profile
from vitkit.cost.tracer import operator_flops
from vitkit.models.registry import backend_overrides, model_entry


class DispatcherFlops(TorchDispatchMode):
    """Multiply-adds and FLOPs of every operator dispatched while active; the names of those the rule does not know."""

    def __init__(self) -> None:
        super().__init__()
        self.macs = self.flops = 0
        self.unknown: set[str] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        counted = operator_flops(func, args, kwargs, out)
        if counted is None:
            self.unknown.add(str(func))
        else:
            self.macs += counted[0]
            self.flops += counted[1]
        return out


# Deformable DETR's ResNet-50 variants with two encoder and two decoder layers (every kind of row, half the time)
SHRUNK = {name: {"enc_layers": 2, "dec_layers": 2} for name in vitkit.list_models() if "deformable_detr_resnet" in name}


def _short_backbone(name: str) -> dict:
    """A detector's Swin backbone with a block per stage, or its ViT with two blocks (every kind of row)."""
    body = model_entry(model_entry(name).config.backbone).config
    return {"depths": (1,) * len(body.depths)} if hasattr(body, "depths") else {"depth": 2}


SHRUNK |= {  # the detectors on Swin and ViT backbones likewise
    name: {"enc_layers": 2, "dec_layers": 2, "backbone_args": _short_backbone(name)}
    for name in vitkit.list_models("deformable_detr_*")
    if model_entry(name).config.backbone != "resnet"
}


@pytest.mark.parametrize("name", vitkit.list_models())
def test_trace_flops_equal_the_dispatchers_count(name):
    with torch.device("meta"):  # shapes only: the counter counts from shapes
        model = vitkit.create_model(name, **backend_overrides(name, "math"), **SHRUNK.get(name, {})).eval()
    config = model_entry(name).config
    size = config.img_size if isinstance(config.img_size, tuple) else (config.img_size, config.img_size)
    with torch.no_grad(), DispatcherFlops() as counter:
        model(torch.empty(2, config.in_chans, *size, device="meta"))
    report = profile(model, size, batch=2)
    assert not counter.unknown
    assert (report.macs, report.flops) == (counter.macs, counter.flops) and report.other_flops > 0
