"""DETR: the paper's variants and parameter count, the output dict, padding masks, attention maps, input checks (its
position encoding and frozen BatchNorm are tested in tests/layers). Equality with transformers' DETR is in
tests/weights/test_convert_detr.py."""


import pytest
import torch

import vitkit
from vitkit.detection import pad_images
from vitkit.layers import set_attention_backend
from vitkit.models.registry import model_entry

# detr_tiny's layout at a size that runs in milliseconds: ResNet-18 blocks 16 wide, D = 32, 2 + 2 layers.
TINY = dict(backbone_width=16, hidden_dim=32, num_heads=4, dim_feedforward=64, num_queries=7, num_classes=5)


def tiny(**overrides) -> torch.nn.Module:
    torch.manual_seed(0)
    return vitkit.create_model("detr_tiny", **{**TINY, **overrides}).eval()


def padded_batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return pad_images([torch.randn(3, 96, 128, generator=g), torch.randn(3, 64, 70, generator=g)])


def test_variants_cite_the_paper():
    assert vitkit.list_models("detr*") == [
        "detr_digits",
        "detr_resnet101",
        "detr_resnet101_dc5",
        "detr_resnet50",
        "detr_resnet50_dc5",
        "detr_resnet50_panoptic",
        "detr_tiny",
    ]
    for name in vitkit.list_models("detr*"):
        assert "arXiv:2005.12872" in model_entry(name).paper


def test_detr_resnet50_has_the_papers_trainable_parameters():
    with torch.device("meta"):
        model = vitkit.create_model("detr_resnet50")
    trainable = {n: p.numel() for n, p in model.named_parameters() if p.requires_grad}
    assert sum(trainable.values()) == 41_302_368  # DETR's training log, num_classes=91
    frozen = [n for n, p in model.named_parameters() if not p.requires_grad]
    assert frozen and all(n.startswith(("backbone.conv1.", "backbone.layer1.")) for n in frozen)
    assert not any(".bn" in n or "downsample.1" in n for n in trainable)  # frozen norms hold buffers only
    assert sum(p.numel() for p in vitkit.create_model("detr_tiny").parameters() if not p.requires_grad) == 0


def test_dc5_halves_the_backbone_stride():
    for name, stride in (("detr_resnet50", 32), ("detr_resnet50_dc5", 16)):
        with torch.device("meta"):
            model = vitkit.create_model(name)
            assert model.backbone(torch.empty(1, 3, 128, 192))[-1].shape == (1, 2048, 128 // stride, 192 // stride)
    with torch.device("meta"):
        layer4 = vitkit.create_model("detr_resnet50_dc5", backbone_depths=(1, 1, 1, 2)).backbone.layer4
    # the first block keeps the previous dilation (and does not stride), the next ones dilate by 2
    assert (layer4[0].conv2.stride, layer4[0].conv2.dilation, layer4[1].conv2.dilation) == ((1, 1), (1, 1), (2, 2))


def test_forward_returns_the_prediction_dict():
    model = tiny()
    images, mask = padded_batch()
    with torch.no_grad():
        out = model(images, mask)
    assert set(out) == {"pred_logits", "pred_boxes", "aux_outputs"}
    assert out["pred_logits"].shape == (2, 7, 6) and out["pred_boxes"].shape == (2, 7, 4)
    assert out["pred_boxes"].min() >= 0 and out["pred_boxes"].max() <= 1
    assert len(out["aux_outputs"]) == 1 and set(out["aux_outputs"][0]) == {"pred_logits", "pred_boxes"}
    # the auxiliary predictions are the heads on the earlier layer's normalised output
    with torch.no_grad():
        decoding = model.forward_features(images, mask)
        states = decoding.states
        assert states.shape == (2, 2, 7, 32) and decoding.encoded is None  # no mask head
        torch.testing.assert_close(out["aux_outputs"][0]["pred_logits"], model.class_embed(states[0]))
        torch.testing.assert_close(model.forward_head(decoding, pre_logits=True), states[-1])

    no_aux = tiny(aux_loss=False)
    with torch.no_grad():
        plain = no_aux(images, mask)
    assert plain["aux_outputs"] == []
    torch.testing.assert_close(plain["pred_logits"], out["pred_logits"])


def test_pixel_mask_conventions():
    model = tiny()
    images, mask = padded_batch()
    with torch.no_grad():
        default = model(images)
        all_real = model(images, torch.ones(images.shape[0], *images.shape[-2:], dtype=torch.bool))
        padded = model(images, mask)
        as_ints = model(images, mask.long())  # transformers' convention: 1 real, 0 padding
        alone = model(images[:1, :, :96, :128])  # the first image fills the padded size
    torch.testing.assert_close(all_real, default)
    torch.testing.assert_close(as_ints, padded)
    torch.testing.assert_close(padded["pred_logits"][:1], alone["pred_logits"])
    assert not torch.allclose(padded["pred_logits"][1], default["pred_logits"][1])  # the mask reaches the model


def test_backends_agree_with_a_padding_mask():
    model = tiny()
    images, mask = padded_batch()
    with torch.no_grad():
        fused = model(images, mask)
        reference = set_attention_backend(model, "math")(images, mask)
    torch.testing.assert_close(fused, reference, atol=1e-5, rtol=1e-5)


def test_cross_attention_maps_are_per_object_and_ignore_padding():
    model = tiny()
    images, mask = padded_batch()  # feature maps 3 x 4; the second image's real part 2 x 3
    names = ["decoder.layers.0.cross_attn", "decoder.layers.1.cross_attn"]
    with torch.no_grad(), vitkit.capture_attention(model, names) as maps:
        model(images, mask)
    assert list(maps) == names
    for attn in maps.values():
        assert attn.shape == (2, 4, 7, 3 * 4)  # (B, heads, Q, H * W)
        torch.testing.assert_close(attn.sum(-1), torch.ones(2, 4, 7))
        padding = torch.ones(3, 4, dtype=torch.bool)
        padding[:2, :3] = False
        assert attn[1][..., padding.flatten()].eq(0).all() and attn[0].gt(0).all()
    with torch.no_grad(), vitkit.capture_attention(model) as every:
        model(images, mask)
    assert {name.rsplit(".", 1)[-1] for name in every} == {"self_attn", "cross_attn"}
    assert model.token_grid((96, 128)) is None


def test_frozen_stem_gets_no_gradient_and_training_reaches_the_rest():
    model = vitkit.create_model("detr_tiny", **TINY, train_stem=False)
    images, mask = padded_batch()
    out = model(images, mask)
    (out["pred_logits"].logsumexp(-1).mean() + out["pred_boxes"].mean()).backward()
    assert model.backbone.conv1.weight.grad is None and model.backbone.layer1[0].conv1.weight.grad is None
    assert model.backbone.layer2[0].conv1.weight.grad.abs().sum() > 0
    assert model.query_embed.weight.grad.abs().sum() > 0


def test_input_errors():
    model = tiny()
    with pytest.raises(ValueError, match=r"expects images \(B, 3, H, W\), got shape \(3, 64, 64\)"):
        model(torch.rand(3, 64, 64))
    with pytest.raises(ValueError, match="floating-point images, got dtype torch.uint8"):
        model(torch.zeros(1, 3, 64, 64, dtype=torch.uint8))
    with pytest.raises(ValueError, match=r"pixel_mask must be \(B, H, W\) = \(1, 64, 64\) like the images, got"):
        model(torch.rand(1, 3, 64, 64), torch.ones(1, 64, 63))
    fixed = tiny(dynamic_img_size=False, img_size=64)
    with pytest.raises(ValueError, match="expected images of size 64x64, got 64x96"):
        fixed(torch.rand(1, 3, 64, 96))
    for overrides, message in (
        ({"backbone_block": "wide"}, "backbone_block must be one of"),
        ({"backbone_depths": (2, 2, 2)}, "backbone_depths needs 4 stages"),
        ({"hidden_dim": 30}, "hidden_dim 30 is not divisible by num_heads 4"),
        ({"num_classes": 0}, "num_classes must be > 0"),
        ({"attn_backend": "fast"}, "attention backend must be one of"),
    ):
        with pytest.raises(ValueError, match=message):
            vitkit.create_model("detr_tiny", **overrides)


def test_costs_cover_backbone_transformer_and_heads():
    report = vitkit.profile("detr_resnet50", img_size=(800, 1216))
    modules = {op.module.split(".")[0] for op in report.ops}
    assert modules == {
        "",  # the model's own: the images laid out channels-last, the mask, the map flattened to tokens
        "backbone",
        "input_proj",
        "position_embedding",
        "encoder",
        "decoder",
        "class_embed",
        "bbox_embed",
    }
    assert 80e9 < report.macs < 100e9  # the paper: 86 GMACs averaged over COCO val at min side 800
    # other sizes run without rebuilding: DETR takes any image size
    assert vitkit.profile("detr_resnet50", img_size=(800, 1333)).macs > report.macs


def test_save_and_load_round_trip(tmp_path):
    model = tiny()
    images, mask = padded_batch()
    vitkit.save_pretrained(model, tmp_path / "detr")
    loaded = vitkit.from_pretrained(tmp_path / "detr")
    assert loaded.config == model.config
    with torch.no_grad():
        torch.testing.assert_close(loaded(images, mask), model(images, mask))


def convolution_weights(model: torch.nn.Module) -> list[torch.Tensor]:
    return [m.weight for m in model.backbone.modules() if isinstance(m, torch.nn.Conv2d) and m.kernel_size != (1, 1)]


@pytest.mark.parametrize("name", ["detr_tiny", "deformable_detr_small"])
def test_resnet_backbone_weights_are_channels_last_and_saved_plainly(tmp_path, name):
    """The ResNet backbone's convolution weights are channels-last, as the images it reads (no copy of each weight at
    every call, nor of its gradient back), after loading saved weights too; the saved file holds them in the plain
    order (safetensors takes no other) and the loaded model computes what the saved one did."""
    torch.manual_seed(0)
    model = vitkit.create_model(name).eval()
    weights = convolution_weights(model)
    assert weights and all(w.is_contiguous(memory_format=torch.channels_last) for w in weights)
    assert not any(w.is_contiguous() for w in weights)  # 3x3 kernels: the two orders differ
    vitkit.save_pretrained(model, tmp_path / "saved")
    loaded = vitkit.from_pretrained(tmp_path / "saved").eval()
    assert all(w.is_contiguous(memory_format=torch.channels_last) for w in convolution_weights(loaded))
    images = torch.randn(1, 3, 96, 128)
    with torch.no_grad():
        expected, got = model(images), loaded(images)
    torch.testing.assert_close(got["pred_boxes"], expected["pred_boxes"])
