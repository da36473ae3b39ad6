"""A detector's checkpoint for other classes: `reset_head` skips every class head (DETR's one; each decoder layer's
and the two-stage proposal head of Deformable DETR) and every other tensor the family sizes by the classes
(`FamilyWeights.class_sized`: Deformable DETR's denoising label embeddings), loads the rest exactly, and the report
lists what was reset with the checkpoint's class count."""

import pytest
import torch
from safetensors.torch import load_file
from test_convert_detr import randomize
from torch import nn

import vitkit
from vitkit.models.registry import family_of
from vitkit.weights import deformable_detr
from vitkit.weights.family import family_weights

# detr_digits' and deformable_detr_digits' layouts at a size that loads in milliseconds
TINY = dict(backbone_width=8, hidden_dim=32, num_heads=2, dim_feedforward=32, num_queries=6, enc_layers=1, dec_layers=2)
DENOISING = dict(two_stage=True, dn_queries=10)  # Deformable DETR with denoising queries: a label embedding


def detector(name: str, num_classes: int, **config) -> nn.Module:
    """A registry detector with every tensor random (off its initial value)."""
    model = vitkit.create_model(name, num_classes=num_classes, **TINY, **config)
    randomize(model)
    return model


def cloned(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize(
    ("name", "config", "heads"),
    [
        ("detr_digits", {}, ["class_embed"]),  # K + 1 rows
        ("deformable_detr_digits", dict(box_refine=False), ["class_embed"]),  # one head, every layer's
        ("deformable_detr_digits", {}, ["class_embed.0", "class_embed.1"]),  # box refinement: one per layer
        ("deformable_detr_digits", dict(two_stage=True), ["class_embed.0", "class_embed.1", "class_embed.2"]),
    ],
)
def test_every_class_head_is_reset_and_everything_else_loads(name, config, heads):
    source = cloned(detector(name, 91, **config))
    model = vitkit.create_model(name, num_classes=3, **TINY, **config)
    own = cloned(model)
    report = vitkit.load_weights(model, source, reset_head=True)
    state = model.state_dict()
    reset = [f"{head}.{t}" for head in heads for t in ("weight", "bias")]
    assert report.reset == reset and report.checkpoint_classes == 91 and report.head_reset
    assert report.loaded_keys == [k for k in state if k not in reset] and report.loaded == len(state) - len(reset)
    assert report.uncovered == [] and report.adapted
    for key, value in state.items():
        assert torch.equal(value, own[key] if key in reset else source[key]), key
    rows = 3 + family_weights(family_of(model).name).extra_outputs  # DETR's "no object"
    assert all(state[k].shape[0] == rows for k in reset)
    assert f"sized by the classes, left as initialised: {', '.join(reset[:5])}" in report.summary()


def test_the_denoising_label_embedding_is_reset_with_the_class_heads():
    assert family_weights("deformable_detr").class_sized == ("label_embed.",)
    source = cloned(detector("deformable_detr_digits", 91, **DENOISING))
    model = vitkit.create_model("deformable_detr_digits", num_classes=3, **TINY, **DENOISING)
    own = cloned(model)
    report = vitkit.load_weights(model, source, reset_head=True)
    state = model.state_dict()
    assert state["label_embed.weight"].shape == (3, 32) and source["label_embed.weight"].shape == (91, 32)
    # the label embedding and the three class heads (two decoder layers' and the proposals'), in the model's order
    assert report.reset == [k for k in state if k.startswith(("label_embed.", "class_embed."))]
    assert len(report.reset) == 7 and report.checkpoint_classes == 91
    for key in report.reset:
        assert torch.equal(state[key], own[key]), key
    assert report.loaded_keys == [k for k in state if k not in report.reset]
    assert all(torch.equal(state[k], source[k]) for k in report.loaded_keys)


def test_a_label_embedding_on_one_side_only_is_the_models_own():
    # A checkpoint trained without denoising: everything else loads, the class heads included (same classes).
    older = cloned(detector("deformable_detr_digits", 3, two_stage=True))
    model = vitkit.create_model("deformable_detr_digits", num_classes=3, **TINY, **DENOISING)
    own = cloned(model)
    report = vitkit.load_weights(model, older)
    state = model.state_dict()
    assert report.reset == ["label_embed.weight"] and not report.head_reset and report.checkpoint_classes == 3
    assert torch.equal(state["label_embed.weight"], own["label_embed.weight"])
    assert report.loaded_keys == [k for k in state if k != "label_embed.weight"]
    assert all(torch.equal(state[k], older[k]) for k in report.loaded_keys)
    # A checkpoint trained with denoising into a model without: dropped.
    newer = cloned(detector("deformable_detr_digits", 3, **DENOISING))
    plain = vitkit.create_model("deformable_detr_digits", num_classes=3, two_stage=True, **TINY)
    report = vitkit.load_weights(plain, newer)
    assert report.dropped == ["label_embed.weight"] and report.reset == [] and not report.adapted
    assert all(torch.equal(v, newer[k]) for k, v in plain.state_dict().items())


def test_the_label_embedding_is_not_exported(tmp_path):
    """Denoising is training only: transformers' model and the paper's have no label embedding, and the detections
    do not depend on it."""
    trained = detector("deformable_detr_digits", 3, **DENOISING)
    vitkit.export_weights(trained, tmp_path / "hf", "hf")
    assert not any("label_embed" in k for k in load_file(tmp_path / "hf" / "model.safetensors"))
    back = vitkit.from_pretrained(tmp_path / "hf")
    expected = {k: v for k, v in trained.state_dict().items() if k != "label_embed.weight"}
    assert back.state_dict().keys() == expected.keys()
    assert all(torch.equal(v, expected[k]) for k, v in back.state_dict().items())
    original = deformable_detr.ORIGINAL.from_vitkit(trained.state_dict())
    assert not any("label_embed" in k for k in original) and "transformer.enc_output.weight" in original


@pytest.mark.parametrize("name", ["vit_tiny_patch16_224", "swin_tiny_patch4_window7_224", "detr_digits"])
def test_a_fresh_classifier_drops_the_class_names_of_the_one_it_replaced(tmp_path, name):
    """Class names are about the classifier they were loaded with: after `reset_classifier`, of the same number of
    classes too, the model carries none and saves none; copies and loads keep them."""
    import copy

    from vitkit.weights import ModelInfo, model_info, read_model_info

    small = {
        "detr_digits": {},
        "swin_tiny_patch4_window7_224": {"img_size": 32, "window_size": 4, "depths": (1, 1, 1, 1)},
    }
    model = vitkit.create_model(name, num_classes=3, **small.get(name, {"img_size": 32, "depth": 1}))
    vitkit.save_pretrained(
        model, tmp_path / "saved", ModelInfo(classes=("cat", "dog", "fox"), mean=(0.5,) * 3, std=(0.5,) * 3)
    )
    loaded = vitkit.from_pretrained(tmp_path / "saved")
    loaded.load_state_dict(loaded.state_dict())
    assert model_info(copy.deepcopy(loaded)).classes == model_info(loaded).classes == ("cat", "dog", "fox")
    loaded.reset_classifier(3)
    assert model_info(loaded).classes is None and model_info(loaded).mean is not None
    vitkit.save_pretrained(loaded, tmp_path / "reset")
    assert read_model_info(tmp_path / "reset").classes is None
