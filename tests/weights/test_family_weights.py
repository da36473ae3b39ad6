"""Each family declares its weights once (`vitkit.weights.<family>.WEIGHTS`); the generic code reads only that."""

import dataclasses

import pytest
import torch

import vitkit
from vitkit.models.registry import families, family
from vitkit.weights import family as family_module
from vitkit.weights.convert import detect_format, formats
from vitkit.weights.family import FamilyWeights, family_weights, merge_orders, registered_weights
from vitkit.weights.rename import Layout, rename


def test_every_family_declares_its_own_tables():
    for fam in families():
        weights = family_weights(fam.name)
        assert isinstance(weights, FamilyWeights)
        assert all(layout.family == fam.name for layout in weights.layouts), fam.name
        assert weights.head and all(prefix.endswith(".") for prefix in weights.head)
    assert list(registered_weights()) == [fam.name for fam in families()]


def test_formats_keep_each_familys_order():
    assert formats() == ("vitkit", "timm", "torchvision", "hf", "detr", "deformable_detr", "vit-pytorch", "paddlevit")
    # a detector listing (hf, detr) registered before classifiers listing (torchvision, hf)
    assert merge_orders([[], ["hf", "detr"], ["torchvision", "hf"]]) == ("torchvision", "hf", "detr")
    assert merge_orders([["a", "b"], ["b", "a"]]) == ("a", "b")  # orders that disagree: first seen first


def test_one_layout_per_format():
    table = Layout(format="x", family="vit", rules=(rename("norm", "ln"),), markers=("ln.weight",))
    with pytest.raises(ValueError, match=r"one layout per format: \['x'\] listed more than once"):
        FamilyWeights(layouts=(table, table))
    assert FamilyWeights(layouts=(table,)).layout("x") is table
    assert FamilyWeights(layouts=(table,)).layout("y") is None


def test_family_without_weights_module_reads_own_names(monkeypatch):
    bare = dataclasses.replace(family("vit"), weights=None)
    monkeypatch.setattr(family_module, "family", lambda name: bare)
    weights = family_weights("vit")
    assert weights.markers == () and weights.layouts == () and weights.head == ("head.",)
    assert weights.read_fields({"patch_embed.proj.weight": torch.zeros(8, 3, 4, 4)}) == {}
    # no markers: any key set is vitkit's own names (the key check then verifies them)
    assert detect_format({"anything.weight": torch.zeros(1)}, "vit", "x.pth") == "vitkit"


def test_weights_module_must_define_weights(monkeypatch):
    wrong = dataclasses.replace(family("vit"), weights="vitkit.weights.hf")
    monkeypatch.setattr(family_module, "family", lambda name: wrong)
    with pytest.raises(TypeError, match="vitkit.weights.hf must define WEIGHTS"):
        family_weights("vit")


def test_display_name_in_size_messages(tmp_path):
    """The checkpoint is named with the family's registered display name."""
    path = tmp_path / "tiny.pth"
    torch.save(vitkit.create_model("swin_tiny_patch4_window7_224", num_classes=0, embed_dim=48).state_dict(), path)
    model = vitkit.create_model("swin_tiny_patch4_window7_224", num_classes=0)
    with pytest.raises(ValueError, match=f"a {family('swin').display_name} with embed_dim 48, the model has 96"):
        vitkit.load_weights(model, path)
