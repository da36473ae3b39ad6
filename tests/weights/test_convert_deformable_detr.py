"""Deformable DETR weights from Hugging Face transformers (`DeformableDetrForObjectDetection`, built from small
configs with random weights, never downloaded) give the same predictions in vitkit on a padded batch, in float64 and
float32, from a saved directory (transformers 4's names, tied heads stored once) and from an in-memory state dict
(transformers 5's names), and export back to transformers."""

import copy
import dataclasses
import re
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
import transformers
from safetensors.torch import load_file
from test_convert_detr import randomize

import vitkit
from vitkit.detection import pad_images
from vitkit.models.registry import build_model
from vitkit.weights.deformable_detr import to_hf

# Width 64 (a multiple of the input projections' 32 GroupNorm groups), 4 heads, 2 + 2 layers, FFN 96, 2 encoder and 3
# decoder points, 10 queries, 5 classes.
SMALL = dict(
    d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
    encoder_ffn_dim=96, decoder_ffn_dim=96, encoder_n_points=2, decoder_n_points=3, num_queries=10, num_labels=5,
    attn_implementation="eager",
)  # fmt: skip
TIMM_R18 = dict(backbone="resnet18", use_timm_backbone=True)  # no backbone_kwargs: those make transformers ask the Hub


def native(*stages: int) -> dict:
    """transformers' own ResNet, narrow (bottleneck blocks 1-2-1-1 from a 16-channel stem), feeding `stages`."""
    return dict(
        backbone_config=transformers.ResNetConfig(
            layer_type="bottleneck", depths=[1, 2, 1, 1], embedding_size=16, hidden_sizes=[64, 128, 256, 512],
            out_features=[f"stage{s}" for s in stages],
        )
    )  # fmt: skip


VARIANTS = {
    # timm's ResNet-18 (the backbone of transformers' released checkpoints, here 18 deep), transformers' default
    # out_indices [2, 3, 4]: layer2..layer4 and one stride-2 level from layer4's map
    "plain": TIMM_R18,
    # timm's ResNet-18 with out_indices [3, 4]: two levels (neither the paper's code nor the defaults build this)
    "two_levels": dict(
        num_feature_levels=2, backbone_config=transformers.TimmBackboneConfig(backbone="resnet18", out_indices=[3, 4])
    ),
    # the narrow native ResNet: cheaper, for the options
    "box_refine": dict(**native(2, 3, 4), with_box_refine=True),
    "two_stage": dict(**native(2, 3, 4), with_box_refine=True, two_stage=True, two_stage_num_proposals=12),
    "one_level": dict(**native(4), num_feature_levels=1),
    # layer4 only, four levels: three stride-2 levels, the first from layer4's map, each other from the level before
    "extra_levels": native(4),
}
TIMM_FIELDS = dict(backbone_width=64, backbone_depths=(2, 2, 2, 2), backbone_block="basic")
NATIVE_FIELDS = dict(backbone_width=16, backbone_depths=(1, 2, 1, 1), backbone_block="bottleneck")
# The vitkit config fields each variant reads as (besides the sizes of SMALL).
EXPECTED_FIELDS = {
    "plain": dict(**TIMM_FIELDS, backbone_stages=(2, 3, 4), num_feature_levels=4, box_refine=False, two_stage=False),
    "two_levels": dict(**TIMM_FIELDS, backbone_stages=(3, 4), num_feature_levels=2),
    "box_refine": dict(**NATIVE_FIELDS, backbone_stages=(2, 3, 4), num_feature_levels=4, box_refine=True),
    "two_stage": dict(**NATIVE_FIELDS, backbone_stages=(2, 3, 4), box_refine=True, two_stage=True, num_queries=12),
    "one_level": dict(**NATIVE_FIELDS, backbone_stages=(4,), num_feature_levels=1, box_refine=False),
    "extra_levels": dict(**NATIVE_FIELDS, backbone_stages=(4,), num_feature_levels=4),
}
# What transformers 5's save_pretrained keeps of the heads: one name of each tie group (per layer index).
ONE_HEAD = {"class_embed.0", "bbox_embed.0"}
SAVED_HEADS = {
    "box_refine": {"class_embed.0", "model.decoder.bbox_embed.0", "model.decoder.bbox_embed.1"},
    "two_stage": {f"model.decoder.{h}.{i}" for h in ("class_embed", "bbox_embed") for i in range(3)},
}
TOLERANCE = {torch.float64: 1e-6, torch.float32: 1e-3}


pytestmark = pytest.mark.usefixtures("hub_offline")  # tests/conftest.py: no Hub look-ups


def hf_deformable_detr(**config) -> transformers.DeformableDetrForObjectDetection:
    torch.manual_seed(0)
    model = transformers.DeformableDetrForObjectDetection(
        transformers.DeformableDetrConfig(**{**SMALL, **config})
    ).eval()
    randomize(model)  # norm affines, biases, level embeddings, BN statistics: all off their initial values
    return model


def padded_batch() -> tuple[torch.Tensor, torch.Tensor]:
    """Two images of different sizes, padded: every level has padded rows and columns for the second."""
    g = torch.Generator().manual_seed(1)
    return pad_images([torch.randn(3, 64, 96, generator=g), torch.randn(3, 48, 72, generator=g)])


def predictions(
    model: torch.nn.Module, dtype: torch.dtype, images: torch.Tensor, mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(pred_logits, pred_boxes) of a copy of `model` in `dtype`."""
    model = copy.deepcopy(model).to(dtype)
    with torch.no_grad():
        if isinstance(model, transformers.DeformableDetrForObjectDetection):
            out = model(pixel_values=images.to(dtype), pixel_mask=mask.long())
            return out.logits, out.pred_boxes
        out = model(images.to(dtype), mask)
        return out["pred_logits"], out["pred_boxes"]


@dataclass
class Case:
    name: str
    theirs: transformers.DeformableDetrForObjectDetection
    directory: Path  # what transformers' save_pretrained wrote
    ours: torch.nn.Module  # vitkit.from_pretrained(directory)
    images: torch.Tensor
    mask: torch.Tensor
    expected: dict[torch.dtype, tuple[torch.Tensor, torch.Tensor]]  # transformers' predictions

    def check(self, model: torch.nn.Module, dtypes: tuple[torch.dtype, ...] = tuple(TOLERANCE)) -> None:
        """`model` predicts what transformers' does (float64 to 1e-6, float32 to 1e-3)."""
        for dtype in dtypes:
            got = predictions(model, dtype, self.images, self.mask)
            for ours, theirs in zip(got, self.expected[dtype], strict=True):
                torch.testing.assert_close(ours, theirs, atol=TOLERANCE[dtype], rtol=0)


def make_case(name: str, theirs: transformers.DeformableDetrForObjectDetection, directory: Path) -> Case:
    theirs.save_pretrained(directory)  # transformers 4's names on disk, one name of each tie group
    images, mask = padded_batch()
    expected = {dtype: predictions(theirs, dtype, images, mask) for dtype in TOLERANCE}
    assert expected[torch.float64][1].std() > 0.02  # boxes that vary: the comparison sees every layer
    return Case(name, theirs, directory, vitkit.from_pretrained(directory), images, mask, expected)


@pytest.fixture(scope="module", params=list(VARIANTS))
def case(request, tmp_path_factory) -> Case:
    name = request.param
    return make_case(name, hf_deformable_detr(**VARIANTS[name]), tmp_path_factory.mktemp(name) / "hf")


def same_state(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def head_keys(directory: Path) -> set[str]:
    """The heads a saved file holds, named to their layer index: `class_embed.0`, `model.decoder.bbox_embed.1`."""
    heads = (re.match(r"(.*(?:class|bbox)_embed\.\d+)\.", k) for k in load_file(directory / "model.safetensors"))
    return {m.group(1) for m in heads if m}


def test_hf_directory_gives_the_same_predictions(case):
    """A transformers 5 directory: transformers 4's names, and of the tied heads one name per group only."""
    assert head_keys(case.directory) == SAVED_HEADS.get(case.name, ONE_HEAD)
    c = case.ours.config
    assert (c.hidden_dim, c.num_heads, c.enc_layers, c.dec_layers, c.dim_feedforward) == (64, 4, 2, 2, 96)
    assert (c.enc_points, c.dec_points, c.num_classes, c.dilation) == (2, 3, 5, False)
    expected = {"num_queries": 10, **EXPECTED_FIELDS[case.name]}
    assert {k: getattr(c, k) for k in expected} == expected
    case.check(case.ours)


def test_hf_in_memory_names(case):
    """transformers 5's module names (every tied name) give the tensors the directory gives: the same predictions."""
    state = case.theirs.state_dict()
    assert "model.decoder.layers.0.self_attn.o_proj.weight" in state and "model.encoder.layers.0.mlp.fc1.bias" in state
    assert any(k.startswith("model.backbone.model.") for k in state)
    ours = build_model("deformable_detr", case.ours.config).eval()
    report = vitkit.load_weights(ours, state)
    assert report.format == "hf" and report.loaded == len(ours.state_dict())
    attn = "model.decoder.layers.1.self_attn"
    qkv = torch.cat([state[f"{attn}.{p}_proj.weight"] for p in "qkv"])  # rows q | k | v
    assert torch.equal(ours.decoder.layers[1].self_attn.qkv.weight, qkv)
    assert same_state(ours, case.ours)


def test_export_back_to_transformers(case, tmp_path):
    vitkit.export_weights(case.ours, tmp_path / "back", format="hf")
    written = set(load_file(tmp_path / "back" / "model.safetensors"))
    assert set(load_file(case.directory / "model.safetensors")) <= written  # every name transformers saved, and more
    back = transformers.DeformableDetrForObjectDetection.from_pretrained(
        tmp_path / "back", attn_implementation="eager"
    ).eval()
    assert same_state(back, case.theirs)  # every tensor back in place; the config: the predictions
    case.check(back, (torch.float32,))


@pytest.fixture(scope="module")
def untied(tmp_path_factory) -> Case:
    """Box refinement with a class head per layer (the paper's, transformers 4's): `tie_word_embeddings=False` keeps
    every head apart, and the refinement's box heads (`model.decoder.bbox_embed`) are set equal to the output's, as
    one module in the paper."""
    theirs = hf_deformable_detr(**VARIANTS["box_refine"], tie_word_embeddings=False)
    theirs.model.decoder.bbox_embed.load_state_dict(theirs.bbox_embed.state_dict())
    assert not torch.equal(theirs.class_embed[0].weight, theirs.class_embed[1].weight)
    return make_case("untied", theirs, tmp_path_factory.mktemp("untied") / "hf")


def test_distinct_class_heads_per_layer(untied, tmp_path):
    assert head_keys(untied.directory) == {
        f"{p}{h}.{i}" for p in ("", "model.decoder.") for h in ("class_embed", "bbox_embed") for i in range(2)
    } - {"model.decoder.class_embed.0", "model.decoder.class_embed.1"}  # every name: transformers 4's files too
    ours = untied.ours
    assert not torch.equal(ours.class_embed[0].weight, ours.class_embed[1].weight)
    untied.check(ours)
    report = vitkit.load_weights(ours, untied.theirs.state_dict())
    repeats = sorted({k.split(".layers.")[0] for k in report.dropped})  # checked equal to the names kept
    assert repeats == ["decoder.bbox_embed.0", "decoder.bbox_embed.1"]
    # exported with every name and tie_word_embeddings on: transformers ties the equal copies only
    vitkit.export_weights(ours, tmp_path / "back", format="hf")
    back = transformers.DeformableDetrForObjectDetection.from_pretrained(
        tmp_path / "back", attn_implementation="eager"
    ).eval()
    assert same_state(back, untied.theirs)
    untied.check(back, (torch.float32,))


def test_tied_copies_that_disagree(untied):
    state = dict(untied.theirs.state_dict())
    ours = build_model("deformable_detr", untied.ours.config).eval()
    moved = "model.decoder.bbox_embed.1.layers.0.weight"
    state[moved] = state[moved] + 1.0  # the refinement's box head no longer the output's
    with pytest.raises(ValueError, match=r"decoder\.bbox_embed\.1\.layers\.0\.weight differs from bbox_embed\.1\."):
        vitkit.load_weights(ours, state)
    # without box refinement vitkit has one class head: every layer's copy must be it
    one_head = build_model("deformable_detr", dataclasses.replace(ours.config, box_refine=False)).eval()
    state, _ = to_hf(one_head.config, one_head.state_dict())
    state["class_embed.1.bias"] = state["class_embed.1.bias"] + 1.0
    with pytest.raises(
        ValueError, match=r"class_embed\.1\.bias differs from class_embed\.0\.bias: .*\(no box refinement"
    ):
        vitkit.load_weights(one_head, state)
