"""transformers' DINOv2 (with and without registers), CLIP and SigLIP image towers <-> vitkit's ViT: `from_pretrained`
on their directories gives transformers' outputs in float64, and `export_weights(format="hf")` writes directories
transformers reads back to the same outputs. Every weight is moved off its initial value (LayerScale at 1.0, zero
registers and biases, unit norms would hide a wrong order, a missing position row or a swapped norm)."""

import json

import pytest
import torch
import transformers

import vitkit
from vitkit.weights import from_pretrained, load_report

SMALL = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, image_size=28, patch_size=7)


def _moved(model, seed=0):
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.2 * torch.randn(p.shape, generator=generator, dtype=p.dtype))
    return model.double().eval()


def _dinov2(registers):
    if registers:
        config = transformers.Dinov2WithRegistersConfig(**SMALL, mlp_ratio=2, num_register_tokens=3)
        return transformers.Dinov2WithRegistersModel(config)
    return transformers.Dinov2Model(transformers.Dinov2Config(**SMALL, mlp_ratio=2))


def _clip(act="quick_gelu"):
    return transformers.CLIPVisionModel(transformers.CLIPVisionConfig(**SMALL, intermediate_size=48, hidden_act=act))


def _siglip(use_head=True):
    config = transformers.SiglipVisionConfig(**SMALL, intermediate_size=48, vision_use_head=use_head)
    return transformers.SiglipVisionModel(config)


CASES = {
    "dinov2": lambda: _dinov2(False),
    "dinov2_registers": lambda: _dinov2(True),
    "clip_quick_gelu": _clip,
    "clip_gelu": lambda: _clip("gelu"),
    "siglip": _siglip,
    "siglip_no_head": lambda: _siglip(False),
}


def _theirs(model, x):
    """(image embedding, tokens as vitkit's forward_features gives them) of a transformers tower."""
    with torch.no_grad():
        out = model(pixel_values=x)
    tokens = out.last_hidden_state
    if isinstance(model, transformers.CLIPVisionModel):  # CLIP's last_hidden_state precedes its final LayerNorm
        tokens = getattr(model, "vision_model", model).post_layernorm(tokens)
    pooled = out.pooler_output if out.pooler_output is not None else tokens.mean(dim=1)
    return pooled, tokens


def _assert_equal(ours, theirs, x):
    pooled, tokens = _theirs(theirs, x)
    with torch.no_grad():
        torch.testing.assert_close(ours.forward_features(x), tokens, atol=1e-6, rtol=1e-6)
        torch.testing.assert_close(ours(x), pooled, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("case", sorted(CASES))
def test_hf_backbone_loads_and_writes_back(case, tmp_path):
    torch.manual_seed(0)
    theirs = _moved(CASES[case]())
    theirs.save_pretrained(tmp_path / "theirs")
    ours = vitkit.from_pretrained(tmp_path / "theirs").double()
    assert ours.config.num_classes == 0
    x = torch.randn(2, 3, 28, 28, dtype=torch.float64)
    _assert_equal(ours, theirs, x)

    vitkit.export_weights(ours, tmp_path / "back", format="hf")
    back = type(theirs).from_pretrained(tmp_path / "back").double().eval()
    _assert_equal(ours, back, x)
    assert type(theirs).__name__ in json.loads((tmp_path / "back" / "config.json").read_text())["architectures"]


@pytest.mark.parametrize("registers", [False, True])
def test_dinov2_at_other_sizes_resamples_its_table_as_transformers(registers, tmp_path):
    """Dinov2Model resamples plainly (bicubic), Dinov2WithRegistersModel with antialiasing: vitkit's reader says
    which (`pos_antialias`), so other image sizes give transformers' outputs too."""
    torch.manual_seed(0)
    theirs = _moved(_dinov2(registers))
    theirs.save_pretrained(tmp_path)
    ours = vitkit.from_pretrained(tmp_path).double()
    for size in [(42, 42), (14, 35)]:
        _assert_equal(ours, theirs, torch.randn(2, 3, *size, dtype=torch.float64))


def _clip_model():
    vision = dict(SMALL, intermediate_size=48)
    text = dict(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32, vocab_size=50)
    return transformers.CLIPModel(transformers.CLIPConfig(vision_config=vision, text_config=text, projection_dim=8))


def _siglip_model():
    vision = dict(SMALL, intermediate_size=48)
    text = dict(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32, vocab_size=50)
    return transformers.SiglipModel(transformers.SiglipConfig(vision_config=vision, text_config=text))


@pytest.mark.parametrize("make", [_clip_model, _siglip_model], ids=["clip", "siglip"])
def test_image_text_model_directory_reads_its_image_tower(make, tmp_path):
    """A CLIPModel / SiglipModel directory: the image tower is read, the text tower and the projections are
    reported as dropped; the embedding is the tower's pooler_output."""
    torch.manual_seed(0)
    theirs = _moved(make())
    theirs.save_pretrained(tmp_path)
    ours = from_pretrained(tmp_path)
    report = load_report(ours)
    ours = ours.double()
    assert any(k.startswith("text_model.") for k in report.dropped)
    x = torch.randn(2, 3, 28, 28, dtype=torch.float64)
    _assert_equal(ours, theirs.vision_model, x)


def test_timm_names_load_for_the_new_variants():
    """The registered CLIP and SigLIP variants hold timm's names: a timm state dict loads strictly and gives the
    same outputs (float64, weights moved)."""
    timm = pytest.importorskip("timm")
    for name in ("vit_base_patch16_clip_quickgelu_224", "vit_base_patch16_siglip_224"):
        small = dict(img_size=32, depth=2, embed_dim=48, num_heads=4, num_classes=5)
        reference = _moved(timm.create_model(name, **small))
        ours = vitkit.create_model(name, **small).double().eval()
        ours.load_state_dict(reference.state_dict(), strict=True)
        x = torch.randn(2, 3, 32, 32, dtype=torch.float64)
        with torch.no_grad():
            torch.testing.assert_close(ours(x), reference(x), atol=1e-6, rtol=1e-6)


def test_classifier_heads_vitkit_cannot_compute_are_refused(tmp_path):
    torch.manual_seed(0)
    config = transformers.Dinov2Config(**SMALL, mlp_ratio=2, num_labels=3)
    transformers.Dinov2ForImageClassification(config).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="Dinov2ForImageClassification's head reads the class token"):
        vitkit.from_pretrained(tmp_path)


def test_export_names_the_fields_transformers_cannot_express(tmp_path):
    model = vitkit.create_model("vit_base_patch16_clip_224", depth=1, img_size=32, embed_dim=32, num_heads=4)
    with pytest.raises(ValueError, match=r"CLIPVisionModel needs num_classes=0 \(this model: 1000\)"):
        vitkit.export_weights(model, tmp_path, format="hf")
