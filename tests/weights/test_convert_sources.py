"""Weights from timm, torchvision and transformers load into vitkit with equal logits, and export back.

Each source model is built with random weights and a tiny config, saved the way its users save it
(torch.save of the state dict, safetensors, transformers' save_pretrained), loaded with vitkit and compared
in fp32 eval mode; the exported weights are loaded back into the source library and compared again.
"""

import pytest
import timm
import torch
import transformers
from safetensors.torch import load_file, save_file
from torchvision.models.vision_transformer import VisionTransformer

import vitkit

TINY = dict(img_size=32, patch_size=4, embed_dim=32, depth=2, num_heads=4, mlp_ratio=2.0, num_classes=5)
HF_TINY = dict(
    hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, image_size=32, patch_size=4
)
TV_TINY = dict(image_size=32, patch_size=4, num_layers=2, num_heads=4, hidden_dim=32, mlp_dim=64, num_classes=5)


def images(n: int = 2, size: int = 32) -> torch.Tensor:
    return torch.randn(n, 3, size, size, generator=torch.Generator().manual_seed(1))


def assert_same(a: torch.Tensor, b: torch.Tensor) -> None:
    torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", ["vit_tiny_patch16_224", "deit_tiny_patch16_224", "deit_tiny_distilled_patch16_224"])
@pytest.mark.parametrize("suffix", [".pth", ".safetensors"])
def test_timm_round_trip(tmp_path, name, suffix):
    torch.manual_seed(0)
    theirs = timm.create_model(name, pretrained=False, **TINY).eval()
    path = tmp_path / f"timm{suffix}"
    if suffix == ".pth":
        torch.save(theirs.state_dict(), path)
    else:
        save_file(theirs.state_dict(), path)
    ours = vitkit.create_model(name, **TINY).eval()
    report = vitkit.load_weights(ours, path)
    assert report.format == "vitkit" and report.loaded == len(theirs.state_dict())
    x = images()
    with torch.no_grad():
        assert_same(ours(x), theirs(x))

    back = timm.create_model(name, pretrained=False, **TINY).eval()
    back.load_state_dict(torch.load(vitkit.export_weights(ours, tmp_path / f"out{suffix}", format="timm")))
    with torch.no_grad():
        assert_same(back(x), theirs(x))


def test_torchvision_round_trip(tmp_path):
    torch.manual_seed(0)
    theirs = VisionTransformer(**TV_TINY).eval()
    torch.save(theirs.state_dict(), tmp_path / "vit.pth")
    ours = vitkit.create_model("vit_base_patch16_224", **TINY).eval()
    report = vitkit.load_weights(ours, tmp_path / "vit.pth")
    assert report.format == "torchvision" and report.loaded == len(theirs.state_dict()) == len(ours.state_dict())
    x = images()
    with torch.no_grad():
        assert_same(ours(x), theirs(x))

    exported = torch.load(vitkit.export_weights(ours, tmp_path / "back.pth", format="torchvision"))
    assert set(exported) == set(theirs.state_dict())
    back = VisionTransformer(**TV_TINY).eval()
    back.load_state_dict(exported)
    with torch.no_grad():
        assert_same(back(x), theirs(x))


def test_torchvision_names_before_mlp_block_v2_load():
    torch.manual_seed(0)
    theirs = VisionTransformer(**TV_TINY).eval()
    old = {
        k.replace("mlp.0.", "mlp.linear_1.").replace("mlp.3.", "mlp.linear_2."): v
        for k, v in theirs.state_dict().items()
    }
    assert any("linear_1" in k for k in old)
    ours = vitkit.create_model("vit_base_patch16_224", **TINY).eval()
    vitkit.load_weights(ours, old, format="torchvision")
    with torch.no_grad():
        assert_same(ours(images()), theirs(images()))


HF_CLASSIFIERS = [
    (transformers.ViTConfig, transformers.ViTForImageClassification, False),
    (transformers.DeiTConfig, transformers.DeiTForImageClassificationWithTeacher, True),
]


@pytest.mark.parametrize("config_cls, model_cls, distilled", HF_CLASSIFIERS, ids=["vit", "deit-distilled"])
def test_hf_classifier_round_trip(tmp_path, config_cls, model_cls, distilled):
    torch.manual_seed(0)
    theirs = model_cls(config_cls(**HF_TINY, num_labels=5)).eval()
    theirs.save_pretrained(tmp_path / "hf")
    ours = vitkit.from_pretrained(tmp_path / "hf")
    c = ours.config
    assert (c.embed_dim, c.depth, c.num_heads, c.mlp_ratio, c.num_classes) == (32, 2, 4, 2.0, 5)
    assert (c.img_size, c.patch_size, c.layer_norm_eps, c.qkv_bias, c.distilled) == (32, 4, 1e-12, True, distilled)
    x = images()
    with torch.no_grad():
        expected = theirs(pixel_values=x).logits
        assert_same(ours(x), expected)

    vitkit.export_weights(ours, tmp_path / "back", format="hf")
    back = model_cls.from_pretrained(tmp_path / "back").eval()
    with torch.no_grad():
        assert_same(back(pixel_values=x).logits, expected)
    # The file uses the names transformers writes itself, so older transformers read it too.
    assert set(load_file(tmp_path / "back" / "model.safetensors")) == set(
        load_file(tmp_path / "hf" / "model.safetensors")
    )


@pytest.mark.parametrize("config_cls, model_cls, distilled", HF_CLASSIFIERS, ids=["vit", "deit-distilled"])
def test_hf_in_memory_names_load(config_cls, model_cls, distilled):
    torch.manual_seed(0)
    theirs = model_cls(config_cls(**HF_TINY, num_labels=5)).eval()
    assert any(".q_proj." in k for k in theirs.state_dict())  # transformers 5 names, not the on-disk ones
    ours = vitkit.create_model("vit_base_patch16_224", **TINY, distilled=distilled, layer_norm_eps=1e-12).eval()
    report = vitkit.load_weights(ours, theirs.state_dict())
    assert report.format == "hf" and report.loaded == len(ours.state_dict())
    x = images()
    with torch.no_grad():
        assert_same(ours(x), theirs(pixel_values=x).logits)


@pytest.mark.parametrize(
    "config_cls, model_cls",
    [(transformers.ViTConfig, transformers.ViTModel), (transformers.DeiTConfig, transformers.DeiTModel)],
)
def test_hf_base_model_has_no_head_and_drops_the_pooler(tmp_path, config_cls, model_cls):
    torch.manual_seed(0)
    theirs = model_cls(config_cls(**HF_TINY)).eval()
    theirs.save_pretrained(tmp_path / "hf")
    ours = vitkit.from_pretrained(tmp_path / "hf")
    report = vitkit.weights.load_report(ours)
    assert ours.config.num_classes == 0 and sorted(report.dropped) == ["pooler.dense.bias", "pooler.dense.weight"]
    x = images()
    with torch.no_grad():
        expected = theirs(pixel_values=x).last_hidden_state
        assert_same(ours.forward_features(x), expected)

    vitkit.export_weights(ours, tmp_path / "back", format="hf")
    back = model_cls.from_pretrained(tmp_path / "back").eval()  # the pooler is newly initialised
    with torch.no_grad():
        assert_same(back(pixel_values=x).last_hidden_state, expected)


def test_hf_config_fields_reach_the_vitkit_model(tmp_path):
    torch.manual_seed(0)
    config = transformers.ViTConfig(
        **{**HF_TINY, "image_size": 48, "intermediate_size": 96}, qkv_bias=False, layer_norm_eps=1e-6, num_labels=3
    )
    theirs = transformers.ViTForImageClassification(config).eval()
    theirs.save_pretrained(tmp_path / "hf")
    ours = vitkit.from_pretrained(tmp_path / "hf", attn_backend="math")
    c = ours.config
    assert (c.img_size, c.mlp_ratio, c.qkv_bias, c.layer_norm_eps, c.num_classes) == (48, 3.0, False, 1e-6, 3)
    assert ours.blocks[0].attn.qkv.bias is None and ours.blocks[0].attn.backend == "math"
    x = images(size=48)
    with torch.no_grad():
        assert_same(ours(x), theirs(pixel_values=x).logits)


def test_hf_pytorch_model_bin_directory(tmp_path):
    torch.manual_seed(0)
    theirs = transformers.ViTForImageClassification(transformers.ViTConfig(**HF_TINY, num_labels=5)).eval()
    theirs.save_pretrained(tmp_path)
    torch.save(load_file(tmp_path / "model.safetensors"), tmp_path / "pytorch_model.bin")
    (tmp_path / "model.safetensors").unlink()
    ours = vitkit.from_pretrained(tmp_path)
    with torch.no_grad():
        assert_same(ours(images()), theirs(pixel_values=images()).logits)


def test_export_refuses_what_the_target_cannot_express(tmp_path):
    distilled = vitkit.create_model("deit_tiny_distilled_patch16_224", **TINY)
    with pytest.raises(ValueError, match="torchvision's VisionTransformer needs a class token read by one head"):
        vitkit.export_weights(distilled, tmp_path / "x.pth", format="torchvision")
    hf_eps = vitkit.create_model("vit_tiny_patch16_224", **TINY, layer_norm_eps=1e-12)
    with pytest.raises(ValueError, match=r"LayerNorm eps 1e-6 \(this model: 1e-12\)"):
        vitkit.export_weights(hf_eps, tmp_path / "x.pth", format="torchvision")
    layerscale = vitkit.create_model("vit_tiny_patch16_224", **TINY, init_values=0.1)
    # LayerScale is DINOv2's, whose transformers class has no classifier vitkit's head equals
    with pytest.raises(ValueError, match=r"Dinov2Model needs num_classes=0 \(this model: \d+\)"):
        vitkit.export_weights(layerscale, tmp_path / "hf", format="hf")
    with pytest.raises(ValueError, match=r"x.txt: expected a .safetensors, .pdparams or .pth"):
        vitkit.export_weights(hf_eps, tmp_path / "x.txt", format="timm")
    assert not any(tmp_path.iterdir())
