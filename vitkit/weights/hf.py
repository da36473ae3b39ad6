"""Hugging Face transformers' conventions that every family's layout shares: config.json values (square sizes, the
activation, labels), the class names in `id2label`, the `preprocessor_config.json` of `ViTImageProcessor`, and the
prefix the encoder sits under beside the heads.

Each family's transformers layouts, config readers and exporters are in its weights file (`vitkit.weights.<family>`,
`FamilyWeights.layouts`, `hf_model_types`, `hf_export`).
"""

from __future__ import annotations

from typing import Any

from vitkit.data.transforms import Framing, non_default_framing
from vitkit.weights.family import State
from vitkit.weights.rename import Layout


def square(value: Any, what: str, source: str) -> int | tuple[int, int]:
    """A config.json size (an int or a pair) as a vitkit config holds it: an int when square, else (H, W)."""
    if isinstance(value, int):
        return value
    if isinstance(value, list | tuple) and len(value) == 2:
        return value[0] if value[0] == value[1] else (int(value[0]), int(value[1]))
    raise ValueError(f"{source}: {what} must be an int or a pair, got {value!r}")


def check_act(hf: dict[str, Any], source: str) -> None:
    """ValueError for a `hidden_act` other than exact GELU, the only one vitkit's MLP computes."""
    act = hf.get("hidden_act", "gelu")
    if act != "gelu":
        raise ValueError(f"{source}: hidden_act {act!r} is not supported; vitkit's MLP uses exact GELU ('gelu')")


ACTIVATIONS = {"gelu": "gelu", "gelu_pytorch_tanh": "gelu_tanh", "gelu_new": "gelu_tanh", "quick_gelu": "quick_gelu"}
"""transformers' `hidden_act` names -> vitkit's activations (`vitkit.layers.mlp.ACTIVATIONS`); "gelu_new" is the same
tanh form as "gelu_pytorch_tanh", computed in other steps."""


def act_of(hf: dict[str, Any], source: str, default: str = "gelu") -> str:
    """The vitkit activation of a config.json's `hidden_act`; ValueError for one vitkit's MLP does not compute."""
    act = hf.get("hidden_act", default)
    if act not in ACTIVATIONS:
        raise ValueError(f"{source}: hidden_act {act!r} is not supported; vitkit computes {sorted(ACTIVATIONS)}")
    return ACTIVATIONS[act]


def hf_act(act: str) -> str:
    """transformers' `hidden_act` name for a vitkit activation."""
    return {"gelu": "gelu", "gelu_tanh": "gelu_pytorch_tanh", "quick_gelu": "quick_gelu"}[act]


def num_labels(hf: dict[str, Any]) -> int:
    """The number of classes of a config.json: its `id2label` entries, else `num_labels` (transformers' default 2)."""
    id2label = hf.get("id2label")
    return len(id2label) if id2label else hf.get("num_labels", 2)


def labels(num_classes: int, names: tuple[str, ...] | None = None) -> dict[str, Any]:
    """`id2label` and `label2id` for a config.json: the class names, or transformers' default LABEL_i."""
    if num_classes == 0:
        return {}
    names = names if names is not None else tuple(f"LABEL_{i}" for i in range(num_classes))
    return {
        "id2label": {str(i): name for i, name in enumerate(names)},
        "label2id": {name: i for i, name in enumerate(names)},
    }


def class_names(hf: dict[str, Any], source: str) -> tuple[str, ...] | None:
    """The class names in a transformers config's `id2label`, in label order; None when it has none or only the
    default LABEL_i names (which say nothing about the classes)."""
    id2label = hf.get("id2label")
    if not id2label:
        return None
    if not isinstance(id2label, dict):
        raise ValueError(f"{source}: id2label must be an object of index -> name, got {type(id2label).__name__}")
    try:
        by_index = {int(k): v for k, v in id2label.items()}
    except ValueError as err:
        raise ValueError(f"{source}: id2label keys must be class indices, got {sorted(id2label)[:5]}") from err
    if sorted(by_index) != list(range(len(by_index))) or not all(isinstance(v, str) for v in by_index.values()):
        raise ValueError(f"{source}: id2label must map the indices 0..{len(by_index) - 1} to names")
    names = tuple(by_index[i] for i in range(len(by_index)))
    return None if names == tuple(f"LABEL_{i}" for i in range(len(names))) else names


PREPROCESSOR_NAME = "preprocessor_config.json"


# PIL's resampling codes, as transformers' image processors store them ("resample"), and vitkit's names for them
PIL_RESAMPLE = {0: "nearest", 2: "bilinear", 3: "bicubic"}


def image_processor(
    img_size: int | tuple[int, int],
    in_chans: int,
    mean: tuple[float, ...] | None,
    std: tuple[float, ...] | None,
    framing: Framing | None = None,
) -> dict | None:
    """A `preprocessor_config.json` that frames images as vitkit does (`framing`), scales by 1/255 and normalises
    with `mean` / `std` for `in_chans` channels. transformers' `ViTImageProcessor` (what ViT, DeiT and Swin
    checkpoints name) where it does the same, resizing to the model's `img_size` whatever the aspect ("squash",
    crop_pct 1); otherwise its `BitImageProcessor` (resize, then centre crop: a shorter side of floor(H / crop_pct)
    for a square model). For a model that is not square it squashes to the resized size before the crop, which
    vitkit's "center" framing does not (it keeps the aspect): those images differ. None for an unknown
    normalisation."""
    if mean is None or std is None:
        return None
    framing = framing or Framing()
    H, W = (img_size, img_size) if isinstance(img_size, int) else img_size
    resample = {name: code for code, name in PIL_RESAMPLE.items()}[framing.interpolation]
    normalisation = {
        "do_rescale": True,
        "rescale_factor": 1 / 255,
        "do_normalize": True,
        "image_mean": _per_channel(mean, in_chans),
        "image_std": _per_channel(std, in_chans),
    }
    if framing.crop_mode == "squash" and framing.crop_pct == 1:
        size = {"height": H, "width": W}
        return {"image_processor_type": "ViTImageProcessor", "do_resize": True, "size": size, "resample": resample,
                **normalisation}  # fmt: skip
    resized = framing.resized_size((H, W), (H, W))
    size = {"shortest_edge": resized} if isinstance(resized, int) else {"height": resized[0], "width": resized[1]}
    return {
        "image_processor_type": "BitImageProcessor",
        "do_resize": True,
        "size": size,
        "resample": resample,
        "do_center_crop": True,
        "crop_size": {"height": H, "width": W},
        "do_convert_rgb": in_chans == 3,
        **normalisation,
    }


def processor_framing(settings: dict[str, Any]) -> dict[str, Any]:
    """The `ModelInfo` framing entries of a transformers image processor's settings (`preprocessor_config.json`):
    "squash" for a resize to a height and width, "center" for a shorter side; crop_pct from the centre crop's size
    over the resized one; the resampling where vitkit has it. {} where it does not resize, or says it unclearly."""
    size, crop = settings.get("size"), settings.get("crop_size")
    if not settings.get("do_resize", True) or size is None:
        return {}
    kind = str(settings.get("image_processor_type") or settings.get("feature_extractor_type") or "")
    if isinstance(size, int):  # older files: one number, a square for ViT's processor, else the shorter side
        size = {"height": size, "width": size} if kind.startswith("ViT") else {"shortest_edge": size}
    if isinstance(crop, int):
        crop = {"height": crop, "width": crop}
    found: dict[str, Any] = {}
    if isinstance(size, dict) and isinstance(size.get("shortest_edge"), int) and size["shortest_edge"] > 0:
        found["crop_mode"], side = "center", size["shortest_edge"]
    elif isinstance(size, dict) and isinstance(size.get("height"), int) and size["height"] > 0:
        found["crop_mode"], side = "squash", size["height"]
    else:
        return {}
    crop_side = crop.get("height") if isinstance(crop, dict) else None
    if settings.get("do_center_crop") and isinstance(crop_side, int) and crop_side > 0:
        found["crop_pct"] = min(1.0, crop_side / side)
    elif found["crop_mode"] == "center":
        return {}  # a shorter side without a crop: the input's size follows the image's aspect
    default = 2 if kind.startswith("ViT") or not kind else 3  # ViT's processor bilinear; CLIP's, BiT's, DeiT's bicubic
    found["interpolation"] = PIL_RESAMPLE.get(settings.get("resample", default))
    return non_default_framing(found)


def _per_channel(values: tuple[float, ...], channels: int) -> list[float]:
    """Statistics for `channels`, as vitkit's normalisation adapts them: one value repeated, or colour averaged."""
    if len(values) == channels:
        return list(values)
    return list(values) * channels if len(values) == 1 else [sum(values) / len(values)] * channels


def prefix_encoder(renamed: State, layout: Layout, prefix: str) -> State:
    """Inside the *ForImageClassification classes the encoder sits under `vit.` / `deit.` / `swin.`; the heads
    stay top level."""
    heads = {r.theirs[0] for r in layout.rules if r.ours.startswith("head")}
    return {(k if k.split(".")[0] in heads else prefix + k): v for k, v in renamed.items()}
