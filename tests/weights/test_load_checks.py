"""Loading refuses what would be silently wrong: NaN / Inf weights, a config.json missing a field or of an unknown
format version, a checkpoint of another size (named by the config fields it fixes, with the models that fit)."""

import json
import re

import pytest
import torch
from safetensors.torch import save_file

import vitkit
from vitkit.cli.messages import CONVERT, cli_message
from vitkit.weights import CheckpointMismatch
from vitkit.weights.io import FORMAT_VERSION

TINY = dict(img_size=32, patch_size=4, embed_dim=32, depth=2, num_heads=4, mlp_ratio=2.0, num_classes=5)


def tiny_vit(**overrides) -> torch.nn.Module:
    return vitkit.create_model("vit_base_patch16_224", **{**TINY, **overrides})


def test_nan_and_inf_weights_are_refused_with_their_names(tmp_path):
    state = tiny_vit().state_dict()
    state["blocks.0.attn.qkv.weight"][0, :3] = float("nan")
    state["norm.bias"][1] = float("inf")
    path = tmp_path / "diverged.safetensors"
    save_file(state, path)
    message = (
        f"{path} holds NaN or Inf values in 2 of {len(state)} tensors: blocks.0.attn.qkv.weight (3 NaN of 3072), "
        "norm.bias (1 Inf of 32)"
    )
    with pytest.raises(ValueError, match=re.escape(message)):
        vitkit.load_weights(tiny_vit(), path)
    with pytest.raises(ValueError, match="holds NaN or Inf values"):
        vitkit.load_weights(tiny_vit(), path, strict=False)  # not loaded as "what fits" either

    # Through a model directory, as predict and eval load it.
    vitkit.save_pretrained(tiny_vit(), tmp_path / "model")
    save_file(state, tmp_path / "model" / "model.safetensors")
    with pytest.raises(ValueError, match=r"model.safetensors holds NaN or Inf values in 2 of"):
        vitkit.from_pretrained(tmp_path / "model")


def test_nan_in_a_skipped_head_does_not_matter():
    state = tiny_vit().state_dict()
    state["head.weight"][:] = float("nan")
    model = tiny_vit(num_classes=3)
    assert vitkit.load_weights(model, state, reset_head=True).head_reset
    assert torch.isfinite(model.head.weight).all()


def test_nan_names_are_vitkits_for_other_layouts():
    from torchvision.models.vision_transformer import VisionTransformer

    theirs = VisionTransformer(32, 4, num_layers=2, num_heads=4, hidden_dim=32, mlp_dim=64, num_classes=5)
    state = theirs.state_dict()
    state["encoder.ln.weight"][0] = float("nan")
    with pytest.raises(ValueError, match=re.escape("in 1 of 32 tensors (named as in vitkit): norm.weight (1 NaN")):
        vitkit.load_weights(tiny_vit(), state)


def _saved(tmp_path, **overrides):
    vitkit.save_pretrained(tiny_vit(**overrides), tmp_path)
    return json.loads((tmp_path / "config.json").read_text())


def test_config_missing_a_field_names_it(tmp_path):
    config = _saved(tmp_path)
    assert config["format_version"] == FORMAT_VERSION == 7
    del config["config"]["embed_dim"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"config.json: config lacks field\(s\) \['embed_dim'\] of ViTConfig"):
        vitkit.from_pretrained(tmp_path)
    # A field given as an override is not missing.
    assert vitkit.from_pretrained(tmp_path, embed_dim=32).config.embed_dim == 32


@pytest.mark.parametrize(
    "version,message",
    [
        (99, r"format_version 99 is not one this vitkit reads \(5, 6, 7\); it was written by a newer vitkit"),
        (4, r"format_version 4 is not one this vitkit reads \(5, 6, 7\)$"),
        ("5", r"format_version '5' is not one this vitkit reads \(5, 6, 7\)$"),
        (None, r"has no 'format_version'; this vitkit reads format_version 7"),
    ],
)
def test_unknown_format_version_is_refused(tmp_path, version, message):
    config = _saved(tmp_path)
    if version is None:
        del config["format_version"]
    else:
        config["format_version"] = version
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=message):
        vitkit.from_pretrained(tmp_path)


def test_checkpoint_of_another_width_names_the_width_and_the_models_that_fit(tmp_path):
    path = tmp_path / "tiny.pth"
    torch.save(vitkit.create_model("vit_tiny_patch16_224", img_size=32, num_classes=5).state_dict(), path)
    small = vitkit.create_model("vit_small_patch16_224", img_size=32, num_classes=5)
    with pytest.raises(CheckpointMismatch) as caught:
        vitkit.load_weights(small, path)
    err = caught.value
    # Not "a classifier for 5 classes, the model 5": the head is as wide as the body.
    # The registered variant first; the fields are every one that makes the model ViT-Tiny (num_heads too, which
    # no tensor's shape shows), never embed_dim alone, which would make a 6-head ViT of ViT-Tiny's width.
    assert str(err) == (
        f"{path} is a ViT with embed_dim 192, the model has 384: use a registered model of that size: "
        "deit_tiny_patch16_224, vit_tiny_patch16_224, or build the model with embed_dim=192, num_heads=3"
    )
    assert cli_message(err, CONVERT).endswith(
        "the model has 384: pass --model NAME with a registered model of that size: deit_tiny_patch16_224, "
        "vit_tiny_patch16_224, or pass --model-arg embed_dim=192 --model-arg num_heads=3"
    )
    assert isinstance(err, ValueError) and err.fields == {"embed_dim": 192, "num_heads": 3}


def test_several_fields_and_the_classifier_in_cli_words():
    deeper = tiny_vit(depth=3, patch_size=8).state_dict()
    with pytest.raises(CheckpointMismatch) as caught:
        vitkit.load_weights(tiny_vit(), deeper)
    assert caught.value.problem.endswith("is a ViT with patch_size 8, depth 3; the model has patch_size 4, depth 2")
    assert "pass --model-arg patch_size=8 --model-arg depth=3" in cli_message(caught.value, CONVERT)

    with pytest.raises(CheckpointMismatch) as caught:
        vitkit.load_weights(tiny_vit(num_classes=7), tiny_vit().state_dict())
    assert str(caught.value) == (
        "state dict has a classifier for 5 classes, the model 7: build the model with num_classes=5, or pass "
        "reset_head=True to keep the model's freshly initialised head"
    )
    assert cli_message(caught.value, CONVERT) == (
        "state dict has a classifier for 5 classes, the model 7: pass --model-arg num_classes=5, or pass "
        "--reset-head to keep the model's freshly initialised head"
    )


def test_checkpoint_of_another_family_suggests_its_models():
    swin = vitkit.create_model("swin_tiny_patch4_window7_224", img_size=64).state_dict()
    with pytest.raises(CheckpointMismatch, match="it looks like a vitkit swin checkpoint") as caught:
        vitkit.load_weights(tiny_vit(), swin)
    assert caught.value.models == ["swin_tiny_patch4_window7_224"]
    assert cli_message(caught.value, CONVERT).endswith(
        ": pass --model NAME with a registered model of that size: swin_tiny_patch4_window7_224"
    )


@pytest.mark.parametrize(("name", "version"), [("deformable_detr_digits", 5), ("detr_digits", 6)])
def test_earlier_detectors_load_with_the_backbone_fields_added_since(tmp_path, name, version):
    """format_version 6 added Deformable DETR's choice of backbone and 7 DETR's: an earlier file lacks those fields,
    and its model (a ResNet's, as every detector of those versions) is built with their defaults."""
    torch.manual_seed(0)
    model = vitkit.create_model(name, enc_layers=1, dec_layers=1).eval()
    vitkit.save_pretrained(model, tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    for field in ("backbone", "backbone_args", "backbone_scales"):
        del config["config"][field]
    config["format_version"] = version
    (tmp_path / "config.json").write_text(json.dumps(config))
    loaded = vitkit.from_pretrained(tmp_path)
    assert loaded.config == model.config
    x = torch.randn(1, 3, 96, 96)
    with torch.no_grad():
        assert torch.equal(loaded(x)["pred_boxes"], model(x)["pred_boxes"])
    config["format_version"] = 7  # a version-7 file holds every field
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"lacks field\(s\) \['backbone', 'backbone_args', 'backbone_scales'\]"):
        vitkit.from_pretrained(tmp_path)


def test_a_run_folder_given_for_a_model_names_its_models(tmp_path):
    """`vitkit train --out RUN` writes RUN/config.json (the run's settings), best/ and final/: given RUN where a model
    folder is expected, the message names the models it holds, not a missing weights file."""
    vitkit.save_pretrained(tiny_vit(), tmp_path / "best")
    (tmp_path / "config.json").write_text(json.dumps({"model": "vit_tiny_patch16_224", "epochs": 1}))
    message = f"{tmp_path} is a training run's folder, not a model's: give one of its models, {tmp_path / 'best'}"
    with pytest.raises(ValueError, match=re.escape(message)):
        vitkit.from_pretrained(tmp_path)
    vitkit.save_pretrained(tiny_vit(), tmp_path / "final")
    with pytest.raises(ValueError, match=re.escape(f"(the epoch that validated best) or {tmp_path / 'final'}")):
        vitkit.from_pretrained(tmp_path)


@pytest.mark.parametrize(
    ("saved", "model", "fix"),
    [
        (dict(), dict(global_pool="avg"), dict(global_pool="avg", fc_norm=False)),
        (dict(global_pool="avg"), dict(), dict(global_pool="avg")),
    ],
    ids=["norm-into-fc_norm", "fc_norm-into-norm"],
)
def test_the_final_norm_on_the_other_side_of_the_pooling_names_fc_norm(tmp_path, saved, model, fix):
    """No shape tells a norm before the pooling from one after it: the error names the setting, which loads."""
    path = tmp_path / "w.safetensors"
    save_file(tiny_vit(**saved).state_dict(), path)
    expected = "build the model with fc_norm=False" if "fc_norm" in fix else "build the model with fc_norm=True"
    with pytest.raises(ValueError, match=re.escape(expected)):
        vitkit.load_weights(tiny_vit(**model), path)
    vitkit.load_weights(tiny_vit(**fix), path)
    with pytest.raises(ValueError) as caught:  # other missing keys: no such words
        vitkit.load_weights(tiny_vit(**model, reg_tokens=1), path)
    assert "fc_norm=" not in str(caught.value)
