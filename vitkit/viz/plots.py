"""Plots: the confusion matrix of an evaluation (Pillow alone), and cost and activation memory against image size
(matplotlib, installed with the `plot` extra)."""

from __future__ import annotations

import torch
from PIL import Image, ImageDraw, ImageFont

from vitkit.analysis.report import ScalePoint, crossover
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


def plot_scaling(points: list[ScalePoint], path: str, title: str) -> None:
    """Draw FLOPs (N^2 and linear terms) and peak activation memory against image side to a PNG."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as err:
        raise OSError("plotting needs matplotlib: pip install 'vitkit[plot]'") from err
    sides = [p.side for p in points]
    fig, (ax_flops, ax_mem) = plt.subplots(1, 2, figsize=(11, 4.2))
    ax_flops.plot(sides, [p.quadratic_flops / 1e9 for p in points], "o-", label="attention N^2 terms")
    ax_flops.plot(sides, [p.linear_flops / 1e9 for p in points], "s-", label="linear terms (qkv, proj, MLP, ...)")
    cross = crossover(points)
    if cross is not None:
        ax_flops.axvline(cross.side, color="grey", linestyle="--")
        ax_flops.annotate(
            f"N^2 terms dominate from {cross.side}px\n({cross.tokens} tokens)",
            (cross.side, cross.linear_flops / 1e9),
            xytext=(12, -90),
            textcoords="offset points",
        )
    ax_flops.set(xlabel="image side (px)", ylabel="GFLOPs per forward", yscale="log", title=title)
    ax_flops.legend()
    ax_mem.plot(sides, [p.activation_bytes_sdpa / 2**20 for p in points], "o-", label="sdpa (fused)")
    ax_mem.plot(sides, [p.activation_bytes_math / 2**20 for p in points], "s-", label="math (explicit N x N)")
    ax_mem.set(xlabel="image side (px)", ylabel="peak activations (MiB)", yscale="log", title="activation memory")
    ax_mem.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
