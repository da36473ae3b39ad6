"""The interface every vitkit model provides, declared once; the rest of the package uses it instead of attribute
names (training checkpoints blocks through it, attention maps ask it for the token grid, analysis reads its costs).

`VitkitModel` is what every model provides; `VitkitDetector` what a detector (a family registered with task
"detection") provides besides. `tests/models/test_all_models.py` checks both for every registered model.
"""

from __future__ import annotations

import types
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from vitkit.cost import CostContext, Device, OpCost, trace, tracing
from vitkit.layers.helpers import to_2tuple


@runtime_checkable
class VitkitModel(Protocol):
    """What a model built by `create_model` provides, whatever its family.

    - ``config``: the frozen config dataclass it was built from (at least ``img_size``, ``in_chans``,
      ``num_classes``).
    - ``forward(x)``: images (B, C, H, W) -> logits (B, num_classes), always
      ``forward_head(forward_features(x))``.
    - ``cost(...)``: the analytic cost of `forward`, one row per operator in forward order (its forward traced on
      meta tensors, `vitkit.cost.tracer`).
    - ``shard_units()``: the model's repeated blocks, the units that gradient checkpointing recomputes and that
      FSDP (`vitkit train --strategy fsdp`) shards and gathers one at a time.
    - ``set_grad_checkpointing(enable)``: recompute the model's blocks (`shard_units`) in backward instead of
      storing their activations.
    - ``token_grid(img_size)``: how attention tokens map to the image, for attention maps; a model whose grid has
      prefix tokens may also name them (``prefix_token_names()``: "class", "distillation", "register 0", ...); a
      model without one token grid may lay its captured attention on the image instead
      (``spatial_attention(maps, img_size)``: a `SpatialAttention` per layer; Swin, BoTNet), and say why it has
      none (``attention_layout()``: a clause for messages, "its blocks attend within 7x7 windows ...").
    - ``no_weight_decay()``: parameters that take no weight decay besides every one of ndim <= 1 (timm's
      convention: learned tokens, position tables).
    - a classifier's ``get_classifier()`` and ``reset_classifier(num_classes)``, as timm's: its head, and a fresh one
      for `num_classes` classes on the same pooled features (0: none, `forward` returns them); the config follows.

    A detector (DETR) reads the same methods its way: ``forward(images, pixel_mask=None)`` returns a dict of
    predictions, always with the same keys; ``forward_features`` the decoder's outputs (L, B, Q, D),
    ``forward_head`` that dict (with ``pre_logits``, the object embeddings (B, Q, D)); ``token_grid`` is None.
    """

    config: Any

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """Images (B, C, H, W) -> the final normalised features, in the family's layout (tokens or a map)."""
        ...

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        """`forward_features`' output -> logits (B, num_classes), or the pooled features (B, D) with `pre_logits`."""
        ...

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Images (B, C, H, W) -> logits (B, num_classes)."""
        ...

    def cost(
        self, img_size: tuple[int, int], batch: int = 1, dtype: torch.dtype = torch.float32, device: Device = "cpu"
    ) -> list[OpCost]:
        """Analytic cost of `forward` on a (batch, C, H, W) input of `dtype` on `device`, one row per operator."""
        ...

    def shard_units(self) -> list[nn.Module]:
        """The model's repeated blocks, in forward order: what `set_grad_checkpointing` recomputes and what
        `torch.distributed.fsdp.fully_shard` wraps one by one under `vitkit train --strategy fsdp` (the rest of the
        model, the embeddings and heads, is sharded with the root). Each is a submodule of the model."""
        ...

    def set_grad_checkpointing(self, enable: bool = True) -> int:
        """Recompute each block in backward (`enable`) or store its activations again (not `enable`).

        Only training forwards with autograd on are checkpointed; eval and no-grad forwards run the blocks as
        they are. Parameter names and the state dict do not change. Returns the number of blocks now
        checkpointed (0 after disabling).
        """
        ...

    def token_grid(self, img_size: tuple[int, int]) -> tuple[int, tuple[int, int]] | None:
        """For images of `img_size` (H, W): (P, (Hp, Wp)) when every attention layer attends over the same
        tokens, P prefix tokens followed by an Hp x Wp grid over the whole image (row-major), from as many queries
        (or, for attention pooling, one probe query); None when the attention layers do not (windows, or maps that
        change size between layers)."""
        ...

    def no_weight_decay(self) -> set[str]:
        """Qualified names of the parameters of ndim > 1 that take no weight decay (learned tokens, position
        tables); parameters of ndim <= 1 (biases, norm scales) take none either way."""
        ...


@runtime_checkable
class VitkitDetector(VitkitModel, Protocol):
    """What a detector provides besides `VitkitModel` (read its way, see there). Training, evaluation, export and
    the attention figures use these, never a detector's attribute names.

    - ``config``: besides the classifier's fields, ``num_queries`` (Q, the most objects an image yields) and
      ``aux_loss`` (whether `aux_outputs` holds the earlier decoder layers' predictions).
    - ``no_object_logit`` (a class attribute): whether the class logits end with a "no object" logit, K + 1 of them
      read by a softmax (DETR: True), or hold the K classes only, each read by a sigmoid (Deformable DETR: False).
      The losses, the matcher and the postprocessing read the first K logits either way; the softmax
      cross-entropy ("ce") needs the "no object" one. Read it with `has_no_object_logit`; a detector that does not
      declare it has DETR's layout (True).
    - ``forward(images, pixel_mask=None)``: images (B, C, H, W) and pixel_mask (B, H, W) (True / 1 where a pixel
      is real, False / 0 where it pads the image; None: all real) -> a dict, always with the same keys:
      ``pred_logits`` (B, Q, K + 1) with "no object" last, or (B, Q, K) without (`no_object_logit`);
      ``pred_boxes`` (B, Q, 4), boxes (cx, cy, w, h) relative to each image's unpadded size; ``aux_outputs``, a
      list of such dicts (without `aux_outputs`), one per earlier decoder layer, for the auxiliary losses. A
      detector may add entries of its own for its losses (two-stage Deformable DETR: ``enc_outputs``, the
      encoder's proposals, a dict like a layer's).
    - ``backbone``: the feature extractor (a ResNet, or a Swin or ViT: `vitkit.models.backbone`): its output is the
      list of feature maps the transformer reads, coarsest last, map i (B, backbone.out_channels[i], h_i, w_i);
      training may give it a learning rate of its own and read its output. A backbone also says the multiple its
      images' sides are padded to (`size_multiple`), its maps' sizes (`feature_sizes`), its blocks, what stays
      frozen by default (`early_layers`), its initialisation (`reset_parameters`) and whether an export traces
      any image size (`exports_any_size`); nothing in a detector asks what kind it is.
    - optionally ``denoising_settings()``: a `DenoisingSettings` when the detector trains with denoising queries
      (DN-DETR, DINO), None when it does not; such a detector's ``forward(images, pixel_mask, denoising)`` takes
      a `DenoisingQueries` and adds ``dn_outputs`` to its dict (read it with `denoising_settings`).
    - optionally ``predicts_masks``: True when `forward` and `predict` also give ``pred_masks`` (B, Q, H', W'), a
      mask logit map per query at a quarter of the padded image's size (DETR with its mask head); read it with
      `predicts_masks`.
    """

    backbone: nn.Module

    def predict(self, images: torch.Tensor, pixel_mask: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        """The last decoder layer's predictions only, ``pred_logits`` and ``pred_boxes`` as in `forward` (and
        ``pred_masks`` where the detector `predicts_masks`): what inference, evaluation and export read (no
        auxiliary outputs are computed)."""
        ...

    def reset_classifier(self, num_classes: int, prior: float | None = None) -> None:
        """A fresh class head for `num_classes` classes (the config follows); with `prior`, its biases make every
        class start at that probability (the focal loss's initialisation)."""
        ...

    def object_attention_layers(self) -> list[str]:
        """Qualified names of the attention layers whose weights have one row per object query (the decoder's
        cross-attention, first layer to last): `capture_attention` on them gives (B, heads, Q, h * w) over the
        `feature_grid` map."""
        ...

    def feature_grid(self, img_size: tuple[int, int]) -> tuple[int, int]:
        """The (h, w) feature map that the encoder and the object attention attend over, for images (padded) of
        `img_size` (H, W)."""
        ...


# The protocols' methods, which `register_family` checks a family's module class for.
METHODS = (
    "forward_features",
    "forward_head",
    "forward",
    "cost",
    "set_grad_checkpointing",
    "token_grid",
    "no_weight_decay",
)
DETECTOR_METHODS = ("predict", "reset_classifier", "object_attention_layers", "feature_grid")
NO_OBJECT_LOGIT = True  # what a detector that does not declare `no_object_logit` has: DETR's K + 1 logits


def predicts_masks(detector: object) -> bool:
    """Whether `detector`'s outputs hold ``pred_masks`` (`VitkitDetector.predicts_masks`); False when it declares
    nothing."""
    return bool(getattr(detector, "predicts_masks", False))


def has_no_object_logit(detector: object) -> bool:
    """Whether `detector` (a detector, or its class) declares a "no object" logit after its K class logits
    (`VitkitDetector.no_object_logit`); `NO_OBJECT_LOGIT` (True, DETR's layout) when it declares nothing. A
    declaration that is not a bool is a TypeError."""
    value = getattr(detector, "no_object_logit", NO_OBJECT_LOGIT)
    if not isinstance(value, bool):
        name = detector.__name__ if isinstance(detector, type) else type(detector).__name__
        raise TypeError(f"{name}.no_object_logit must be a bool, got {value!r}")
    return value


@dataclass(frozen=True)
class SpatialAttention:
    """One attention layer's weights laid on the image: which cells of a grid over the image each cell attends to,
    and how much. What a model whose attention is not over one token grid (`token_grid` None: Swin's windows,
    BoTNet's feature maps) gives from its `spatial_attention(maps, img_size)`, for the explorer.

    Letters: B batch, h heads, Q = Hg * Wg cells (row-major), K keys per cell.
    """

    layer: str  # the attention layer's name (its `capture_attention` key)
    grid: tuple[int, int]  # (Hg, Wg): the map the layer attends over, covering the whole image
    keys: torch.Tensor  # (Q, K) int64: each cell's keys, as cell indices into the grid (a window's, or all)
    weights: torch.Tensor  # (B, h, Q, K): each cell's attention to its keys; rows sum to one
    note: str = ""  # what the keys are, in words (e.g. "7x7 windows shifted by (3, 3)")


@dataclass(frozen=True)
class DenoisingSettings:
    """How a detector trains with denoising queries (DN-DETR, arXiv:2203.01305; DINO's contrastive form,
    arXiv:2203.03605): noised copies of each image's ground-truth boxes and labels, fed to the decoder beside the
    object queries, each taught to give back its box (or, for a negative, "no object").

    Attributes:
        queries: about how many denoising queries an image gets: `groups` (`DenoisingQueries`) copies of 2 n slots
            (n the most boxes of an image in the batch: a positive and a negative copy of each box), as many
            groups as fit in `queries` and at least one (DINO's dn_number 100).
        label_noise: the share of copies whose label is replaced by a random class (DINO: 0.5, of which half
            draw their own class back).
        box_noise: the scale of the box noise: a positive copy moves each side by up to box_noise / 2 of the box's
            width or height, a negative by between box_noise / 2 and box_noise (DINO: 1.0).
    """

    queries: int
    label_noise: float
    box_noise: float

    def __post_init__(self) -> None:
        if self.queries <= 0:
            raise ValueError(f"denoising queries must be positive, got {self.queries}")
        if not 0.0 <= self.label_noise <= 1.0 or self.box_noise < 0:
            raise ValueError(
                f"expected label_noise in [0, 1] and box_noise >= 0, got {self.label_noise} and {self.box_noise}"
            )


@dataclass(frozen=True)
class DenoisingQueries:
    """The denoising queries of a batch (made by `vitkit.detection.make_denoising`), placed before the object
    queries in the decoder.

    Attributes:
        labels: (B, P) int64: each slot's noised class index, -1 for a padding slot (an image with fewer than n
            boxes); P = groups * 2 n.
        boxes: (B, P, 4) noised boxes (cx, cy, w, h) in [0, 1].
        groups: G, the copies of the ground truth: group g holds slots [2 n g, 2 n (g + 1)), the n positives then
            the n negatives.
    """

    labels: torch.Tensor
    boxes: torch.Tensor
    groups: int

    def attention_allowed(self, num_queries: int) -> torch.Tensor:
        """(P + Q, P + Q) bool, True where decoder query i may attend to query j: the object queries see only each
        other (the noised ground truth would give the answer away), and each group sees itself and the object
        queries, not the other groups."""
        P = self.labels.shape[1]
        size = P // self.groups if self.groups else 0
        total = P + num_queries
        index = torch.arange(total, device=self.labels.device)
        group = torch.where(index < P, index // max(size, 1), -1)  # (P + Q,): -1 for the object queries
        same = group[:, None] == group[None, :]  # (P + Q, P + Q)
        to_objects = (group == -1)[None, :].expand(total, total)  # every query may attend to the object queries
        return same | to_objects


def denoising_settings(detector: object) -> DenoisingSettings | None:
    """The `DenoisingSettings` `detector` (a detector) declares through its optional ``denoising_settings()``;
    None when it declares none or trains without."""
    method = getattr(detector, "denoising_settings", None)
    return method() if method is not None else None


class CostFromImages:
    """`VitkitModel.cost` written once, for a model that checks its images with `check_input(x)`: its forward on a
    batch of images, traced (`vitkit.cost.tracer`)."""

    def cost(
        self, img_size: tuple[int, int], batch: int = 1, dtype: torch.dtype = torch.float32, device: Device = "cpu"
    ) -> list[OpCost]:
        """The operators of `forward` on a (batch, C, H, W) input in `dtype` on `device`, in forward order (a size
        `forward` refuses raises its ValueError)."""
        images = torch.empty((batch, self.config.in_chans, *img_size), device="meta")
        self.check_input(images)
        return trace(self, images, ctx=CostContext(dtype, device))


def require_model(model: object, purpose: str) -> VitkitModel:
    """`model` itself, or ValueError naming what it lacks when it is not a vitkit model (`purpose` says what
    needed one, e.g. "gradient checkpointing")."""
    if isinstance(model, VitkitModel):
        return model
    missing = ", ".join(name for name in ("config", *METHODS) if not hasattr(model, name))
    raise ValueError(f"{purpose} needs a vitkit model (vitkit.create_model); {type(model).__name__} lacks {missing}")


def checkpoint_blocks(blocks: Iterable[nn.Module], enable: bool = True) -> int:
    """Make each of `blocks` recompute its forward in backward (`enable`) or undo that; the number now checkpointed.

    The families' `set_grad_checkpointing` call this with their blocks. The block's forward is rebound on the
    instance, so parameter names and the state dict are unchanged, and a deep copy (EMA) runs its own weights.
    """
    count = 0
    for block in blocks:
        if enable:
            block.forward = types.MethodType(_checkpointed_forward, block)
            count += 1
        else:
            block.__dict__.pop("forward", None)
    return count


def _checkpointed_forward(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
    """The block's own forward, under `torch.utils.checkpoint` while training with autograd on, plain otherwise.

    The recomputation in backward runs the block a second time; BatchNorm running statistics are restored after
    it, so they move once per step, as without checkpointing. `checkpoint` replays the random state (dropout,
    drop path).
    """
    forward = type(self).forward
    if not (self.training and torch.is_grad_enabled()) or tracing():  # a cost trace counts the plain forward
        return forward(self, *args, **kwargs)
    calls = 0

    def run(*args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls == 1:
            return forward(self, *args, **kwargs)
        with _kept_norm_statistics(self):  # the recomputation in backward
            return forward(self, *args, **kwargs)

    return checkpoint(run, *args, use_reentrant=False, **kwargs)


@contextmanager
def _kept_norm_statistics(module: nn.Module) -> Iterator[None]:
    """Restore the BatchNorm running statistics under `module` on leaving (also when recomputation stops early)."""
    norms = [m for m in module.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.track_running_stats]
    saved = [{name: buf.clone() for name, buf in m.named_buffers(recurse=False)} for m in norms]
    try:
        yield
    finally:
        with torch.no_grad():
            for m, buffers in zip(norms, saved, strict=True):
                for name, value in buffers.items():
                    getattr(m, name).copy_(value)


def check_detector_input(
    config: Any, images: torch.Tensor, pixel_mask: torch.Tensor | None, name: str
) -> torch.Tensor | None:
    """A detector's `check_input`: ValueError unless images are (B, in_chans, H, W) floats (of `config.img_size`
    without `config.dynamic_img_size`) and pixel_mask is None or (B, H, W); the mask as booleans. `name` names the
    detector in the messages."""
    c = config
    if images.ndim != 4 or images.shape[1] != c.in_chans:
        raise ValueError(f"{name} expects images (B, {c.in_chans}, H, W), got shape {tuple(images.shape)}")
    if not images.is_floating_point():
        raise ValueError(f"{name} expects floating-point images, got dtype {images.dtype}")
    B, _, H, W = images.shape
    if not c.dynamic_img_size and (H, W) != to_2tuple(c.img_size):
        h, w = to_2tuple(c.img_size)
        raise ValueError(
            f"expected images of size {h}x{w}, got {H}x{W}; build the model with dynamic_img_size=True to "
            "accept other sizes"
        )
    if pixel_mask is None:
        return None
    if tuple(pixel_mask.shape) != (B, H, W):
        raise ValueError(
            f"pixel_mask must be (B, H, W) = {(B, H, W)} like the images, got shape {tuple(pixel_mask.shape)}"
        )
    return pixel_mask if pixel_mask.dtype == torch.bool else pixel_mask != 0
