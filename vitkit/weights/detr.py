"""DETR weights: vitkit's own names, facebookresearch/detr's checkpoints and Hugging Face transformers'
`DetrForObjectDetection` <-> vitkit.

vitkit's DETR keeps the original code's names where it has them (`input_proj`, `query_embed`, `class_embed`,
`bbox_embed.layers.*`, torchvision's ResNet names under `backbone.`), with its transformer under `encoder.` /
`decoder.`. Fine-tuning on other classes replaces the class head only: the box head predicts boxes of any class.

facebookresearch/detr (format "detr"): the DETR checkpoints of the paper's code (`detr-r50-e632da11.pth`, the
`checkpoint.pth` files its `main.py` writes). Its model is `DETR` (its models/detr.py): `backbone` is a `Joiner`
whose [0] is the ResNet wrapper, holding torchvision's ResNet up to layer4 as `body` (frozen BatchNorm, which keeps
weight, bias, running_mean and running_var, and no `num_batches_tracked`); [1] is the sine position encoding,
without parameters. `transformer` (models/transformer.py) is post-norm by default, its attentions
`nn.MultiheadAttention` (`in_proj_weight` / `in_proj_bias`, `out_proj`), its feed-forward `linear1` / `linear2`; the
decoder's shared final norm is `transformer.decoder.norm`, and the encoder has none. Files are
``{"model": state_dict, ...}``: `main.py` adds "optimizer", "lr_scheduler", "epoch" and "args" (an
`argparse.Namespace`), which reading skips.

The paper's code computes what vitkit's DETR computes (FrozenBatchNorm eps 1e-5 inside the rsqrt, LayerNorm eps
1e-5, ReLU feed-forward, sine encoding normalised to 2 pi), so its weights give equal outputs in the vitkit model of
the same size: detr-r50 -> `detr_resnet50`, detr-r50-dc5 -> `detr_resnet50_dc5`, detr-r101 -> `detr_resnet101`.
Its panoptic checkpoints (`DETRsegm`) hold the same detector under `detr.`, beside the mask head (`bbox_attention`,
`mask_head`): they load into a model with `masks=True` (`detr_resnet50_panoptic`), which is written back so. Not
read (loading them is a ValueError): pre-norm models (`--pre_norm`: vitkit's layers are post-norm; the file has
`transformer.encoder.norm`) and learned position encodings (`backbone.1.row_embed` / `col_embed`).

transformers: `DetrForObjectDetection`, the model under `model.`, its heads beside it (`DetrForSegmentation`: that
model under `detr.`, beside the mask head), with timm's ResNet as the
backbone (`use_timm_backbone`, as its released checkpoints) or transformers' own `ResNetBackbone`. transformers 4 (and
the files transformers 5 writes) name the backbone `backbone.conv_encoder.model`, the attention output `out_proj` and
the feed-forward `fc1` / `fc2`; inside transformers 5 models they are `backbone.model`, `o_proj`, `mlp.fc1` /
`mlp.fc2`. Import accepts all of them.

torchvision (format "torchvision"): a ResNet classifier's state dict, torchvision's `resnet18` .. `resnet152` or
timm's ResNets of those names (the same names: conv1, bn1, layer1..4, fc), holds the backbone alone: it loads into
`backbone.` (its classifier `fc` dropped) and the rest of the detector keeps its initialisation. It is not written.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from vitkit.models.detr import DetrConfig
from vitkit.weights.family import FamilyWeights, State
from vitkit.weights.hf import labels, num_labels
from vitkit.weights.rename import Layout, Rename, rename
from vitkit.weights.shapes import count


def read_fields(state: Mapping[str, torch.Tensor]) -> dict[str, Any]:
    """The config fields a DETR state dict fixes: the backbone, width, queries, layers and feed-forward width."""
    fields: dict[str, Any] = {}
    conv1 = state.get("backbone.conv1.weight")
    if conv1 is not None and conv1.ndim == 4:  # a ResNet's stem (a Swin's or ViT's backbone is `backbone.body`)
        fields.update(backbone="resnet", in_chans=conv1.shape[1], backbone_width=conv1.shape[0])
    if depths := tuple(count(state, rf"backbone\.layer{s}\.(\d+)\.") for s in range(1, 5)):
        if all(depths):
            fields["backbone_depths"] = depths
            fields["backbone_block"] = "bottleneck" if "backbone.layer1.0.conv3.weight" in state else "basic"
    if (proj := state.get("input_proj.weight")) is not None:
        fields["hidden_dim"] = proj.shape[0]
    if (queries := state.get("query_embed.weight")) is not None:
        fields["num_queries"] = queries.shape[0]
    for name, prefix in (("enc_layers", "encoder"), ("dec_layers", "decoder")):
        if layers := count(state, rf"{prefix}\.layers\.(\d+)\."):
            fields[name] = layers
    if (fc1 := state.get("encoder.layers.0.mlp.fc1.weight")) is not None:
        fields["dim_feedforward"] = fc1.shape[0]
    if (lay1 := state.get("mask_head.lay1.weight")) is not None and proj is not None:
        # DETR's mask head reads the width D and one attention map per head: lay1 takes D + M channels
        fields.update(masks=True, num_heads=lay1.shape[1] - proj.shape[0])
    return fields


# timm's ResNets that transformers' DETR names as `backbone`: (block, blocks per stage), all 64 wide; torchvision's
# ResNets of the same names (facebookresearch/detr's `--backbone`) have the same layout.
TIMM_RESNETS = {
    "resnet18": ("basic", (2, 2, 2, 2)),
    "resnet34": ("basic", (3, 4, 6, 3)),
    "resnet50": ("bottleneck", (3, 4, 6, 3)),
    "resnet101": ("bottleneck", (3, 4, 23, 3)),
    "resnet152": ("bottleneck", (3, 8, 36, 3)),
}


def resnet_name(config: DetrConfig) -> str | None:
    """timm's (and torchvision's) name for the config's backbone, or None when it is no standard ResNet."""
    if config.backbone_width != 64:
        return None
    layout = (config.backbone_block, tuple(config.backbone_depths))
    return next((name for name, known in TIMM_RESNETS.items() if known == layout), None)


# --- facebookresearch/detr --------------------------------------------------------------------------------------------
BACKBONE_BODY = "backbone.0.body"  # Joiner [0] -> Backbone.body: torchvision's ResNet names (conv1, bn1, layer1..4)
_CONVS = ("conv1", "layer{s}.{b}.conv{n}", "layer{s}.{b}.downsample.0")
RESNET_NORMS = ("bn1", "layer{s}.{b}.bn{n}", "layer{s}.{b}.downsample.1")
_NORM_TENSORS = ("weight", "bias", "running_mean", "running_var")  # FrozenBatchNorm2d's buffers


def resnet_rules(body: str = f"{BACKBONE_BODY}.") -> tuple[Rename, ...]:
    """vitkit's backbone keeps torchvision's names: `backbone.X` <- `{body}X` (facebookresearch/detr's
    `backbone.0.body.X`; a ResNet classifier's `X`), tensor by tensor, so that a BatchNorm's `num_batches_tracked`
    (absent from DETR's frozen norms, present if a norm was a BatchNorm2d) is dropped rather than carried along."""
    return (
        *(rename(f"backbone.{conv}.weight", f"{body}{conv}.weight") for conv in _CONVS),  # (out, in, kh, kw) both
        *(rename(f"backbone.{norm}.{t}", f"{body}{norm}.{t}") for norm in RESNET_NORMS for t in _NORM_TENSORS),
    )


def attention_rules(ours: str, theirs: str) -> tuple[Rename, ...]:
    return (
        # nn.MultiheadAttention's in_proj is already the fused q, k, v: (3D, D) and (3D,), rows q | k | v, the order
        # vitkit's qkv reads them in. No split.
        rename(f"{ours}.qkv.weight", f"{theirs}.in_proj_weight"),
        rename(f"{ours}.qkv.bias", f"{theirs}.in_proj_bias"),
        rename(f"{ours}.proj", f"{theirs}.out_proj"),  # (D, D) both
    )


_ENC, _DEC = "encoder.layers.{i}", "decoder.layers.{i}"

# DETR's mask head (`vitkit.models.detr_masks`): the same names in facebookresearch/detr's segmentation.py, in its
# panoptic checkpoints and in the files transformers writes for `DetrForSegmentation`
MASK_PARTS = ("bbox_attention", "mask_head")
MASK_RULES = (
    rename("bbox_attention.q_linear", "bbox_attention.q_linear"),  # (D, D) both
    rename("bbox_attention.k_linear", "bbox_attention.k_linear"),  # (D, D) both (the original applies it as a 1x1 conv)
    rename("mask_head.lay{n}", "mask_head.lay{n}"),  # 3x3 convolutions, lay1..lay5
    rename("mask_head.gn{n}", "mask_head.gn{n}"),  # their GroupNorms
    rename("mask_head.adapter{n}", "mask_head.adapter{n}"),  # 1x1 convolutions on layer3, layer2, layer1
    rename("mask_head.out_lay", "mask_head.out_lay"),
)
_STAGE = {"to_ours": lambda i: {"n": i["t"] + 1}, "to_theirs": lambda i: {"t": i["n"] - 1}}  # adapter n: stage n - 1
_REFINED = {"to_ours": lambda i: {"n": i["t"] + 3}, "to_theirs": lambda i: {"t": i["n"] - 3}}  # lay n: stage n - 3
# transformers 5's module names inside a `DetrForSegmentation` (its files keep the names above)
HF_MASK_RULES = (
    rename("bbox_attention.q_linear", "bbox_attention.q_proj"),
    rename("bbox_attention.k_linear", "bbox_attention.k_proj"),
    rename("mask_head.lay1", "mask_head.conv1.conv"),
    rename("mask_head.gn1", "mask_head.conv1.norm"),
    rename("mask_head.lay2", "mask_head.conv2.conv"),
    rename("mask_head.gn2", "mask_head.conv2.norm"),
    rename("mask_head.adapter{n}", "mask_head.fpn_stages.{t}.fpn_adapter", **_STAGE),
    rename("mask_head.lay{n}", "mask_head.fpn_stages.{t}.refine.conv", **_REFINED),
    rename("mask_head.gn{n}", "mask_head.fpn_stages.{t}.refine.norm", **_REFINED),
    rename("mask_head.out_lay", "mask_head.output_conv"),
)


def with_detr_prefix(state: State, prefix: str, heads: tuple[str, ...] = (), head_prefix: str = "") -> State:
    """A DETR state dict in a format's names as its segmentation model nests it: the detector's tensors under
    `prefix` (heads among `heads` under `head_prefix`), the mask head's beside it."""

    def nested(key: str) -> str:
        first = key.split(".")[0]
        if first in MASK_PARTS:
            return key
        return (head_prefix if first in heads else prefix) + key

    return {nested(k): v for k, v in state.items()}


def check_original_export(config: DetrConfig) -> None:
    """ValueError for DETR configurations facebookresearch/detr cannot build: its backbone is
    `torchvision.models.<name>` for a standard ResNet (64 wide, 3 input channels), and torchvision's BasicBlock
    does not dilate."""
    if config.backbone != "resnet":
        raise ValueError(
            f"facebookresearch/detr's backbone is a torchvision ResNet; this model's is {config.backbone}: keep it in "
            "vitkit's layout (save_pretrained)"
        )
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


class OriginalLayout(Layout):
    """facebookresearch/detr's layout; a model with the mask head is written as its `DETRsegm`, the detector under
    `detr.` beside `bbox_attention` and `mask_head` (the panoptic checkpoints' names)."""

    def from_vitkit(self, state: State, config: Any = None) -> State:
        state = super().from_vitkit(state, config)
        return with_detr_prefix(state, "detr.") if getattr(config, "masks", False) else state


ORIGINAL = OriginalLayout(
    format="detr",
    family="detr",
    rules=(
        *resnet_rules(),
        rename("input_proj", "input_proj"),  # Conv2d (D, C5, 1, 1) both
        rename("query_embed", "query_embed"),  # Embedding (Q, D) both
        *attention_rules(f"{_ENC}.self_attn", f"transformer.{_ENC}.self_attn"),
        rename(f"{_ENC}.norm1", f"transformer.{_ENC}.norm1"),
        rename(f"{_ENC}.mlp.fc1", f"transformer.{_ENC}.linear1"),  # (F, D) both
        rename(f"{_ENC}.mlp.fc2", f"transformer.{_ENC}.linear2"),  # (D, F) both
        rename(f"{_ENC}.norm2", f"transformer.{_ENC}.norm2"),
        *attention_rules(f"{_DEC}.self_attn", f"transformer.{_DEC}.self_attn"),
        rename(f"{_DEC}.norm1", f"transformer.{_DEC}.norm1"),
        *attention_rules(f"{_DEC}.cross_attn", f"transformer.{_DEC}.multihead_attn"),
        rename(f"{_DEC}.norm2", f"transformer.{_DEC}.norm2"),
        rename(f"{_DEC}.mlp.fc1", f"transformer.{_DEC}.linear1"),
        rename(f"{_DEC}.mlp.fc2", f"transformer.{_DEC}.linear2"),
        rename(f"{_DEC}.norm3", f"transformer.{_DEC}.norm3"),
        rename("decoder.norm", "transformer.decoder.norm"),  # the final norm shared by every decoder layer's output
        rename("class_embed", "class_embed"),  # (K + 1, D) both, the last row "no object"
        rename("bbox_embed", "bbox_embed"),  # layers.0..2 both
        *MASK_RULES,
    ),
    markers=(f"{BACKBONE_BODY}.conv1.weight", "query_embed.weight", "transformer.decoder.norm.weight"),
    strip_prefixes=("detr.",),  # a panoptic checkpoint's `DETRsegm` holds the detector as `detr`
    dropped=tuple(f"{BACKBONE_BODY}.{norm}.num_batches_tracked" for norm in RESNET_NORMS),
    check_export=check_original_export,
    wrapper="model",  # its main.py and hubconf.py read checkpoint["model"]
)


# --- torchvision's and timm's ResNet classifiers: the backbone alone --------------------------------------------------


def backbone_only_export(family: str, formats: str) -> Callable[[Any], None]:
    """The `check_export` of a format that holds a detector's backbone alone: always a ValueError naming `formats`,
    those that write the whole model."""

    def refuse(config: Any) -> None:
        raise ValueError(
            f"the torchvision layout of {family} models is a ResNet classifier's file, which initialises the backbone "
            f"alone (loading leaves the rest as initialised); write the whole model as {formats}"
        )

    return refuse


def resnet_classifier(family: str, formats: str) -> Layout:
    """torchvision's `resnet18` .. `resnet152` (and timm's ResNets of the same names, which keep torchvision's names:
    conv1, bn1, layer1..4, fc) as `family`'s backbone: `backbone.X` <- `X`, the classifier `fc` and BatchNorm's step
    counts dropped, the rest of the detector left as initialised. A pretrained classifier is where DETR and
    Deformable DETR start their backbones (their papers' ImageNet ResNet-50)."""
    return Layout(
        format="torchvision",
        family=family,
        rules=resnet_rules(""),
        markers=("conv1.weight", "bn1.running_var", "layer1.0.conv1.weight"),
        dropped=("fc", *(f"{norm}.num_batches_tracked" for norm in RESNET_NORMS)),
        check_export=backbone_only_export(family, formats),
        part="backbone.",
        part_name="ResNet",
    )


TORCHVISION = resnet_classifier("detr", "vitkit, hf or detr")


# --- Hugging Face transformers ----------------------------------------------------------------------------------------
HF_BACKBONES = ("backbone.conv_encoder.model", "backbone.model")  # on disk, in memory


def hf_native_backbone(prefix: str) -> tuple[Rename, ...]:
    """transformers' own ResNet (`ResNetBackbone`) under `prefix`: the same convolutions and norms as torchvision's,
    named by stage and position; stages count from 0 (`encoder.stages.t`), torchvision's from 1 (`layer{t + 1}`), and
    a block's convs and norms from 0 (`layer.j`), torchvision's from 1 (`conv{j + 1}`, `bn{j + 1}`)."""
    stage = f"{prefix}.encoder.stages.{{t}}.layers.{{b}}"
    conv_ours = {"to_ours": lambda i: {"s": i["t"] + 1, "b": i["b"], "n": i["j"] + 1}}
    conv_theirs = {"to_theirs": lambda i: {"t": i["s"] - 1, "b": i["b"], "j": i["n"] - 1}}
    shortcut = {
        "to_ours": lambda i: {"s": i["t"] + 1, "b": i["b"]},
        "to_theirs": lambda i: {"t": i["s"] - 1, "b": i["b"]},
    }
    return (
        rename("backbone.conv1", f"{prefix}.embedder.embedder.convolution"),  # (w0, C, 7, 7) both
        rename("backbone.bn1", f"{prefix}.embedder.embedder.normalization"),
        rename("backbone.layer{s}.{b}.conv{n}", f"{stage}.layer.{{j}}.convolution", **conv_ours, **conv_theirs),
        rename("backbone.layer{s}.{b}.bn{n}", f"{stage}.layer.{{j}}.normalization", **conv_ours, **conv_theirs),
        rename("backbone.layer{s}.{b}.downsample.0", f"{stage}.shortcut.convolution", **shortcut),
        rename("backbone.layer{s}.{b}.downsample.1", f"{stage}.shortcut.normalization", **shortcut),
    )


def hf_timm_backbone(prefix: str) -> tuple[Rename, ...]:
    """timm's ResNet under `prefix`: torchvision's names (conv1, bn1, layer1..4), which vitkit's backbone keeps."""
    return (rename("backbone", prefix),)


def _hf_body(out_proj: str, ffn: str) -> tuple[Rename, ...]:
    """The transformer and heads, with the attention output named `out_proj` and the feed-forward under `ffn`."""
    enc, dec = "encoder.layers.{i}", "decoder.layers.{i}"

    def attention(ours: str, theirs: str) -> tuple[Rename, ...]:
        # Separate q, k, v Linears (D, D) each, concatenated along dim 0 into the fused qkv (3D, D), rows q | k | v
        # (nn.MultiheadAttention's in_proj layout); biases (D,) each -> (3D,).
        qkv = rename(f"{ours}.qkv", f"{theirs}.q_proj", f"{theirs}.k_proj", f"{theirs}.v_proj")
        return qkv, rename(f"{ours}.proj", f"{theirs}.{out_proj}")

    return (
        rename("input_proj", "input_projection"),  # Conv2d (D, C5, 1, 1) both
        rename("query_embed", "query_position_embeddings"),  # Embedding (Q, D) both
        *attention(f"{enc}.self_attn", f"{enc}.self_attn"),
        rename(f"{enc}.norm1", f"{enc}.self_attn_layer_norm"),
        rename(f"{enc}.mlp.fc1", f"{enc}.{ffn}fc1"),
        rename(f"{enc}.mlp.fc2", f"{enc}.{ffn}fc2"),
        rename(f"{enc}.norm2", f"{enc}.final_layer_norm"),
        *attention(f"{dec}.self_attn", f"{dec}.self_attn"),
        rename(f"{dec}.norm1", f"{dec}.self_attn_layer_norm"),
        *attention(f"{dec}.cross_attn", f"{dec}.encoder_attn"),
        rename(f"{dec}.norm2", f"{dec}.encoder_attn_layer_norm"),
        rename(f"{dec}.mlp.fc1", f"{dec}.{ffn}fc1"),
        rename(f"{dec}.mlp.fc2", f"{dec}.{ffn}fc2"),
        rename(f"{dec}.norm3", f"{dec}.final_layer_norm"),
        rename("decoder.norm", "decoder.layernorm"),  # the final norm shared by every decoder layer's output
        rename("class_embed", "class_labels_classifier"),  # (K + 1, D) both, the last row "no object"
        rename("bbox_embed", "bbox_predictor"),  # layers.0..2 both
    )


_HF_COMMON = dict(
    format="hf",
    family="detr",
    markers=("input_projection.weight", "query_position_embeddings.weight"),
    strip_prefixes=("detr.model.", "detr.", "model."),  # `DetrForSegmentation` holds the detector as `detr`
)
_HF_HEADS = ("class_labels_classifier", "bbox_predictor")  # beside `model.` in DetrForObjectDetection
# Import: either backbone, either naming (the native backbone's rules first: the timm rule takes any name under the
# prefix). Export: the files' names, with the backbone the config can express.
HF = Layout(
    rules=(
        *(r for prefix in HF_BACKBONES for r in hf_native_backbone(prefix)),
        *(r for prefix in HF_BACKBONES for r in hf_timm_backbone(prefix)),
        *_hf_body("out_proj", ""),
        *_hf_body("o_proj", "mlp."),
        *MASK_RULES,
        *HF_MASK_RULES,
    ),
    **_HF_COMMON,
)
HF_TIMM = Layout(rules=hf_timm_backbone(HF_BACKBONES[0]) + _hf_body("out_proj", "") + MASK_RULES, **_HF_COMMON)
HF_NATIVE = Layout(rules=hf_native_backbone(HF_BACKBONES[0]) + _hf_body("out_proj", "") + MASK_RULES, **_HF_COMMON)


def backbone_from_hf(hf: dict[str, Any], source: str) -> dict[str, Any]:
    """The vitkit backbone fields for a transformers DETR config's backbone: timm's (`use_timm_backbone`, or a
    `timm_backbone` sub-config, as transformers 5 writes) or transformers' own ResNet (`backbone_config` "resnet")."""
    sub = hf.get("backbone_config")
    if sub is None and not hf.get("use_timm_backbone", True):
        sub = {"model_type": "resnet"}  # transformers' default: its ResNet-50
    if sub is None or sub.get("model_type") == "timm_backbone":
        name = (hf.get("backbone") if sub is None else sub.get("backbone")) or "resnet50"
        if name.split(".")[0] not in TIMM_RESNETS:
            raise ValueError(f"{source}: timm backbone {name!r} is not supported; vitkit reads {sorted(TIMM_RESNETS)}")
        block, depths = TIMM_RESNETS[name.split(".")[0]]
        dilation = bool(hf.get("dilation")) or (sub is not None and sub.get("output_stride") == 16)
        return dict(backbone_block=block, backbone_depths=depths, backbone_width=64, dilation=dilation)
    if sub.get("model_type") != "resnet":
        raise ValueError(f"{source}: backbone {sub.get('model_type')!r} is not supported; vitkit reads ResNets")
    if hf.get("dilation"):
        raise ValueError(f"{source}: dilation with transformers' own ResNet is not supported (transformers neither)")
    block = sub.get("layer_type", "bottleneck")
    depths = tuple(sub.get("depths", (3, 4, 6, 3)))
    width = sub.get("embedding_size", 64)
    expansion = 4 if block == "bottleneck" else 1
    hidden = list(sub.get("hidden_sizes", (256, 512, 1024, 2048)))
    expected = [width * 2**s * expansion for s in range(4)]
    if hidden != expected or sub.get("downsample_in_first_stage") or sub.get("downsample_in_bottleneck"):
        raise ValueError(
            f"{source}: vitkit's backbone is torchvision's ResNet: with embedding_size {width} and {block} blocks its "
            f"hidden_sizes are {expected} (got {hidden}), striding on the 3x3 and not in the first stage"
        )
    if sub.get("hidden_act", "relu") != "relu":
        raise ValueError(f"{source}: backbone hidden_act {sub['hidden_act']!r} is not supported; ResNets use 'relu'")
    return dict(backbone_block=block, backbone_depths=depths, backbone_width=width, dilation=False)


def config_from_hf(hf: dict[str, Any], keys: set[str], source: str) -> DetrConfig:
    """The vitkit DETR config equal to a transformers `DetrConfig` (arguments: see
    `vitkit.weights.family.ConfigReader`).

    `auxiliary_loss` becomes `aux_loss`. With it transformers' decoder feeds each layer's normalised output to the
    next layer, which DETR's code does not: vitkit computes DETR's, so such a model's outputs differ from
    transformers' (its released checkpoints have it off).
    """
    for field, allowed in (("position_embedding_type", "sine"), ("activation_function", "relu")):
        if hf.get(field, allowed) != allowed:
            raise ValueError(f"{source}: {field} {hf[field]!r} is not supported; vitkit's DETR uses {allowed!r}")
    pairs = (("encoder_attention_heads", "decoder_attention_heads", 8), ("encoder_ffn_dim", "decoder_ffn_dim", 2048))
    for enc, dec, default in pairs:
        if hf.get(enc, default) != hf.get(dec, default):
            raise ValueError(
                f"{source}: {enc} {hf.get(enc, default)} != {dec} {hf.get(dec, default)}; vitkit's DETR uses one"
            )
    return DetrConfig(
        in_chans=hf.get("num_channels", 3),
        num_classes=num_labels(hf),
        **backbone_from_hf(hf, source),
        hidden_dim=hf.get("d_model", 256),
        num_heads=hf.get("encoder_attention_heads", 8),
        enc_layers=hf.get("encoder_layers", 6),
        dec_layers=hf.get("decoder_layers", 6),
        dim_feedforward=hf.get("encoder_ffn_dim", 2048),
        drop_rate=float(hf.get("dropout", 0.1)),
        attn_drop_rate=float(hf.get("attention_dropout", 0.0)),
        num_queries=hf.get("num_queries", 100),
        aux_loss=bool(hf.get("auxiliary_loss", False)),
        masks=any(key.split(".")[0] in MASK_PARTS for key in keys),  # a `DetrForSegmentation`
    )


def without_step_counts(state: State) -> State:
    """`state` without the `num_batches_tracked` counters of a backbone trained with BatchNorm (`backbone_norm`
    "batch"): transformers' and the original codes' backbones keep frozen norms, which count no steps."""
    return {k: v for k, v in state.items() if not k.endswith(".num_batches_tracked")}


def to_hf(config: DetrConfig, state: State) -> tuple[State, dict[str, Any]]:
    """A vitkit DETR state dict and config as transformers writes a `DetrForObjectDetection`.

    A standard ResNet (18 / 34 / 50 / 101 / 152, 64 wide) is written as timm's backbone, as transformers' DETR
    checkpoints are; any other width or depth as transformers' own ResNet, which cannot dilate (no DC5).
    `auxiliary_loss` is written False (see `config_from_hf`), so transformers computes the same outputs.
    """
    if config.backbone != "resnet":
        raise ValueError(
            f"transformers' DETR has a ResNet backbone; this model's is {config.backbone}: keep it in vitkit's layout "
            "(save_pretrained)"
        )
    timm_name = resnet_name(config)
    if timm_name is None and config.dilation:
        raise ValueError(
            "transformers' DETR dilates (DC5) timm's ResNets only (18, 34, 50, 101, 152 at width 64); this backbone is "
            f"{config.backbone_block} {config.backbone_depths} at width {config.backbone_width}"
        )
    layout = HF_TIMM if timm_name else HF_NATIVE
    state = without_step_counts(state)
    renamed = layout.from_vitkit(state)
    if config.masks:  # a `DetrForSegmentation`: the detector under `detr.`
        renamed = with_detr_prefix(renamed, "detr.model.", _HF_HEADS, "detr.")
    else:
        renamed = with_detr_prefix(renamed, "model.", _HF_HEADS)
    hf: dict[str, Any] = {
        "architectures": ["DetrForSegmentation" if config.masks else "DetrForObjectDetection"],
        "model_type": "detr",
        "num_channels": config.in_chans,
        "d_model": config.hidden_dim,
        "encoder_layers": config.enc_layers,
        "decoder_layers": config.dec_layers,
        "encoder_attention_heads": config.num_heads,
        "decoder_attention_heads": config.num_heads,
        "encoder_ffn_dim": config.dim_feedforward,
        "decoder_ffn_dim": config.dim_feedforward,
        "activation_function": "relu",
        "dropout": config.drop_rate,
        "attention_dropout": config.attn_drop_rate,
        "activation_dropout": config.drop_rate,
        "num_queries": config.num_queries,
        "position_embedding_type": "sine",
        "auxiliary_loss": False,
        "dilation": config.dilation,
        "use_pretrained_backbone": False,
        **labels(config.num_classes),
    }
    if timm_name:
        hf.update(use_timm_backbone=True, backbone=timm_name, backbone_config=None)
    else:
        stages = [1, 2, 3, 4] if config.masks else [4]  # the mask head reads layer1..layer3 too
        hf.update(use_timm_backbone=False, backbone_config=hf_resnet_config(config, stages))
    return renamed, hf


def hf_resnet_config(config: Any, stages: list[int]) -> dict[str, Any]:
    """transformers' `ResNetConfig` (as a dict) of a detector config's ResNet (`in_chans`, `backbone_width`,
    `backbone_block`, `backbone_depths`), its maps read from `stages` (1..4: layer1..layer4)."""
    w, expansion = config.backbone_width, 4 if config.backbone_block == "bottleneck" else 1
    return {
        "model_type": "resnet",
        "num_channels": config.in_chans,
        "embedding_size": w,
        "hidden_sizes": [w * 2**s * expansion for s in range(4)],
        "depths": list(config.backbone_depths),
        "layer_type": config.backbone_block,
        "hidden_act": "relu",
        "downsample_in_first_stage": False,
        "downsample_in_bottleneck": False,
        "out_features": [f"stage{s}" for s in stages],
    }


WEIGHTS = FamilyWeights(
    in_timm=False,  # timm has no DETR: its format would be vitkit's own names, under another name
    # facebookresearch/detr's files have the first two as well; its decoder's norm sits under `transformer.`
    markers=("input_proj.weight", "query_embed.weight", "decoder.norm.weight"),
    head=("class_embed.",),  # the class head only: the box head predicts boxes of any class, so fine-tuning keeps it
    extra_outputs=1,  # "no object"
    layouts=(TORCHVISION, HF, ORIGINAL),  # torchvision first, as the classifiers list it: one order of formats
    read_fields=read_fields,
    unread_fields=("num_heads",),  # every attention's projections are (D, D) for any head count
    hf_model_types={"detr": config_from_hf},
    hf_export=to_hf,
)
