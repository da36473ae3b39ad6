"""Windows of a feature map: cut a map (B, H, W, C) into non-overlapping windows and put them back, so attention
within windows is one batched attention over B * nW short sequences (Swin's windows, ViTDet's windowed blocks).

Letters: B batch, H, W map height and width, C channels, nW windows per image, Wh, Ww window height and width.
"""

from __future__ import annotations

import torch


def window_partition(x: torch.Tensor, window_size: tuple[int, int]) -> torch.Tensor:
    """Cut a map (B, H, W, C) into windows (B * nW, Wh, Ww, C), image-major, windows in row-major order.

    H and W must be multiples of the window sides.
    """
    B, H, W, C = x.shape
    Wh, Ww = window_size
    x = x.view(B, H // Wh, Wh, W // Ww, Ww, C)  # (B, H/Wh, Wh, W/Ww, Ww, C)
    x = x.permute(0, 1, 3, 2, 4, 5)  # (B, H/Wh, W/Ww, Wh, Ww, C)
    return x.reshape(-1, Wh, Ww, C)  # (B * nW, Wh, Ww, C)


def window_reverse(windows: torch.Tensor, window_size: tuple[int, int], H: int, W: int) -> torch.Tensor:
    """Inverse of `window_partition`: windows (B * nW, Wh, Ww, C) -> map (B, H, W, C)."""
    Wh, Ww = window_size
    C = windows.shape[-1]
    x = windows.view(-1, H // Wh, W // Ww, Wh, Ww, C)  # (B, H/Wh, W/Ww, Wh, Ww, C)
    x = x.permute(0, 1, 3, 2, 4, 5)  # (B, H/Wh, Wh, W/Ww, Ww, C)
    return x.reshape(-1, H, W, C)  # (B, H, W, C)


def padded_size(size: tuple[int, int], window_size: tuple[int, int]) -> tuple[int, int]:
    """(H, W) rounded up to whole windows."""
    # (n + w - 1) // w, not -(-n // w): under torch.export n is symbolic and the ONNX exporter turns its floor
    # division into ONNX Div, which truncates toward zero, so a negative dividend rounds the wrong way (-8 // 14 -> 0)
    return tuple((n + w - 1) // w * w for n, w in zip(size, window_size, strict=True))  # type: ignore[return-value]


def window_tokens(size: tuple[int, int], window_size: tuple[int, int]) -> torch.Tensor:
    """For a map of `size` (H, W) padded at the bottom and right to whole windows and partitioned: each window's
    tokens as indices into the map's H * W tokens (row-major), -1 for padding: (nW, Wh * Ww) int64."""
    H, W = size
    Hp, Wp = padded_size(size, window_size)
    tokens = torch.full((Hp, Wp), -1, dtype=torch.long)
    tokens[:H, :W] = torch.arange(H * W).view(H, W)
    return window_partition(tokens.view(1, Hp, Wp, 1), window_size).reshape(-1, window_size[0] * window_size[1])
