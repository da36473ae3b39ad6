"""Vision Transformer (ViT) and Data-efficient Image Transformer (DeiT).

- "An Image is Worth 16x16 Words: Transformers for Image Recognition at Scale", Dosovitskiy et al.,
  arXiv:2010.11929 (ViT).
- "Training data-efficient image transformers & distillation through attention", Touvron et al.,
  arXiv:2012.12877 (DeiT; the distilled variants add a distillation token and a second head).

The same family holds the ViTs people fine-tune today and the other libraries' ViTs, each difference a config field:
DINOv2 (LayerScale; with registers, arXiv:2309.16588), CLIP (a LayerNorm before the blocks, quick GELU, no patch bias),
SigLIP (attention pooling, `vitkit.layers.AttentionPool`), vit-pytorch's ViT and SimpleViT (a LayerNorm over each
patch's pixels and one after its projection, heads of their own width, big_vision's sin-cos table).

Data path: image (B, C, H, W) -> PatchEmbed (B, N, D) -> [cls (, dist), registers] + pos -> (pre-norm) -> Block x
depth -> norm -> pool (class token, mean of patch tokens, their bilinear pool, or attention pooling) -> head
(B, num_classes). Parameter names and shapes follow timm's `VisionTransformer`, so timm state dicts load unchanged.

Letters: B batch, N patch tokens, P prefix tokens (class, distillation, registers), D embedding dim.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from functools import partial

import torch
from torch import nn

from vitkit.layers import (
    AttentionPool,
    BilinearPool,
    Block,
    PatchEmbed,
    big_vision_sincos_2d,
    check_backend,
    resample_abs_pos_embed,
    sincos_2d_pos_embed,
    to_2tuple,
)
from vitkit.layers.helpers import fresh_classifier, take_indices
from vitkit.layers.mlp import ACTIVATIONS
from vitkit.layers.window import window_tokens
from vitkit.models.interface import CostFromImages, SpatialAttention, checkpoint_blocks
from vitkit.models.registry import (
    TimmTag,
    check_field_types,
    check_positive,
    check_rates,
    register_family,
    register_model,
)
from vitkit.util import listed

GLOBAL_POOLS = ("token", "avg", "bilinear", "map")
POS_EMBEDS = ("learn", "sincos", "sincos_big_vision")
VIT_PAPER = "An Image is Worth 16x16 Words (Dosovitskiy et al., arXiv:2010.11929)"
DEIT_PAPER = "Training data-efficient image transformers & distillation through attention (arXiv:2012.12877)"
SCALING_PAPER = "Scaling Vision Transformers (Zhai et al., arXiv:2106.04560)"
DINOV2_PAPER = "DINOv2: Learning Robust Visual Features without Supervision (Oquab et al., arXiv:2304.07193)"
REGISTERS_PAPER = "Vision Transformers Need Registers (Darcet et al., arXiv:2309.16588)"
CLIP_PAPER = "Learning Transferable Visual Models From Natural Language Supervision (Radford et al., arXiv:2103.00020)"
SIGLIP_PAPER = "Sigmoid Loss for Language Image Pre-Training (Zhai et al., arXiv:2303.15343)"


@dataclass(frozen=True)
class ViTConfig:
    img_size: int | tuple[int, int] = 224  # training image size, an int for square or (H, W)
    patch_size: int = 16  # patch side p; img_size must be a multiple of it
    in_chans: int = 3  # image channels
    num_classes: int = 1000  # classifier outputs; 0 removes the head (forward returns pooled features)
    embed_dim: int = 768  # token width D
    depth: int = 12  # number of encoder blocks
    num_heads: int = 12  # attention heads; must divide embed_dim
    mlp_ratio: float = 4.0  # MLP hidden width as a multiple of embed_dim
    qkv_bias: bool = True  # bias on the fused qkv projection
    class_token: bool = True  # prepend a learned class token
    distilled: bool = False  # DeiT: add a distillation token and a second head (needs class_token)
    reg_tokens: int = 0  # register tokens after the class token ("Vision Transformers Need Registers", DINOv2)
    no_embed_class: bool = False  # the position table covers the patches only: the prefix tokens get none (DINOv2)
    global_pool: str = "token"  # "token": class token output; "avg": mean of the patch tokens; "bilinear": B-CNN
    # bilinear pooling of the patch tokens (vitkit.layers.BilinearPool), the head taking its bilinear_dim^2 features;
    # "map": attention pooling, one learned query over all tokens (SigLIP; vitkit.layers.AttentionPool)
    bilinear_dim: int | None = 64  # global_pool="bilinear": channels each token is projected to first; None: all D
    pos_embed: str = "learn"  # "learn": learned absolute table; "sincos": vitkit's fixed 2-D sin-cos table;
    # "sincos_big_vision": big_vision's fixed table, as vit-pytorch's SimpleViT (vitkit.layers.big_vision_sincos_2d)
    drop_rate: float = 0.0  # dropout before the head, after position embedding and in the blocks
    attn_drop_rate: float = 0.0  # dropout on attention weights
    drop_path_rate: float = 0.0  # stochastic depth, increasing linearly with depth to this rate
    layer_norm_eps: float = 1e-6  # LayerNorm epsilon (1e-6 as in timm and the JAX reference)
    init_values: float | None = None  # LayerScale initial value; None disables LayerScale
    dynamic_img_size: bool = False  # accept any image size divisible by the patch (position table resampled)
    attn_backend: str = "auto"  # "auto", "sdpa" (fused kernel) or "math" (the reference formula); see layers.attention
    pre_norm: bool = False  # a LayerNorm on the tokens before the blocks (CLIP's `pre_layrnorm`, timm's `norm_pre`)
    patch_bias: bool = True  # a bias on the patch projection (CLIP's has none)
    patch_norm: bool = False  # LayerNorm over each patch's pixels before the projection and over its token after
    # (vit-pytorch)
    act: str = "gelu"  # the MLP's activation: "gelu" (exact), "gelu_tanh" (SigLIP), "quick_gelu" (OpenAI's CLIP)
    head_dim: int | None = None  # attention head width when num_heads x head_dim is not embed_dim (vit-pytorch's
    # dim_head); None: embed_dim / num_heads
    proj_bias: bool = True  # a bias on the attention's output projection (vit-pytorch's SimpleViT has none)
    fc_norm: bool | None = None  # the final norm after pooling (True) or on the tokens before it (False); None:
    # after for global_pool="avg", before otherwise (timm's rule)
    pos_antialias: bool = True  # resample the learned position table to other grids with antialiasing (timm, DINOv2
    # with registers); False: plain bicubic (transformers' Dinov2Model)
    window_size: int = 0  # ViTDet (arXiv:2203.16527): blocks attend within windows of this many patches a side (the
    # grid zero-padded to whole windows), except `global_blocks`; 0: every block attends over all tokens
    global_blocks: tuple[int, ...] = ()  # with window_size: the blocks (0-based) that attend over all tokens (ViTDet:
    # four evenly spaced, (2, 5, 8, 11) of 12)
    final_norm: bool = True  # a LayerNorm after the blocks (`norm` or `fc_norm`); False: none (ViTDet's backbone,
    # whose maps are the blocks' outputs, normalised in its feature pyramid)
    rel_pos: bool = False  # decomposed relative positions in every block (ViTDet, MViTv2): a table per axis and block,
    # sized for its window, or for the grid at img_size in a global block (resampled for others)

    def __post_init__(self) -> None:
        check_field_types(self)
        check_positive(self, "patch_size", "in_chans", "embed_dim", "depth", "num_heads", "mlp_ratio", "layer_norm_eps")
        check_rates(self, "drop_rate", "attn_drop_rate", "drop_path_rate")
        to_2tuple(self.img_size)
        if self.head_dim is None and self.embed_dim % self.num_heads != 0:
            raise ValueError(
                f"embed_dim {self.embed_dim} is not divisible by num_heads {self.num_heads}; set head_dim for heads "
                "of another width"
            )
        if self.head_dim is not None and self.head_dim <= 0:
            raise ValueError(f"head_dim must be > 0 or None, got {self.head_dim}")
        if self.global_pool not in GLOBAL_POOLS:
            raise ValueError(f"global_pool must be one of {GLOBAL_POOLS}, got {self.global_pool!r}")
        if self.act not in ACTIVATIONS:
            raise ValueError(f"act must be one of {ACTIVATIONS}, got {self.act!r}")
        if self.global_pool == "map" and self.embed_dim % self.num_heads != 0:
            raise ValueError(f"global_pool='map' needs embed_dim {self.embed_dim} divisible by num_heads")
        if self.bilinear_dim is not None and self.bilinear_dim <= 0:
            raise ValueError(f"bilinear_dim must be > 0 or None, got {self.bilinear_dim}")
        if self.global_pool == "token" and not self.class_token:
            raise ValueError("global_pool='token' needs class_token=True")
        if self.distilled and (not self.class_token or self.global_pool != "token"):
            raise ValueError("distilled=True needs class_token=True and global_pool='token'")
        if self.fc_norm and (self.global_pool == "bilinear" or self.distilled):
            raise ValueError("fc_norm=True needs a pool of embed_dim features: not the bilinear pool, not distilled")
        if self.pos_embed not in POS_EMBEDS:
            raise ValueError(f"pos_embed must be one of {POS_EMBEDS}, got {self.pos_embed!r}")
        if self.num_classes < 0:
            raise ValueError(f"num_classes must be >= 0, got {self.num_classes}")
        if self.reg_tokens < 0:
            raise ValueError(f"reg_tokens must be >= 0, got {self.reg_tokens}")
        if self.window_size < 0:
            raise ValueError(f"window_size must be >= 0 (0: no windows), got {self.window_size}")
        outside = [i for i in self.global_blocks if not 0 <= i < self.depth]
        if outside:
            raise ValueError(f"global_blocks {list(self.global_blocks)} name blocks outside 0..{self.depth - 1}")
        if self.global_blocks and not self.window_size:
            raise ValueError("global_blocks needs window_size > 0 (without windows every block is global)")
        check_backend(self.attn_backend)

    def block_window(self, i: int) -> int:
        """The window side of block i: window_size, or 0 for a global block."""
        return 0 if i in self.global_blocks else self.window_size

    @property
    def size_multiple(self) -> int:
        """Image sides must be multiples of this: the patch."""
        return self.patch_size


class Blocks(nn.Sequential):
    """The encoder blocks, run in order on tokens (B, P + N, D), each told the patch grid and the number of prefix
    tokens (which windows and relative positions need); as `nn.Sequential`, it holds its input until the last block
    has run."""

    def forward(self, x: torch.Tensor, grid: tuple[int, int], prefix: int) -> torch.Tensor:
        for block in self:
            x = block(x, grid, prefix)
        return x


class VisionTransformer(CostFromImages, nn.Module):
    """ViT / DeiT built from a `ViTConfig`.

    `forward` returns logits (B, num_classes) (for distilled models: the mean of the class and
    distillation heads, as DeiT evaluates). Training with DeiT's distillation loss uses
    `forward_distill`, which returns both heads' logits.
    """

    def __init__(self, config: ViTConfig) -> None:
        super().__init__()
        self.config = c = config
        self.num_prefix_tokens = int(c.class_token) + int(c.distilled) + c.reg_tokens
        norm = partial(nn.LayerNorm, eps=c.layer_norm_eps)
        self.patch_embed = PatchEmbed(
            c.img_size,
            c.patch_size,
            c.in_chans,
            c.embed_dim,
            norm_layer=norm if c.patch_norm else None,
            strict_img_size=not c.dynamic_img_size,
            bias=c.patch_bias,
            pixel_norm_layer=norm if c.patch_norm else None,
        )
        self.cls_token = nn.Parameter(torch.zeros(1, 1, c.embed_dim)) if c.class_token else None
        self.dist_token = nn.Parameter(torch.zeros(1, 1, c.embed_dim)) if c.distilled else None
        self.reg_token = nn.Parameter(torch.zeros(1, c.reg_tokens, c.embed_dim)) if c.reg_tokens else None
        pos_len = self.patch_embed.num_patches + self.embedded_prefix
        # A sin-cos table is fixed (requires_grad=False) but kept as a parameter so the state dict layout
        # is the same as for a learned one.
        self.pos_embed = nn.Parameter(torch.zeros(1, pos_len, c.embed_dim), requires_grad=c.pos_embed == "learn")
        self.pos_drop = nn.Dropout(c.drop_rate)
        self.norm_pre = norm(c.embed_dim) if c.pre_norm else nn.Identity()
        dpr = [c.drop_path_rate * i / max(c.depth - 1, 1) for i in range(c.depth)]  # linear stochastic-depth rule
        self.blocks = Blocks(
            *[
                Block(
                    c.embed_dim,
                    c.num_heads,
                    c.mlp_ratio,
                    c.qkv_bias,
                    proj_drop=c.drop_rate,
                    attn_drop=c.attn_drop_rate,
                    drop_path=dpr[i],
                    init_values=c.init_values,
                    norm_eps=c.layer_norm_eps,
                    attn_backend=c.attn_backend,
                    act=c.act,
                    head_dim=c.head_dim,
                    proj_bias=c.proj_bias,
                    window_size=c.block_window(i),
                    rel_pos_size=self._rel_pos_size(i) if c.rel_pos else None,
                )
                for i in range(c.depth)
            ]
        )
        # As in timm: the final norm sits before pooling for class-token models and after it (fc_norm) for
        # mean pooling, unless `fc_norm` says otherwise. The bilinear pool takes the normalised tokens, and its
        # output is L2-normalised; attention pooling takes all the normalised tokens.
        self.norm = norm(c.embed_dim) if c.final_norm and not self.use_fc_norm else nn.Identity()
        self.fc_norm = norm(c.embed_dim) if c.final_norm and self.use_fc_norm else nn.Identity()
        self.pool = BilinearPool(c.embed_dim, reduce_dim=c.bilinear_dim) if c.global_pool == "bilinear" else None
        self.attn_pool = (
            AttentionPool(c.embed_dim, c.num_heads, c.mlp_ratio, c.qkv_bias, c.layer_norm_eps, c.act, c.attn_backend)
            if c.global_pool == "map"
            else None
        )
        pooled = self.pool.num_features if self.pool is not None else c.embed_dim
        self.head_drop = nn.Dropout(c.drop_rate)
        self.head = nn.Linear(pooled, c.num_classes) if c.num_classes > 0 else nn.Identity()
        if c.distilled:
            self.head_dist = nn.Linear(c.embed_dim, c.num_classes) if c.num_classes > 0 else nn.Identity()
        self.init_weights()

    @property
    def num_features(self) -> int:
        return self.config.embed_dim

    def get_classifier(self) -> nn.Module | tuple[nn.Module, nn.Module]:
        """The classifier (timm's name): a Linear, Identity without classes; a distilled model's two, (head,
        head_dist), as timm's."""
        return (self.head, self.head_dist) if self.config.distilled else self.head

    def reset_classifier(self, num_classes: int) -> None:
        """A fresh classifier for `num_classes` classes (0: none, `forward` returns the pooled features), as timm's;
        the config follows. A distilled model's distillation head too."""
        pooled = self.pool.num_features if self.pool is not None else self.config.embed_dim
        self.head = fresh_classifier(self, pooled, num_classes)
        if self.config.distilled:
            self.head_dist = fresh_classifier(self, self.config.embed_dim, num_classes)
        self.config = replace(self.config, num_classes=num_classes)

    def _rel_pos_size(self, i: int) -> tuple[int, int]:
        """What block i's relative position tables are sized for: its window, or the grid at img_size."""
        window = self.config.block_window(i)
        return (window, window) if window else self.patch_embed.grid_size

    @property
    def use_fc_norm(self) -> bool:
        """Whether the final norm follows the pooling (`fc_norm`) rather than preceding it (`norm`)."""
        return self.config.global_pool == "avg" if self.config.fc_norm is None else self.config.fc_norm

    def init_weights(self) -> None:
        """timm's ViT initialisation: truncated normal (std .02) for linears and tables, tiny class token."""
        if self.config.pos_embed == "sincos":
            with torch.no_grad():
                self.pos_embed.copy_(self._sincos_table(self.patch_embed.grid_size))
        else:
            nn.init.trunc_normal_(self.pos_embed, std=0.02)
        if self.cls_token is not None:
            nn.init.normal_(self.cls_token, std=1e-6)
        if self.dist_token is not None:
            nn.init.trunc_normal_(self.dist_token, std=0.02)
        if self.reg_token is not None:
            nn.init.normal_(self.reg_token, std=1e-6)
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.trunc_normal_(module.weight, std=0.02)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)

    @property
    def embedded_prefix(self) -> int:
        """Prefix tokens that have a row of the position table: all of them, or none with `no_embed_class`."""
        return 0 if self.config.no_embed_class else self.num_prefix_tokens

    def _sincos_table(self, grid: tuple[int, int]) -> torch.Tensor:
        table = big_vision_sincos_2d if self.config.pos_embed == "sincos_big_vision" else sincos_2d_pos_embed
        return table(self.config.embed_dim, grid, num_prefix_tokens=self.embedded_prefix)

    def _pos_embed(self, x: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
        """Prepend the prefix tokens (class, distillation, registers) to x (B, N, D) and add the position table for
        the token grid: to every token, or with `no_embed_class` to the patches before the prefix is prepended."""
        B = x.shape[0]
        prefix = [t.expand(B, -1, -1) for t in (self.cls_token, self.dist_token, self.reg_token) if t is not None]
        pos_embed = self.pos_embed
        if grid != self.patch_embed.grid_size:
            if self.config.pos_embed != "learn":
                pos_embed = self._sincos_table(grid).to(x.device, pos_embed.dtype)
            else:
                pos_embed = resample_abs_pos_embed(
                    pos_embed,
                    grid,
                    self.patch_embed.grid_size,
                    num_prefix_tokens=self.embedded_prefix,
                    antialias=self.config.pos_antialias,
                )
        if self.config.no_embed_class:
            return self.pos_drop(torch.cat([*prefix, x + pos_embed], dim=1))  # (B, P + N, D)
        x = torch.cat([*prefix, x], dim=1)  # (B, P + N, D)
        return self.pos_drop(x + pos_embed)

    def _embed(self, x: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int]]:
        tokens = self.patch_embed(x)  # (B, N, D); checks the input
        grid = self.patch_embed.feat_size(x.shape[-2:])
        return self._pos_embed(tokens, grid), grid

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """Images (B, C, H, W) -> normalised tokens (B, P + N, D)."""
        x, grid = self._embed(x)
        x = self.norm_pre(x)  # the embedded tokens are freed before the blocks run
        x = self.blocks(x, grid, self.num_prefix_tokens)
        return self.norm(x)

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        """Tokens (B, P + N, D) -> logits (B, num_classes), or the pooled features (B, D) with `pre_logits`
        ((B, pool.num_features) for the bilinear pool)."""
        if self.config.distilled:
            cls, dist = x[:, 0], x[:, 1]
            if pre_logits:
                return (cls + dist) / 2
            return (self.head(self.head_drop(cls)) + self.head_dist(self.head_drop(dist))) / 2
        if self.pool is not None:
            x = self.pool(x[:, self.num_prefix_tokens :])  # (B, N, D) -> (B, r * r)
        elif self.attn_pool is not None:
            x = self.attn_pool(x)  # (B, P + N, D) -> (B, D)
        elif self.config.global_pool == "avg":
            x = x[:, self.num_prefix_tokens :].mean(dim=1)  # (B, N, D) -> (B, D)
        else:
            x = x[:, 0]  # the class token (B, D)
        x = self.head_drop(self.fc_norm(x))
        return x if pre_logits else self.head(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_head(self.forward_features(x))

    def shard_units(self) -> list[nn.Module]:
        """The encoder blocks (`vitkit.models.interface.VitkitModel`)."""
        return list(self.blocks)

    def set_grad_checkpointing(self, enable: bool = True) -> int:
        """Recompute each encoder block in backward (`vitkit.models.interface.VitkitModel`); the blocks now
        checkpointed."""
        return checkpoint_blocks(self.shard_units(), enable)

    def token_grid(self, img_size: tuple[int, int]) -> tuple[int, tuple[int, int]] | None:
        """Every block attends over all tokens: the P prefix tokens, then the (H / p, W / p) patch grid; None with
        windows (`spatial_attention` lays those on the image)."""
        if self.config.window_size:
            return None
        return self.num_prefix_tokens, self.patch_embed.feat_size(img_size)

    def attention_layout(self) -> str:
        """Why `token_grid` is None (windows), in words (`vitkit.models.interface.VitkitModel`)."""
        c = self.config
        windowed = f"its blocks but {listed([str(i) for i in c.global_blocks])}" if c.global_blocks else "its blocks"
        return f"{windowed} attend within {c.window_size}x{c.window_size}-patch windows, not over the whole image"

    def spatial_attention(self, maps: Mapping[str, torch.Tensor], img_size: tuple[int, int]) -> list[SpatialAttention]:
        """Each captured block's attention laid on the patch grid (`vitkit.models.interface.SpatialAttention`): a
        windowed block's (B * nW, h, P + M * M, P + M * M) as every patch's row over its window's patches (-1 where
        the window pads the grid), a global block's (B, h, P + N, P + N) over all patches; the prefix tokens are left
        out and each row renormalised over the patches, for images of `img_size`."""
        grid = self.patch_embed.feat_size(img_size)
        H, W = grid
        P = self.num_prefix_tokens
        out = []
        for i in range(len(self.blocks)):
            name = f"blocks.{i}.attn"
            if name not in maps:
                continue
            record = maps[name][:, :, P:, P:]  # patches over patches
            record = record / record.sum(dim=-1, keepdim=True).clamp_min(torch.finfo(record.dtype).tiny)
            window = self.config.block_window(i)
            if not window:
                keys = torch.arange(H * W).expand(H * W, -1)
                out.append(SpatialAttention(name, grid, keys, record, "all patches"))
                continue
            tokens = window_tokens(grid, (window, window))  # (nW, M * M): each window's patches, -1 for padding
            real = tokens >= 0
            where = torch.empty(H * W, dtype=torch.long)
            where[tokens[real]] = torch.arange(tokens.numel()).view_as(tokens)[real]  # each patch's place
            nW, M2 = tokens.shape
            h = record.shape[1]
            rows = record.reshape(-1, nW, h, M2, M2).permute(0, 2, 1, 3, 4).reshape(-1, h, nW * M2, M2)
            weights = rows[:, :, where]  # (B, h, H * W, M * M): each patch's row in its window
            out.append(SpatialAttention(name, grid, tokens[where // M2], weights, f"{window}x{window} windows"))
        return out

    def prefix_token_names(self) -> tuple[str, ...]:
        """What each token before the patches is, in token order: "class", "distillation", "register 0", ... (the
        attention views name them, and keep registers apart from the maps)."""
        c = self.config
        registers = tuple(f"register {i}" for i in range(c.reg_tokens))
        return ("class",) * c.class_token + ("distillation",) * c.distilled + registers

    def no_weight_decay(self) -> set[str]:
        """The position table and the learned tokens (timm's `no_weight_decay`), and attention pooling's probe."""
        names = ("pos_embed", "cls_token", "dist_token", "reg_token")
        probe = {"attn_pool.latent"} if self.attn_pool is not None else set()
        return {name for name in names if getattr(self, name) is not None} | probe

    def forward_distill(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """DeiT training: (class-head logits, distillation-head logits), each (B, num_classes)."""
        if not self.config.distilled:
            raise ValueError("forward_distill needs a distilled model (config.distilled=True)")
        x = self.forward_features(x)
        return self.head(self.head_drop(x[:, 0])), self.head_dist(self.head_drop(x[:, 1]))

    def check_input(self, x: torch.Tensor) -> None:
        """ValueError, saying what was expected and what came, for images (B, C, H, W) forward cannot take."""
        self.patch_embed.check_input(x)

    def feature_info(self) -> list[tuple[int, int]]:
        """(channels, stride) of each block's output as `forward_intermediates` gives it: D at the patch's stride."""
        return [(self.config.embed_dim, self.config.patch_size)] * self.config.depth

    # timm's default outputs of a features model (`create_model(..., features_only=True)`): the last three blocks
    default_feature_outputs: int | None = 3

    def prune_intermediate_layers(
        self, indices: int | Sequence[int] | None = None, prune_norm: bool = False, prune_head: bool = True
    ) -> list[int]:
        """Drop what `forward_intermediates(x, indices)` does not use, as timm's: the blocks after the last output,
        the final norm (`prune_norm`), the pooling and classifier (`prune_head`). Returns the outputs' indices,
        counted from the first block. The pruned model serves `forward_intermediates` (a features model); its
        config still describes the model it was cut from."""
        take = take_indices(len(self.blocks), indices)
        self.blocks = self.blocks[: max(take) + 1]
        if prune_norm:
            self.norm = nn.Identity()
        if prune_head:
            self.fc_norm, self.pool, self.attn_pool = nn.Identity(), None, None
            self.reset_classifier(0)
        return take

    def check_feature_outputs(self, indices: Sequence[int]) -> None:
        """ValueError unless `forward_intermediates(x, indices, norm=True)` uses every parameter (as a detector's
        backbone must, to train under DDP and to take a checkpoint whole): the last block among the outputs, and
        the final norm on the tokens, not after a pooling of its own."""
        c = self.config
        if c.depth - 1 not in indices:
            raise ValueError(
                f"a backbone's outputs must include the ViT's last block {c.depth} (blocks after the last output "
                f"would run for nothing); for fewer blocks, set its depth (got blocks {[i + 1 for i in indices]})"
            )
        if c.global_pool in ("map", "bilinear") or (self.use_fc_norm and c.final_norm) or c.distilled:
            raise ValueError(
                f"a ViT with global_pool {c.global_pool!r}{', distilled' if c.distilled else ''} keeps parameters a "
                "detector's maps do not use (its pooling, or its norm after it); a backbone ViT pools with its class "
                "token (DINOv2, CLIP and the ViT paper's variants)"
            )

    def forward_intermediates(
        self,
        x: torch.Tensor,
        indices: int | list[int] | tuple[int, ...] | None = None,
        output_fmt: str = "NCHW",
        norm: bool = False,
        intermediates_only: bool = False,
    ) -> list[torch.Tensor] | tuple[torch.Tensor, list[torch.Tensor]]:
        """Outputs of chosen blocks, patch tokens only (prefix tokens dropped).

        Args:
            x: images (B, C, H, W).
            indices: None for every block, an int n for the last n blocks, or a list of block indices
                (negative ones count from the end).
            output_fmt: "NCHW" for feature maps (B, D, Hp, Wp), "NLC" for tokens (B, Hp*Wp, D).
            norm: apply the final norm to each output.
            intermediates_only: False (timm's default): (`forward_features(x)`, the outputs), every block runs;
                True: the outputs alone, what follows the last output skipped.
        """
        if output_fmt not in ("NCHW", "NLC"):
            raise ValueError(f"output_fmt must be 'NCHW' or 'NLC', got {output_fmt!r}")
        take = take_indices(len(self.blocks), indices)
        x, (Hp, Wp) = self._embed(x)
        x = self.norm_pre(x)
        outputs = []
        for i, block in enumerate(self.blocks[: len(self.blocks) if not intermediates_only else max(take) + 1]):
            x = block(x, (Hp, Wp), self.num_prefix_tokens)
            if i in take:
                y = (self.norm(x) if norm else x)[:, self.num_prefix_tokens :]  # (B, N, D)
                if output_fmt == "NCHW":
                    y = y.reshape(y.shape[0], Hp, Wp, -1).permute(0, 3, 1, 2).contiguous()  # (B, D, Hp, Wp)
                outputs.append(y)
        return outputs if intermediates_only else (self.norm(x), outputs)


register_family(
    "vit",
    ViTConfig,
    VisionTransformer,
    display_name="ViT",
    weights="vitkit.weights.vit",
    cost_parts={"patch_embed": "embedding"},
)


def _vit(
    name: str, paper: str = VIT_PAPER, pretrained: tuple[TimmTag, ...] = (), unpublished: str = "", **fields: object
) -> None:
    register_model(name, "vit", ViTConfig(**fields), paper, pretrained=pretrained, unpublished=unpublished)


# timm's weights (`vitkit.create_model(name, pretrained=True)`, the first of a variant its default): the tags of
# timm's pretrained configs, what they were trained on as timm's model cards say ("How to train your ViT?", AugReg:
# arXiv:2106.10270); the ImageNet-21k heads have no published label names
_IN21K = {"num_classes": 21843}
_NO_HEAD = {"num_classes": 0}
AUGREG2_FT = TimmTag(
    "augreg2_in21k_ft_in1k", "ImageNet-21k, fine-tuned on ImageNet-1k (AugReg), fine-tuned again by timm"
)
AUGREG_FT = TimmTag("augreg_in21k_ft_in1k", "ImageNet-21k, fine-tuned on ImageNet-1k (AugReg)")
AUGREG_1K = TimmTag("augreg_in1k", "ImageNet-1k (AugReg)")
AUGREG_21K = TimmTag("augreg_in21k", "ImageNet-21k (AugReg), its 21,843 classes", _IN21K, None)
ORIG_FT = TimmTag("orig_in21k_ft_in1k", "ImageNet-21k, fine-tuned on ImageNet-1k (the ViT paper's)")
ORIG_21K = TimmTag("orig_in21k", "ImageNet-21k (the ViT paper's), without its head", _NO_HEAD, None)
DINO = TimmTag("dino", "ImageNet-1k, self-supervised (DINO, arXiv:2104.14294), no head", _NO_HEAD, None)
DINOV2 = TimmTag("lvd142m", "LVD-142M, self-supervised (DINOv2), no head", labels=None)
CLIP_LAION = TimmTag("laion2b_ft_in12k_in1k", "LAION-2B (OpenCLIP), fine-tuned on ImageNet-12k then ImageNet-1k")
CLIP_OPENAI = TimmTag("openai_ft_in12k_in1k", "OpenAI's WIT-400M (CLIP), fine-tuned on ImageNet-12k then ImageNet-1k")
CLIP_LAION_1K = TimmTag("laion2b_ft_in1k", "LAION-2B (OpenCLIP), fine-tuned on ImageNet-1k")
SIGLIP2 = TimmTag("v2_webli", "WebLI (SigLIP 2, arXiv:2502.14786), no head", labels=None)
SIGLIP = TimmTag("webli", "WebLI (SigLIP), no head", labels=None)
DEIT = TimmTag("fb_in1k", "ImageNet-1k (DeiT's, with distillation from a RegNetY-16GF for the distilled ones)")


# ViT sizes from the ViT paper (Table 1); Tiny and Small from DeiT (Table 1).
_TINY = dict(embed_dim=192, depth=12, num_heads=3)
_SMALL = dict(embed_dim=384, depth=12, num_heads=6)
_BASE = dict(embed_dim=768, depth=12, num_heads=12)
_LARGE = dict(embed_dim=1024, depth=24, num_heads=16)
_HUGE = dict(embed_dim=1280, depth=32, num_heads=16)  # the ViT paper's ViT-H
_GIANT = dict(embed_dim=1408, depth=40, num_heads=16, mlp_ratio=48 / 11)  # ViT-g, "Scaling Vision Transformers"

_vit("vit_tiny_patch16_224", **_TINY, pretrained=(AUGREG_FT, AUGREG_21K))
_vit("vit_small_patch16_224", **_SMALL, pretrained=(AUGREG_FT, AUGREG_1K, AUGREG_21K, DINO))
_vit("vit_small_patch16_384", img_size=384, **_SMALL, pretrained=(AUGREG_FT, AUGREG_1K))
_vit("vit_base_patch16_224", **_BASE, pretrained=(AUGREG2_FT, AUGREG_FT, ORIG_FT, AUGREG_1K, AUGREG_21K, ORIG_21K))
_vit("vit_base_patch16_384", img_size=384, **_BASE, pretrained=(AUGREG_FT, ORIG_FT, AUGREG_1K))
_vit("vit_base_patch32_224", patch_size=32, **_BASE, pretrained=(AUGREG_FT, AUGREG_1K, AUGREG_21K, ORIG_21K))
_vit("vit_base_patch32_384", img_size=384, patch_size=32, **_BASE, pretrained=(AUGREG_FT, AUGREG_1K))
_vit("vit_large_patch16_224", **_LARGE, pretrained=(AUGREG_FT, AUGREG_21K, ORIG_21K))
# the sizes people shard (`vitkit train --strategy fsdp`), with timm's names: 304M, 632M and 1.01B parameters
_SHARDED = "timm publishes none for this size (an architecture to train, sharded, from scratch)"
_vit("vit_large_patch14_224", patch_size=14, **_LARGE, unpublished=_SHARDED)
_vit("vit_huge_patch14_224", patch_size=14, **_HUGE, pretrained=(ORIG_21K,))
_vit("vit_giant_patch14_224", SCALING_PAPER, patch_size=14, **_GIANT, unpublished=_SHARDED)
# DINOv2's backbones (no classifier) at their 518x518 training size, with LayerScale, and with 4 registers, which
# have no position embedding, nor has the class token ("Vision Transformers Need Registers"); timm's names
_DINOV2 = dict(img_size=518, patch_size=14, init_values=1e-5, num_classes=0)
_REGISTERS = dict(reg_tokens=4, no_embed_class=True)
_vit("vit_small_patch14_dinov2", DINOV2_PAPER, **_SMALL, **_DINOV2, pretrained=(DINOV2,))
_vit("vit_base_patch14_dinov2", DINOV2_PAPER, **_BASE, **_DINOV2, pretrained=(DINOV2,))
_vit("vit_large_patch14_dinov2", DINOV2_PAPER, **_LARGE, **_DINOV2, pretrained=(DINOV2,))
_vit("vit_small_patch14_reg4_dinov2", REGISTERS_PAPER, **_SMALL, **_DINOV2, **_REGISTERS, pretrained=(DINOV2,))
_vit("vit_base_patch14_reg4_dinov2", REGISTERS_PAPER, **_BASE, **_DINOV2, **_REGISTERS, pretrained=(DINOV2,))
_vit("vit_large_patch14_reg4_dinov2", REGISTERS_PAPER, **_LARGE, **_DINOV2, **_REGISTERS, pretrained=(DINOV2,))
# CLIP's image tower: a LayerNorm before the blocks, no patch bias, LayerNorm eps 1e-5; OpenAI's weights were trained
# with quick GELU (timm's names; the head is a classifier, 1000 classes, as timm builds them)
_CLIP = dict(pre_norm=True, patch_bias=False, layer_norm_eps=1e-5)
_vit("vit_base_patch16_clip_224", CLIP_PAPER, **_BASE, **_CLIP, pretrained=(CLIP_LAION, CLIP_OPENAI, CLIP_LAION_1K))
_vit(
    "vit_base_patch16_clip_quickgelu_224",
    CLIP_PAPER,
    **_BASE,
    **_CLIP,
    act="quick_gelu",
    unpublished="OpenAI's and MetaCLIP's weights for it are OpenCLIP checkpoints (the whole CLIP, its text tower "
    "too, and a 512-wide projection for a head), a layout vitkit does not read; vit_base_patch16_clip_224's tags hold "
    "OpenAI's and LAION's towers fine-tuned on ImageNet, and from_pretrained('hf-hub:openai/clip-vit-base-patch16') "
    "reads transformers' CLIP",
)
_vit(
    "vit_large_patch14_clip_224",
    CLIP_PAPER,
    patch_size=14,
    **_LARGE,
    **_CLIP,
    pretrained=(CLIP_LAION, CLIP_OPENAI, CLIP_LAION_1K),
)
# SigLIP's image tower: no class token, attention pooling (MAP); a backbone. timm builds it with exact GELU, which its
# weights load into unchanged; transformers' checkpoints say "gelu_pytorch_tanh", read as act="gelu_tanh"
_SIGLIP = dict(class_token=False, global_pool="map", num_classes=0)
_vit("vit_base_patch16_siglip_224", SIGLIP_PAPER, **_BASE, **_SIGLIP, pretrained=(SIGLIP2, SIGLIP))
_vit(
    "vit_so400m_patch14_siglip_224",
    SIGLIP_PAPER,
    patch_size=14,
    embed_dim=1152,
    depth=27,
    num_heads=16,
    mlp_ratio=3.7362,
    **_SIGLIP,
    pretrained=(SIGLIP2, SIGLIP),
)
# vitkit's small ViT for the bundled 28x28 digits (16 tokens of 7x7 patches): what `vitkit train` trains by default.
_DIGITS = dict(embed_dim=128, depth=4, num_heads=4, mlp_ratio=2.0)
_vit(
    "vit_digits_patch7_28",
    img_size=28,
    patch_size=7,
    num_classes=10,
    **_DIGITS,
    unpublished="vitkit's own size, which `vitkit train` trains on the bundled digits in a minute",
)

_vit("deit_tiny_patch16_224", DEIT_PAPER, **_TINY, pretrained=(DEIT,))
_vit("deit_small_patch16_224", DEIT_PAPER, **_SMALL, pretrained=(DEIT,))
_vit("deit_base_patch16_224", DEIT_PAPER, **_BASE, pretrained=(DEIT,))
_vit("deit_tiny_distilled_patch16_224", DEIT_PAPER, distilled=True, **_TINY, pretrained=(DEIT,))
_vit("deit_small_distilled_patch16_224", DEIT_PAPER, distilled=True, **_SMALL, pretrained=(DEIT,))
_vit("deit_base_distilled_patch16_224", DEIT_PAPER, distilled=True, **_BASE, pretrained=(DEIT,))
