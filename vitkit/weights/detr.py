"""facebookresearch/detr's layout: the DETR checkpoints of the paper's code (`detr-r50-e632da11.pth`, the
`checkpoint.pth` files its `main.py` writes) <-> vitkit.

The original model is `DETR` (models/detr.py): `backbone` is a `Joiner` whose [0] is the ResNet wrapper, holding
torchvision's ResNet up to layer4 as `body` (frozen BatchNorm, which keeps weight, bias, running_mean and
running_var, and no `num_batches_tracked`); [1] is the sine position encoding, without parameters. `transformer`
(models/transformer.py) is post-norm by default, its attentions `nn.MultiheadAttention` (`in_proj_weight` /
`in_proj_bias`, `out_proj`), its feed-forward `linear1` / `linear2`; the decoder's shared final norm is
`transformer.decoder.norm`, and the encoder has none. Files are ``{"model": state_dict, ...}``: `main.py` adds
"optimizer", "lr_scheduler", "epoch" and "args" (an `argparse.Namespace`), which reading skips.

The paper's code computes what vitkit's DETR computes (FrozenBatchNorm eps 1e-5 inside the rsqrt, LayerNorm eps
1e-5, ReLU feed-forward, sine encoding normalised to 2 pi), so its weights give equal outputs in the vitkit model of
the same size: detr-r50 -> `detr_resnet50`, detr-r50-dc5 -> `detr_resnet50_dc5`, detr-r101 -> `detr_resnet101`.
Not read (loading them is a ValueError): pre-norm models (`--pre_norm`: vitkit's layers are post-norm; the file has
`transformer.encoder.norm`), learned position encodings (`backbone.1.row_embed` / `col_embed`) and the panoptic
models (all under `detr.`, beside a mask head).
"""

from __future__ import annotations

from vitkit.models.detr import DetrConfig
from vitkit.weights.hf import TIMM_RESNETS, resnet_name
from vitkit.weights.rename import Layout, Rename, rename

_BODY = "backbone.0.body"  # Joiner [0] -> Backbone.body: torchvision's ResNet names (conv1, bn1, layer1..4)
_CONVS = ("conv1", "layer{s}.{b}.conv{n}", "layer{s}.{b}.downsample.0")
_NORMS = ("bn1", "layer{s}.{b}.bn{n}", "layer{s}.{b}.downsample.1")
_NORM_TENSORS = ("weight", "bias", "running_mean", "running_var")  # FrozenBatchNorm2d's buffers


def _resnet() -> tuple[Rename, ...]:
    """vitkit's backbone keeps torchvision's names: `backbone.X` <- `backbone.0.body.X`, tensor by tensor, so that a
    BatchNorm's `num_batches_tracked` (absent from DETR's frozen norms, present if a norm was a BatchNorm2d) is
    dropped rather than carried along."""
    return (
        *(rename(f"backbone.{conv}.weight", f"{_BODY}.{conv}.weight") for conv in _CONVS),  # (out, in, kh, kw) both
        *(rename(f"backbone.{norm}.{t}", f"{_BODY}.{norm}.{t}") for norm in _NORMS for t in _NORM_TENSORS),
    )


def _attention(ours: str, theirs: str) -> tuple[Rename, ...]:
    return (
        # nn.MultiheadAttention's in_proj is already the fused q, k, v: (3D, D) and (3D,), rows q | k | v, the order
        # vitkit's qkv reads them in. No split.
        rename(f"{ours}.qkv.weight", f"{theirs}.in_proj_weight"),
        rename(f"{ours}.qkv.bias", f"{theirs}.in_proj_bias"),
        rename(f"{ours}.proj", f"{theirs}.out_proj"),  # (D, D) both
    )


_ENC, _DEC = "encoder.layers.{i}", "decoder.layers.{i}"


def check_detr_export(config: DetrConfig) -> None:
    """ValueError for DETR configurations facebookresearch/detr cannot build: its backbone is
    `torchvision.models.<name>` for a standard ResNet (64 wide, 3 input channels), and torchvision's BasicBlock
    does not dilate."""
    problems = []
    name = resnet_name(config)
    if name is None:
        problems.append(
            f"a torchvision ResNet ({', '.join(TIMM_RESNETS)}: width 64), not {config.backbone_block} blocks "
            f"{config.backbone_depths} at width {config.backbone_width}"
        )
    elif config.dilation and config.backbone_block == "basic":
        problems.append(f"bottleneck blocks to dilate (DC5): torchvision's {name} cannot (dilation=False)")
    if config.in_chans != 3:
        problems.append(f"3 input channels (this model: {config.in_chans})")
    if problems:
        raise ValueError("facebookresearch/detr's DETR needs " + "; ".join(problems))


DETR = Layout(
    format="detr",
    family="detr",
    rules=(
        *_resnet(),
        rename("input_proj", "input_proj"),  # Conv2d (D, C5, 1, 1) both
        rename("query_embed", "query_embed"),  # Embedding (Q, D) both
        *_attention(f"{_ENC}.self_attn", f"transformer.{_ENC}.self_attn"),
        rename(f"{_ENC}.norm1", f"transformer.{_ENC}.norm1"),
        rename(f"{_ENC}.mlp.fc1", f"transformer.{_ENC}.linear1"),  # (F, D) both
        rename(f"{_ENC}.mlp.fc2", f"transformer.{_ENC}.linear2"),  # (D, F) both
        rename(f"{_ENC}.norm2", f"transformer.{_ENC}.norm2"),
        *_attention(f"{_DEC}.self_attn", f"transformer.{_DEC}.self_attn"),
        rename(f"{_DEC}.norm1", f"transformer.{_DEC}.norm1"),
        *_attention(f"{_DEC}.cross_attn", f"transformer.{_DEC}.multihead_attn"),
        rename(f"{_DEC}.norm2", f"transformer.{_DEC}.norm2"),
        rename(f"{_DEC}.mlp.fc1", f"transformer.{_DEC}.linear1"),
        rename(f"{_DEC}.mlp.fc2", f"transformer.{_DEC}.linear2"),
        rename(f"{_DEC}.norm3", f"transformer.{_DEC}.norm3"),
        rename("decoder.norm", "transformer.decoder.norm"),  # the final norm shared by every decoder layer's output
        rename("class_embed", "class_embed"),  # (K + 1, D) both, the last row "no object"
        rename("bbox_embed", "bbox_embed"),  # layers.0..2 both
    ),
    markers=(f"{_BODY}.conv1.weight", "query_embed.weight", "transformer.decoder.norm.weight"),
    dropped=tuple(f"{_BODY}.{norm}.num_batches_tracked" for norm in _NORMS),
    check_export=check_detr_export,
)

# The entry of the file that holds the state dict: DETR's main.py and hubconf.py read checkpoint["model"].
WRAPPER = "model"

# vitkit family -> its facebookresearch/detr layout.
LAYOUTS: dict[str, Layout] = {"detr": DETR}
