"""What a model needs beside its weights (`ModelInfo`: class names, normalisation, a detector's category ids and
postprocessing, the data it was trained on) travels with them in config.json: save_pretrained, from_pretrained, the
Hugging Face export (`id2label` / `label2id`, `preprocessor_config.json`) and back, and convert."""

import json
import re

import numpy as np
import pytest
import torch
import transformers
from PIL import Image

import vitkit
from vitkit.data import Framing, preprocess
from vitkit.weights import ModelInfo, convert, export_weights, model_info, read_model_info

TINY = dict(img_size=32, patch_size=4, embed_dim=32, depth=2, num_heads=4, mlp_ratio=2.0, num_classes=3)
NAMES = ("cat", "dog", "éléphant")
MEAN, STD = (0.5, 0.4, 0.3), (0.2, 0.25, 0.3)


def tiny_vit(**overrides) -> torch.nn.Module:
    return vitkit.create_model("vit_base_patch16_224", **{**TINY, **overrides}).eval()


def test_save_pretrained_keeps_names_and_normalisation(tmp_path):
    vitkit.save_pretrained(tiny_vit(), tmp_path / "m", ModelInfo(NAMES, MEAN, STD))
    saved = json.loads((tmp_path / "m" / "config.json").read_text())
    assert (saved["classes"], saved["mean"], saved["std"]) == (list(NAMES), list(MEAN), list(STD))
    loaded = vitkit.from_pretrained(tmp_path / "m")
    assert loaded.pretrained_info == ModelInfo(NAMES, MEAN, STD) == read_model_info(tmp_path / "m")
    # Not given: what the model carries, as timm's and transformers' models keep their labels and preprocessing ...
    vitkit.save_pretrained(loaded, tmp_path / "again")
    assert read_model_info(tmp_path / "again") == ModelInfo(NAMES, MEAN, STD)
    vitkit.save_pretrained(loaded, tmp_path / "empty", ModelInfo())  # ... an empty one writes nothing
    assert read_model_info(tmp_path / "empty") == ModelInfo()
    # ... without the names once the classifier has another number of outputs
    resized = vitkit.from_pretrained(tmp_path / "m", reset_head=True, num_classes=5)
    vitkit.save_pretrained(resized, tmp_path / "five")
    assert read_model_info(tmp_path / "five") == ModelInfo(mean=MEAN, std=STD)
    # Without names nothing is written, and nothing is made up when reading.
    vitkit.save_pretrained(tiny_vit(), tmp_path / "bare")
    assert set(json.loads((tmp_path / "bare" / "config.json").read_text())) == {"format_version", "family", "config"}
    assert model_info(vitkit.from_pretrained(tmp_path / "bare")) == ModelInfo()


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(classes=["a", "b"]), "2 classes for a model with 3 classes"),
        (dict(classes=["a", "b", "a"]), r"classes repeat \['a'\]"),
        (dict(classes="abc"), "classes must be a list of class names"),
        (dict(mean=MEAN), "mean and std come together; got only mean"),
        (dict(mean=MEAN, std=(0.2, 0.0, 0.3)), "std must be > 0"),
        (dict(mean=(0.5,), std=(0.5, 0.5)), "mean has 1 values but std 2"),
        (dict(mean=(float("nan"),), std=(0.5,)), "mean must be a non-empty list of finite numbers"),
        (dict(category_ids=(1, 2)), "2 category_ids for a model with 3 classes"),
        (dict(category_ids=(1, 2, True)), "category_ids must be a list of integers"),
        (dict(val_fraction=0.1), "val_fraction and split_seed describe the split of the data, which is not given"),
        (dict(data="builtin:mnist5k", val_fraction=1.0), r"val_fraction must be a number in \[0, 1\)"),
        (dict(postprocess=["ce"]), "postprocess must be an object of postprocessing settings"),
    ],
)
def test_descriptions_that_do_not_fit_are_refused(tmp_path, kwargs, message):
    with pytest.raises(ValueError, match=f"save_pretrained: {message}"):
        vitkit.save_pretrained(tiny_vit(), tmp_path, ModelInfo(**kwargs))


def test_every_entry_travels_and_is_checked_when_read(tmp_path):
    info = ModelInfo(NAMES, MEAN, STD, (3, 1, 7), {"top_k": 5}, "/data/pets", 0.2, 4)
    vitkit.save_pretrained(tiny_vit(), tmp_path, info)
    assert read_model_info(tmp_path) == info == model_info(vitkit.from_pretrained(tmp_path))
    saved = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**saved, "classes": ["a", "b"]}))
    with pytest.raises(ValueError, match="config.json: 2 classes for a model with 3 classes"):
        vitkit.from_pretrained(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({**saved, "split_seed": "4"}))
    with pytest.raises(ValueError, match="config.json: split_seed must be an integer, got '4'"):
        vitkit.from_pretrained(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({**saved, "labels": ["a", "b", "c"]}))
    with pytest.raises(ValueError, match=r"unknown entries \['labels'\]"):
        vitkit.from_pretrained(tmp_path)


@pytest.mark.parametrize("files", [("dataset.json",), ("dataset.json", "postprocess.json")])
def test_a_directory_of_the_split_layout_says_what_its_config_lacks(tmp_path, files):
    """Model directories kept their data's description in dataset.json (and a detector's reading in
    postprocess.json) early in vitkit's development; such a directory is refused, naming those files and the
    entries its config.json lacks."""
    detector = len(files) == 2
    model = vitkit.create_model("detr_digits", num_classes=3) if detector else tiny_vit()
    vitkit.save_pretrained(model, tmp_path, ModelInfo(mean=MEAN, std=STD))
    for name in files:
        (tmp_path / name).write_text("{}")
    lacking = (
        "['classes', 'category_ids', 'postprocess', 'data']" if detector else "['classes', 'data', 'val_fraction']"
    )
    with pytest.raises(ValueError, match=re.escape(f"config.json lacks the entries {lacking}")) as caught:
        vitkit.from_pretrained(tmp_path)
    assert " and ".join(files) in str(caught.value) and "vitkit train" in str(caught.value)


@pytest.mark.parametrize(
    "framing, processor_class",
    [
        ({}, "BitImageProcessor"),  # vitkit's default: the shorter side to the model's, the centre cut out
        ({"crop_pct": 0.8, "interpolation": "bicubic"}, "BitImageProcessor"),  # as timm's and torchvision's
        ({"crop_mode": "squash"}, "ViTImageProcessor"),  # transformers' ViT: the whole image, squashed
    ],
)
def test_names_go_out_to_transformers_and_come_back(tmp_path, framing, processor_class):
    torch.manual_seed(0)
    model = tiny_vit()
    export_weights(model, tmp_path / "hf", "hf", ModelInfo(NAMES, MEAN, STD, **framing))
    theirs = transformers.ViTForImageClassification.from_pretrained(tmp_path / "hf").eval()
    assert theirs.config.id2label == dict(enumerate(NAMES))
    assert theirs.config.label2id == {name: i for i, name in enumerate(NAMES)}
    processor = transformers.AutoImageProcessor.from_pretrained(tmp_path / "hf")
    assert type(processor).__name__.startswith(processor_class)
    assert (list(processor.image_mean), list(processor.image_std)) == (list(MEAN), list(STD))
    # transformers' processor gives the input vitkit's evaluation gives, on an image of another shape and size
    image = Image.fromarray(np.random.default_rng(0).integers(0, 256, (50, 76, 3), dtype=np.uint8))
    expected = preprocess(image, (32, 32), 3, MEAN, STD, Framing(**framing))
    got = processor(image, return_tensors="pt")["pixel_values"][0]
    level = 1 / 255 / min(STD)  # one grey level, normalised: its resize rounds a few pixels the other way
    torch.testing.assert_close(got, expected, atol=level * 1.01, rtol=0)
    assert (got - expected).abs().gt(1e-5).float().mean() < 0.01

    back = vitkit.from_pretrained(tmp_path / "hf")
    assert back.pretrained_info == ModelInfo(NAMES, MEAN, STD, **framing)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(back(x), theirs(pixel_values=x).logits, atol=1e-5, rtol=1e-5)


def test_transformers_names_are_exposed_and_default_labels_are_not_names(tmp_path):
    config = transformers.ViTConfig(
        hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64, image_size=32, patch_size=4
    )
    config.id2label, config.label2id = {0: "ant", 1: "bee"}, {"ant": 0, "bee": 1}
    transformers.ViTForImageClassification(config).save_pretrained(tmp_path / "named")
    assert vitkit.from_pretrained(tmp_path / "named").pretrained_info.classes == ("ant", "bee")

    config.id2label, config.label2id = {0: "LABEL_0", 1: "LABEL_1"}, {"LABEL_0": 0, "LABEL_1": 1}
    transformers.ViTForImageClassification(config).save_pretrained(tmp_path / "default")
    assert vitkit.from_pretrained(tmp_path / "default").pretrained_info == ModelInfo()
    export_weights(vitkit.from_pretrained(tmp_path / "default"), tmp_path / "out", "hf")
    assert json.loads((tmp_path / "out" / "config.json").read_text())["id2label"] == {"0": "LABEL_0", "1": "LABEL_1"}
    assert not (tmp_path / "out" / "preprocessor_config.json").exists()  # no normalisation known, none made up


def test_convert_carries_names_and_drops_them_with_a_new_head(tmp_path):
    vitkit.save_pretrained(tiny_vit(), tmp_path / "vk", ModelInfo(NAMES, MEAN, STD, data="builtin:mnist5k"))
    convert(tmp_path / "vk", tmp_path / "same")
    assert read_model_info(tmp_path / "same") == read_model_info(tmp_path / "vk")  # every entry
    convert(tmp_path / "vk", tmp_path / "hf", dst_format="hf")
    convert(tmp_path / "hf", tmp_path / "vk2")
    assert read_model_info(tmp_path / "vk2") == ModelInfo(NAMES, MEAN, STD)
    convert(tmp_path / "vk2", tmp_path / "vk4", reset_head=True, overrides={"num_classes": 4})
    assert read_model_info(tmp_path / "vk4") == ModelInfo(None, MEAN, STD)  # the names were the old head's
    convert(tmp_path / "vk2", tmp_path / "vk3", reset_head=True)
    assert read_model_info(tmp_path / "vk3") == ModelInfo(None, MEAN, STD)  # a new head of the same size too


@pytest.mark.parametrize(
    "settings, framing",
    [
        ({"image_processor_type": "ViTImageProcessor", "size": {"height": 224, "width": 224}}, {"crop_mode": "squash"}),
        ({"image_processor_type": "ViTImageProcessor", "size": 224, "resample": 3}, {"crop_mode": "squash",
                                                                                        "interpolation": "bicubic"}),
        ({"feature_extractor_type": "CLIPFeatureExtractor", "size": 224, "crop_size": 224, "do_center_crop": True},
         {"interpolation": "bicubic"}),  # an older file: one number, the shorter side; CLIP's bicubic default
        ({"image_processor_type": "BitImageProcessor", "size": {"shortest_edge": 256}, "do_center_crop": True,
          "crop_size": {"height": 224, "width": 224}, "resample": 3}, {"crop_pct": 0.875, "interpolation": "bicubic"}),
        ({"image_processor_type": "DeiTImageProcessor", "size": {"height": 256, "width": 256}, "do_center_crop": True,
          "crop_size": {"height": 224, "width": 224}}, {"crop_mode": "squash", "crop_pct": 0.875,
                                                        "interpolation": "bicubic"}),
        ({"image_processor_type": "BitImageProcessor", "size": {"shortest_edge": 224}}, {}),  # no crop: unclear
        ({"do_resize": False, "size": {"height": 224, "width": 224}}, {}),
    ],
)  # fmt: skip
def test_a_transformers_processor_s_framing(settings, framing):
    assert vitkit.weights.hf.processor_framing(settings) == framing


def test_a_timm_pretrained_cfg_s_framing():
    from vitkit.weights.timm_repo import timm_framing

    cfg = {"mean": [0.5] * 3, "std": [0.5] * 3, "crop_pct": 0.9, "interpolation": "bicubic", "crop_mode": "center"}
    assert timm_framing(cfg) == {"crop_pct": 0.9, "interpolation": "bicubic"}  # "center" is vitkit's default
    assert timm_framing({"mean": [0.5] * 3}) == {"crop_pct": 0.875, "interpolation": "bicubic"}  # timm's defaults
    assert timm_framing({"crop_pct": 1.0, "interpolation": "bilinear", "crop_mode": "border"}) == {}  # border: unread
    assert timm_framing({}) == {}
