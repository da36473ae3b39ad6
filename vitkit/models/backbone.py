"""A registered classifier as a detector's backbone: a Swin's stages or a ViT's blocks as the maps a detector reads.

A detector asks its backbone for maps only (`vitkit.models.interface.VitkitDetector`: `backbone(images)` gives the
maps, coarsest last, with `out_channels`, `feature_sizes(img_size)`, `blocks()` and `size_multiple`). A ResNet gives
them as it is; `ClassifierBackbone` gives them for any registered model with timm's `forward_intermediates` (the
outputs of chosen stages or blocks as (B, C, h, w) maps, with the final norm where it applies), `feature_info`
(each output's channels and stride) and `check_feature_outputs` (whether those outputs use every parameter): Swin
(strides 4..32) and ViT (every block at the patch's stride).

A plain ViT's maps all have one stride. `scales` turn them into a pyramid, ViTDet's way (Li et al., "Exploring
Plain Vision Transformer Backbones for Object Detection", ECCV 2022, its simple feature pyramid): scale 4 by two
stride-2 transposed convolutions with a LayerNorm and GELU between them, 2 by one, 1 as it is, 0.5 by 2x2 max
pooling. From one output (the last block, ViTDet) every scale is built; from as many outputs as scales (taps after
chosen blocks, as RF-DETR and LW-DETR take them), each output makes its own scale. The detector's input
projections then project and normalise each map, as they do a ResNet's.

Parameter names: `body.*` the classifier's own (timm's), so its checkpoints fill the backbone under that prefix;
`pyramid.<i>.*` the scale layers.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vitkit.models.registry import CLASSIFICATION, build_model, family, model_entry, replace_config

SCALES = (4.0, 2.0, 1.0, 0.5)  # the simple feature pyramid's scales (ViTDet)


class LayerNorm2d(nn.LayerNorm):
    """LayerNorm over the channels of a map (B, C, H, W), as ViTDet's and ConvNeXt's."""

    def forward(self, x: Tensor) -> Tensor:
        return super().forward(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)  # (B, C, H, W) -> (B, H, W, C) and back


class Upsample2x(nn.ConvTranspose2d):
    """A 2x2 stride-2 transposed convolution (its parameters and result), computed as a 1x1 convolution to four
    times the channels and a pixel shuffle (depth to space): each input pixel becomes a 2x2 block. The same
    arithmetic as `F.conv_transpose2d`, which torch.export cannot yet give symbolic image sizes (the ONNX export of
    a detector that takes any size)."""

    def __init__(self, in_channels: int, out_channels: int) -> None:
        super().__init__(in_channels, out_channels, 2, 2)

    def forward(self, x: Tensor) -> Tensor:
        c_in, c_out = self.in_channels, self.out_channels
        # (C_in, C_out, 2, 2) -> (C_out, 2, 2, C_in): output channel o's 2x2 block at rows 4 o + 2 a + b
        w = self.weight.permute(1, 2, 3, 0).reshape(c_out * 4, c_in, 1, 1)
        y = F.pixel_shuffle(F.conv2d(x, w), 2)  # (B, 4 C_out, H, W) -> (B, C_out, 2H, 2W): [o, 2i + a, 2j + b]
        return y + self.bias.view(1, -1, 1, 1)


def scale_layer(channels: int, scale: float) -> tuple[nn.Module, int]:
    """ViTDet's layer that takes a map of `channels` to `scale` times its resolution: (the layer, its output
    channels)."""
    if scale == 4.0:
        half, quarter = channels // 2, channels // 4
        layers = [Upsample2x(channels, half), LayerNorm2d(half), nn.GELU()]
        return nn.Sequential(*layers, Upsample2x(half, quarter)), quarter
    if scale == 2.0:
        return Upsample2x(channels, channels // 2), channels // 2
    if scale == 1.0:
        return nn.Identity(), channels
    if scale == 0.5:
        return nn.MaxPool2d(2, 2), channels
    raise ValueError(f"a pyramid scale must be one of {SCALES}, got {scale}")


class ClassifierBackbone(nn.Module):
    """The registered classifier `model` (without its head) as a backbone: images (B, C, H, W) -> the maps of its
    outputs `outs` (1-based stages or blocks), through the pyramid `scales` when given, finest first.

    Args:
        model: a registered model whose family has `forward_intermediates` and `feature_info` (Swin, ViT).
        outs: its outputs that feed the maps, increasing: Swin's stages 1..4, a ViT's blocks 1..depth.
        scales: () for the outputs as they are; else the pyramid's scales (of `SCALES`, decreasing), all from
            one output or one per output.
        fields: config fields of `model` to replace (`backbone_config`: the detector sets the channels, any
            image size, no head).
        in_chans: the detector's image channels.
    """

    def __init__(
        self,
        model: str,
        outs: Sequence[int],
        scales: Sequence[float] = (),
        fields: Mapping[str, Any] | None = None,
        in_chans: int = 3,
    ) -> None:
        super().__init__()
        config = backbone_config(model, fields or {}, in_chans)
        check_backbone_outputs(model, outs, scales, fields or {})
        self.body = build_model(model_entry(model).family, config)
        self.outs = tuple(outs)
        self.indices = [i - 1 for i in self.outs]  # forward_intermediates counts from 0
        self.body.check_feature_outputs(self.indices)
        info = self.body.feature_info()
        channels = [info[i][0] for i in self.indices]
        strides = [info[i][1] for i in self.indices]
        self.scales = tuple(float(s) for s in scales)
        if self.scales:
            sources = [len(channels) - 1] * len(self.scales) if len(channels) == 1 else list(range(len(channels)))
            pairs = [scale_layer(channels[s], scale) for s, scale in zip(sources, self.scales, strict=True)]
            self.pyramid = nn.ModuleList([layer for layer, _ in pairs])
            self.sources = sources
            self.out_channels = [c for _, c in pairs]
            # each map's side is the image's times mul // div (a scale of 0.5 halves the output's side)
            self.ratios = [
                (int(scale), strides[s]) if scale >= 1 else (1, 2 * strides[s])
                for s, scale in zip(sources, self.scales, strict=True)
            ]
        else:
            self.pyramid = None
            self.out_channels, self.ratios = channels, [(1, s) for s in strides]
        self.strides = [div / mul for mul, div in self.ratios]  # each map's stride, in pixels
        self.size_multiple = self.body.config.size_multiple * (2 if 0.5 in self.scales else 1)
        # whether an ONNX export traces any image size (the body says: a ViT does; Swin's windows fix the size)
        self.exports_any_size = getattr(self.body, "exports_any_size", True)

    def forward(self, images: Tensor) -> list[Tensor]:
        """Images (B, C, H, W), sides multiples of `size_multiple` -> the maps (B, C_l, H / s_l, W / s_l), finest
        first."""
        maps = self.body.forward_intermediates(
            images, self.indices, output_fmt="NCHW", norm=True, intermediates_only=True
        )
        if self.pyramid is None:
            return maps
        return [layer(maps[s]) for layer, s in zip(self.pyramid, self.sources, strict=True)]

    def feature_sizes(self, img_size: tuple[int, int]) -> list[tuple[int, int]]:
        """The (h, w) of each map for images of `img_size` (H, W), padded to sides that are multiples of
        `size_multiple` (`pad_to_multiple`)."""
        m = self.size_multiple
        H, W = (img_size[0] + m - 1) // m * m, (img_size[1] + m - 1) // m * m  # padded to whole multiples
        return [(H * mul // div, W * mul // div) for mul, div in self.ratios]  # integers (or traced sizes)

    def blocks(self) -> list[nn.Module]:
        """The body's blocks (what gradient checkpointing wraps)."""
        return self.body.shard_units()

    def early_layers(self) -> list[nn.Module]:
        """Nothing a detector keeps frozen (`train_stem` is a ResNet's): a transformer backbone trains whole."""
        return []

    def reset_parameters(self) -> None:
        """The body's own initialisation (the classifier's), the pyramid's transposed convolutions as ViTDet's
        (Kaiming normal, fan out), their norms at one and zero."""
        self.body.init_weights()
        if self.pyramid is not None:
            for module in self.pyramid.modules():
                if isinstance(module, nn.ConvTranspose2d):
                    nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")
                    nn.init.zeros_(module.bias)
                elif isinstance(module, nn.LayerNorm):
                    nn.init.ones_(module.weight)
                    nn.init.zeros_(module.bias)


def backbone_config(model: str, fields: Mapping[str, Any], in_chans: int) -> Any:
    """The config of the registered model `model` as a detector's backbone: with `fields` replaced, the detector's
    `in_chans`, any image size, without a head. Its `img_size` stays the classifier's (that of its pretrained
    position table, which each forward resamples to the detector's images), unless `fields` change it."""
    fields = {**fields, "num_classes": 0, "in_chans": in_chans, "dynamic_img_size": True}
    return replace_config(model_entry(model).config, **fields)


def backbone_outputs(model: str, fields: Mapping[str, Any]) -> int:
    """How many outputs the registered Swin or ViT `model` with `fields` gives a detector: its stages, or its
    blocks."""
    config = replace_config(model_entry(model).config, **fields)
    return len(config.depths) if hasattr(config, "depths") else config.depth


def pad_to_multiple(images: Tensor, pixel_mask: Tensor | None, multiple: int) -> tuple[Tensor, Tensor | None]:
    """Images (B, C, H, W) padded with zeros at the bottom and right to sides that are multiples of `multiple`, and
    their pixel mask (B, H, W) with the padding False (all real before, when None). With `multiple` 1, as they
    came. The same operations whatever the size (no branch on it), so that an export traced at one size pads at
    every other."""
    if multiple == 1:
        return images, pixel_mask
    H, W = images.shape[-2:]
    pad_h, pad_w = (multiple - H % multiple) % multiple, (multiple - W % multiple) % multiple
    if pixel_mask is None:
        pixel_mask = torch.ones_like(images[:, 0], dtype=torch.bool)  # (B, H, W)
    return F.pad(images, (0, pad_w, 0, pad_h)), F.pad(pixel_mask, (0, pad_w, 0, pad_h), value=False)


def check_backbone_outputs(model: str, outs: Sequence[int], scales: Sequence[float], fields: Mapping[str, Any]) -> None:
    """ValueError for a backbone `model` that is no registered classifier with maps, for `outs` it does not have,
    or `scales` that do not pair with them."""
    entry = model_entry(model)
    fam = family(entry.family)
    if fam.task != CLASSIFICATION or not hasattr(fam.model_cls, "check_feature_outputs"):
        raise ValueError(
            f"backbone {model!r} is a {fam.display_name} model, which gives no maps; a detector's backbone is "
            "'resnet' or a Swin or ViT variant (vitkit.list_models('swin_*'), 'vit_*')"
        )
    count = backbone_outputs(model, fields)
    unit = "stages" if hasattr(entry.config, "depths") else "blocks"
    if not outs or list(outs) != sorted(set(outs)) or not all(1 <= o <= count for o in outs):
        raise ValueError(f"backbone_stages of {model} must be increasing {unit} among 1..{count}, got {tuple(outs)}")
    if scales:
        if list(scales) != sorted(set(scales), reverse=True) or not set(scales) <= set(SCALES):
            raise ValueError(f"backbone_scales must be decreasing, among {SCALES}, got {tuple(scales)}")
        if len(outs) not in (1, len(scales)):
            raise ValueError(
                f"backbone_scales {tuple(scales)} take one output (every scale from it) or one per scale, got "
                f"{len(outs)} outputs {tuple(outs)}"
            )


def check_backbone_choice(config: Any, outs: Sequence[int]) -> None:
    """ValueError for a detector config's backbone fields (`backbone`, `backbone_args`, `backbone_scales`) that do not
    make a backbone with the outputs `outs`: an unknown name, a ResNet given a transformer's fields, outputs or
    scales the model does not have, fields its config refuses."""
    if config.backbone == "resnet":
        if config.backbone_scales or config.backbone_args:
            raise ValueError(
                "backbone_scales and backbone_args are a Swin or ViT backbone's; a ResNet's fields are "
                "backbone_block, backbone_depths, backbone_width, backbone_stages, dilation and backbone_norm"
            )
        return
    try:
        model_entry(config.backbone)
    except ValueError as err:
        raise ValueError(f"backbone must be 'resnet' or a registered Swin or ViT variant: {err}") from None
    check_backbone_outputs(config.backbone, outs, config.backbone_scales, dict(config.backbone_args))
    backbone_config(config.backbone, dict(config.backbone_args), config.in_chans)


class FeatureInfo:
    """timm's `feature_info` of a features model: each output's channels (`num_chs`) and stride in pixels
    (`reduction`), in output order."""

    def __init__(self, outputs: Sequence[tuple[int, int]]) -> None:
        self.info = [{"num_chs": c, "reduction": s} for c, s in outputs]

    def channels(self, idx: int | None = None) -> int | list[int]:
        return self.info[idx]["num_chs"] if idx is not None else [i["num_chs"] for i in self.info]

    def reduction(self, idx: int | None = None) -> int | list[int]:
        return self.info[idx]["reduction"] if idx is not None else [i["reduction"] for i in self.info]

    def __len__(self) -> int:
        return len(self.info)

    def __getitem__(self, idx: int) -> dict[str, int]:
        return self.info[idx]

    def __repr__(self) -> str:
        return f"FeatureInfo(channels={self.channels()}, reduction={self.reduction()})"


class FeatureMaps(nn.Module):
    """A classifier as timm's features model (`create_model(name, features_only=True)`): images (B, C, H, W) -> the
    outputs of chosen stages or blocks, a list of maps (B, C_i, H / s_i, W / s_i), with `feature_info` giving
    each one's channels and stride. The model is pruned of what those outputs do not use (later blocks or stages,
    the classifier; the final norm unless `norm`), as timm prunes it; its parameters keep their names under
    `model.`, as timm's ViT features model keeps them.

    Args:
        model: a model whose family has `forward_intermediates`, `feature_info` and `prune_intermediate_layers`
            (ViT, DeiT, Swin, BoTNet).
        out_indices: which outputs: None for the family's default (timm's: a ViT's last three blocks, every Swin
            stage, BoTNet's stem and every stage), an int n for the last n, or indices counted from 0 (negative
            ones from the end).
        output_fmt: "NCHW", or "NHWC" for channels-last maps (what timm's Swin features model returns).
        norm: apply the final norm where the family does (`forward_intermediates(norm=True)`).
    """

    def __init__(
        self,
        model: nn.Module,
        out_indices: int | Sequence[int] | None = None,
        output_fmt: str = "NCHW",
        norm: bool = False,
    ) -> None:
        super().__init__()
        if not callable(getattr(model, "prune_intermediate_layers", None)):
            name = type(model).__name__
            raise ValueError(
                f"features_only needs a model with timm's forward_intermediates and prune_intermediate_layers (ViT, "
                f"DeiT, Swin, BoTNet); a {name} has none (a detector's backbone gives its maps: model.backbone(images))"
            )
        if output_fmt not in ("NCHW", "NHWC"):
            raise ValueError(f"output_fmt must be 'NCHW' or 'NHWC', got {output_fmt!r}")
        outputs = model.feature_info()
        indices = model.default_feature_outputs if out_indices is None else out_indices
        # in the order the maps come, once each (forward_intermediates returns them so, whatever the order asked)
        self.out_indices = sorted(set(model.prune_intermediate_layers(indices, prune_norm=not norm)))
        self.model = model
        self.output_fmt, self.norm = output_fmt, norm
        self.feature_info = FeatureInfo([outputs[i] for i in self.out_indices])

    def forward(self, images: Tensor) -> list[Tensor]:
        maps = self.model.forward_intermediates(
            images, self.out_indices, output_fmt="NCHW", norm=self.norm, intermediates_only=True
        )
        return maps if self.output_fmt == "NCHW" else [m.permute(0, 2, 3, 1) for m in maps]
