"""Building blocks shared by every vitkit model: one concept per module."""

from vitkit.kernels.policy import ATTENTION_BACKENDS, BACKENDS, DEFORMABLE_BACKENDS
from vitkit.layers.attention import (
    Attention,
    attention_backend,
    attention_layers,
    capture_attention,
    check_backend,
    set_attention_backend,
)
from vitkit.layers.attention2d import POS_KINDS, Attention2d
from vitkit.layers.attention_pool import AttentionPool
from vitkit.layers.bilinear import BilinearPool
from vitkit.layers.block import Block, LayerScale
from vitkit.layers.deformable import MultiScaleDeformableAttention, SampledAttention
from vitkit.layers.drop import DropPath, drop_path
from vitkit.layers.einsum import attention_einsum, multihead_attention_einsum
from vitkit.layers.helpers import to_2tuple
from vitkit.layers.mlp import Mlp
from vitkit.layers.norm import FrozenBatchNorm2d
from vitkit.layers.patch_embed import PatchEmbed
from vitkit.layers.pos_embed import (
    SinePositionEmbedding,
    big_vision_sincos_2d,
    resample_abs_pos_embed,
    sincos_2d_pos_embed,
)
from vitkit.layers.rel_pos import DecomposedRelPos, FactorizedPosEmbed2d, RelPosEmbed2d

__all__ = [
    "ATTENTION_BACKENDS",
    "BACKENDS",
    "DEFORMABLE_BACKENDS",
    "POS_KINDS",
    "Attention",
    "Attention2d",
    "AttentionPool",
    "BilinearPool",
    "Block",
    "DecomposedRelPos",
    "DropPath",
    "FactorizedPosEmbed2d",
    "FrozenBatchNorm2d",
    "LayerScale",
    "Mlp",
    "MultiScaleDeformableAttention",
    "PatchEmbed",
    "RelPosEmbed2d",
    "SampledAttention",
    "SinePositionEmbedding",
    "attention_backend",
    "attention_einsum",
    "attention_layers",
    "big_vision_sincos_2d",
    "capture_attention",
    "check_backend",
    "drop_path",
    "multihead_attention_einsum",
    "resample_abs_pos_embed",
    "set_attention_backend",
    "sincos_2d_pos_embed",
    "to_2tuple",
]
