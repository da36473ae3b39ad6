"""fundamentalvision/Deformable-DETR's checkpoints (the layout of `r50_deformable_detr-checkpoint.pth` and of the
training checkpoints its `main.py` writes) load into vitkit, give the tensors (and predictions) transformers'
`DeformableDetrForObjectDetection` gives with the same weights, and export back name for name.

The original names and shapes come from a module tree built here as the paper's code builds its model
(models/backbone.py: torchvision's ResNet with frozen BatchNorm cut after layer4, as `backbone.0.body`;
models/deformable_transformer.py: `MSDeformAttn`'s four Linears, the decoder's `cross_attn` / `norm1` / `self_attn`
(`nn.MultiheadAttention`) / `norm2` / `linear1` / `linear2` / `norm3`, `level_embed`, `reference_points` or the
two-stage `enc_output` / `pos_trans`; models/deformable_detr.py: the input projections, `query_embed` and the head
lists, repeated or cloned, shared with the decoder under box refinement). Values come from random transformers
models through the renames written out below (transformers' conversion script's, with transformers 5's module
names). Nothing here goes through vitkit's table.
"""

import argparse
import copy
import re

import pytest
import torch
import torchvision
import transformers
from safetensors.torch import load_file
from test_convert_detr import randomize
from torch import nn
from torchvision.models._utils import IntermediateLayerGetter
from torchvision.ops.misc import FrozenBatchNorm2d

import vitkit
from vitkit.cli import main
from vitkit.detection import pad_images
from vitkit.weights.convert import LoadReport, formats

FORMAT = "deformable_detr"
# Width 64, 4 heads, 2 + 2 layers, FFN 96, 2 encoder and 3 decoder points, 10 queries, 5 classes.
SMALL = dict(hidden=64, heads=4, enc=2, dec=2, ffn=96, enc_points=2, dec_points=3, queries=10, classes=5)
VITKIT_SMALL = dict(
    hidden_dim=64, num_heads=4, enc_layers=2, dec_layers=2, dim_feedforward=96, enc_points=2, dec_points=3,
    num_queries=10, num_classes=5,
)  # fmt: skip
R18 = dict(backbone_block="basic", backbone_depths=(2, 2, 2, 2), backbone_width=64)  # vitkit's ResNet-18 fields
HF_SMALL = dict(
    d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
    encoder_ffn_dim=96, decoder_ffn_dim=96, encoder_n_points=2, decoder_n_points=3, num_queries=10, num_labels=5,
    backbone="resnet18", use_timm_backbone=True, attn_implementation="eager",
)  # fmt: skip

# Original name -> transformers 5's module name, applied in order (transformers' convert_deformable_detr_to_pytorch
# renames, then its v5 renames: backbone.model, mlp.fc1 / mlp.fc2, o_proj). The decoder's norms: the original numbers
# them in construction order, cross-attention first.
TO_TRANSFORMERS = (
    (r"^backbone\.0\.body\.", "model.backbone.model."),
    (r"^input_proj\.", "model.input_proj."),
    (r"^query_embed\.", "model.query_position_embeddings."),
    (r"^(transformer\.encoder\.layers\.\d+)\.norm1\.", r"\1.self_attn_layer_norm."),
    (r"^(transformer\.encoder\.layers\.\d+)\.norm2\.", r"\1.final_layer_norm."),
    (r"^(transformer\.decoder\.layers\.\d+)\.norm1\.", r"\1.encoder_attn_layer_norm."),
    (r"^(transformer\.decoder\.layers\.\d+)\.norm2\.", r"\1.self_attn_layer_norm."),
    (r"^(transformer\.decoder\.layers\.\d+)\.norm3\.", r"\1.final_layer_norm."),
    (r"\.cross_attn\.", ".encoder_attn."),
    (r"\.self_attn\.out_proj\.", ".self_attn.o_proj."),
    (r"\.linear1\.", ".mlp.fc1."),
    (r"\.linear2\.", ".mlp.fc2."),
    (r"^transformer\.", "model."),
)


pytestmark = pytest.mark.usefixtures("hub_offline")  # tests/conftest.py: no Hub look-ups


def transformers_name(key: str) -> str:
    for pattern, repl in TO_TRANSFORMERS:
        key = re.sub(pattern, repl, key)
    return key


def tree(**children: nn.Module | nn.Parameter) -> nn.Module:
    module = nn.Module()
    for name, child in children.items():
        setattr(module, name, child)
    return module


def original_deformable_detr(
    backbone: str = "resnet50",
    dilation: bool = False,
    levels: int = 4,
    hidden: int = 64,
    heads: int = 4,
    enc: int = 2,
    dec: int = 2,
    ffn: int = 96,
    enc_points: int = 2,
    dec_points: int = 3,
    queries: int = 10,
    classes: int = 5,
    refine: bool = False,
    two_stage: bool = False,
) -> nn.Module:
    """The paper's `DeformableDETR` module tree (names, shapes and shared modules; no forward). Its code builds
    resnet50 / 101 (channels fixed at 512, 1024, 2048); resnet18 has the same names, with 128, 256, 512."""
    resnet = getattr(torchvision.models, backbone)(
        replace_stride_with_dilation=[False, False, dilation], norm_layer=FrozenBatchNorm2d
    )
    multi = levels > 1  # then layer2..layer4, else layer4 only
    body = IntermediateLayerGetter(
        resnet, return_layers={"layer2": "0", "layer3": "1", "layer4": "2"} if multi else {"layer4": "0"}
    )
    channels = {"resnet18": [128, 256, 512]}.get(backbone, [512, 1024, 2048])
    channels = channels if multi else channels[-1:]

    def ms_deform_attn(points: int) -> nn.Module:
        return tree(
            sampling_offsets=nn.Linear(hidden, heads * levels * points * 2),
            attention_weights=nn.Linear(hidden, heads * levels * points),
            value_proj=nn.Linear(hidden, hidden),
            output_proj=nn.Linear(hidden, hidden),
        )

    def encoder_layer() -> nn.Module:
        return tree(
            self_attn=ms_deform_attn(enc_points),
            norm1=nn.LayerNorm(hidden),
            linear1=nn.Linear(hidden, ffn),
            linear2=nn.Linear(ffn, hidden),
            norm2=nn.LayerNorm(hidden),
        )

    def decoder_layer() -> nn.Module:
        return tree(
            cross_attn=ms_deform_attn(dec_points),
            norm1=nn.LayerNorm(hidden),
            self_attn=nn.MultiheadAttention(hidden, heads),
            norm2=nn.LayerNorm(hidden),
            linear1=nn.Linear(hidden, ffn),
            linear2=nn.Linear(ffn, hidden),
            norm3=nn.LayerNorm(hidden),
        )

    transformer = tree(
        encoder=tree(layers=nn.ModuleList([encoder_layer() for _ in range(enc)])),
        decoder=tree(layers=nn.ModuleList([decoder_layer() for _ in range(dec)])),
        level_embed=nn.Parameter(torch.empty(levels, hidden)),
    )
    if two_stage:
        transformer.enc_output = nn.Linear(hidden, hidden)
        transformer.enc_output_norm = nn.LayerNorm(hidden)
        transformer.pos_trans = nn.Linear(2 * hidden, 2 * hidden)
        transformer.pos_trans_norm = nn.LayerNorm(2 * hidden)
    else:
        transformer.reference_points = nn.Linear(hidden, 2)

    model = tree(transformer=transformer)
    class_embed = nn.Linear(hidden, classes)
    bbox_embed = tree(
        layers=nn.ModuleList([nn.Linear(hidden, hidden), nn.Linear(hidden, hidden), nn.Linear(hidden, 4)])
    )
    num_pred = dec + two_stage
    if refine:  # clones, the box heads' list also the decoder's
        model.class_embed = nn.ModuleList([copy.deepcopy(class_embed) for _ in range(num_pred)])
        model.bbox_embed = nn.ModuleList([copy.deepcopy(bbox_embed) for _ in range(num_pred)])
        transformer.decoder.bbox_embed = model.bbox_embed
    else:  # the one module repeated
        model.class_embed = nn.ModuleList([class_embed for _ in range(num_pred)])
        model.bbox_embed = nn.ModuleList([bbox_embed for _ in range(num_pred)])
    if two_stage:
        transformer.decoder.class_embed = model.class_embed
    if not two_stage:
        model.query_embed = nn.Embedding(queries, 2 * hidden)
    projections = [nn.Sequential(nn.Conv2d(c, hidden, 1), nn.GroupNorm(32, hidden)) for c in channels]
    in_channels = channels[-1]
    for _ in range(len(channels), levels):
        projections.append(nn.Sequential(nn.Conv2d(in_channels, hidden, 3, 2, 1), nn.GroupNorm(32, hidden)))
        in_channels = hidden
    model.input_proj = nn.ModuleList(projections)
    model.backbone = nn.Sequential(tree(body=body), nn.Identity())  # Joiner(Backbone, sine position encoding)
    return model


def random_state(original: nn.Module) -> dict[str, torch.Tensor]:
    """The tree's state dict with random values, shared modules' names sharing them (as the paper's files)."""
    randomize(original)
    return {k: v.clone() for k, v in original.state_dict().items()}


def repeated_names(original: nn.Module) -> tuple[int, set[int]]:
    """(how many state-dict names repeat another's tensor, the storages of the tensors that are repeated)."""
    pointers = [t.data_ptr() for t in original.state_dict().values()]
    return len(pointers) - len(set(pointers)), {p for p in pointers if pointers.count(p) > 1}


# The paper's released variants, at a small width, with ResNet-50: (tree arguments, vitkit model and fields).
ORIGINAL_VARIANTS = {
    "r50_deformable_detr": (dict(), "deformable_detr_resnet50", {}),
    "plus_iterative_bbox_refinement": (dict(refine=True), "deformable_detr_resnet50_box_refine", {}),
    # the proposal encoding is 4 x 128 wide: two-stage only at width 256
    "plus_plus_two_stage": (
        dict(refine=True, two_stage=True, hidden=256, heads=8),
        "deformable_detr_resnet50_two_stage",
        dict(hidden_dim=256, num_heads=8),
    ),
    # layer4 alone, dilated (the names of single_scale too)
    "single_scale_dc5": (
        dict(levels=1, dilation=True),
        "deformable_detr_resnet50",
        dict(num_feature_levels=1, dilation=True),
    ),
}


@pytest.mark.parametrize("variant", list(ORIGINAL_VARIANTS))
def test_original_layout_loads_and_exports_name_for_name(variant, tmp_path):
    args, name, fields = ORIGINAL_VARIANTS[variant]
    original = original_deformable_detr(**{**SMALL, **args})
    state = random_state(original)
    ours = vitkit.create_model(name, **{**VITKIT_SMALL, **fields}).eval()
    report = vitkit.load_weights(ours, {"model": state})
    assert (report.format, report.unwrapped, report.loaded) == (FORMAT, ["entry 'model'"], len(ours.state_dict()))
    repeats, shared = repeated_names(original)
    assert len(report.dropped) == repeats  # the heads' second names, checked equal to the names kept
    assert {original.state_dict()[k].data_ptr() for k in report.dropped} <= shared

    path = vitkit.export_weights(ours, tmp_path / f"{variant}.pth", format=FORMAT)
    written = torch.load(path, weights_only=True)
    assert set(written) == {"model"}  # what its main.py --resume reads: checkpoint["model"]
    assert {k: v.shape for k, v in written["model"].items()} == {k: v.shape for k, v in state.items()}
    assert all(torch.equal(written["model"][k], v) for k, v in state.items())  # original -> vitkit -> original
    original.load_state_dict(written["model"])  # strict: exactly the original module tree's names


def test_decoder_norms_swap_and_attention_stays_fused():
    state = random_state(original_deformable_detr("resnet18", **SMALL))
    ours = vitkit.create_model("deformable_detr_resnet50", **VITKIT_SMALL, **R18)
    vitkit.load_weights(ours, state)
    layer, theirs = ours.decoder.layers[1], "transformer.decoder.layers.1"
    assert torch.equal(layer.norm1.weight, state[f"{theirs}.norm2.weight"])  # after the self-attention
    assert torch.equal(layer.norm2.weight, state[f"{theirs}.norm1.weight"])  # after the cross-attention
    assert torch.equal(layer.self_attn.qkv.weight, state[f"{theirs}.self_attn.in_proj_weight"])  # rows q | k | v
    assert torch.equal(ours.encoder.layers[0].norm2.bias, state["transformer.encoder.layers.0.norm2.bias"])


def original_state(theirs: dict[str, torch.Tensor], original: nn.Module) -> dict[str, torch.Tensor]:
    """The original-layout state dict holding transformers' tensors `theirs` (transformers 5's module names)."""
    out, used = {}, set()
    for key, like in original.state_dict().items():
        prefix, _, leaf = key.rpartition(".")
        if leaf.startswith("in_proj_"):  # nn.MultiheadAttention: q, k, v stacked along dim 0
            names = [f"{transformers_name(prefix + '.')}{p}_proj.{leaf[len('in_proj_') :]}" for p in "qkv"]
            value = torch.cat([theirs[n] for n in names])
        else:
            names = [transformers_name(key)]
            value = theirs[names[0]]
        assert value.shape == like.shape, (key, value.shape, like.shape)
        out[key] = value.clone()
        used.update(names)
    assert used == set(theirs)  # every transformers tensor has its place: the table above is whole
    return out


def hf_deformable_detr(**config) -> transformers.DeformableDetrForObjectDetection:
    torch.manual_seed(0)
    model = transformers.DeformableDetrForObjectDetection(
        transformers.DeformableDetrConfig(**{**HF_SMALL, **config})
    ).eval()
    randomize(model)
    return model


# transformers variants on timm's ResNet-18 (the original's names; its code would assert against 18 layers and run
# two-stage at width 256 only, vitkit reads them all): (transformers config, tree arguments, vitkit fields).
HF_VARIANTS = {
    "plain": (dict(), dict(), {}),
    "box_refine": (dict(with_box_refine=True), dict(refine=True), dict(box_refine=True)),
    "two_stage": (
        dict(with_box_refine=True, two_stage=True, two_stage_num_proposals=10),
        dict(refine=True, two_stage=True),
        dict(box_refine=True, two_stage=True),
    ),
    "single_scale": (dict(num_feature_levels=1), dict(levels=1), dict(num_feature_levels=1)),
}


def format_and_count(report: LoadReport) -> tuple[str, int]:
    return report.format, report.loaded


@pytest.mark.parametrize("variant", list(HF_VARIANTS))
def test_original_checkpoint_is_what_transformers_holds(variant):
    """The same weights in the original layout and in transformers': the same vitkit model, tensor for tensor."""
    hf, args, fields = HF_VARIANTS[variant]
    theirs = hf_deformable_detr(**hf).state_dict()
    state = original_state(theirs, original_deformable_detr("resnet18", **{**SMALL, **args}))
    from_original = vitkit.create_model("deformable_detr_resnet50", **VITKIT_SMALL, **R18, **fields)
    from_hf = copy.deepcopy(from_original)
    everything = len(from_hf.state_dict())
    assert format_and_count(vitkit.load_weights(from_original, {"model": state})) == (FORMAT, everything)
    assert format_and_count(vitkit.load_weights(from_hf, theirs)) == ("hf", everything)
    a, b = from_original.state_dict(), from_hf.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


def predictions(model: nn.Module, images: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    with torch.no_grad():
        if isinstance(model, transformers.DeformableDetrForObjectDetection):
            out = model(pixel_values=images, pixel_mask=mask.long())
            return out.logits, out.pred_boxes
        out = model(images, mask)
        return out["pred_logits"], out["pred_boxes"]


def test_training_checkpoint_predicts_as_transformers_and_converts(tmp_path, capsys):
    """main.py's checkpoint.pth (the model beside the optimizer, schedule, epoch and its argparse.Namespace) with box
    refinement: vitkit predicts what transformers does with the same weights; `vitkit convert` reads and writes it."""
    theirs = hf_deformable_detr(with_box_refine=True)
    state = original_state(theirs.state_dict(), original_deformable_detr("resnet18", **SMALL, refine=True))
    params = [nn.Parameter(t.clone()) for t in state.values() if t.is_floating_point()][:4]
    optimizer = torch.optim.AdamW(params, lr=2e-4, weight_decay=1e-4)
    sum(p.sum() for p in params).backward()
    optimizer.step()  # moment buffers in the optimizer's state
    schedule = torch.optim.lr_scheduler.StepLR(optimizer, 40)
    args = argparse.Namespace(lr=2e-4, backbone="resnet18", with_box_refine=True, two_stage=False, num_queries=10)
    path = tmp_path / "checkpoint.pth"
    torch.save(
        {"model": state, "optimizer": optimizer.state_dict(), "lr_scheduler": schedule.state_dict(), "epoch": 49,
         "args": args},
        path,
    )  # fmt: skip
    ours = vitkit.create_model("deformable_detr_resnet50_box_refine", **VITKIT_SMALL, **R18).eval()
    assert vitkit.load_weights(ours, path).format == FORMAT
    g = torch.Generator().manual_seed(1)
    images, mask = pad_images([torch.randn(3, 64, 96, generator=g), torch.randn(3, 48, 72, generator=g)])
    expected = predictions(theirs, images, mask)
    assert expected[1].std() > 0.02  # boxes that vary: the comparison sees every layer
    for a, b in zip(predictions(ours, images, mask), expected, strict=True):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)


def test_vitkit_convert_reads_and_writes_the_original_layout(tmp_path, capsys):
    assert FORMAT in formats()  # the `--from` / `--to` choices of `vitkit convert`
    original = original_deformable_detr(**SMALL, refine=True)
    state = random_state(original)
    torch.save({"model": state, "epoch": 49, "args": argparse.Namespace(with_box_refine=True)}, tmp_path / "r50.pth")
    sets = [a for k, v in VITKIT_SMALL.items() for a in ("--set", f"{k}={v}")]
    model = "deformable_detr_resnet50_box_refine"
    assert main(["convert", str(tmp_path / "r50.pth"), str(tmp_path / "vk"), "--model", model, *sets]) == 0
    assert f"{FORMAT} layout" in capsys.readouterr().out
    assert main(["convert", str(tmp_path / "vk"), str(tmp_path / "back.pth"), "--to", FORMAT]) == 0
    back = torch.load(tmp_path / "back.pth", weights_only=True)
    assert set(back) == {"model"} and back["model"].keys() == state.keys()
    assert all(torch.equal(back["model"][k], v) for k, v in state.items())
    # a .safetensors file holds the flat state dict, every repeated name its own copy (it stores no shared tensors)
    assert main(["convert", str(tmp_path / "vk"), str(tmp_path / "back.safetensors"), "--to", FORMAT]) == 0
    flat = load_file(tmp_path / "back.safetensors")
    assert flat.keys() == state.keys() and all(torch.equal(flat[k], v) for k, v in state.items())


def test_what_vitkit_does_not_read_or_write(tmp_path):
    # two-stage without box refinement: the paper's code has it, transformers and vitkit do not
    state = random_state(original_deformable_detr("resnet18", **SMALL, two_stage=True))
    two_stage = vitkit.create_model("deformable_detr_resnet50_two_stage", **VITKIT_SMALL, **R18)
    with pytest.raises(ValueError, match="two-stage Deformable DETR without box refinement"):
        vitkit.load_weights(two_stage, {"model": state})
    # a learned position encoding (backbone.1): no place in vitkit's model
    state = random_state(original_deformable_detr("resnet18", **SMALL))
    learned = {**state, **{f"backbone.1.{a}_embed.weight": torch.randn(50, 32) for a in ("row", "col")}}
    ours = vitkit.create_model("deformable_detr_resnet50", **VITKIT_SMALL, **R18)
    with pytest.raises(ValueError, match=re.escape("2 unexpected ['backbone.1.row_embed.weight'")):
        vitkit.load_weights(ours, learned)
    # a BatchNorm2d's step counter (the frozen norms have none) is dropped and reported
    counters = {f"backbone.0.body.{n}.num_batches_tracked": torch.tensor(5) for n in ("bn1", "layer4.1.bn2")}
    report = vitkit.load_weights(ours, {**state, **counters})
    assert set(counters) <= set(report.dropped) and report.loaded == len(ours.state_dict())

    # exports the paper's code cannot build (ResNet-18 models: each message names every problem)
    for model, fields, message in (
        ("deformable_detr_resnet50", {}, "torchvision's resnet50, resnet101 or resnet152 (width 64), not resnet18"),
        ("deformable_detr_resnet50", dict(num_feature_levels=2), "not stages (3, 4) for 2 levels"),
        ("deformable_detr_resnet50_two_stage", {}, "hidden_dim 256 with two_stage (its proposal encoding is 4 x 128"),
    ):
        narrow = vitkit.create_model(model, **VITKIT_SMALL, **R18, **fields)
        with pytest.raises(ValueError, match=re.escape(message)):
            vitkit.export_weights(narrow, tmp_path / "out.pth", format=FORMAT)
    assert not (tmp_path / "out.pth").exists()

    vit = vitkit.create_model("vit_base_patch16_224", img_size=32, patch_size=4, embed_dim=32, depth=1, num_heads=4)
    with pytest.raises(
        ValueError, match=r"known format \(.*deformable_detr.*\): it looks like a deformable_detr checkpoint"
    ):
        vitkit.load_weights(vit, {"model": state})
    with pytest.raises(ValueError, match="there is no deformable_detr layout for vit models"):
        vitkit.export_weights(vit, tmp_path / "vit.pth", format=FORMAT)
