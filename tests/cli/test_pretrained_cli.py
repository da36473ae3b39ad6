"""The commands on published weights, offline (a Hugging Face cache the tests build, `hub_cache`): `vitkit predict
--model NAME --pretrained` and `--model-dir hf-hub:ORG/REPO` give what the same files give from a path, with
ImageNet's label names; `vitkit models --pretrained` lists the table; mistakes in the flags are refused first."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch
from PIL import Image

import vitkit
from vitkit.cli import main
from vitkit.data import preprocess
from vitkit.models import registry
from vitkit.models.registry import published_weights
from vitkit.weights import download_mb
from vitkit.weights.hub import label_names

TIMM_REPO = "timm/vit_tiny_patch16_224.augreg_in21k_ft_in1k"
DETR_REPO = "vitkit-tests/deformable-detr-small"


@pytest.fixture
def photos(tmp_path):
    """Two random RGB images of other sizes than the models': their paths."""
    rng = np.random.default_rng(0)
    paths = []
    for i, size in enumerate(((240, 200), (130, 170))):
        paths.append(tmp_path / f"{i}.png")
        Image.fromarray(rng.integers(0, 256, (*size, 3), dtype=np.uint8)).save(paths[-1])
    return paths


def predict_json(capsys, *argv) -> list[dict]:
    capsys.readouterr()
    assert main(["predict", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_predict_with_a_classifier_by_name_and_by_repository(hub_cache, timm_vit, photos, capsys):
    _, folder = timm_vit
    hub_cache.put(TIMM_REPO, folder)
    images = [str(p) for p in photos]
    by_name = predict_json(capsys, "--model", "vit_tiny_patch16_224", "--pretrained", *images)
    assert by_name == predict_json(capsys, "--model-dir", str(folder), *images)  # the same files from a path
    assert by_name == predict_json(capsys, "--model-dir", f"hf-hub:{TIMM_REPO}", *images)
    names = label_names("imagenet-1k")
    theirs = timm_vit[0]
    for row, path in zip(by_name, photos, strict=True):
        assert len(row["top"]) == 5 and all(top["class"] in names for top in row["top"])  # "tabby", not "281"
        # the name of timm's own most probable class for the image as predict prepares it (its mean and std 0.5)
        x = preprocess(Image.open(path), (224, 224), 3, (0.5,) * 3, (0.5,) * 3)
        with torch.no_grad():
            assert row["top"][0]["class"] == names[theirs(x[None]).argmax().item()]
    capsys.readouterr()
    assert main(["predict", "--model", "vit_tiny_patch16_224.augreg_in21k_ft_in1k", "--pretrained", images[0]]) == 0
    assert by_name[0]["top"][0]["class"] in capsys.readouterr().out


def test_predict_with_a_detector_by_name_and_by_repository(hub_cache, hf_deformable, photos, tmp_path, point_table):
    """deformable_detr_resnet50 --pretrained loads its table's repository (pointed here at a small one)."""
    _, folder = hf_deformable
    hub_cache.put(DETR_REPO, folder)
    point_table("deformable_detr_resnet50", f"hf-hub:{DETR_REPO}", vitkit.from_pretrained(folder).config)
    found = {}
    for key, source in (
        ("name", ["--model", "deformable_detr_resnet50", "--pretrained"]),
        ("hub", ["--model-dir", f"hf-hub:{DETR_REPO}"]),
        ("path", ["--model-dir", str(folder)]),
    ):
        out = tmp_path / key
        argv = ["predict", *source, str(photos[0]), "--out", str(out), "--threshold", "0.0"]
        assert main(argv) == 0
        (row,) = json.loads((out / "detections.json").read_text())
        assert row.pop("picture") == str(out / photos[0].name) and (out / photos[0].name).is_file()
        found[key] = row
    assert found["name"] == found["hub"] == found["path"] and found["path"]["detections"]
    assert all(d["class"] == f"thing {d['category_id']}" for d in found["name"]["detections"])  # the repository's


def test_models_lists_the_published_weights(capsys):
    assert main(["models", "--pretrained"]) == 0
    out = capsys.readouterr().out
    for line in (
        "vit_base_patch16_224.augreg2_in21k_ft_in1k",
        "swin_tiny_patch4_window7_224.ms_in1k",
        "hf-hub:SenseTime/deformable-detr-with-box-refine-two-stage",
        "https://download.pytorch.org/models/resnet50-0676ba61.pth",
        "without published weights:",
        "  botnet50: ",
    ):
        assert line in out
    row = next(r for r in out.splitlines() if r.startswith("vit_tiny_patch16_224.augreg_in21k_ft_in1k "))
    assert row.split()[1:3] == [f"{download_mb('vit_tiny_patch16_224'):.1f}", "Apache-2.0"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--model", "vit_tiny_patch16_224"], "has no trained weights of its own: add --pretrained"),
        (["--model-dir", "somewhere", "--pretrained"], "--pretrained goes with --model NAME"),
        (["--model", "vit_tiny_patch16_224.in1k", "--pretrained"], "has no weights tagged 'in1k'"),
        (["--model", "botnet50", "--pretrained"], "no weights are published for botnet50"),
        (["--model", "detr_resnet50.tv_in1k", "--pretrained"], "fill its backbone alone: its class and box heads"),
    ],
)
def test_flag_mistakes_are_refused_before_anything_is_read(argv, message, capsys, photos, hub_cache):
    assert main(["predict", *argv, str(photos[0])]) == 2
    assert message in capsys.readouterr().err


def test_the_other_commands_read_a_hub_repository(hub_cache, timm_vit, photos, tmp_path, capsys):
    _, folder = timm_vit
    hub_cache.put(TIMM_REPO, folder)
    heat = tmp_path / "heat.png"
    assert main(["attention", "--model-dir", f"hf-hub:{TIMM_REPO}", str(photos[0]), "--out", str(heat)]) == 0
    assert heat.is_file()
    page = tmp_path / "page.html"
    assert main(["explore", "--model", "vit_tiny_patch16_224", "--pretrained", str(photos[0]), "--out", str(page)]) == 0
    (row,) = predict_json(capsys, "--model-dir", f"hf-hub:{TIMM_REPO}", str(photos[0]))
    assert f'"top":[["{row["top"][0]["class"]}",' in page.read_text()  # ImageNet's names in the page's top classes
    exported = tmp_path / "model.pt"
    argv = ["export", "--model-dir", f"hf-hub:{TIMM_REPO}", "--format", "torchscript", "--out", str(exported)]
    assert main(argv) == 0 and exported.is_file()


def test_weights_without_label_names_say_so(hub_cache, timm_vit, photos, capsys, monkeypatch):
    """Published weights whose head has no names (ImageNet-21k's): predict says the classes are indices (the
    default tag's table entry is stood in for one without names)."""
    _, folder = timm_vit
    hub_cache.put(TIMM_REPO, folder)
    entry, published = published_weights("vit_tiny_patch16_224")
    unnamed = dataclasses.replace(published, labels=None)
    monkeypatch.setitem(registry._MODELS, entry.name, dataclasses.replace(entry, pretrained=(unnamed,)))
    assert main(["predict", "--model", "vit_tiny_patch16_224", "--pretrained", str(photos[0])]) == 0
    out, err = capsys.readouterr()
    assert "vit_tiny_patch16_224's weights come with no label names (none were published)" in err
    assert out.splitlines()[1].split()[1].isdigit()  # the first class of the first image: an index
