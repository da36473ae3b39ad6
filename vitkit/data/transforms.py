"""Image transforms (torchvision transforms v2): PIL image -> uint8 tensor (C, H, W) for a model, and the
normalisation to float, applied to whole batches (cheaper than per image, and on the GPU when there is one).
Geometry runs on the PIL image, which is faster than on a tensor for the small images vitkit trains on.

Every image is first brought to 8 bits and to the model's channels by one rule (`convert_image`), so one pipeline
serves any mix of files:

- 16-bit images (PIL modes I;16, I;16B, I;16L; and I, which PIL makes of 16-bit PGM files) are scaled from
  0..65535 to 0..255 (x * 255 / 65535, rounded), not clipped; an I image whose TIFF header states another bit
  depth is scaled by that depth. Float images (mode F) are intensities in [0, 1], scaled by 255.
  Values outside those ranges are an error (`ImageModeError`), never clipped.
- Transparent images (RGBA, LA, PA, RGBa, and palette or RGB images with a transparent colour) are composited on
  a white background, as transformers' `convert_to_rgb` and most image viewers show them; the alpha channel is
  then gone.
- Palette (P), CMYK, YCbCr, HSV and bilevel (1) images are converted by PIL (CMYK without a colour profile).
- A 3-channel model gets grey images repeated in R, G and B; a 1-channel model gets colour images as their
  luma L = 0.299 R + 0.587 G + 0.114 B (ITU-R 601-2, PIL's formula).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from PIL import Image
from torchvision import tv_tensors
from torchvision.transforms import v2

CHANNEL_MODES = {1: "L", 3: "RGB"}  # model input channels -> PIL mode the image is converted to
BACKGROUND = (255, 255, 255)  # transparent pixels are composited on white
HIGH_DEPTH_MODES = ("I;16", "I;16B", "I;16L", "I;16N", "I", "F")  # scaled to 8 bits by `to_8bit`
# 8-bit modes `convert_image` reads; every other mode (after `to_8bit`) is refused with its name.
EIGHT_BIT_MODES = ("1", "L", "LA", "P", "PA", "RGB", "RGBA", "RGBa", "RGBX", "CMYK", "YCbCr", "HSV")


class ImageModeError(ValueError):
    """An image whose mode or values vitkit does not convert (an unsupported mode, a 16-bit value out of range,
    a float image outside [0, 1])."""


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


def _bit_depth(image: Image.Image) -> int:
    """Bits per sample of a 16- or 32-bit integer image: the TIFF header's when it states one, else 16 (PIL reads
    16-bit PNG as I;16 and 16-bit PGM as I, already spread over 0..65535 whatever the file's maxval)."""
    if image.mode.startswith("I;16"):
        return 16
    tags = getattr(image, "tag_v2", None)
    bits = tags.get(258) if tags is not None else None  # TIFF BitsPerSample
    if isinstance(bits, tuple):
        bits = bits[0] if bits else None
    return bits if isinstance(bits, int) and 8 <= bits <= 32 else 16


def integer_depth(image: Image.Image) -> tuple[int, int] | None:
    """(bits per sample, the largest value) of a 16- or 32-bit integer image (`to_8bit` maps 0..2^bits - 1 to
    0..255); None for other images. Decodes the pixels."""
    if image.mode not in HIGH_DEPTH_MODES or image.mode == "F":
        return None
    return _bit_depth(image), int(np.asarray(image).max())


def to_8bit(image: Image.Image) -> Image.Image:
    """A 16-bit or float grey image as an 8-bit one ("L"), scaled by its range; other images unchanged.

    Integer images of b bits map 0..2^b - 1 to 0..255 (rounded); float images map [0, 1] to 0..255. ImageModeError
    (naming the range found) for values outside the range: they are not clipped.
    """
    if image.mode not in HIGH_DEPTH_MODES:
        return image
    values = np.asarray(image)
    if image.mode == "F":
        if np.isnan(values).any():
            raise ImageModeError("float image (mode F) holds NaN values")
        low, high, top = float(values.min()), float(values.max()), 1.0
        if low < 0.0 or high > 1.0:
            raise ImageModeError(
                f"float image (mode F) has values in [{low:g}, {high:g}]; vitkit reads float images as "
                "intensities in [0, 1] (save 8- or 16-bit integers instead)"
            )
    else:
        bits = _bit_depth(image)
        top = float(2**bits - 1)
        low, high = int(values.min()), int(values.max())
        if low < 0 or high > top:
            raise ImageModeError(
                f"{bits}-bit image (mode {image.mode}) has values in [{low}, {high}], outside 0..{int(top)}"
            )
    scaled = np.rint(values.astype(np.float64) * (255.0 / top)).astype(np.uint8)
    return Image.fromarray(scaled)  # (H, W) uint8: mode "L"


def _has_alpha(image: Image.Image) -> bool:
    return image.mode in ("LA", "PA", "RGBA", "RGBa") or image.has_transparency_data


def convert_image(image: Image.Image, channels: int) -> Image.Image:
    """`image` as 8 bits in the model's channels ("L" for 1, "RGB" for 3), by the rule in the module docstring.

    ImageModeError for a mode vitkit does not convert (e.g. LAB) or values out of range.
    """
    mode = image_mode(channels)
    image = to_8bit(image)
    if image.mode not in EIGHT_BIT_MODES:
        raise ImageModeError(f"image mode {image.mode} is not supported; vitkit reads {', '.join(EIGHT_BIT_MODES)}")
    if _has_alpha(image):
        background = Image.new("RGBA", image.size, BACKGROUND)
        image = Image.alpha_composite(background, image.convert("RGBA"))
    return image if image.mode == mode else image.convert(mode)


class ConvertImage:
    """PIL image -> the same image in 8 bits and the model's `channels`, by `convert_image`'s rule."""

    def __init__(self, channels: int) -> None:
        image_mode(channels)  # ValueError for channels other than 1 and 3
        self.channels = channels

    def __call__(self, image: Image.Image) -> Image.Image:
        return convert_image(image, self.channels)


def normalize(images: torch.Tensor, mean: tuple[float, ...], std: tuple[float, ...]) -> torch.Tensor:
    """uint8 images (..., C, H, W) -> float32 (x / 255 - mean) / std, per channel (statistics adapted to C)."""
    channels = images.shape[-3]
    mean_t = torch.tensor(channel_stats(mean, channels), device=images.device).view(-1, 1, 1)  # (C, 1, 1)
    std_t = torch.tensor(channel_stats(std, channels), device=images.device).view(-1, 1, 1)  # (C, 1, 1)
    return (images.float() / 255 - mean_t) / std_t


INTERPOLATIONS = {
    "bilinear": v2.InterpolationMode.BILINEAR,
    "bicubic": v2.InterpolationMode.BICUBIC,
    "nearest": v2.InterpolationMode.NEAREST,
}  # how an evaluation resize samples: the names timm's pretrained_cfg uses
CROP_MODES = ("center", "squash")  # timm's crop_mode names


@dataclass(frozen=True)
class Framing:
    """How an image becomes a model's input in evaluation, as the weights were evaluated by their publishers
    (timm's pretrained_cfg: crop_pct, interpolation, crop_mode; transformers' image processors).

    "center": resized, its aspect kept, to the smallest size that covers (H / crop_pct, W / crop_pct) (the shorter
    side to floor(H / crop_pct) for a square model, timm's and torchvision's `Resize(int)`), then the centre
    (H, W) cut out. "squash": resized to (floor(H / crop_pct), floor(W / crop_pct)) whatever its aspect, then the
    centre (H, W) (transformers' ViTImageProcessor: crop_pct 1, the whole image squashed to (H, W)).
    """

    crop_pct: float = 1.0  # the share of the resized image's side the crop keeps, in (0, 1]
    interpolation: str = "bilinear"  # one of INTERPOLATIONS
    crop_mode: str = "center"  # one of CROP_MODES

    def __post_init__(self) -> None:
        if isinstance(self.crop_pct, bool) or not (isinstance(self.crop_pct, int | float) and 0 < self.crop_pct <= 1):
            raise ValueError(f"crop_pct must be a number in (0, 1], got {self.crop_pct!r}")
        if not isinstance(self.interpolation, str) or self.interpolation not in INTERPOLATIONS:
            raise ValueError(f"interpolation must be one of {list(INTERPOLATIONS)}, got {self.interpolation!r}")
        if not isinstance(self.crop_mode, str) or self.crop_mode not in CROP_MODES:
            raise ValueError(f"crop_mode must be one of {list(CROP_MODES)}, got {self.crop_mode!r}")

    def resized_size(self, image_size: tuple[int, int], img_size: tuple[int, int]) -> tuple[int, int] | int:
        """What an image of `image_size` (h, w) is resized to before the centre crop of `img_size` (H, W): (h', w'),
        or one int, the shorter side's length (torchvision's `Resize(int)`, the long side truncated), for a square
        model in "center" mode."""
        (h, w), (H, W) = image_size, img_size
        Hs, Ws = math.floor(H / self.crop_pct + 1e-6), math.floor(W / self.crop_pct + 1e-6)  # 224 / 0.875 = 256
        if self.crop_mode == "squash":
            return Hs, Ws
        if Hs == Ws:
            return Hs
        factor = max(Hs / h, Ws / w)
        return max(Hs, round(h * factor)), max(Ws, round(w * factor))

    def crop_box(self, image_size: tuple[int, int], img_size: tuple[int, int]) -> tuple[float, float, float, float]:
        """The part of an image of `image_size` (h, w) the model sees, in its pixels: (left, top, right, bottom)."""
        (h, w), (H, W) = image_size, img_size
        size = self.resized_size(image_size, img_size)
        if isinstance(size, int):  # the shorter side to `size`: the same scale on both sides
            scale_y = scale_x = size / min(h, w)
        else:
            scale_y, scale_x = size[0] / h, size[1] / w
        crop_h, crop_w = min(H / scale_y, h), min(W / scale_x, w)
        left, top = (w - crop_w) / 2, (h - crop_h) / 2
        return left, top, left + crop_w, top + crop_h

    def resize(self, image: Image.Image, img_size: tuple[int, int]) -> Image.Image:
        size = self.resized_size((image.height, image.width), img_size)
        return v2.functional.resize(
            image, size if isinstance(size, int) else list(size), INTERPOLATIONS[self.interpolation], antialias=True
        )


def non_default_framing(entries: dict[str, Any]) -> dict[str, Any]:
    """`Framing` entries (crop_pct, interpolation, crop_mode; None: not said) as a model's `ModelInfo` keeps them:
    those given that differ from the default (checked: ValueError for a value `Framing` refuses)."""
    default = Framing()
    Framing(**{k: v for k, v in entries.items() if v is not None})
    return {k: v for k, v in entries.items() if v is not None and v != getattr(default, k)}


class ResizeToCover:
    """PIL image -> the image resized as `framing` says before its centre crop of (H, W); by default (bilinear,
    aspect kept) to the smallest size that covers (H, W): scaled by the larger of H / height and W / width, so a
    centre crop of (H, W) leaves no side short. For a square (H, W) it is torchvision's `Resize(H)` (the shorter
    side to H)."""

    def __init__(self, size: tuple[int, int], framing: Framing | None = None) -> None:
        self.size = size
        self.framing = framing or Framing()

    def __call__(self, image: Image.Image) -> Image.Image:
        return self.framing.resize(image, self.size)


def center_crop_share(image_size: tuple[int, int], img_size: tuple[int, int], framing: Framing | None = None) -> float:
    """The share of an image of `image_size` (height, width) that `eval_transform` keeps for a model of `img_size`
    (H, W): the crop's area over the image's (`Framing.crop_box`); 1.0 for an image of the model's shape, 0.5 for
    a 2:1 one under a square model (by default)."""
    left, top, right, bottom = (framing or Framing()).crop_box(image_size, img_size)
    return min(1.0, (right - left) * (bottom - top) / (image_size[0] * image_size[1]))


def eval_transform(img_size: tuple[int, int], channels: int, framing: Framing | None = None) -> v2.Compose:
    """PIL image -> uint8 (C, H, W): the model's channels (`convert_image`), resized as `framing` says (by default:
    to cover `img_size`, the shorter side to its side for a square model, bilinear), centre crop of `img_size`."""
    return v2.Compose(
        [
            ConvertImage(channels),
            ResizeToCover(tuple(img_size), framing),
            v2.CenterCrop(img_size),
            v2.PILToTensor(),
        ]
    )


def preprocess(
    image: Image.Image,
    img_size: tuple[int, int],
    channels: int,
    mean: tuple[float, ...],
    std: tuple[float, ...],
    framing: Framing | None = None,
) -> torch.Tensor:
    """One image as a model sees it in evaluation: `eval_transform`, then `normalize` -> float (C, H, W)."""
    return normalize(eval_transform(img_size, channels, framing)(image), mean, std)


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
        ConvertImage(channels),
        v2.RandomResizedCrop(img_size, scale=(min_scale, 1.0), antialias=True),
    ]
    if hflip > 0:
        steps.append(v2.RandomHorizontalFlip(hflip))
    if randaugment > 0:
        steps.append(v2.RandAugment(magnitude=randaugment))
    return v2.Compose([*steps, v2.PILToTensor()])


def detection_train_transform(
    short_side: int, max_size: int | None = None, hflip: float = 0.5, scale_jitter: float = 0.0, crop: float = 0.0
) -> tuple[v2.Compose, v2.Compose]:
    """The training augmentation of detection samples, as DETR trains: a horizontal flip, a random crop, then a
    resize to a random shorter side (multi-scale training); as two transforms of (PIL image, {"boxes":
    tv_tensors.BoundingBoxes, "labels": (n,) tensor, ...}), each drawn under its own seed: the flip and crop, drawn
    for each image, and the resize, drawn once for a batch (so its images share a size and pad little, as mmdet's
    `BatchSyncRandomResize`). Boxes follow the image; those left without area are dropped with their labels (and
    with every other (n,) tensor the dict holds under `DETECTION_BOX_KEYS`).

    Args:
        short_side, max_size: the shorter side the images are resized to in evaluation, and the most the longer
            side may be (the shorter side shrinks to fit), as `vitkit.data.CocoDetection` resizes them.
        hflip: probability of a horizontal flip (0 for data whose meaning flips).
        scale_jitter: the shorter side is drawn uniformly from the integers in short_side * (1 -+ scale_jitter).
        crop: probability of a random crop (SSD's, torchvision's `RandomIoUCrop` without its IoU condition): each
            side keeps CROP_MIN_SCALE to all of its length, the aspect within CROP_ASPECT of the image's (so an
            image keeps its orientation), and a box is kept, clipped to the crop, when its centre lies inside. An
            image without boxes is not cropped.
    """
    if short_side <= 0 or max_size is not None and max_size <= 0:
        raise ValueError(f"short_side and max_size must be positive, got {short_side} and {max_size}")
    for name, p in (("hflip", hflip), ("crop", crop)):
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"{name} must be a probability in [0, 1], got {p}")
    if not 0.0 <= scale_jitter < 1.0:
        raise ValueError(f"scale_jitter must be in [0, 1) (0 is off), got {scale_jitter}")
    per_image: list[v2.Transform] = []
    if hflip > 0:
        per_image.append(v2.RandomHorizontalFlip(hflip))
    if crop > 0:
        per_image.append(v2.RandomApply([_RelativeAspectCrop(CROP_MIN_SCALE, CROP_ASPECT)], p=crop))
    low, high = jittered_sides(short_side, scale_jitter)
    per_batch = [
        v2.RandomShortestSize(list(range(low, high + 1)), max_size, antialias=True),
        v2.SanitizeBoundingBoxes(min_size=1, labels_getter=_box_tensors),
    ]
    return v2.Compose(per_image), v2.Compose(per_batch)


def jittered_sides(short_side: int, scale_jitter: float) -> tuple[int, int]:
    """(smallest, largest) shorter side of multi-scale training: short_side * (1 -+ scale_jitter), rounded."""
    return max(round(short_side * (1 - scale_jitter)), 1), round(short_side * (1 + scale_jitter))


CROP_MIN_SCALE = 0.5  # a random crop keeps at least this share of each side
CROP_ASPECT = (0.75, 4 / 3)  # and an aspect (width over height) within these factors of the image's
DETECTION_BOX_KEYS = ("labels", "index")  # (n,) tensors of a target dict that follow its boxes


def _box_tensors(inputs: tuple) -> tuple[torch.Tensor, ...]:
    """The (n,) tensors of a sample's target dict that `SanitizeBoundingBoxes` drops with their boxes."""
    target = inputs[1] if len(inputs) == 2 and isinstance(inputs[1], dict) else inputs[0][1]
    return tuple(target[key] for key in DETECTION_BOX_KEYS if key in target)


class _RelativeAspectCrop(v2.Transform):
    """torchvision's `RandomIoUCrop` with no IoU condition (a crop keeps the boxes whose centres it holds) and its
    aspect range relative to the image's; a sample without boxes passes unchanged (there is no box to keep)."""

    def __init__(self, min_scale: float, aspect: tuple[float, float]) -> None:
        super().__init__()
        self.min_scale, self.aspect = min_scale, aspect

    def forward(self, *inputs: object) -> object:
        sample = inputs if len(inputs) > 1 else inputs[0]
        flat = _flatten(sample)
        boxes = [b for b in flat if isinstance(b, tv_tensors.BoundingBoxes)]
        if not boxes or boxes[0].shape[0] == 0:
            return sample
        height, width = boxes[0].canvas_size
        low, high = (width / height * factor for factor in self.aspect)
        return v2.RandomIoUCrop(self.min_scale, 1.0, low, high, sampler_options=[0.0])(*inputs)


def _flatten(sample: object) -> list:
    if isinstance(sample, dict):
        return [x for v in sample.values() for x in _flatten(v)]
    if isinstance(sample, list | tuple):
        return [x for v in sample for x in _flatten(v)]
    return [sample]
