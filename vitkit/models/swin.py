"""Swin Transformer: a hierarchical vision transformer attending within (shifted) local windows.

"Swin Transformer: Hierarchical Vision Transformer using Shifted Windows", Liu et al., arXiv:2103.14030.

Data path: image (B, C, H, W) -> PatchEmbed + LayerNorm (B, H/p, W/p, D) -> stages; stage s > 0 starts with a
patch merging (2x2 neighbours concatenated, normed and projected: half the resolution, twice the width), then
blocks that alternate regular and shifted windows -> final LayerNorm (B, H/32, W/32, 8D) -> mean over the map
-> head (B, num_classes).
A block is pre-norm: x + WindowAttention(norm1(x)); x + Mlp(norm2(x)). Window attention is the shared
`Attention` over the tokens of each window, with a learned relative position bias and, in shifted blocks, a
mask (-100) that keeps tokens rolled in from the opposite border from attending across the seam.
Parameter names and shapes follow timm's `SwinTransformer`, so timm state dicts load unchanged.

Letters: B batch, H, W map size, C channels, h heads, (Wh, Ww) window, N = Wh * Ww tokens per window,
nW windows per image.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

from vitkit.layers import (
    Attention,
    DropPath,
    Mlp,
    PatchEmbed,
    check_backend,
    to_2tuple,
)
from vitkit.layers.helpers import fresh_classifier, take_indices
from vitkit.layers.window import padded_size, window_partition, window_reverse
from vitkit.models.interface import CostFromImages, SpatialAttention, checkpoint_blocks
from vitkit.models.registry import (
    TimmTag,
    check_field_types,
    check_positive,
    check_rates,
    register_family,
    register_model,
)
from vitkit.util import nearest_multiples

SWIN_PAPER = "Swin Transformer: Hierarchical Vision Transformer using Shifted Windows (Liu et al., arXiv:2103.14030)"
MASK_VALUE = -100.0  # added to the logits of token pairs from different regions of a shifted window (as the paper)


@dataclass(frozen=True)
class SwinConfig:
    """Configuration of a Swin Transformer.

    Windows, shifts and relative-bias tables are fixed by `img_size` (a stage no larger than the window gets a
    window clipped to its size and no shift). With `dynamic_img_size` other sizes run with the same windows
    (so the same weights): maps are padded at the bottom and right to whole windows and the shift masks are
    built for the padded size, as timm's `strict_img_size=False`.
    """

    img_size: int | tuple[int, int] = 224  # training image size, an int for square or (H, W); fixes windows and masks
    patch_size: int = 4  # patch side p; img_size must be a multiple of p * 2**(len(depths) - 1)
    in_chans: int = 3  # image channels
    num_classes: int = 1000  # classifier outputs; 0 removes the head (forward returns pooled features)
    embed_dim: int = 96  # width of stage 0; stage s has embed_dim * 2**s channels
    depths: tuple[int, ...] = (2, 2, 6, 2)  # blocks per stage; the number of stages is len(depths)
    num_heads: tuple[int, ...] = (3, 6, 12, 24)  # attention heads per stage; each must divide its stage width
    window_size: int = 7  # window side M; clipped to a stage's resolution when the stage is no larger
    mlp_ratio: float = 4.0  # MLP hidden width as a multiple of the stage width
    qkv_bias: bool = True  # bias on the fused qkv projection
    drop_rate: float = 0.0  # dropout in the blocks (after attention projection, in the MLP) and before the head
    attn_drop_rate: float = 0.0  # dropout on attention weights
    drop_path_rate: float = 0.1  # stochastic depth, rising linearly over all blocks to this rate (timm's default)
    layer_norm_eps: float = 1e-5  # LayerNorm epsilon (1e-5, PyTorch's default, as in the reference code and timm)
    dynamic_img_size: bool = False  # accept other image sizes (sides multiples of p * 2**(stages - 1)); see above
    attn_backend: str = "auto"  # "auto", "sdpa" (fused kernel) or "math" (the reference formula); see layers.attention

    def __post_init__(self) -> None:
        # Lists (from JSON or users) become tuples so the frozen config stays hashable and comparable.
        for name in ("depths", "num_heads"):
            if isinstance(getattr(self, name), list):
                object.__setattr__(self, name, tuple(getattr(self, name)))
        check_field_types(self)
        check_positive(self, "patch_size", "in_chans", "embed_dim", "mlp_ratio", "layer_norm_eps")
        check_rates(self, "drop_rate", "attn_drop_rate", "drop_path_rate")
        img_size = to_2tuple(self.img_size)
        if len(self.depths) == 0 or any(d < 1 for d in self.depths):
            raise ValueError(f"depths must be one or more positive block counts, got {self.depths}")
        if len(self.num_heads) != len(self.depths):
            raise ValueError(
                f"num_heads {self.num_heads} must give one head count per stage ({len(self.depths)} stages)"
            )
        for stage, heads in enumerate(self.num_heads):
            width = self.embed_dim * 2**stage
            if heads < 1 or width % heads != 0:
                raise ValueError(f"stage {stage} width {width} is not divisible by num_heads {heads}")
        if self.window_size < 1:
            raise ValueError(f"window_size must be >= 1, got {self.window_size}")
        multiple = self.size_multiple
        for side, size in zip(("height", "width"), img_size, strict=True):
            if size < 1 or size % multiple != 0:
                raise ValueError(
                    f"img_size {side} {size} is not a positive multiple of {multiple} "
                    f"(patch_size {self.patch_size} * 2**{len(self.depths) - 1} for {len(self.depths)} stages)"
                )
        if self.num_classes < 0:
            raise ValueError(f"num_classes must be >= 0, got {self.num_classes}")
        check_backend(self.attn_backend)

    @property
    def size_multiple(self) -> int:
        """Image sides must be multiples of this: the patch times one halving per stage after the first."""
        return self.patch_size * 2 ** (len(self.depths) - 1)


def relative_position_index(window_size: tuple[int, int], device: torch.device | None = None) -> torch.Tensor:
    """Row of the bias table for every pair of tokens in a window: (N, N) longs.

    Tokens i, j at (yi, xi), (yj, xj) (row-major in the window) get
    (yi - yj + Wh - 1) * (2 * Ww - 1) + (xi - xj + Ww - 1), one row per distinct offset.
    """
    Wh, Ww = window_size
    ys, xs = torch.meshgrid(
        torch.arange(Wh, device=device), torch.arange(Ww, device=device), indexing="ij"
    )  # each (Wh, Ww)
    coords = torch.stack([ys.flatten(), xs.flatten()])  # (2, N)
    offsets = coords[:, :, None] - coords[:, None, :]  # (2, N, N)
    return (offsets[0] + Wh - 1) * (2 * Ww - 1) + (offsets[1] + Ww - 1)  # (N, N)


def shift_mask(
    size: tuple[int, int],
    window_size: tuple[int, int],
    shift_size: tuple[int, int],
    device: torch.device | None = None,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Attention mask of a shifted-window block on a map of `size` (whole windows): (nW, N, N) of 0 and -100.

    After the cyclic roll by -shift, each side splits into up to three regions: [0, H - Wh), [H - Wh, H - shift)
    and [H - shift, H) (the last holds tokens rolled in from the other border). Tokens attend only to tokens
    of the same region pair; a side that is not shifted is one region.
    """
    regions = []
    for length, window, shift in zip(size, window_size, shift_size, strict=True):
        coord = torch.arange(length, device=device)
        if shift > 0:
            regions.append((coord >= length - window).long() + (coord >= length - shift).long())
        else:
            regions.append(torch.zeros_like(coord))
    label = (regions[0][:, None] * 3 + regions[1][None, :]).to(dtype)  # (H, W), one label per region pair
    label = window_partition(label[None, :, :, None], window_size).flatten(1)  # (nW, N)
    differ = label[:, None, :] != label[:, :, None]  # (nW, N, N)
    return torch.zeros(differ.shape, device=device, dtype=dtype).masked_fill(differ, MASK_VALUE)


class WindowAttention(Attention):
    """The shared multi-head `Attention` within windows, plus a learned relative position bias.

    Args:
        dim: channels C.
        num_heads: heads h.
        window_size: (Wh, Ww); the bias table has (2 Wh - 1)(2 Ww - 1) rows, one per relative offset.
        qkv_bias, attn_drop, proj_drop, backend: as for `Attention`.
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        window_size: tuple[int, int],
        qkv_bias: bool = True,
        attn_drop: float = 0.0,
        proj_drop: float = 0.0,
        backend: str = "auto",
    ) -> None:
        super().__init__(dim, num_heads, qkv_bias, attn_drop, proj_drop, backend)
        self.window_size = window_size
        Wh, Ww = window_size
        self.relative_position_bias_table = nn.Parameter(torch.zeros((2 * Wh - 1) * (2 * Ww - 1), num_heads))
        self.register_buffer("relative_position_index", relative_position_index(window_size), persistent=False)

    def relative_position_bias(self) -> torch.Tensor:
        """The bias (h, N, N) added to every window's logits, contiguous.

        One gather from the transposed table, so the bias comes out (h, N * N) in memory order: adding a permuted
        (strided) bias to bf16 logits on CPU took 10x the time of a contiguous one (8.6 against 0.8 ms for Swin-T's
        first stage at batch 16)."""
        N = self.window_size[0] * self.window_size[1]
        table = self.relative_position_bias_table.t()  # (h, R): a view
        return table.index_select(1, self.relative_position_index.view(-1)).view(-1, N, N)  # (h, N * N) -> (h, N, N)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """Attend within windows x (B * nW, N, C); `mask` (nW, N, N) is the shift mask or None."""
        bias = self.relative_position_bias().unsqueeze(0)  # (1, h, N, N), broadcast over windows
        if mask is not None:
            # Windows are image-major, so window w of every image shares mask[w]. sdpa's fused kernels need
            # 4-D inputs (a (B, nW, h, N, d) layout falls back to the math kernel) and a batch broadcast of
            # (nW, ...) over B has no strided view, so the per-window bias is expanded to B copies.
            nW = mask.shape[0]
            bias = bias + mask.unsqueeze(1)  # (nW, h, N, N)
            bias = bias.unsqueeze(0).expand(x.shape[0] // nW, -1, -1, -1, -1)  # (B, nW, h, N, N)
            bias = bias.reshape(x.shape[0], *bias.shape[2:])  # (B * nW, h, N, N)
        return super().forward(x, bias)


class SwinBlock(nn.Module):
    """Pre-norm block with (shifted) window attention on a map (B, H, W, C) -> (B, H, W, C).

    Args:
        dim: channels C.
        resolution: the map size (H, W) at the configured image size; windows larger than it are clipped
            to it and such a block does not shift.
        num_heads: heads.
        window_size: window side M.
        shifted: roll the map by M // 2 before partitioning (odd blocks of a stage).
        mlp_ratio, qkv_bias, proj_drop, attn_drop, drop_path, norm_eps, attn_backend: as for `Block`.
    """

    def __init__(
        self,
        dim: int,
        resolution: tuple[int, int],
        num_heads: int,
        window_size: int,
        shifted: bool,
        mlp_ratio: float = 4.0,
        qkv_bias: bool = True,
        proj_drop: float = 0.0,
        attn_drop: float = 0.0,
        drop_path: float = 0.0,
        norm_eps: float = 1e-5,
        attn_backend: str = "auto",
    ) -> None:
        super().__init__()
        self.resolution = resolution
        self.window_size = tuple(min(r, window_size) for r in resolution)
        shift = window_size // 2 if shifted else 0
        self.shift_size = tuple(0 if r <= window_size else shift for r in resolution)
        self.norm1 = nn.LayerNorm(dim, eps=norm_eps)
        self.attn = WindowAttention(dim, num_heads, self.window_size, qkv_bias, attn_drop, proj_drop, attn_backend)
        self.drop_path1 = DropPath(drop_path)
        self.norm2 = nn.LayerNorm(dim, eps=norm_eps)
        self.mlp = Mlp(dim, int(dim * mlp_ratio), drop=proj_drop)
        self.drop_path2 = DropPath(drop_path)
        self.register_buffer("attn_mask", self._mask(resolution), persistent=False)
        order = self._window_order(resolution)
        self.register_buffer("window_order", order, persistent=False)
        self.register_buffer("token_order", None if order is None else order.argsort(), persistent=False)

    def _padded(self, H: int, W: int) -> tuple[int, int]:
        """(H, W) rounded up to whole windows."""
        return padded_size((H, W), self.window_size)

    def _mask(
        self, size: tuple[int, int], device: torch.device | None = None, dtype: torch.dtype = torch.float32
    ) -> torch.Tensor | None:
        """The shift mask (nW, N, N) for a map of `size` (padded to whole windows), or None if not shifted."""
        if not any(self.shift_size):
            return None
        return shift_mask(self._padded(*size), self.window_size, self.shift_size, device, dtype)

    def _window_order(self, size: tuple[int, int], device: torch.device | None = None) -> torch.Tensor | None:
        """For a map of `size` that splits into whole windows: the token index (into the map's H * W tokens,
        row-major) at each position of the rolled and partitioned map, (H * W,) int64, so that one gather does the
        roll and the partition (and its inverse permutation, `argsort`, the merge and the roll back); None when
        padding is needed."""
        H, W = size
        if self._padded(H, W) != (H, W):
            return None
        tokens = torch.arange(H * W, device=device).view(1, H, W, 1)  # (1, H, W, 1): each token's index
        tokens = torch.roll(tokens, shifts=(-self.shift_size[0], -self.shift_size[1]), dims=(1, 2))
        return window_partition(tokens, self.window_size).reshape(-1)  # (H * W,) in window order

    def _attention(self, x: torch.Tensor) -> torch.Tensor:
        """Window attention over a map x (B, H, W, C): roll, pad, partition, attend, merge, crop, roll back.

        On a map of whole windows, roll and partition are one gather of the tokens in window order, and merge and
        roll back one gather by the inverse order: two copies instead of four (the same values as the steps)."""
        B, H, W, C = x.shape
        Wh, Ww = self.window_size
        if (H, W) == self.resolution:
            order, inverse, mask = self.window_order, self.token_order, self.attn_mask
        else:
            order = self._window_order((H, W), x.device)
            inverse, mask = None if order is None else order.argsort(), self._mask((H, W), x.device, x.dtype)
        if order is not None:
            windows = x.reshape(B, H * W, C).index_select(1, order).view(-1, Wh * Ww, C)  # (B * nW, N, C)
            windows = self.attn(windows, mask)  # (B * nW, N, C)
            return windows.reshape(B, H * W, C).index_select(1, inverse).view(B, H, W, C)  # each token back
        sh, sw = self.shift_size
        if sh or sw:
            x = torch.roll(x, shifts=(-sh, -sw), dims=(1, 2))
        Hp, Wp = self._padded(H, W)
        if (Hp, Wp) != (H, W):
            x = F.pad(x, (0, 0, 0, Wp - W, 0, Hp - H))  # zero rows at the bottom, columns at the right: (B, Hp, Wp, C)
        # reshape, not view: with B = 1 and one row of several windows, window_partition returns a strided view.
        windows = window_partition(x, self.window_size).reshape(-1, Wh * Ww, C)  # (B * nW, N, C)
        windows = self.attn(windows, mask)  # (B * nW, N, C)
        x = window_reverse(windows.view(-1, Wh, Ww, C), self.window_size, Hp, Wp)  # (B, Hp, Wp, C)
        x = x[:, :H, :W]  # (B, H, W, C)
        if sh or sw:
            x = torch.roll(x, shifts=(sh, sw), dims=(1, 2))
        return x

    def window_keys(self, size: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """For a map of `size` (H, W): each token's window (B * nW order) and place in it, and the window's tokens,
        as `_attention` partitions the map (rolled by the shift, padded to whole windows): (window (H * W,),
        place (H * W,), keys (H * W, N) as token indices into the map, -1 for padding)."""
        H, W = size
        Hp, Wp = self._padded(H, W)
        tokens = torch.full((Hp, Wp), -1, dtype=torch.long)
        tokens[:H, :W] = torch.arange(H * W).view(H, W)
        tokens = torch.roll(tokens[:H, :W], shifts=(-self.shift_size[0], -self.shift_size[1]), dims=(0, 1))
        padded = torch.full((Hp, Wp), -1, dtype=torch.long)
        padded[:H, :W] = tokens
        order = window_partition(padded.view(1, Hp, Wp, 1), self.window_size).reshape(-1)  # (nW * N,) tokens
        N = self.window_size[0] * self.window_size[1]
        position = torch.empty(H * W, dtype=torch.long)
        real = order >= 0
        position[order[real]] = torch.arange(order.numel())[real]  # each token's place in window order
        return position // N, position % N, order.view(-1, N)[position // N]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.drop_path1(self._attention(self.norm1(x)))
        x = x + self.drop_path2(self.mlp(self.norm2(x)))
        return x


class PatchMerging(nn.Module):
    """Halve the resolution: concatenate each 2x2 neighbourhood (B, H, W, C) -> (B, H/2, W/2, 4C), norm, project.

    Args:
        dim: input channels C.
        out_dim: output channels (2C in Swin).
        norm_eps: LayerNorm epsilon.
    """

    def __init__(self, dim: int, out_dim: int, norm_eps: float = 1e-5) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(4 * dim, eps=norm_eps)
        self.reduction = nn.Linear(4 * dim, out_dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, H, W, C = x.shape
        x = x.reshape(B, H // 2, 2, W // 2, 2, C)  # (B, H/2, dy, W/2, dx, C)
        # Channel order (dx, dy, C): the neighbours (0,0), (1,0), (0,1), (1,1) as (dy, dx), as the reference code.
        x = x.permute(0, 1, 3, 4, 2, 5).flatten(3)  # (B, H/2, W/2, dx, dy, C) -> (B, H/2, W/2, 4C)
        return self.reduction(self.norm(x))


class SwinStage(nn.Module):
    """One stage: optional patch merging at its start, then blocks alternating regular and shifted windows.

    Args:
        dim: input channels.
        out_dim: stage channels (2 * dim after a patch merging).
        resolution: the stage's map size (after merging) at the configured image size.
        depth: number of blocks.
        downsample: start with a `PatchMerging` (every stage but the first).
        drop_path: stochastic-depth rate of each block.
        Other arguments: as for `SwinBlock`.
    """

    def __init__(
        self,
        dim: int,
        out_dim: int,
        resolution: tuple[int, int],
        depth: int,
        downsample: bool,
        num_heads: int,
        window_size: int,
        mlp_ratio: float,
        qkv_bias: bool,
        proj_drop: float,
        attn_drop: float,
        drop_path: list[float],
        norm_eps: float,
        attn_backend: str,
    ) -> None:
        super().__init__()
        self.downsample = PatchMerging(dim, out_dim, norm_eps) if downsample else nn.Identity()
        self.blocks = nn.Sequential(
            *[
                SwinBlock(
                    out_dim,
                    resolution,
                    num_heads,
                    window_size,
                    shifted=i % 2 == 1,
                    mlp_ratio=mlp_ratio,
                    qkv_bias=qkv_bias,
                    proj_drop=proj_drop,
                    attn_drop=attn_drop,
                    drop_path=drop_path[i],
                    norm_eps=norm_eps,
                    attn_backend=attn_backend,
                )
                for i in range(depth)
            ]
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.blocks(self.downsample(x))


class ClassifierHead(nn.Module):
    """Mean over the map (B, H, W, C) -> (B, C), dropout, linear classifier (absent when num_classes is 0)."""

    def __init__(self, dim: int, num_classes: int, drop: float = 0.0) -> None:
        super().__init__()
        self.drop = nn.Dropout(drop)
        self.fc = nn.Linear(dim, num_classes) if num_classes > 0 else nn.Identity()

    def forward(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        x = self.drop(x.mean(dim=(1, 2)))  # (B, C)
        return x if pre_logits else self.fc(x)


class SwinTransformer(CostFromImages, nn.Module):
    """Swin Transformer built from a `SwinConfig`; `forward` returns logits (B, num_classes)."""

    # its exported graph fixes the image size it was traced at (the windows' padding and the shift masks are built
    # from the size in Python): a detector on it exports at one size (`vitkit.perf.export`)
    exports_any_size = False

    def __init__(self, config: SwinConfig) -> None:
        super().__init__()
        self.config = c = config
        num_stages = len(c.depths)
        norm_layer = partial(nn.LayerNorm, eps=c.layer_norm_eps)
        self.patch_embed = PatchEmbed(
            c.img_size,
            c.patch_size,
            c.in_chans,
            c.embed_dim,
            norm_layer=norm_layer,
            flatten=False,
            strict_img_size=not c.dynamic_img_size,
        )
        # Stochastic depth rises linearly over all blocks of all stages.
        total = sum(c.depths)
        dpr = [c.drop_path_rate * i / max(total - 1, 1) for i in range(total)]
        stages = []
        Hs, Ws = self.patch_embed.grid_size
        for s, depth in enumerate(c.depths):
            if s > 0:
                Hs, Ws = Hs // 2, Ws // 2
            first = sum(c.depths[:s])
            stages.append(
                SwinStage(
                    c.embed_dim * 2 ** max(s - 1, 0),
                    c.embed_dim * 2**s,
                    (Hs, Ws),
                    depth,
                    downsample=s > 0,
                    num_heads=c.num_heads[s],
                    window_size=c.window_size,
                    mlp_ratio=c.mlp_ratio,
                    qkv_bias=c.qkv_bias,
                    proj_drop=c.drop_rate,
                    attn_drop=c.attn_drop_rate,
                    drop_path=dpr[first : first + depth],
                    norm_eps=c.layer_norm_eps,
                    attn_backend=c.attn_backend,
                )
            )
        self.layers = nn.Sequential(*stages)
        self.num_features = c.embed_dim * 2 ** (num_stages - 1)
        self.norm = norm_layer(self.num_features)
        self.head = ClassifierHead(self.num_features, c.num_classes, c.drop_rate)
        self.init_weights()

    def init_weights(self) -> None:
        """timm's initialisation: truncated normal (std .02) for linears and bias tables, zero linear biases."""
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.trunc_normal_(module.weight, std=0.02)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, WindowAttention):
                nn.init.trunc_normal_(module.relative_position_bias_table, std=0.02)

    def check_input(self, x: torch.Tensor) -> None:
        """Raise ValueError, saying what was expected and what came, for images (B, C, H, W) forward cannot take."""
        self.patch_embed.check_input(x)
        multiple = self.config.size_multiple
        stages = len(self.config.depths)
        for side, size in zip(("height", "width"), x.shape[-2:], strict=True):
            if size % multiple != 0:
                raise ValueError(
                    f"image {side} {size} is not a multiple of {multiple} "
                    f"(patch_size {self.config.patch_size} * 2**{stages - 1} for {stages} stages): the nearest that "
                    f"are {nearest_multiples(size, multiple)}"
                )

    def _embed(self, x: torch.Tensor) -> torch.Tensor:
        """Check the images (B, C, H, W) and embed them as a map (B, H/p, W/p, D)."""
        self.check_input(x)
        return self.patch_embed(x)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """Images (B, C, H, W) -> the normalised last-stage map (B, H/32, W/32, num_features) (channels last)."""
        return self.norm(self.layers(self._embed(x)))

    def get_classifier(self) -> nn.Module:
        """The classifier (timm's name): a Linear, Identity without classes."""
        return self.head.fc

    def reset_classifier(self, num_classes: int) -> None:
        """A fresh classifier for `num_classes` classes (0: none, `forward` returns the pooled features), as timm's;
        the config follows."""
        self.head.fc = fresh_classifier(self, self.num_features, num_classes)
        self.config = replace(self.config, num_classes=num_classes)

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        """Map (B, H, W, C) -> logits (B, num_classes), or the pooled features (B, C) with `pre_logits`."""
        return self.head(x, pre_logits=pre_logits)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_head(self.forward_features(x))

    def shard_units(self) -> list[nn.Module]:
        """Each Swin block of every stage, patch merging staying with the root
        (`vitkit.models.interface.VitkitModel`)."""
        return [block for stage in self.layers for block in stage.blocks]

    def set_grad_checkpointing(self, enable: bool = True) -> int:
        """Recompute each Swin block of every stage in backward (`vitkit.models.interface.VitkitModel`; patch
        merging is not checkpointed); the blocks now checkpointed."""
        return checkpoint_blocks(self.shard_units(), enable)

    def token_grid(self, img_size: tuple[int, int]) -> None:
        """None: each block attends within (shifted) windows of its stage's map, never over the whole image."""
        return None

    def attention_layout(self) -> str:
        """Why `token_grid` is None, in words (`vitkit.models.interface.VitkitModel`)."""
        M = self.config.window_size
        return f"its blocks attend within {M}x{M} windows of each stage's feature map (shifted every other block)"

    def spatial_attention(self, maps: Mapping[str, torch.Tensor], img_size: tuple[int, int]) -> list[SpatialAttention]:
        """Each captured block's window attention (B * nW, h, N, N) laid on its stage's map: every token's row over
        the tokens of its (shifted) window (`vitkit.models.interface.SpatialAttention`), for images of `img_size`."""
        H, W = self.patch_embed.feat_size(img_size)
        out = []
        for s, stage in enumerate(self.layers):
            if s > 0:
                H, W = H // 2, W // 2  # patch merging halves the map
            for b, block in enumerate(stage.blocks):
                name = f"layers.{s}.blocks.{b}.attn"
                if name not in maps:
                    continue
                record = maps[name]  # (B * nW, h, N, N)
                window, place, keys = block.window_keys((H, W))
                Hp, Wp = block._padded(H, W)
                (Wh, Ww), h, N = block.window_size, record.shape[1], record.shape[-1]
                nW = Hp * Wp // N
                mine = record.reshape(-1, nW, h, N, N)[:, window]  # (B, HW, h, N, N): each token's window
                rows = mine[:, torch.arange(H * W), :, place]  # (HW, B, h, N): its own row (indices apart go first)
                shifted = f" shifted by {block.shift_size}" if any(block.shift_size) else ""
                weights = rows.permute(1, 2, 0, 3)  # (B, h, HW, N)
                out.append(SpatialAttention(name, (H, W), keys, weights, f"{Wh}x{Ww} windows{shifted}"))
        return out

    def no_weight_decay(self) -> set[str]:
        """Every block's relative position bias table (timm's `no_weight_decay_keywords`)."""
        return {name for name, _ in self.named_parameters() if name.endswith("relative_position_bias_table")}

    def feature_info(self) -> list[tuple[int, int]]:
        """(channels, stride) of each stage's output as `forward_intermediates` gives it."""
        c = self.config
        return [(c.embed_dim * 2**s, c.patch_size * 2**s) for s in range(len(c.depths))]

    # timm's default outputs of a features model (`create_model(..., features_only=True)`): every stage
    default_feature_outputs: int | None = None

    def prune_intermediate_layers(
        self, indices: int | Sequence[int] | None = None, prune_norm: bool = False, prune_head: bool = True
    ) -> list[int]:
        """Drop what `forward_intermediates(x, indices)` does not use, as timm's: the stages after the last output,
        the final norm (`prune_norm`, or when the last stage goes: it is sized for that stage only), the classifier
        (`prune_head`, or when the last stage goes). Returns the outputs' indices, counted from the first stage. The
        pruned model serves `forward_intermediates` (a features model); its config still describes the model it was
        cut from."""
        take = take_indices(len(self.layers), indices, unit="stage")
        cut = max(take) < len(self.layers) - 1
        if prune_norm or cut:
            self.norm = nn.Identity()
        self.layers = self.layers[: max(take) + 1]
        if prune_head or cut:
            self.reset_classifier(0)
        return take

    def check_feature_outputs(self, indices: Sequence[int]) -> None:
        """ValueError unless `forward_intermediates(x, indices, norm=True)` uses every parameter (as a detector's
        backbone must, to train under DDP and to take a checkpoint whole): the last stage among the outputs."""
        last = len(self.config.depths) - 1
        if last not in indices:
            raise ValueError(
                f"a backbone's outputs must include Swin's last stage {last + 1} (later stages and the final norm "
                f"would be unused); for fewer stages, set depths (got stages {[i + 1 for i in indices]})"
            )

    def forward_intermediates(
        self,
        x: torch.Tensor,
        indices: int | list[int] | tuple[int, ...] | None = None,
        output_fmt: str = "NCHW",
        norm: bool = False,
        intermediates_only: bool = False,
    ) -> list[torch.Tensor] | tuple[torch.Tensor, list[torch.Tensor]]:
        """Outputs of chosen stages.

        Args:
            x: images (B, C, H, W).
            indices: None for every stage, an int n for the last n stages, or a list of stage indices
                (negative ones count from the end).
            output_fmt: "NCHW" for (B, C_s, H_s, W_s) maps, "NHWC" for channels-last (B, H_s, W_s, C_s).
            norm: apply the final norm to the last stage's output (the only stage it is sized for).
            intermediates_only: False (timm's default): (`forward_features(x)`, the outputs), every stage runs;
                True: the outputs alone, what follows the last output skipped.
        """
        if output_fmt not in ("NCHW", "NHWC"):
            raise ValueError(f"output_fmt must be 'NCHW' or 'NHWC', got {output_fmt!r}")
        take = take_indices(len(self.layers), indices, unit="stage")
        x = self._embed(x)
        outputs = []
        for i, stage in enumerate(self.layers[: len(self.layers) if not intermediates_only else max(take) + 1]):
            x = stage(x)  # (B, H_s, W_s, C_s)
            if i in take:
                y = self.norm(x) if norm and i == len(self.layers) - 1 else x
                outputs.append(y.permute(0, 3, 1, 2).contiguous() if output_fmt == "NCHW" else y)  # (B, C_s, H_s, W_s)
        return outputs if intermediates_only else (self.norm(x), outputs)


register_family(
    "swin",
    SwinConfig,
    SwinTransformer,
    display_name="Swin",
    weights="vitkit.weights.swin",
    cost_parts={"patch_embed": "embedding"},
)


def _swin(name: str, pretrained: tuple[TimmTag, ...] = (), **fields: object) -> None:
    register_model(name, "swin", SwinConfig(**fields), SWIN_PAPER, pretrained=pretrained)


# timm's copies of Microsoft's weights (`vitkit.create_model(name, pretrained=True)`, the first its default); the
# ImageNet-22k heads have no published label names
_IN1K = TimmTag("ms_in1k", "ImageNet-1k (the Swin paper's)", licence="MIT")
_IN22K_FT = TimmTag("ms_in22k_ft_in1k", "ImageNet-22k, fine-tuned on ImageNet-1k (the Swin paper's)", licence="MIT")
_IN22K = TimmTag("ms_in22k", "ImageNet-22k (the Swin paper's), its 21,841 classes", {"num_classes": 21841}, None, "MIT")


# Sizes from the Swin paper (Section 3.3): T, S, B, L differ in width C, stage-3 depth and heads (head dim 32).
_TINY = dict(embed_dim=96, depths=(2, 2, 6, 2), num_heads=(3, 6, 12, 24))
_SMALL = dict(embed_dim=96, depths=(2, 2, 18, 2), num_heads=(3, 6, 12, 24))
_BASE = dict(embed_dim=128, depths=(2, 2, 18, 2), num_heads=(4, 8, 16, 32))
_LARGE = dict(embed_dim=192, depths=(2, 2, 18, 2), num_heads=(6, 12, 24, 48))

_swin("swin_tiny_patch4_window7_224", **_TINY, pretrained=(_IN1K, _IN22K_FT, _IN22K))
_swin("swin_small_patch4_window7_224", **_SMALL, pretrained=(_IN22K_FT, _IN1K, _IN22K))
_swin("swin_base_patch4_window7_224", **_BASE, pretrained=(_IN22K_FT, _IN1K, _IN22K))
_swin("swin_base_patch4_window12_384", img_size=384, window_size=12, **_BASE, pretrained=(_IN22K_FT, _IN1K, _IN22K))
_swin("swin_large_patch4_window7_224", **_LARGE, pretrained=(_IN22K_FT, _IN22K))
_swin("swin_large_patch4_window12_384", img_size=384, window_size=12, **_LARGE, pretrained=(_IN22K_FT, _IN22K))
