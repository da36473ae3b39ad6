"""Image transforms (torchvision transforms v2): PIL image -> uint8 tensor (C, H, W) for a model, and the
normalisation to float, applied to whole batches (cheaper than per image, and on the GPU when there is one).
Geometry runs on the PIL image, which is faster than on a tensor for the small images vitkit trains on.

Every image is first converted to the model's channels (grayscale, RGB, RGBA and palette images alike; an alpha
channel is dropped), so one pipeline serves any mix of files.
"""

from __future__ import annotations

import torch
from PIL import Image
from torchvision.transforms import v2

CHANNEL_MODES = {1: "L", 3: "RGB"}  # model input channels -> PIL mode the image is converted to


def image_mode(channels: int) -> str:
    """The PIL mode for a model with `channels` input channels (1: "L", 3: "RGB")."""
    if channels not in CHANNEL_MODES:
        raise ValueError(f"images can be converted to 1 or 3 channels, the model has in_chans={channels}")
    return CHANNEL_MODES[channels]


def channel_stats(values: tuple[float, ...], channels: int) -> tuple[float, ...]:
    """Per-channel statistics for `channels`: one grey value repeated for colour, colour values averaged for grey."""
    if len(values) == channels:
        return tuple(values)
    if len(values) == 1:
        return tuple(values) * channels
    if channels == 1:
        return (sum(values) / len(values),)
    raise ValueError(f"cannot map statistics of {len(values)} channels to {channels} channels")


class ConvertMode:
    """PIL image -> the same image in `mode` ("L" or "RGB"), as `PIL.Image.convert` does it."""

    def __init__(self, mode: str) -> None:
        self.mode = mode

    def __call__(self, image: Image.Image) -> Image.Image:
        return image.convert(self.mode)


def normalize(images: torch.Tensor, mean: tuple[float, ...], std: tuple[float, ...]) -> torch.Tensor:
    """uint8 images (..., C, H, W) -> float32 (x / 255 - mean) / std, per channel (statistics adapted to C)."""
    channels = images.shape[-3]
    mean_t = torch.tensor(channel_stats(mean, channels), device=images.device).view(-1, 1, 1)  # (C, 1, 1)
    std_t = torch.tensor(channel_stats(std, channels), device=images.device).view(-1, 1, 1)  # (C, 1, 1)
    return (images.float() / 255 - mean_t) / std_t


def eval_transform(img_size: tuple[int, int], channels: int) -> v2.Compose:
    """PIL image -> uint8 (C, H, W): the model's channels, shorter side resized, centre crop of `img_size`."""
    return v2.Compose(
        [
            ConvertMode(image_mode(channels)),
            v2.Resize(min(img_size), antialias=True),
            v2.CenterCrop(img_size),
            v2.PILToTensor(),
        ]
    )


def preprocess(
    image: Image.Image, img_size: tuple[int, int], channels: int, mean: tuple[float, ...], std: tuple[float, ...]
) -> torch.Tensor:
    """One image as a model sees it in evaluation: `eval_transform`, then `normalize` -> float (C, H, W)."""
    return normalize(eval_transform(img_size, channels)(image), mean, std)


def train_transform(
    img_size: tuple[int, int], channels: int, min_scale: float = 0.25, hflip: float = 0.5, randaugment: int = 0
) -> v2.Compose:
    """PIL image -> randomly augmented uint8 (C, H, W) in the model's channels (normalise batches with `normalize`).

    Args:
        img_size: output (H, W).
        channels: the model's input channels (1 or 3).
        min_scale: random resized crop keeps between `min_scale` and all of the image area (aspect 3/4 to 4/3).
        hflip: probability of a horizontal flip (0 for data whose meaning flips, like digits).
        randaugment: RandAugment magnitude (0 to 30); 0 turns it off.
    """
    if not 0.0 < min_scale <= 1.0:
        raise ValueError(f"min_scale must be in (0, 1], got {min_scale}")
    if not 0.0 <= hflip <= 1.0:
        raise ValueError(f"hflip must be a probability in [0, 1], got {hflip}")
    if not 0 <= randaugment <= 30:
        raise ValueError(f"randaugment magnitude must be in 0..30 (0 is off), got {randaugment}")
    steps: list[v2.Transform] = [
        ConvertMode(image_mode(channels)),
        v2.RandomResizedCrop(img_size, scale=(min_scale, 1.0), antialias=True),
    ]
    if hflip > 0:
        steps.append(v2.RandomHorizontalFlip(hflip))
    if randaugment > 0:
        steps.append(v2.RandAugment(magnitude=randaugment))
    return v2.Compose([*steps, v2.PILToTensor()])
