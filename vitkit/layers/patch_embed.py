"""Patch embedding: cut the image into p x p patches and project each to a token (a Conv2d with kernel = stride = p).

This is also where images enter a model, so it checks them: a 4-D floating tensor (B, C, H, W) with the
channels the model was built for, and a size the model accepts.

Letters: B batch, C input channels, H, W image size, p patch size, D embedding dim, Hp = H / p, Wp = W / p.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from vitkit.layers.helpers import to_2tuple
from vitkit.util import nearest_multiples


class PatchEmbed(nn.Module):
    """(B, C, H, W) -> tokens (B, Hp*Wp, D), or (B, Hp, Wp, D) with `flatten=False`.

    Args:
        img_size: the training image size (H, W) or one int for square images.
        patch_size: patch side p (or (ph, pw)).
        in_chans: input channels C.
        embed_dim: token channels D.
        norm_layer: optional norm applied to the tokens (Swin uses LayerNorm here).
        flatten: return a token sequence (True) or a channels-last grid (False).
        strict_img_size: accept only `img_size`; when False any size divisible by the patch is accepted.
        bias: add a bias to the projection (CLIP's has none).
        pixel_norm_layer: optional norm over each patch's C * ph * pw pixels before the projection (vit-pytorch:
            LayerNorm over the flattened patch, then the projection, then `norm_layer`). The patches are then
            unfolded to (B, N, C * ph * pw) in (c, ph, pw) order and projected with the convolution's weight as a
            linear map, which equals the convolution.
    """

    def __init__(
        self,
        img_size: int | tuple[int, int] = 224,
        patch_size: int | tuple[int, int] = 16,
        in_chans: int = 3,
        embed_dim: int = 768,
        norm_layer: type[nn.Module] | None = None,
        flatten: bool = True,
        strict_img_size: bool = True,
        bias: bool = True,
        pixel_norm_layer: Callable[[int], nn.Module] | None = None,
    ) -> None:
        super().__init__()
        self.img_size = to_2tuple(img_size)
        self.patch_size = to_2tuple(patch_size)
        for side, size, patch in zip(("height", "width"), self.img_size, self.patch_size, strict=True):
            if size % patch != 0:
                raise ValueError(
                    f"image {side} {size} is not a multiple of patch size {patch}: the nearest that are "
                    f"{nearest_multiples(size, patch)}"
                )
        self.grid_size = (self.img_size[0] // self.patch_size[0], self.img_size[1] // self.patch_size[1])
        self.num_patches = self.grid_size[0] * self.grid_size[1]
        self.in_chans = in_chans
        self.flatten = flatten
        self.strict_img_size = strict_img_size
        pixels = in_chans * self.patch_size[0] * self.patch_size[1]
        self.pixel_norm = pixel_norm_layer(pixels) if pixel_norm_layer is not None else None
        self.proj = nn.Conv2d(in_chans, embed_dim, kernel_size=self.patch_size, stride=self.patch_size, bias=bias)
        self.norm = norm_layer(embed_dim) if norm_layer is not None else nn.Identity()

    def feat_size(self, img_size: tuple[int, int]) -> tuple[int, int]:
        """The token grid (Hp, Wp) for an image of size (H, W)."""
        return img_size[0] // self.patch_size[0], img_size[1] // self.patch_size[1]

    def check_input(self, x: torch.Tensor) -> None:
        """Raise ValueError, saying what was expected and what came, for input the model cannot take."""
        if not isinstance(x, torch.Tensor):
            raise ValueError(f"expected an image tensor (B, C, H, W), got {type(x).__name__}")
        if x.ndim != 4:
            raise ValueError(f"expected a 4-D image batch (B, C, H, W), got shape {tuple(x.shape)}")
        if not x.is_floating_point():
            raise ValueError(f"expected a floating-point image tensor, got dtype {x.dtype} (convert with x.float())")
        weight = self.proj.weight
        meta = "meta" in (x.device.type, weight.device.type)  # shape-only checks (cost) skip the dtype
        if x.dtype != weight.dtype and not meta and not torch.is_autocast_enabled(x.device.type):
            raise ValueError(
                f"expected images of dtype {weight.dtype} (the model's), got {x.dtype}; convert with "
                f"x.to({weight.dtype}), or use vitkit.optimize for bf16 inference"
            )
        _, C, H, W = x.shape
        if C != self.in_chans:
            raise ValueError(f"expected {self.in_chans} input channels, got {C} (input shape {tuple(x.shape)})")
        if self.strict_img_size:
            if (H, W) != self.img_size:
                raise ValueError(
                    f"expected images of size {self.img_size[0]}x{self.img_size[1]}, got {H}x{W}; "
                    "build the model with dynamic_img_size=True to accept other sizes"
                )
            return
        for side, size, patch in zip(("height", "width"), (H, W), self.patch_size, strict=True):
            if size % patch != 0 or size == 0:
                raise ValueError(
                    f"image {side} {size} is not a positive multiple of patch size {patch}: the nearest that are "
                    f"{nearest_multiples(size, patch)}"
                )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.check_input(x)
        if self.pixel_norm is not None:
            x = self._normalised_patches(x)  # (B, Hp, Wp, D)
        else:
            x = self.proj(x)  # (B, D, Hp, Wp)
            x = x.permute(0, 2, 3, 1)  # (B, Hp, Wp, D)
        if self.flatten:
            x = x.flatten(1, 2)  # (B, Hp*Wp, D)
        return self.norm(x)

    def _normalised_patches(self, x: torch.Tensor) -> torch.Tensor:
        """Images (B, C, H, W) -> each patch's pixels normalised, then projected: (B, Hp, Wp, D)."""
        B, C, H, W = x.shape
        (ph, pw), (Hp, Wp) = self.patch_size, self.feat_size((H, W))
        x = x.reshape(B, C, Hp, ph, Wp, pw).permute(0, 2, 4, 1, 3, 5)  # (B, Hp, Wp, C, ph, pw)
        x = self.pixel_norm(x.reshape(B, Hp, Wp, C * ph * pw))  # (B, Hp, Wp, C ph pw), in (c, ph, pw) order
        return F.linear(x, self.proj.weight.flatten(1), self.proj.bias)  # the conv's (D, C, ph, pw) as (D, C ph pw)

