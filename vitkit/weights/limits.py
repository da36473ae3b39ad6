"""Shared export checks: what other libraries' versions of a vitkit family cannot express."""

from __future__ import annotations

from vitkit.models.swin import SwinConfig


def _stage_sizes(img_size: int | tuple[int, int], patch_size: int, stages: int) -> list[tuple[int, int]]:
    """A Swin model's map size per stage at its image size."""
    H, W = (img_size, img_size) if isinstance(img_size, int) else img_size
    return [(H // patch_size // 2**s, W // patch_size // 2**s) for s in range(stages)]


def check_swin_windows(config: SwinConfig, target: str) -> None:
    """ValueError when a stage's map is smaller than the window: vitkit then shrinks the window and its bias table
    to the map (as timm does), where `target` keeps the full window."""
    for s, (H, W) in enumerate(_stage_sizes(config.img_size, config.patch_size, len(config.depths))):
        if min(H, W) < config.window_size:
            raise ValueError(
                f"{target} keeps window_size {config.window_size} at every stage, but stage {s} of this model is "
                f"{H}x{W} (its window and bias table shrink to the map); use a larger img_size or window_size <= {H}"
            )
