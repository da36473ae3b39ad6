"""timm's model directories: what timm's `push_to_hf_hub` / `save_for_hf` write and its Hub repositories hold
(`timm/NAME.TAG`), read as a vitkit model of the same registered name.

Their config.json holds "architecture" (timm's model name, which is vitkit's registry name for the models vitkit
has), "num_classes", "global_pool", "pretrained_cfg" (the image size, "mean" and "std") and, when the publisher gave
them, "model_args" (arguments of timm's model, here config fields) and "label_names"; the weights,
`model.safetensors` (or `pytorch_model.bin`), carry timm's parameter names, which are vitkit's.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from vitkit.data.transforms import non_default_framing
from vitkit.models.registry import list_models, model_entry
from vitkit.weights.family import family_weights
from vitkit.weights.hub import HUB_PREFIX, published_labels
from vitkit.weights.io import CONFIG_NAME, ModelInfo, check_model_info


def is_timm_config(saved: Any) -> bool:
    """Whether a parsed config.json was written by timm (it names an "architecture" and no transformers
    `model_type` nor vitkit `family`)."""
    return isinstance(saved, dict) and "architecture" in saved and not {"model_type", "family"} & saved.keys()


def timm_model(saved: dict[str, Any], directory: Path) -> tuple[str, dict[str, Any]]:
    """(registry name, config fields beside the variant's) of the model a timm directory holds: its "model_args"
    and "global_pool" as config fields, its "num_classes". ValueError for an architecture vitkit does not register,
    or an argument that is no field of its config nor one its family fixes at that value (`timm_fixed`)."""
    source = directory / CONFIG_NAME
    name = saved["architecture"]
    if not isinstance(name, str) or name not in list_models():
        raise ValueError(
            f"{source}: a timm model directory of {name!r}, which vitkit does not have; it reads timm's repositories "
            "of its registered models (vitkit.list_models(), `vitkit models`)"
        )
    entry = model_entry(name)
    config, fixed = entry.config, family_weights(entry.family).timm_fixed
    known = {f.name for f in dataclasses.fields(config)}
    args = {k: _field_value(v) for k, v in (saved.get("model_args") or {}).items()}
    if "global_pool" in saved and "global_pool" not in args:
        args["global_pool"] = saved["global_pool"]
    refused = sorted(k for k, v in args.items() if k not in known and (k not in fixed or fixed[k] != v))
    if refused:
        raise ValueError(
            f"{source}: model_args {', '.join(f'{k}={args[k]!r}' for k in refused)} describe a model vitkit's {name} "
            f"is not (its config fields: {sorted(known)}; it has {dict(fixed) or 'no other settings'})"
        )
    fields = {k: v for k, v in args.items() if k in known}
    fields["num_classes"] = saved.get("num_classes", fields.get("num_classes", config.num_classes))
    return name, fields


def _field_value(value: Any) -> Any:
    """A timm model argument as a config field: lists as tuples, a square size as one number."""
    if isinstance(value, list):
        return value[0] if len(value) == 2 and value[0] == value[1] else tuple(value)
    return value


def timm_info(saved: dict[str, Any], directory: Path, classes: tuple[str, ...] | None = None) -> ModelInfo:
    """The normalisation of a timm directory's pretrained_cfg and its label names where they fit the head:
    "label_names", else `classes`, else those of the published weights it is a copy of (timm's "NAME.TAG", its
    "architecture" and pretrained_cfg's "tag", in a registered model's table)."""
    cfg = saved.get("pretrained_cfg") or {}
    num_classes = saved.get("num_classes", 0)
    names = _names(saved.get("label_names"), saved.get("label_descriptions")) or classes
    if names is None and isinstance(cfg.get("tag"), str):
        names = published_labels(f"{HUB_PREFIX}timm/{saved.get('architecture')}.{cfg['tag']}")
    if names is not None and len(names) != num_classes:
        names = None
    values = {"classes": names, "mean": cfg.get("mean"), "std": cfg.get("std"), **timm_framing(cfg)}
    return check_model_info(values, num_classes, str(directory / CONFIG_NAME))


def timm_framing(cfg: dict[str, Any]) -> dict[str, Any]:
    """The `ModelInfo` framing entries of a timm pretrained_cfg: its crop_pct, interpolation and crop_mode where
    vitkit has them (`vitkit.data.Framing`; timm's "border" mode and other resamplings are left to the defaults)."""
    if not cfg:
        return {}
    defaults = {"crop_pct": 0.875, "interpolation": "bicubic", "crop_mode": None}  # timm's, where a cfg has none
    found = {}
    for name, default in defaults.items():
        value = cfg.get(name, default)
        try:
            found[name] = non_default_framing({name: value}).get(name)
        except ValueError:  # one vitkit does not read (timm's "border" mode): the default
            found[name] = None
    return non_default_framing(found)


def _names(labels: Any, descriptions: Any) -> tuple[str, ...] | None:
    """timm's label names (a list, or a dict of index -> name without gaps) in words: each name's description where
    given (ImageNet's synsets, "n02123045" -> "tabby, tabby cat")."""
    if isinstance(labels, dict):
        labels = [labels.get(str(i), labels.get(i)) for i in range(len(labels))]
    if not isinstance(labels, list) or not all(isinstance(n, str) for n in labels):
        return None
    words = descriptions if isinstance(descriptions, dict) else {}
    return tuple(words.get(n, n) for n in labels)
