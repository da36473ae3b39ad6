"""Data for training and evaluation: bundled datasets, ImageFolder trees, transforms (torchvision v2), batching."""

from vitkit.data.loader import Batch, EpochSampler, TransformedImages, Unreadable, collate, make_loader
from vitkit.data.sources import (
    BUILTIN_PREFIX,
    DEFAULT_DATA,
    ArrayImages,
    DataInfo,
    ImageFiles,
    augment_defaults,
    list_builtin,
    load_builtin,
    load_data,
    load_eval_split,
    load_folder,
    open_image,
    stratified_split,
    write_image_folder,
)
from vitkit.data.transforms import channel_stats, eval_transform, image_mode, normalize, preprocess, train_transform

__all__ = [
    "BUILTIN_PREFIX",
    "DEFAULT_DATA",
    "ArrayImages",
    "Batch",
    "DataInfo",
    "EpochSampler",
    "ImageFiles",
    "TransformedImages",
    "Unreadable",
    "augment_defaults",
    "channel_stats",
    "collate",
    "eval_transform",
    "image_mode",
    "list_builtin",
    "load_builtin",
    "load_data",
    "load_eval_split",
    "load_folder",
    "make_loader",
    "normalize",
    "open_image",
    "preprocess",
    "stratified_split",
    "train_transform",
    "write_image_folder",
]
