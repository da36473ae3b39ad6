"""Plots drawn with Pillow alone: the confusion matrix of an evaluation."""

from __future__ import annotations

import torch
from PIL import Image, ImageDraw, ImageFont

from vitkit.viz.attention import colorize


def confusion_image(confusion: torch.Tensor, classes: list[str] | tuple[str, ...], cell: int = 40) -> Image.Image:
    """A confusion matrix (K, K) (rows: true class, columns: predicted class) as a picture.

    Each cell is coloured by the share of its row (so every class reads on the same scale) and shows its count.
    """
    K = len(classes)
    if confusion.shape != (K, K):
        raise ValueError(f"confusion matrix of shape {tuple(confusion.shape)} does not match {K} classes")
    font = ImageFont.load_default(size=max(cell // 3, 8))
    margin = cell * 2
    image = Image.new("RGB", (margin + K * cell, margin + K * cell), "white")
    draw = ImageDraw.Draw(image)
    counts = confusion.double()
    shares = counts / counts.sum(dim=1, keepdim=True).clamp(min=1)  # (K, K)
    colours = colorize(shares, 0.0, 1.0)  # (K, K, 3)
    for i in range(K):
        for j in range(K):
            x, y = margin + j * cell, margin + i * cell
            draw.rectangle((x, y, x + cell - 1, y + cell - 1), fill=tuple(colours[i, j].tolist()))
            ink = "white" if shares[i, j] < 0.5 else "black"  # readable on the dark and the light end of the map
            draw.text((x + cell / 2, y + cell / 2), str(int(counts[i, j])), fill=ink, font=font, anchor="mm")
    for k, name in enumerate(classes):
        label = name if len(name) <= 8 else name[:7] + "…"
        draw.text((margin + k * cell + cell / 2, margin - 4), label, fill="black", font=font, anchor="md")
        draw.text((margin - 4, margin + k * cell + cell / 2), label, fill="black", font=font, anchor="rm")
    draw.text((margin + K * cell / 2, cell / 2), "predicted", fill="black", font=font, anchor="mm")
    draw.text((4, cell / 2), "true", fill="black", font=font, anchor="lm")
    return image
