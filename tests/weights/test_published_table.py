"""Every entry of the families' tables of published weights can be taken by the model it is declared for: the
reference library's own record of the weights (timm's pretrained configs, transformers' configs as its conversion
scripts wrote them, torchvision's weights enums) names the same place, licence, head and size, and the reference model's
state dict, read by the entry's layout, fills the registered variant key for key and shape for shape (on the meta
device: nothing is allocated, nothing downloaded)."""

from __future__ import annotations

import functools
import math
import warnings

import pytest
import timm
import torch
import torchvision
import transformers

import vitkit
from vitkit.models.registry import list_models, list_pretrained, model_entry, published_weights, replace_config
from vitkit.weights import load_weights
from vitkit.weights.family import hf_model_types

PUBLISHED = [(full, *published_weights(full)) for full in list_pretrained()]


def by_layout(layout: str) -> list:
    return [pytest.param(entry, weights, id=full) for full, entry, weights in PUBLISHED if weights.layout == layout]


def stand_in(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A state dict of real tensors with the shapes and dtypes of `state` (meta) that hold no memory."""
    return {k: torch.zeros((), dtype=v.dtype).expand(v.shape) for k, v in state.items()}


def load_on_meta(name: str, fields: dict, state: dict[str, torch.Tensor], format: str):
    """`vitkit.load_weights` of `state` into the variant `name` with `fields`, built on the meta device: its report
    (every key and shape checked, as for a real download)."""
    with torch.device("meta"):
        model = vitkit.create_model(name, **fields)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*copying from a non-meta parameter")
        return load_weights(model, stand_in(state), format=format)


def test_every_model_has_weights_or_says_why_not():
    for name in list_models():
        entry = model_entry(name)
        assert bool(entry.pretrained) != bool(entry.unpublished), name
    assert len(PUBLISHED) >= 80
    tags = {full.split(".", 1)[1] for full, *_ in PUBLISHED}
    assert {"augreg2_in21k_ft_in1k", "lvd142m", "webli", "ms_in1k", "c1_in1k", "coco", "tv_in1k"} <= tags


@functools.lru_cache
def timm_state(arch: str, num_classes: int) -> dict[str, torch.Tensor]:
    """timm's state dict of `arch` with `num_classes` outputs, on the meta device (tags of one head share it)."""
    with torch.device("meta"):
        return timm.create_model(arch, pretrained=False, num_classes=num_classes).state_dict()


@pytest.mark.parametrize(("entry", "weights"), by_layout("timm"))
def test_timm_entries_are_timm_weights_the_variant_takes(entry, weights):
    arch = f"{entry.name}.{weights.tag}"
    cfg = timm.get_pretrained_cfg(arch)
    assert cfg is not None, f"timm publishes no {arch}"
    assert weights.source == f"hf-hub:{cfg.hf_hub_id}" and weights.licence.lower() == cfg.license
    config = replace_config(entry.config, **weights.fields)
    size = config.img_size if isinstance(config.img_size, tuple) else (config.img_size,) * 2
    assert config.num_classes == cfg.num_classes and tuple(cfg.input_size[1:]) == size
    assert weights.labels == ("imagenet-1k" if cfg.num_classes == 1000 else None)  # 21k heads: no names published
    theirs = timm_state(entry.name, cfg.num_classes)
    report = load_on_meta(entry.name, weights.fields, theirs, "vitkit")
    assert report.loaded == len(theirs) and not report.head_reset


# What transformers' repositories hold in config.json beside transformers' defaults, as transformers' conversion
# scripts wrote them (convert_deformable_detr_to_pytorch.py: DeformableDetrConfig() with dilation, with_box_refine,
# two_stage from its flags and num_labels 91, COCO's id2label; the DETR script likewise, its backbone by name from
# timm, DC5 by dilation)
HF_CONFIGS = {
    "facebook/detr-resnet-50": dict(backbone="resnet50"),
    "facebook/detr-resnet-50-dc5": dict(backbone="resnet50", dilation=True),
    "facebook/detr-resnet-50-panoptic": dict(backbone="resnet50", num_labels=250),  # a DetrForSegmentation
    "facebook/detr-resnet-101": dict(backbone="resnet101"),
    "facebook/detr-resnet-101-dc5": dict(backbone="resnet101", dilation=True),
    "SenseTime/deformable-detr": dict(),
    "SenseTime/deformable-detr-with-box-refine": dict(with_box_refine=True),
    "SenseTime/deformable-detr-with-box-refine-two-stage": dict(with_box_refine=True, two_stage=True),
}
TRAINING_ONLY = ("aux_loss", "drop_rate", "attn_drop_rate", "drop_path_rate")  # the same weights either way


@pytest.mark.parametrize(("entry", "weights"), by_layout("hf"))
def test_transformers_entries_are_repositories_the_variant_takes(entry, weights):
    repo = weights.source.removeprefix("hf-hub:")
    assert repo in HF_CONFIGS, f"{repo}: no record of its config in this test"
    config_cls, model_cls = {
        "detr": (transformers.DetrConfig, transformers.DetrForObjectDetection),
        "detr masks": (transformers.DetrConfig, transformers.DetrForSegmentation),
        "deformable_detr": (transformers.DeformableDetrConfig, transformers.DeformableDetrForObjectDetection),
    }[entry.family + (" masks" if getattr(entry.config, "masks", False) else "")]
    hf = config_cls(
        use_timm_backbone=True, use_pretrained_backbone=False, **{"num_labels": 91, **HF_CONFIGS[repo]}
    )  # 91 COCO ids, as their id2label (the panoptic model: 250)
    with torch.device("meta"):
        theirs = model_cls(hf).state_dict()
    _, read_config = hf_model_types()[hf.model_type]
    read = read_config(hf.to_dict(), set(theirs), repo)
    ours = replace_config(entry.config, **weights.fields)
    differ = {k for k in vars(ours) if getattr(read, k) != getattr(ours, k)}
    if "backbone_stages" in differ and read.stages == ours.stages:  # given, or the same by default
        differ.remove("backbone_stages")
    assert differ <= set(TRAINING_ONLY), {k: (getattr(read, k), getattr(ours, k)) for k in differ}
    report = load_on_meta(entry.name, weights.fields, theirs, "hf")
    assert report.loaded > 0 and not report.uncovered and not report.head_reset


@pytest.mark.parametrize(("entry", "weights"), by_layout("torchvision"))
def test_torchvision_entries_are_torchvision_files_that_fill_the_backbone(entry, weights):
    depth = {(3, 4, 6, 3): 50, (3, 4, 23, 3): 101}[tuple(entry.config.backbone_depths)]
    enum = getattr(torchvision.models, f"ResNet{depth}_Weights")
    published = enum.IMAGENET1K_V1 if weights.tag == "tv_in1k" else enum.IMAGENET1K_V2
    assert weights.tag in ("tv_in1k", "tv2_in1k") and weights.source == published.url
    assert math.isclose(weights.size_mb, published.meta["_file_size"] * 2**20 / 1e6, abs_tol=0.05)  # MiB -> MB
    assert weights.licence == "BSD-3-Clause" and weights.labels is None
    with torch.device("meta"):
        theirs = getattr(torchvision.models, f"resnet{depth}")().state_dict()
    report = load_on_meta(entry.name, weights.fields, theirs, "torchvision")
    assert report.loaded == len([k for k in theirs if not k.startswith("fc.") and "num_batches" not in k])
    assert all(not k.startswith("backbone.") for k in report.uncovered)  # the whole backbone, nothing else
