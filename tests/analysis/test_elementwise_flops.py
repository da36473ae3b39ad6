"""Every registered model's element-wise FLOPs (norms, activations, softmax, adds, biases, pooling) against a count at
the dispatcher: torch's FlopCounterMode taught vitkit's per-element constants for the aten operators it sees, the
matrix work counted as zero (its FLOPs are held against the stock counter in test_profile.py).

Left out on both sides, as vitkit's analytic count leaves them out: arithmetic on 1-D tensors (a frozen norm's
per-channel scale and shift, computed from its buffers on every call) and the per-position normalisation inside
DETR's sine encoding (`SinePositionEmbedding`, counted as a divide and a sine or cosine per output element).
"""

import math

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import vitkit
from vitkit.analysis import profile
from vitkit.layers import cost
from vitkit.layers.deformable import BILINEAR_FLOPS
from vitkit.layers.pos_embed import SinePositionEmbedding
from vitkit.models.deformable_detr import GROUP_NORM_FLOPS
from vitkit.models.registry import model_entry

aten = torch.ops.aten


def _first(shape):
    """The shape of an operator's (first) output."""
    return shape[0] if shape and isinstance(shape[0], tuple | list | torch.Size) else shape


def per_element(flops: int):
    """`flops` per output element, nothing for a 1-D output (per-channel arithmetic on parameters)."""

    def count(*args, out_shape=None, **kwargs) -> int:
        shape = _first(out_shape)
        return flops * math.prod(shape) if len(shape) > 1 else 0

    return count


def nothing(*args, out_shape=None, **kwargs) -> int:
    return 0


def bias(bias_shape, *args, out_shape=None, **kwargs) -> int:
    """addmm's bias add: one per output element (its matrix product counted elsewhere)."""
    return math.prod(out_shape)


def conv_bias(x_shape, w_shape, bias_shape, *args, out_shape=None, **kwargs) -> int:
    return math.prod(out_shape) if bias_shape is not None else 0


def per_input(x_shape, *args, out_shape=None, **kwargs) -> int:
    """A mean or average pool: one add per input element."""
    return math.prod(x_shape)


def max_pool(x_shape, kernel, *args, out_shape=None, **kwargs) -> int:
    return (kernel[0] * kernel[1] - 1) * math.prod(_first(out_shape))  # k^2 - 1 comparisons per output


def clamp(x_shape, low=None, high=None, *args, out_shape=None, **kwargs) -> int:
    """A clamp: one comparison per bound given, per output element (none for a 1-D output)."""
    return ((low is not None) + (high is not None)) * per_element(1)(out_shape=out_shape)


def embedding_bag(weight_shape, indices_shape, *args, out_shape=None, **kwargs) -> int:
    """A weighted embedding bag: one multiply-add per gathered row and channel (deformable attention's bilinear
    sampling: four rows per sampled channel)."""
    return 2 * math.prod(indices_shape) * weight_shape[-1]


ELEMENTWISE = {
    **dict.fromkeys((aten.mm, aten.bmm, aten.baddbmm), nothing),
    aten.addmm: bias,
    **dict.fromkeys((aten.convolution, aten._convolution), conv_bias),
    **dict.fromkeys((aten.add, aten.add_, aten.mul, aten.mul_, aten.div, aten.sin, aten.cos), per_element(1)),
    **dict.fromkeys((aten.relu, aten.relu_), per_element(cost.RELU_FLOPS)),
    aten.gelu: per_element(cost.GELU_FLOPS),
    aten._softmax: per_element(cost.SOFTMAX_FLOPS),
    aten.native_layer_norm: per_element(cost.LAYER_NORM_FLOPS),
    aten._native_batch_norm_legit_no_training: per_element(cost.BATCH_NORM_FLOPS),
    aten.addcmul: per_element(cost.BATCH_NORM_FLOPS),  # the frozen norm's x * scale + shift
    aten.addcmul_: per_element(2),  # a multiply-add: the levelwise deformable path's weighted sum
    aten.sigmoid: per_element(cost.SIGMOID_FLOPS),
    **dict.fromkeys((aten.mean, aten.avg_pool2d), per_input),
    aten.max_pool2d_with_indices: max_pool,
    # multi-scale deformable attention: its sampling, weighted sums and the gather's index arithmetic
    **dict.fromkeys((aten.sub, aten.sub_, aten.rsub, aten.floor), per_element(1)),
    **dict.fromkeys((aten.clamp, aten.clamp_), clamp),
    aten.sum: per_input,
    aten.grid_sampler_2d: per_element(BILINEAR_FLOPS),
    # Deformable DETR: its input projections' GroupNorm (a LayerNorm's arithmetic over groups of channels) and the
    # logarithm of `inverse_sigmoid`
    aten.native_group_norm: per_element(GROUP_NORM_FLOPS),
    aten.log: per_element(1),
    **dict.fromkeys((aten._embedding_bag, aten._embedding_bag_forward_only), embedding_bag),
}


# Deformable DETR's ResNet-50 variants with two encoder and two decoder layers (every kind of row, half the time)
SHRUNK = {name: {"enc_layers": 2, "dec_layers": 2} for name in vitkit.list_models() if "deformable_detr_resnet" in name}


@pytest.mark.parametrize("name", vitkit.list_models())
def test_analytic_elementwise_flops_equal_the_dispatchers_count(name):
    with torch.device("meta"):  # shapes only: the counter counts from shapes
        model = vitkit.create_model(name, attn_backend="math", **SHRUNK.get(name, {})).eval()
    config = model_entry(name).config
    size = config.img_size if isinstance(config.img_size, tuple) else (config.img_size, config.img_size)
    with torch.no_grad(), FlopCounterMode(display=False, custom_mapping=ELEMENTWISE, depth=1) as counter:
        model(torch.empty(2, config.in_chans, *size, device="meta"))
    sine = [n for n, m in model.named_modules() if isinstance(m, SinePositionEmbedding)]
    counts = counter.get_flop_counts()
    counted = counter.get_total_flops() - sum(sum(counts[f"{type(model).__name__}.{n}"].values()) for n in sine)
    report = profile(model, size, batch=2)
    analytic = report.other_flops - sum(op.other_flops for op in report.ops if op.module in sine)
    assert analytic == counted > 0
