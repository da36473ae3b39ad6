"""DETR's mask head (the paper's panoptic model): transformers' `DetrForSegmentation`, built from small random
configs (never downloaded), gives the same `pred_masks` in vitkit in float64, from its files and from its in-memory
names; facebookresearch/detr's panoptic layout (`detr.` beside `bbox_attention` and `mask_head`) reads and writes
back; both exports load where they came from."""

import math

import pytest
import torch
import transformers
from safetensors.torch import load_file
from test_convert_detr import HF_SMALL, NATIVE, padded_batch, randomize

import vitkit
from vitkit.models.detr_masks import ObjectAttentionMap

# test_convert_detr's small model with 8 heads (the mask head's first width, D + M = 72, splits into 8 groups)
SEGMENTATION = {**HF_SMALL, "encoder_attention_heads": 8, "decoder_attention_heads": 8}


def hf_segmentation(**config) -> transformers.DetrForSegmentation:
    torch.manual_seed(0)
    config = transformers.DetrConfig(**{**SEGMENTATION, **config}, attn_implementation="eager")
    model = transformers.DetrForSegmentation(config).eval()
    randomize(model)
    return model.double()


def outputs(model: torch.nn.Module, images: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, ...]:
    with torch.no_grad():
        if isinstance(model, transformers.DetrForSegmentation):
            out = model(pixel_values=images, pixel_mask=mask.long())
            return out.logits, out.pred_boxes, out.pred_masks
        out = model(images, mask)
        return out["pred_logits"], out["pred_boxes"], out["pred_masks"]


def assert_equal_outputs(ours: torch.nn.Module, theirs: torch.nn.Module) -> None:
    images, mask = padded_batch()
    expected = outputs(theirs, images.double(), mask)
    assert expected[2].std() > 0.1  # masks that vary: every layer of the head matters
    for got, want in zip(outputs(ours.double().eval(), images.double(), mask), expected, strict=True):
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)


@pytest.fixture(scope="module")
def timm_segmentation():
    """transformers' DETR with the mask head on timm's ResNet-18, the layout of `facebook/detr-resnet-50-panoptic`."""
    return hf_segmentation(backbone="resnet18", use_timm_backbone=True)


def test_a_detr_for_segmentation_directory_gives_the_same_masks(timm_segmentation, tmp_path):
    timm_segmentation.save_pretrained(tmp_path / "hf")  # the names transformers 4 used, which its files keep
    assert "mask_head.lay1.weight" in load_file(tmp_path / "hf" / "model.safetensors")
    ours = vitkit.from_pretrained(tmp_path / "hf")
    assert ours.config.masks and ours.config.num_heads == 8
    assert_equal_outputs(ours, timm_segmentation)
    images, mask = padded_batch()
    predicted = ours.float().predict(images, mask)  # what inference and export read: the masks beside the boxes
    assert predicted["pred_masks"].shape == (2, 10, *ours(images, mask)["pred_masks"].shape[-2:])


def test_in_memory_names_of_transformers_5_load(timm_segmentation):
    state = timm_segmentation.state_dict()
    assert "mask_head.fpn_stages.2.refine.conv.weight" in state and "bbox_attention.q_proj.weight" in state
    ours = vitkit.create_model(
        "detr_tiny", masks=True, backbone_width=64, hidden_dim=64, num_heads=8, dim_feedforward=128, num_queries=10,
        num_classes=5,
    ).double()  # fmt: skip
    report = vitkit.load_weights(ours, state)
    assert report.format == "hf" and report.loaded == len(ours.state_dict())
    assert torch.equal(ours.mask_head.lay5.weight, state["mask_head.fpn_stages.2.refine.conv.weight"])
    assert torch.equal(ours.mask_head.adapter1.weight, state["mask_head.fpn_stages.0.fpn_adapter.weight"])
    assert_equal_outputs(ours, timm_segmentation)


def test_transformers_own_resnet_and_export_back(tmp_path):
    theirs = hf_segmentation(use_timm_backbone=False, backbone_config={**NATIVE, "out_features": ["stage1",
                             "stage2", "stage3", "stage4"], "model_type": "resnet"})  # fmt: skip
    theirs.save_pretrained(tmp_path / "hf")
    ours = vitkit.from_pretrained(tmp_path / "hf")
    assert (ours.config.backbone_width, ours.config.backbone_depths) == (16, (1, 2, 1, 1))
    assert_equal_outputs(ours, theirs)
    vitkit.export_weights(ours, tmp_path / "back", format="hf")
    written = load_file(tmp_path / "back" / "model.safetensors")
    assert set(written) == set(load_file(tmp_path / "hf" / "model.safetensors"))  # the same files' names
    back = transformers.DetrForSegmentation.from_pretrained(tmp_path / "back", attn_implementation="eager")
    assert_equal_outputs(ours, back.double().eval())


def test_the_original_panoptic_layout_reads_and_writes_back(timm_segmentation, tmp_path):
    timm_segmentation.save_pretrained(tmp_path / "hf")
    ours = vitkit.from_pretrained(tmp_path / "hf")
    path = vitkit.export_weights(ours, tmp_path / "detr-panoptic.pth", format="detr")
    written = torch.load(path, weights_only=True)["model"]  # {"model": state_dict}, as its main.py writes
    detector = {k for k in written if k.split(".")[0] not in ("bbox_attention", "mask_head")}
    assert detector and all(k.startswith("detr.") for k in detector)  # `DETRsegm.detr`
    assert {"detr.backbone.0.body.layer1.0.conv1.weight", "detr.transformer.decoder.norm.weight"} <= detector
    assert {"bbox_attention.q_linear.weight", "bbox_attention.k_linear.bias", "mask_head.lay1.weight",
            "mask_head.gn5.bias", "mask_head.adapter3.weight", "mask_head.out_lay.weight"} <= set(written)  # fmt: skip
    again = vitkit.create_model(
        "detr_tiny", masks=True, backbone_width=64, hidden_dim=64, num_heads=8, dim_feedforward=128, num_queries=10,
        num_classes=5,
    )  # fmt: skip
    report = vitkit.load_weights(again, path)
    assert report.format == "detr" and report.loaded == len(again.state_dict())
    assert_equal_outputs(again, timm_segmentation)


def test_the_attention_map_is_the_papers_formula():
    """softmax over every head's positions of one query together, of (W_q q) . (W_k m) / sqrt(D / M), written out
    with the map as the paper's code holds it (B, D, h, w) and its key projection a 1x1 convolution."""
    torch.manual_seed(0)
    layer = ObjectAttentionMap(32, 4).double()
    queries, memory = torch.randn(2, 5, 32, dtype=torch.float64), torch.randn(2, 32, 3, 4, dtype=torch.float64)
    real = torch.ones(2, 3, 4, dtype=torch.bool)
    real[1, :, 3] = False  # the second image's last column pads it
    q = layer.q_linear(queries).view(2, 5, 4, 8)
    k = torch.nn.functional.conv2d(memory, layer.k_linear.weight[..., None, None], layer.k_linear.bias)
    logits = torch.einsum("bqnc,bnchw->bqnhw", q / math.sqrt(8), k.view(2, 4, 8, 3, 4))
    logits = logits.masked_fill(~real[:, None, None], float("-inf"))
    expected = logits.flatten(2).softmax(-1).view(logits.shape)
    got = layer(queries, memory.flatten(2).transpose(1, 2), (3, 4), real.flatten(1))
    torch.testing.assert_close(got, expected, atol=1e-12, rtol=0)
    assert got[1, :, :, :, 3].abs().max() == 0  # padding takes no weight
    torch.testing.assert_close(got.sum(dim=(2, 3, 4)), torch.ones(2, 5, dtype=torch.float64))  # one softmax a query


def test_the_mask_head_needs_a_resnet_and_widths_that_split_into_groups():
    with pytest.raises(ValueError, match="widths D \\+ M, D / 2, .., D / 16 = \\(68, 32, 16, 8, 4\\)"):
        vitkit.create_model("detr_tiny", masks=True, hidden_dim=64, num_heads=4)
    with pytest.raises(ValueError, match="mask head reads a ResNet's layer1..layer3 maps"):
        vitkit.create_model("detr_tiny", masks=True, backbone="vit_tiny_patch16_224", num_heads=8, hidden_dim=128)
