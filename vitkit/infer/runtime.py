"""Where and how a model runs: the device (a GPU when there is one) and the precision of its forward pass.

Training and inference both use these.
"""

from __future__ import annotations

import dataclasses

import torch

from vitkit.analysis.precision import StepTimes, time_step
from vitkit.kernels.probe import config_digest, measured


def resolve_device(device: str | None) -> str:
    """ "cuda" when asked for or, with `device` None, when a GPU is present; otherwise "cpu"."""
    if device is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'cpu' or 'cuda', got {device!r}")
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' was asked for but torch sees no CUDA GPU")
    return device


def autocast(device: torch.device, precision: str) -> torch.autocast:
    """bfloat16 autocast for precision "bf16", a disabled context for "fp32"."""
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16")


PROBE_BATCH = 8  # the most images of the forward `inference_step_times` times
FORWARD_TIMES_FILE = "forward_times.json"  # its times per machine and model, in `vitkit.kernels.probe.cache_dir()`


def probe_images(model: torch.nn.Module, batch: int, i: int, generator: torch.Generator) -> torch.Tensor:
    """Round `i`'s random images (min(batch, PROBE_BATCH), C, H, W) of `model`'s input size, for timing its forward:
    a detector's width grows by 16 px a round, as photographs' shapes differ, so that each round sets up kernels
    for a new shape as a detector's inference does."""
    from vitkit.layers import to_2tuple
    from vitkit.models.interface import VitkitDetector

    config = model.config
    height, width = to_2tuple(config.img_size)
    width += 16 * i if isinstance(model, VitkitDetector) else 0
    return torch.randn(min(batch, PROBE_BATCH), config.in_chans, height, width, generator=generator)


def inference_step_times(model: torch.nn.Module, device: str | torch.device, batch: int = 1) -> StepTimes:
    """`model`'s inference forward timed in fp32 and under bf16 autocast (`vitkit.analysis.precision.time_step`), on
    `probe_images`, `batch` of them: where a command's `--precision auto` meets products that favour bf16, the model
    decides. Measured once per machine: cached as the products' rates are (`vitkit.kernels.probe.measured`), under
    the model's class and config, the device and the images' batch."""
    device, generator = torch.device(device), torch.Generator().manual_seed(0)
    model.eval()

    def step(autocast_on: bool, i: int) -> None:
        images = probe_images(model, batch, i, generator).to(device)
        with torch.inference_mode(), autocast(device, "bf16" if autocast_on else "fp32"):
            model(images)

    def measure() -> dict[str, float]:
        return dataclasses.asdict(time_step(step))

    what = f"{type(model).__name__} {config_digest(model.config)} | forward | {min(batch, PROBE_BATCH)} images"
    key = f"{what} on {device.type}"
    return StepTimes(**measured(FORWARD_TIMES_FILE, ("fp32", "bf16"), measure, what=key, isolate=False))
