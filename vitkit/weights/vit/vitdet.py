"""transformers' ViTDet (`VitDetModel`, `VitDetBackbone`) <-> vitkit's ViT with windows.

ViTDet (Li et al., arXiv:2203.16527) is a plain ViT without a class token or a final norm whose blocks attend within
windows except a few global ones (`window_block_indices` lists the windowed blocks), with optional decomposed
relative positions; vitkit's ViT computes it with `window_size`, `global_blocks`, `rel_pos` and `final_norm=False`.
Its position table keeps a class token's row (`pretrain_use_cls_token`), dropped on import, and is sized for
`pretrain_image_size`: vitkit resamples it once, on import, to the grid at `image_size` (transformers' bicubic,
without antialiasing, as transformers resamples it in every forward), so the two agree at `image_size`.
"""

from __future__ import annotations

from typing import Any

import torch

from vitkit.models.vit import ViTConfig
from vitkit.weights.family import State
from vitkit.weights.hf import act_of, hf_act, square
from vitkit.weights.rename import rename
from vitkit.weights.vit.hf import VITDET_MARKER, HfViTLayout
from vitkit.weights.vit.shared import PLAIN, require, square_size

_LAYER = "encoder.layer.{i}"
VITDET_RULES = (
    rename("patch_embed.proj", "embeddings.projection"),  # Conv2d (D, C, p, p) both
    rename("pos_embed", "embeddings.position_embeddings"),  # (1, 1 + N, D) there, the class row first; (1, N, D)
    rename("blocks.{i}.norm1", f"{_LAYER}.norm1"),
    rename("blocks.{i}.attn.qkv", f"{_LAYER}.attention.qkv"),  # (3D, D) both, rows q | k | v
    rename("blocks.{i}.attn.proj", f"{_LAYER}.attention.proj"),
    rename("blocks.{i}.rel_pos.rel_pos_h", f"{_LAYER}.attention.rel_pos_h"),  # (2S - 1, d) both
    rename("blocks.{i}.rel_pos.rel_pos_w", f"{_LAYER}.attention.rel_pos_w"),
    rename("blocks.{i}.norm2", f"{_LAYER}.norm2"),
    rename("blocks.{i}.mlp.fc1", f"{_LAYER}.mlp.fc1"),
    rename("blocks.{i}.mlp.fc2", f"{_LAYER}.mlp.fc2"),
)


# Import reads these through the transformers layout every ViT table shares (`vitkit.weights.vit.HF`), which drops
# the class row; export writes ViTDet's names only.
HF_VITDET = HfViTLayout(format="hf", family="vit", rules=VITDET_RULES, markers=(VITDET_MARKER,))


def config_from_vitdet(hf: dict[str, Any], keys: set[str], source: str) -> ViTConfig:
    """The vitkit ViT equal to transformers' `VitDetModel` / `VitDetBackbone` (model_type "vitdet") at its
    `image_size`; its `forward_intermediates(x, norm=False)` gives `VitDetBackbone`'s maps after each block."""
    if hf.get("residual_block_indices"):
        raise ValueError(f"{source}: ViTDet's residual blocks (residual_block_indices) are not supported")
    if not hf.get("use_absolute_position_embeddings", True):
        raise ValueError(f"{source}: a ViTDet without absolute position embeddings is not supported")
    depth = hf.get("num_hidden_layers", 12)
    windowed = set(hf.get("window_block_indices", ()))
    window = hf.get("window_size", 0) if windowed else 0
    return ViTConfig(
        img_size=square(hf.get("image_size", 224), "image_size", source),
        patch_size=square(hf.get("patch_size", 16), "patch_size", source),
        in_chans=hf.get("num_channels", 3),
        num_classes=0,
        embed_dim=hf.get("hidden_size", 768),
        depth=depth,
        num_heads=hf.get("num_attention_heads", 12),
        mlp_ratio=float(hf.get("mlp_ratio", 4)),
        qkv_bias=hf.get("qkv_bias", True),
        class_token=False,
        global_pool="avg",
        fc_norm=False,
        final_norm=False,
        drop_rate=hf.get("dropout_prob", 0.0),
        drop_path_rate=hf.get("drop_path_rate", 0.0),
        layer_norm_eps=hf.get("layer_norm_eps", 1e-6),
        dynamic_img_size=True,
        act=act_of(hf, source),
        pos_antialias=False,
        window_size=window,
        global_blocks=tuple(i for i in range(depth) if i not in windowed) if window else (),
        rel_pos=hf.get("use_relative_position_embeddings", False),
    )


def vitdet_to_hf(config: ViTConfig, state: State) -> tuple[State, dict[str, Any]]:
    """A ViT with windows, or without a final norm, as transformers' `VitDetModel`: (state, config.json)."""
    library = "transformers' VitDetModel"
    fields = {k: v for k, v in PLAIN.items() if k not in ("window_size", "global_blocks", "rel_pos", "fc_norm")}
    require(
        config, library, **{**fields, "act": config.act, "final_norm": False}, class_token=False, global_pool="avg",
        distilled=False, num_classes=0, init_values=None,
    )  # fmt: skip
    if config.mlp_ratio != int(config.mlp_ratio):
        raise ValueError(f"{library} needs a whole mlp_ratio (this model: {config.mlp_ratio})")
    size = square_size(config, library)
    windowed = [i for i in range(config.depth) if config.block_window(i)]
    hf = {
        "architectures": ["VitDetModel"],
        "model_type": "vitdet",
        "hidden_size": config.embed_dim,
        "num_hidden_layers": config.depth,
        "num_attention_heads": config.num_heads,
        "mlp_ratio": int(config.mlp_ratio),
        "hidden_act": hf_act(config.act),
        "dropout_prob": config.drop_rate,
        "drop_path_rate": config.drop_path_rate,
        "layer_norm_eps": config.layer_norm_eps,
        "image_size": size,
        "pretrain_image_size": size,
        "patch_size": config.patch_size,
        "num_channels": config.in_chans,
        "qkv_bias": config.qkv_bias,
        "window_block_indices": windowed,
        "window_size": config.window_size,
        "residual_block_indices": [],
        "use_absolute_position_embeddings": True,
        "use_relative_position_embeddings": config.rel_pos,
    }
    state = dict(state)
    pos = state["pos_embed"]
    state["pos_embed"] = torch.cat([torch.zeros_like(pos[:, :1]), pos], dim=1)  # (1, 1 + N, D): a zero class row
    return HF_VITDET.from_vitkit(state, config), hf
