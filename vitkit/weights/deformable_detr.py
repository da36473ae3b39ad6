"""Deformable DETR weights: vitkit's own names and Hugging Face transformers' `DeformableDetrForObjectDetection`
<-> vitkit.

vitkit's Deformable DETR keeps vitkit's DETR layout (`backbone.*` in torchvision's ResNet names, `input_proj`,
`query_embed`, `encoder.layers.*`, `decoder.layers.*` with norm1 after the self-attention, `class_embed`,
`bbox_embed.layers.*`) and the paper's names for the rest (`level_embed`, `reference_points`, `enc_output(_norm)`,
`pos_trans(_norm)`, the deformable attention's `sampling_offsets`, `attention_weights`, `value_proj`,
`output_proj`). Without box refinement its one class head and one box head are `class_embed` and `bbox_embed`; with
it, a ModuleList of each, one per decoder layer (`class_embed.{i}`, `bbox_embed.{i}`), the two-stage proposal heads
last. Its class heads have K rows (sigmoid logits, no "no object"). Fine-tuning on other classes replaces the class
heads and the other tensors sized by the classes (denoising queries' `label_embed`, where the model has it) only.

transformers (format "hf"): `DeformableDetrForObjectDetection`, the model under `model.` and its heads beside it,
with timm's ResNet as the backbone (its released checkpoints; `out_indices` name the stages that feed the levels) or
transformers' own `ResNetBackbone`. transformers 4 (and the files transformers 5 writes) name the backbone
`backbone.conv_encoder.model`, the self-attention output `out_proj` and the feed-forward `fc1` / `fc2`; inside
transformers 5 models they are `backbone.model`, `o_proj`, `mlp.fc1` / `mlp.fc2`. Import accepts all of them.

transformers keeps a head per decoder layer in every variant (`class_embed.{j}`, `bbox_embed.{j}`) and, with box
refinement, a second name for the box heads (`model.decoder.bbox_embed.{j}`; two-stage also
`model.decoder.class_embed.{j}`), and ties those that the paper shares: a file may hold every name (transformers 4,
the released checkpoints) or one of each tie group (what transformers 5's `save_pretrained` writes). Import reads
each vitkit head from whichever name of its group is present (`resolve_heads`); names that repeat a tensor vitkit
holds once are dropped, after checking that they repeat it. Export writes every name, as the released checkpoints
do; transformers ties equal copies on loading.

fundamentalvision/Deformable-DETR (format "deformable_detr"): the checkpoints of the paper's code
(`r50_deformable_detr-checkpoint.pth`, `..._single_scale...`, `..._plus_iterative_bbox_refinement...`,
`..._plus_plus_two_stage...`, and the `checkpoint.pth` files its `main.py` writes: ``{"model": state_dict, ...}``).
Its `DeformableDETR` holds `backbone` (a `Joiner` whose [0] holds torchvision's ResNet as `body`, frozen BatchNorm
with weight, bias, running_mean and running_var; [1] the sine encoding, without parameters), `input_proj`,
`query_embed`, `transformer` (`level_embed`, `encoder.layers.*` with `self_attn` / `norm1` / `linear1` / `linear2` /
`norm2`, `decoder.layers.*` with `cross_attn` / `norm1` / `self_attn` (`nn.MultiheadAttention`) / `norm2` /
`linear1` / `linear2` / `norm3`, `reference_points` or the two-stage `enc_output(_norm)` / `pos_trans(_norm)`) and
the heads `class_embed.{j}` / `bbox_embed.{j}.layers.*`. Its decoder norms are numbered in construction order,
cross-attention first: its norm1 follows the cross-attention, its norm2 the self-attention (vitkit's norm2 and norm1).
Its heads are lists in every variant, the one module repeated without box refinement, and with it the box heads'
list is also `transformer.decoder.bbox_embed` (two-stage: the class heads' also `transformer.decoder.class_embed`);
its state dicts write every name. Import resolves them as transformers' (`resolve_heads`); export writes them
all. The paper's code computes a few steps in float32 whatever the input type (the sine encoding, the valid
ratios, reference grids), where vitkit follows the input's: equal in float32, not bit for bit in float64. Not read:
two-stage without box refinement (transformers neither), learned position encodings (`backbone.1.row_embed`).

torchvision (format "torchvision"): a ResNet classifier's file (torchvision's or timm's names) holds the backbone
alone, as for DETR (`vitkit.weights.detr`): the rest of the model keeps its initialisation. It is not written.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from vitkit.models.deformable_detr import DeformableDetrConfig
from vitkit.weights.detr import (
    BACKBONE_BODY,
    HF_BACKBONES,
    RESNET_NORMS,
    TIMM_RESNETS,
    attention_rules,
    backbone_from_hf,
    hf_native_backbone,
    hf_resnet_config,
    hf_timm_backbone,
    resnet_classifier,
    resnet_name,
    resnet_rules,
    without_step_counts,
)
from vitkit.weights.family import FamilyWeights, State
from vitkit.weights.hf import labels, num_labels
from vitkit.weights.rename import Layout, Rename, rename
from vitkit.weights.shapes import count

_HEADS = ("class_embed", "bbox_embed")  # beside `model.` in DeformableDetrForObjectDetection
# The denoising queries' label embeddings (a row per class): used in training only, so neither transformers' model nor
# the paper's has them, and the detections do not depend on them; not written.
_TRAINING_ONLY = ("label_embed.",)


def read_fields(state: Mapping[str, torch.Tensor]) -> dict[str, Any]:
    """The config fields a Deformable DETR state dict fixes: the backbone, width, levels, queries, layers,
    feed-forward width and the two options."""
    fields: dict[str, Any] = {}
    conv1 = state.get("backbone.conv1.weight")
    if conv1 is not None and conv1.ndim == 4:  # a ResNet's stem (a Swin's or ViT's backbone is `backbone.body`)
        fields.update(backbone="resnet", in_chans=conv1.shape[1], backbone_width=conv1.shape[0])
    if (depths := tuple(count(state, rf"backbone\.layer{s}\.(\d+)\.") for s in range(1, 5))) and all(depths):
        fields["backbone_depths"] = depths
        fields["backbone_block"] = "bottleneck" if "backbone.layer1.0.conv3.weight" in state else "basic"
    if (levels := state.get("level_embed")) is not None and levels.ndim == 2:
        fields.update(num_feature_levels=levels.shape[0], hidden_dim=levels.shape[1])
    if (queries := state.get("query_embed.weight")) is not None:
        fields["num_queries"] = queries.shape[0]
    for name, prefix in (("enc_layers", "encoder"), ("dec_layers", "decoder")):
        if layers := count(state, rf"{prefix}\.layers\.(\d+)\."):
            fields[name] = layers
    if (fc1 := state.get("encoder.layers.0.mlp.fc1.weight")) is not None:
        fields["dim_feedforward"] = fc1.shape[0]
    if any(k.startswith(_HEADS) for k in state):
        fields["box_refine"] = "class_embed.0.weight" in state
        fields["two_stage"] = "enc_output.weight" in state
    return fields


# --- Hugging Face transformers ----------------------------------------------------------------------------------------


def _hf_body(out_proj: str, ffn: str) -> tuple[Rename, ...]:
    """The transformer, with the decoder self-attention's output named `out_proj` and the feed-forward under `ffn`.
    The heads are named as vitkit's by `resolve_heads` before renaming."""
    enc, dec = "encoder.layers.{i}", "decoder.layers.{i}"
    return (
        rename("input_proj", "input_proj"),  # {l}.0 Conv2d (D, C_l, 1, 1) or (D, C, 3, 3), {l}.1 GroupNorm: both
        rename("level_embed", "level_embed"),  # (L, D) both
        rename("query_embed", "query_position_embeddings"),  # Embedding (Q, 2D) both: [position | content]
        rename("reference_points", "reference_points"),  # Linear (2, D) both
        rename("enc_output_norm", "enc_output_norm"),  # two-stage: the proposal queries' Linear (D, D) and its norm
        rename("enc_output", "enc_output"),
        rename("pos_trans_norm", "pos_trans_norm"),  # two-stage: the proposal encoding's Linear (2D, 2D) and norm
        rename("pos_trans", "pos_trans"),
        rename(f"{enc}.self_attn", f"{enc}.self_attn"),  # the deformable attention's four Linears, the same names
        rename(f"{enc}.norm1", f"{enc}.self_attn_layer_norm"),
        rename(f"{enc}.mlp.fc1", f"{enc}.{ffn}fc1"),  # (F, D) both
        rename(f"{enc}.mlp.fc2", f"{enc}.{ffn}fc2"),  # (D, F) both
        rename(f"{enc}.norm2", f"{enc}.final_layer_norm"),
        # Separate q, k, v Linears (D, D) each, concatenated along dim 0 into the fused qkv (3D, D), rows q | k | v;
        # biases (D,) each -> (3D,).
        rename(f"{dec}.self_attn.qkv", *(f"{dec}.self_attn.{p}_proj" for p in "qkv")),
        rename(f"{dec}.self_attn.proj", f"{dec}.self_attn.{out_proj}"),
        rename(f"{dec}.norm1", f"{dec}.self_attn_layer_norm"),  # after the self-attention in both
        rename(f"{dec}.cross_attn", f"{dec}.encoder_attn"),
        rename(f"{dec}.norm2", f"{dec}.encoder_attn_layer_norm"),
        rename(f"{dec}.mlp.fc1", f"{dec}.{ffn}fc1"),
        rename(f"{dec}.mlp.fc2", f"{dec}.{ffn}fc2"),
        rename(f"{dec}.norm3", f"{dec}.final_layer_norm"),
        rename("class_embed", "class_embed"),  # (K, D) both; named as vitkit's by `resolve_heads`
        rename("bbox_embed", "bbox_embed"),  # layers.0..2 both
    )


def _decoder_layers(names: set[str], transformer: str = "") -> int:
    pattern = re.compile(re.escape(transformer) + r"decoder\.layers\.(\d+)\.")
    return 1 + max((int(m.group(1)) for k in names if (m := pattern.match(k))), default=-1)


def resolve_heads(
    state: Mapping[str, torch.Tensor], transformer: str = ""
) -> tuple[dict[str, torch.Tensor], list[str]]:
    """A state dict with its heads named as vitkit's: (the state, the names dropped as repeats of a tensor kept).

    Args:
        state: transformers' names without `model.` (`transformer` ""), or the paper's code's names (`transformer`
            "transformer."): the heads beside the transformer in both, the decoder's second names for them
            (`{transformer}decoder.class_embed.{j}`, `{transformer}decoder.bbox_embed.{j}`) inside it.
        transformer: the prefix of the transformer's own names (`decoder.layers`, `enc_output`).

    A file with box refinement (a `decoder.bbox_embed`) or two-stage (an `enc_output`) gives a head per decoder
    layer, the proposal heads last: class head i from `class_embed.i`, else `decoder.class_embed.i`, else (one-stage,
    neither present) `class_embed.0`, the one transformers 5 saves of a tie group; box head i from `bbox_embed.i`, else
    `decoder.bbox_embed.i`. A file without refinement gives one head of each, from index 0. ValueError where names
    that vitkit holds once carry different values.
    """
    names = set(state)
    decoder = f"{transformer}decoder."
    layers = _decoder_layers(names, transformer)
    two_stage = f"{transformer}enc_output.weight" in names
    refine = two_stage or any(k.startswith(f"{decoder}bbox_embed.") for k in names)
    head_names = (*(f"{h}." for h in _HEADS), f"{decoder}class_embed.", f"{decoder}bbox_embed.")
    out = {k: v for k, v in state.items() if not k.startswith(head_names)}
    # vitkit prefix -> (the source prefixes holding it, the one read first; those read only when none of them is
    # present: a tie group's one saved member)
    groups: dict[str, tuple[list[str], list[str]]] = {}
    for head in _HEADS:
        if not refine:
            copies = [f"{head}.{j}" for j in range(layers)] + [f"{decoder}{head}.{j}" for j in range(layers)]
            groups[head] = (copies, [])
            continue
        for i in range(layers + two_stage):
            fallback = [f"{head}.0"] if head == "class_embed" and not two_stage else []
            groups[f"{head}.{i}"] = ([f"{head}.{i}", f"{decoder}{head}.{i}"], fallback)
    used: set[str] = set()
    for ours, (sources, fallback) in groups.items():
        present = [s for s in sources if any(k.startswith(s + ".") for k in names)]
        present = present or [s for s in fallback if any(k.startswith(s + ".") for k in names)]
        if not present:
            continue
        first = present[0]
        for key in (k for k in names if k.startswith(first + ".")):
            out[ours + key[len(first) :]] = state[key]
            used.add(key)
        for other in present[1:]:
            for key in (k for k in names if k.startswith(other + ".")):
                kept = state.get(first + key[len(other) :])
                if kept is None or kept.shape != state[key].shape or not torch.equal(kept, state[key]):
                    raise ValueError(
                        f"{key} differs from {first + key[len(other) :]}: vitkit's Deformable DETR holds them as one "
                        f"tensor ({'box refinement' if refine else 'no box refinement'}, {layers} decoder layers)"
                    )
    dropped = sorted(k for k in names if k.startswith(head_names) and k not in used)
    known = [s for sources, fallback in groups.values() for s in (*sources, *fallback)]
    unmatched = [k for k in dropped if not any(k.startswith(s + ".") for s in known)]
    for key in unmatched:  # heads of no group (an index past the layers): left for the key check to report
        out[key] = state[key]
    return out, [k for k in dropped if k not in unmatched]


class HfLayout(Layout):
    """transformers' layout: the heads resolved from their tie groups (`resolve_heads`), then renamed by the rules."""

    def to_vitkit(
        self, state: dict[str, torch.Tensor], config: Any = None
    ) -> tuple[dict[str, torch.Tensor], list[str], list[str]]:
        # a BatchNorm's step count, in files whose backbone norms were not frozen: nothing frozen norms hold
        counts = [k for k in state if k.endswith(".num_batches_tracked")]
        kept = {self.strip(k): v for k, v in state.items() if k not in counts}
        heads_resolved, repeats = resolve_heads(kept)
        out, dropped, unmatched = super().to_vitkit(heads_resolved)
        return out, [*counts, *repeats, *dropped], unmatched


_HF_COMMON = dict(
    format="hf",
    family="deformable_detr",
    markers=("level_embed", "encoder.layers.0.self_attn_layer_norm.weight"),
    strip_prefixes=("model.",),
)
# Import: either backbone, either naming (the native backbone's rules first: the timm rule takes any name under the
# prefix). Export: the files' names, with the backbone the config can express.
HF = HfLayout(
    rules=(
        *(r for prefix in HF_BACKBONES for r in hf_native_backbone(prefix)),
        *(r for prefix in HF_BACKBONES for r in hf_timm_backbone(prefix)),
        *_hf_body("out_proj", ""),
        *_hf_body("o_proj", "mlp."),
    ),
    **_HF_COMMON,
)
HF_TIMM = Layout(rules=hf_timm_backbone(HF_BACKBONES[0]) + _hf_body("out_proj", ""), **_HF_COMMON)
HF_NATIVE = Layout(rules=hf_native_backbone(HF_BACKBONES[0]) + _hf_body("out_proj", ""), **_HF_COMMON)


def _stages_from_hf(hf: dict[str, Any], levels: int, source: str) -> tuple[int, ...]:
    """The ResNet stages (1..4) whose maps feed the levels: timm's `out_indices` (1..4: layer1..layer4; transformers'
    default [2, 3, 4], or [4] for one level), or transformers' ResNet `out_features` / `out_indices` ("stage1".. /
    1..4; default "stage4")."""
    sub = hf.get("backbone_config")
    if sub is None and not hf.get("use_timm_backbone", True):
        sub = {"model_type": "resnet"}
    if sub is None or sub.get("model_type") == "timm_backbone":
        kwargs = (hf.get("backbone_kwargs") or {}) if sub is None else sub
        indices = kwargs.get("out_indices") or ([2, 3, 4] if levels > 1 else [4])
    elif sub.get("out_features"):
        features = sub["out_features"]
        if not all(isinstance(f, str) and re.fullmatch(r"stage[1-4]", f) for f in features):
            raise ValueError(f"{source}: backbone out_features {features} must be ResNet stages 'stage1'..'stage4'")
        indices = [int(f[-1]) for f in features]
    else:
        indices = sub.get("out_indices") or [4]
    stages = tuple(int(i) for i in indices)
    if not all(1 <= s <= 4 for s in stages):
        raise ValueError(f"{source}: the backbone must feed the levels from ResNet stages 1..4, got {list(indices)}")
    return stages


def config_from_hf(hf: dict[str, Any], keys: set[str], source: str) -> DeformableDetrConfig:
    """The vitkit Deformable DETR config equal to a transformers `DeformableDetrConfig` (arguments: see
    `vitkit.weights.family.ConfigReader`). Two-stage keeps `two_stage_num_proposals` proposals (vitkit's
    `num_queries`); `auxiliary_loss` becomes `aux_loss`. vitkit's feed-forward block drops out after its activation
    at `dropout` as the paper's code does (transformers' `activation_dropout`, 0.0 by default, is not kept: it only
    matters in training)."""
    for field, allowed in (("position_embedding_type", "sine"), ("activation_function", "relu")):
        if hf.get(field, allowed) != allowed:
            raise ValueError(
                f"{source}: {field} {hf[field]!r} is not supported; vitkit's Deformable DETR uses {allowed!r}"
            )
    pairs = (("encoder_attention_heads", "decoder_attention_heads", 8), ("encoder_ffn_dim", "decoder_ffn_dim", 1024))
    for enc, dec, default in pairs:
        if hf.get(enc, default) != hf.get(dec, default):
            raise ValueError(
                f"{source}: {enc} {hf.get(enc, default)} != {dec} {hf.get(dec, default)}; vitkit's Deformable DETR "
                "uses one"
            )
    backbone = backbone_from_hf(hf, source)
    kwargs = hf.get("backbone_kwargs") or {}
    backbone["dilation"] = backbone["dilation"] or kwargs.get("output_stride") == 16
    levels = hf.get("num_feature_levels", 4)
    two_stage = bool(hf.get("two_stage", False))
    return DeformableDetrConfig(
        in_chans=hf.get("num_channels", 3),
        num_classes=num_labels(hf),
        **backbone,
        backbone_stages=_stages_from_hf(hf, levels, source),
        num_feature_levels=levels,
        hidden_dim=hf.get("d_model", 256),
        num_heads=hf.get("encoder_attention_heads", 8),
        enc_layers=hf.get("encoder_layers", 6),
        dec_layers=hf.get("decoder_layers", 6),
        enc_points=hf.get("encoder_n_points", 4),
        dec_points=hf.get("decoder_n_points", 4),
        dim_feedforward=hf.get("encoder_ffn_dim", 1024),
        drop_rate=float(hf.get("dropout", 0.1)),
        attn_drop_rate=float(hf.get("attention_dropout", 0.0)),
        num_queries=hf.get("two_stage_num_proposals", 300) if two_stage else hf.get("num_queries", 300),
        aux_loss=bool(hf.get("auxiliary_loss", False)),
        box_refine=bool(hf.get("with_box_refine", False)),
        two_stage=two_stage,
    )


def _hf_heads(config: DeformableDetrConfig, state: State) -> State:
    """vitkit's heads under every name transformers gives them (copies: safetensors stores no shared tensors)."""
    layers = config.dec_layers
    out: State = {}
    for key, tensor in state.items():
        head, _, rest = key.partition(".")
        if not config.box_refine:  # one head, every decoder layer's
            out.update({f"{head}.{j}.{rest}": tensor.clone() for j in range(layers)})
            continue
        i, _, rest = rest.partition(".")
        out[f"{head}.{i}.{rest}"] = tensor.clone()
        if head == "bbox_embed" or config.two_stage:  # the decoder's second name for the heads it reads
            out[f"model.decoder.{head}.{i}.{rest}"] = tensor.clone()
    return out


def to_hf(config: DeformableDetrConfig, state: State) -> tuple[State, dict[str, Any]]:
    """A vitkit Deformable DETR state dict and config as transformers writes a `DeformableDetrForObjectDetection`.

    A standard ResNet (18 / 34 / 50 / 101 / 152, 64 wide) is written as timm's backbone, as transformers' released
    checkpoints are; any other width or depth as transformers' own ResNet, which cannot dilate (no DC5). Every head
    is written under every name transformers gives it, with `tie_word_embeddings` on: transformers ties the copies
    (and keeps box refinement's distinct class heads apart). The denoising label embeddings (training only) are not
    written.
    """
    if config.backbone != "resnet":
        raise ValueError(
            f"transformers' DeformableDetr has a ResNet backbone; this model's is {config.backbone}: keep it in "
            "vitkit's layout (save_pretrained)"
        )
    timm_name = resnet_name(config)
    if timm_name is None and config.dilation:
        raise ValueError(
            "transformers dilates (DC5) timm's ResNets only (18, 34, 50, 101, 152 at width 64); this backbone is "
            f"{config.backbone_block} {config.backbone_depths} at width {config.backbone_width}"
        )
    layout = HF_TIMM if timm_name else HF_NATIVE
    state = {k: v for k, v in without_step_counts(state).items() if not k.startswith(_TRAINING_ONLY)}
    heads = {k: v for k, v in state.items() if k.startswith(_HEADS)}
    body = layout.from_vitkit({k: v for k, v in state.items() if k not in heads})
    renamed = {"model." + k: v for k, v in body.items()} | _hf_heads(config, heads)
    stages = list(config.stages)
    hf: dict[str, Any] = {
        "architectures": ["DeformableDetrForObjectDetection"],
        "model_type": "deformable_detr",
        "num_channels": config.in_chans,
        "d_model": config.hidden_dim,
        "num_feature_levels": config.num_feature_levels,
        "encoder_layers": config.enc_layers,
        "decoder_layers": config.dec_layers,
        "encoder_attention_heads": config.num_heads,
        "decoder_attention_heads": config.num_heads,
        "encoder_ffn_dim": config.dim_feedforward,
        "decoder_ffn_dim": config.dim_feedforward,
        "encoder_n_points": config.enc_points,
        "decoder_n_points": config.dec_points,
        "activation_function": "relu",
        "dropout": config.drop_rate,
        "attention_dropout": config.attn_drop_rate,
        "activation_dropout": config.drop_rate,
        "num_queries": config.num_queries,
        "two_stage_num_proposals": config.num_queries,
        "with_box_refine": config.box_refine,
        "two_stage": config.two_stage,
        "position_embedding_type": "sine",
        "auxiliary_loss": config.aux_loss,
        "dilation": config.dilation,
        "tie_word_embeddings": True,
        **labels(config.num_classes),
    }
    if timm_name:
        hf["backbone_config"] = {
            "model_type": "timm_backbone",
            "backbone": timm_name,
            "num_channels": config.in_chans,
            "features_only": True,
            "use_pretrained_backbone": False,
            "out_indices": stages,
            "output_stride": 16 if config.dilation else None,
        }
    else:
        hf["backbone_config"] = hf_resnet_config(config, stages)
    return renamed, hf


# --- fundamentalvision/Deformable-DETR ------------------------------------------------------------------------------
_ORIGINAL_FORMAT = "deformable_detr"
_T = "transformer."  # the paper's `DeformableTransformer`: encoder, decoder, level_embed and the query / proposal parts


def _original_body() -> tuple[Rename, ...]:
    """The paper's names for all but the heads (`resolve_heads` names those as vitkit's before renaming)."""
    enc, dec = "encoder.layers.{i}", "decoder.layers.{i}"
    return (
        *resnet_rules(),  # backbone.X <- backbone.0.body.X: torchvision's ResNet, frozen norms' four buffers
        rename("input_proj", "input_proj"),  # {l}.0 Conv2d (D, C_l, 1, 1) or (D, C, 3, 3), {l}.1 GroupNorm: both
        rename("level_embed", f"{_T}level_embed"),  # (L, D) both
        rename("query_embed", "query_embed"),  # Embedding (Q, 2D) both: [position | content]
        rename("reference_points", f"{_T}reference_points"),  # Linear (2, D) both, one-stage
        rename("enc_output_norm", f"{_T}enc_output_norm"),  # two-stage: the proposal queries' Linear (D, D), norm
        rename("enc_output", f"{_T}enc_output"),
        rename("pos_trans_norm", f"{_T}pos_trans_norm"),  # two-stage: the proposal encoding's Linear (2D, 2D), norm
        rename("pos_trans", f"{_T}pos_trans"),
        rename(f"{enc}.self_attn", f"{_T}{enc}.self_attn"),  # MSDeformAttn's four Linears, the same names
        rename(f"{enc}.norm1", f"{_T}{enc}.norm1"),
        rename(f"{enc}.mlp.fc1", f"{_T}{enc}.linear1"),  # (F, D) both
        rename(f"{enc}.mlp.fc2", f"{_T}{enc}.linear2"),  # (D, F) both
        rename(f"{enc}.norm2", f"{_T}{enc}.norm2"),
        *attention_rules(f"{dec}.self_attn", f"{_T}{dec}.self_attn"),  # nn.MultiheadAttention: in_proj is vitkit's qkv
        # The paper's decoder layer names its norms in construction order, cross-attention's first: its norm2 follows
        # the self-attention (vitkit's norm1), its norm1 the cross-attention (vitkit's norm2).
        rename(f"{dec}.norm1", f"{_T}{dec}.norm2"),
        rename(f"{dec}.cross_attn", f"{_T}{dec}.cross_attn"),
        rename(f"{dec}.norm2", f"{_T}{dec}.norm1"),
        rename(f"{dec}.mlp.fc1", f"{_T}{dec}.linear1"),
        rename(f"{dec}.mlp.fc2", f"{_T}{dec}.linear2"),
        rename(f"{dec}.norm3", f"{_T}{dec}.norm3"),
        rename("class_embed", "class_embed"),  # (K, D) both; named as vitkit's by `resolve_heads`
        rename("bbox_embed", "bbox_embed"),  # layers.0..2 both
    )


def _original_heads(state: State) -> State:
    """vitkit's heads under every name the paper's model gives them (copies: a `.safetensors` file stores no shared
    tensors). Its `class_embed` and `bbox_embed` are always lists, a head per decoder layer (two-stage: the proposal
    heads last): without box refinement the one module repeated, with it clones, the box heads' list also the
    decoder's `transformer.decoder.bbox_embed` (two-stage: the class heads' also `transformer.decoder.class_embed`)."""
    layers = _decoder_layers(set(state))
    refine, two_stage = "class_embed.0.weight" in state, "enc_output.weight" in state
    out: State = {}
    for key, tensor in state.items():
        if not key.startswith(_HEADS):
            continue
        head, _, rest = key.partition(".")
        if not refine:  # one head, every decoder layer's
            out.update({f"{head}.{j}.{rest}": tensor.clone() for j in range(layers)})
            continue
        out[key] = tensor.clone()
        if head == "bbox_embed" or two_stage:
            out[f"{_T}decoder.{key}"] = tensor.clone()
    return out


class OriginalLayout(Layout):
    """The paper's layout: the heads resolved from their repeated names (`resolve_heads`), the rest renamed by the
    rules; export writes every name the paper's model has (not the denoising label embeddings, training only)."""

    def to_vitkit(
        self, state: dict[str, torch.Tensor], config: Any = None
    ) -> tuple[dict[str, torch.Tensor], list[str], list[str]]:
        if f"{_T}enc_output.weight" in state and not any(k.startswith(f"{_T}decoder.bbox_embed.") for k in state):
            raise ValueError(
                "a two-stage Deformable DETR without box refinement (--two_stage without --with_box_refine: "
                f"{_T}enc_output, no {_T}decoder.bbox_embed): vitkit's, as transformers', refines the proposals' "
                "boxes in every decoder layer (two_stage needs box_refine), which changes what the weights compute"
            )
        heads_resolved, repeats = resolve_heads(state, _T)
        out, dropped, unmatched = super().to_vitkit(heads_resolved)
        return out, [*repeats, *dropped], unmatched

    def from_vitkit(self, state: dict[str, torch.Tensor], config: Any = None) -> dict[str, torch.Tensor]:
        heads = {k: v for k, v in state.items() if k.startswith(_HEADS)}
        body = super().from_vitkit(
            {k: v for k, v in state.items() if k not in heads and not k.startswith(_TRAINING_ONLY)}
        )
        return body | _original_heads(state)


def check_original_export(config: DeformableDetrConfig) -> None:
    """ValueError for configurations the paper's code cannot build or run: its backbone is torchvision's ResNet-50,
    -101 or -152 (`build_backbone` asserts against 18 and 34: the channels are fixed at 512, 1024, 2048) on 3 input
    channels, giving layer2..layer4 to more than one level and layer4 to one; its two-stage proposal encoding has 128
    features per coordinate, 2D = 512 only for D = 256."""
    problems = []
    name = resnet_name(config) if config.backbone == "resnet" else config.backbone
    if name not in ("resnet50", "resnet101", "resnet152"):
        problems.append(
            "torchvision's resnet50, resnet101 or resnet152 (width 64), not "
            + (
                name
                if name
                else f"{config.backbone_block} blocks {config.backbone_depths} at width {config.backbone_width}"
            )
        )
    if config.in_chans != 3:
        problems.append(f"3 input channels (this model: {config.in_chans})")
    L, stages = config.num_feature_levels, tuple(config.stages)
    wanted = (4,) if L == 1 else (2, 3, 4)
    if stages != wanted or L == 2:
        problems.append(
            "layer2..layer4 feeding the first three of >= 3 levels, or layer4 one level (backbone_stages (2, 3, 4) "
            f"or (4,)), not stages {stages} for {L} levels"
        )
    if config.two_stage and config.hidden_dim != 256:
        problems.append(
            f"hidden_dim 256 with two_stage (its proposal encoding is 4 x 128 wide), not {config.hidden_dim}"
        )
    if problems:
        raise ValueError("fundamentalvision/Deformable-DETR's model needs " + "; ".join(problems))


ORIGINAL = OriginalLayout(
    format=_ORIGINAL_FORMAT,
    family="deformable_detr",
    rules=_original_body(),
    markers=(f"{_T}level_embed", f"{_T}encoder.layers.0.self_attn.sampling_offsets.weight"),
    dropped=tuple(f"{BACKBONE_BODY}.{norm}.num_batches_tracked" for norm in RESNET_NORMS),
    check_export=check_original_export,
    wrapper="model",  # its main.py reads and writes checkpoint["model"]
)


# A ResNet classifier's file (torchvision's, or timm's of the same names): the backbone alone (see vitkit.weights.detr).
TORCHVISION = resnet_classifier("deformable_detr", f"vitkit, hf or {_ORIGINAL_FORMAT}")


def mask_head_of(model: nn.Module, state: Mapping[str, torch.Tensor]) -> list[str]:
    """A checkpoint whose mask head makes its pixel embeddings as Mask DINO's does (`mask_head.pixel_conv`, the
    models of earlier vitkit versions) loads into a model whose head is made so: the model's head is switched
    (`QueryMasks.use_mask_dino_pixels`) before the key check. Nothing is resampled: returns []."""
    head = getattr(model, "mask_head", None)
    if head is not None and "mask_head.pixel_conv.weight" in state and not hasattr(head, "pixel_conv"):
        head.use_mask_dino_pixels()
    return []


WEIGHTS = FamilyWeights(
    in_timm=False,  # timm has no DETR: its format would be vitkit's own names, under another name
    markers=("level_embed", "encoder.layers.0.norm1.weight", "decoder.layers.0.norm3.weight"),
    # the class heads only (every decoder layer's and two-stage's proposal head): the box heads predict boxes of any
    # class, so fine-tuning keeps them
    head=("class_embed.",),
    class_sized=_TRAINING_ONLY,  # the denoising queries' label embeddings, a row per class
    extra_outputs=0,  # K sigmoid logits, no "no object"
    layouts=(TORCHVISION, HF, ORIGINAL),  # torchvision first, as the classifiers list it: one order of formats
    adapt=mask_head_of,
    read_fields=read_fields,
    unread_fields=("num_heads", "enc_points", "dec_points"),  # the sampling offsets' rows fix only their
    # product, heads x levels x points x 2
    hf_model_types={"deformable_detr": config_from_hf},
    hf_export=to_hf,
)

__all__ = [
    "HF",
    "ORIGINAL",
    "TIMM_RESNETS",
    "TORCHVISION",
    "WEIGHTS",
    "check_original_export",
    "config_from_hf",
    "read_fields",
    "resolve_heads",
    "to_hf",
]
