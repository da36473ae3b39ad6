"""The data of the attention explorer (`vitkit explore`, drawn by `vitkit.viz.explorer`), one of three kinds:

- "tokens" (ViT, DeiT, registers): for each image, every selected layer's and head's attention over all tokens, so
  that the page can show where any token (a patch, the class token, a register) looks; attention rollout through
  each layer; the prediction.
- "grid" (Swin, BoTNet): each layer's attention as the model lays it on the image (`spatial_attention`): every
  cell's weights over its keys (a window, or the whole feature map); the prediction.
- "detector" (DETR, Deformable DETR): the detections, and in every decoder layer what each one's query attended to
  (a dense map, or sampling points), with its mask where the model predicts masks; the encoder at any point (DETR's
  self-attention, Deformable DETR's points).

Every page carries the model's costs (`vitkit.profile`) at the size its images run at: a classifier's at its
`img_size`, a detector's for each image at the size that image was resized to (and at the model's `img_size` besides).

Size: the weights are quantised to 8 bits per row (each row's largest weight is 255, the row's scale kept as a
float32), then deflated (zlib's format); the page inflates them itself as it loads, so that its first view is drawn by
the time the page has loaded. A value is read back as q / 255 * scale, within scale / 510 of the captured weight.

Letters: L layers, h heads, N tokens (P prefix tokens, then the Hp x Wp patch grid), K classes.
"""

from __future__ import annotations

import base64
import io
import zlib
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import torch
from PIL import Image
from torch import nn

from vitkit.analysis import profile
from vitkit.analysis.available import available_memory
from vitkit.analysis.profile import category, group_key
from vitkit.analysis.report import grouped, shape_flow, shares
from vitkit.data import preprocess
from vitkit.errors import OptionError
from vitkit.infer.attention import capture_layers, framing_of, prefix_token_names, rollouts
from vitkit.infer.detect import add_masks, detector_inputs, detector_outputs, image_detections, reading
from vitkit.infer.object_attention import sampled_points
from vitkit.layers import AttentionPool, attention_layers, capture_attention, to_2tuple
from vitkit.layers.deformable import SampledAttention
from vitkit.models.interface import VitkitDetector
from vitkit.models.registry import family_of
from vitkit.util import counted
from vitkit.viz.attention import COLORMAP, model_view
from vitkit.viz.detection import POINT_COLOURS
from vitkit.weights import ModelInfo

TOP = 5  # classes listed with the prediction


def quantise(weights: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """Attention weights (..., N) -> (uint8 codes (..., N), float32 scales (...,)): each row's largest weight is 255."""
    w = weights.detach().double().cpu()
    scale = w.amax(dim=-1).clamp_min(1e-30)  # (...,)
    codes = torch.round(w / scale[..., None] * 255).to(torch.uint8)
    return codes.numpy(), scale.float().numpy()


def dequantise(codes: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """What the page reads back: codes / 255 * scale, per row."""
    return codes.astype(np.float64) / 255 * scales[..., None]


def _packed(array: np.ndarray) -> str:
    """An array's bytes deflated (zlib's format, which the page inflates), as base64."""
    return base64.b64encode(zlib.compress(np.ascontiguousarray(array).tobytes(), 9)).decode("ascii")


def _png(image: Image.Image) -> str:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG", optimize=True)
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def _selected(count: int, chosen: Sequence[int] | None, what: str) -> list[int]:
    """The indices `chosen` (negative ones from the end) of `count` layers or heads, each checked; all without."""
    if chosen is None:
        return list(range(count))
    picked = []
    for i in chosen:
        if not -count <= i < count:
            raise ValueError(f"{what} {i} is out of range: the model has {count} {what}s (0..{count - 1})")
        picked.append(i % count)
    return sorted(set(picked))


def image_data(
    model: nn.Module,
    image: Image.Image,
    mean: Sequence[float],
    std: Sequence[float],
    class_names: Sequence[str] | None = None,
    layers: Sequence[int] | None = None,
    heads: Sequence[int] | None = None,
    label: str = "",
) -> dict[str, Any]:
    """One image's part of the page: the model's view of it, the selected layers' and heads' attention (quantised),
    the rollout through each selected layer, the top classes."""
    config = model.config
    img_size = to_2tuple(config.img_size)
    device = next(model.parameters()).device
    framing = framing_of(model)
    pixels = preprocess(image, img_size, config.in_chans, tuple(mean), tuple(std), framing)[None].to(device)
    output, maps, _, _ = capture_layers(model, pixels)
    L = _selected(len(maps), layers, "layer")
    H = _selected(maps[0].shape[1], heads, "head")
    attn = torch.stack([maps[i][0, H].float().cpu() for i in L])  # (L', h', N, N)
    through = [r[0] for r in rollouts([m.float().cpu() for m in maps], None)]  # through each layer: L of (N, N)
    through = torch.stack([through[i] for i in L])  # (L', N, N)
    codes, scales = quantise(attn)
    rollout_codes, rollout_scales = quantise(through)
    top = _top(model, output, class_names)
    return {
        "label": label,
        "view": _png(model_view(image, img_size, channels=config.in_chans, framing=framing)),
        "attention": _packed(codes),
        "scales": _packed(scales),
        "rollout": _packed(rollout_codes),
        "rollout_scales": _packed(rollout_scales),
        "top": top,
    }


def costs(model: nn.Module, img_size: tuple[int, int] | None = None) -> dict[str, Any]:
    """The costs panel of one image of `img_size` (H, W) (default: the model's `img_size`): the input size, totals,
    each block's FLOPs, attention share and activations written, the shape flow."""
    img_size = to_2tuple(model.config.img_size) if img_size is None else (int(img_size[0]), int(img_size[1]))
    report = profile(model, img_size, batch=1)
    attention: dict[str, int] = {}
    for op in report.ops:
        if category(op.module, report.parts) == "attention":
            key = group_key(op.module, "block", report.parts)
            attention[key] = attention.get(key, 0) + op.flops
    rows = [
        [row.name, row.flops / 1e9, attention.get(row.name, 0) / max(row.flops, 1), row.out_bytes / 2**20]
        for row in grouped(report, "block")
    ]
    return {
        "input": list(img_size),
        "params": report.params,
        "gflops": report.flops / 1e9,
        "attention_share": shares(report).get("attention", 0.0),
        "activation_mib": report.activation_bytes / 2**20,
        "blocks": rows,
        "shape_flow": _one_block(report),
    }


def _one_block(report: Any) -> list[str]:
    """`shape_flow`'s lines of the block holding the first attention layer only (a ResNet's stages group many)."""
    first = next((op.module for op in report.ops if op.op == "qkv"), None)
    if first is None:
        return []
    block = first.rpartition(".")[0]
    return [line for line in shape_flow(report) if line.split()[0].startswith(block)]


def explorer_data(
    model: nn.Module,
    images: Sequence[tuple[str, Image.Image]],
    mean: Sequence[float],
    std: Sequence[float],
    class_names: Sequence[str] | None = None,
    name: str = "",
    layers: Sequence[int] | None = None,
    heads: Sequence[int] | None = None,
) -> dict[str, Any]:
    """Everything the explorer page shows of `model` on `images` ((label, image) pairs): see the module docstring.

    Args:
        model: a model whose attention layers attend over one token grid of the whole image (ViT, DeiT, with or
            without registers); others are refused with the reason.
        images: the images, each with the label the page lists it by (its file name).
        mean, std: the normalisation the model was trained with.
        class_names: the classifier's class names, in label order.
        name: what the page calls the model (its directory or registered name).
        layers, heads: the layers and heads kept (default: all); fewer make a smaller file.
    """
    if not images:
        raise ValueError("the explorer needs at least one image")
    config = model.config
    tokens = model.token_grid(to_2tuple(config.img_size))
    if tokens is None and callable(getattr(model, "spatial_attention", None)) and not isinstance(model, VitkitDetector):
        return grid_explorer_data(model, images, mean, std, class_names, name)
    if tokens is None:
        raise ValueError(
            f"{family_of(model).display_name} neither attends over one grid of patches (`token_grid`) nor lays its "
            "attention on the image (`spatial_attention`); a detector's page is detector_explorer_data's"
        )
    prefix, grid = tokens
    _check_size(model, len(images), prefix + grid[0] * grid[1], layers, heads)
    pages = [image_data(model, image, mean, std, class_names, layers, heads, label) for label, image in images]
    maps_layers = len(_attention_layers(model))
    h = config.num_heads
    L = _selected(maps_layers, layers, "layer")
    H = _selected(h, heads, "head")
    return _page(
        "tokens",
        model,
        name,
        f"{counted(maps_layers, 'layer')} x {counted(h, 'head')}",
        grid=list(grid),
        patch=config.patch_size,
        prefix=list(prefix_token_names(model)),
        tokens=prefix + grid[0] * grid[1],
        layers=L,
        heads=H,
        images=pages,
    )


PAGE_MEMORY_SHARE = 0.5  # the largest share of the free memory the page's data may take while it is made


def _check_size(
    model: nn.Module, images: int, N: int, layers: Sequence[int] | None, heads: Sequence[int] | None
) -> None:
    """ValueError, before anything runs, when the selected maps of every image would not fit in memory while the
    page is made: each (N x N) map is held as float32, then float64 while quantised, then as bytes (13 bytes a
    weight), with the rollout through each layer besides."""
    L = len(_selected(len(_attention_layers(model)), layers, "layer"))
    H = len(_selected(model.config.num_heads, heads, "head"))
    needed = images * L * (H + 1) * N * N * 13
    free = available_memory()
    if free is not None and needed > PAGE_MEMORY_SHARE * free:
        raise OptionError(
            lambda name: (
                f"the explorer's data for {images} image(s), {L} layer(s) x {H} head(s) of {N} x {N} attention "
                f"would take about {needed / 2**30:.1f} GiB while the page is made, and {free / 2**30:.1f} GiB are "
                f"free: keep fewer layers ({name('layers', [0, -1])}) or heads ({name('heads', [0])}), or use a "
                "smaller image size"
            )
        )


def _attention_layers(model: nn.Module) -> list[nn.Module]:
    """The model's self-attention layers (an attention pool's probe is none)."""
    return [m for _, m in attention_layers(model) if not isinstance(m, AttentionPool)]


@torch.no_grad()
def detector_image_data(
    model: nn.Module,
    info: ModelInfo,
    image: Image.Image,
    threshold: float,
    postprocessing: Any = None,
    label: str = "",
) -> dict[str, Any]:
    """One image's part of a detector's page: the image, its detections above `threshold` (each query its best
    class, as `vitkit attention` reads them), and for every decoder layer what each detection's query attended to:
    a dense cross-attention's maps over the feature map (DETR; quantised, each head), or a deformable one's sampling
    points in pixels of the image, with their weights (Deformable DETR); each detection's mask (a model with a mask
    head; COCO's compressed RLE, as detections.json holds it); the model's costs at the size the image
    was resized to (`padded`), which is the model's `img_size` only for an image of its shape."""
    names = model.object_attention_layers()
    lays_out = callable(getattr(model, "spatial_attention", None))  # DETR's encoder: its figure 3
    pixels, mask, sizes = detector_inputs(model, info, [image])
    with capture_attention(model) as maps:  # every layer: the decoder's, and the encoder's for a clicked point
        outputs = detector_outputs(model.eval(), pixels, mask)
    one_per_query = replace(reading(model, postprocessing), top_k=None)
    (result,) = one_per_query(outputs, sizes, threshold)
    order = result["scores"].argsort(descending=True, stable=True)
    queries = result["queries"][order].tolist()
    if "pred_masks" in outputs:  # each object's mask (RLE, as detections.json holds it), shown under its query's view
        add_masks(result, outputs["pred_masks"][0], mask[0], tuple(sizes[0].tolist()))
    detections = image_detections(result, info)
    padded = (pixels.shape[-2], pixels.shape[-1])
    real = (int(mask[0, :, 0].sum()), int(mask[0, 0, :].sum()))  # the image's part of the padded input
    layers = []
    for name in names:
        record = maps[name]
        if isinstance(record, SampledAttention):
            samples = sampled_points(record, queries, padded, real, (image.height, image.width))
            layers.append(
                {
                    "points": _packed(samples.points.float().numpy()),  # (n, h, L, K, 2): (x, y) in image pixels
                    "weights": _packed(samples.weights.float().numpy()),  # (n, h, L, K)
                    "shape": list(samples.weights.shape),
                    "levels": [list(s) for s in samples.spatial_shapes],
                }
            )
        else:
            attn = record[0][:, queries].float().cpu()  # (h, n, hw)
            codes, scales = quantise(attn.transpose(0, 1))  # (n, h, hw), per row
            layers.append(
                {
                    "attention": _packed(codes),
                    "scales": _packed(scales),
                    "shape": list(codes.shape),
                    "grid": list(model.feature_grid(padded)),
                }
            )
    encoder = _sampled_encoder(maps, names, padded, real, image) if not lays_out else []
    for a in model.spatial_attention(maps, padded) if lays_out else []:
        codes, scales = quantise(a.weights[0].float().cpu())  # (h, Q, Q): every position over every position
        encoder.append(
            {
                "name": a.layer,
                "grid": list(a.grid),
                "heads": int(codes.shape[0]),
                "attention": _packed(codes),
                "scales": _packed(scales),
            }
        )
    return {
        "label": label,
        "view": _png(image.convert("RGB")),
        "size": [image.height, image.width],
        "encoder": encoder,
        "padded": list(padded),
        "real": list(real),
        "detections": [
            {"label": d.label, "score": d.score, "box": list(d.box), "query": q}
            | ({"mask": d.mask} if d.mask is not None else {})
            for d, q in zip(detections, queries, strict=True)
        ],
        "layers": layers,
        "costs": costs(model, padded),
    }


ENCODER_POINTS_MAX = 4_000_000  # sampling points of a deformable encoder kept in a page (16 bytes each), all layers


def _sampled_encoder(
    maps: dict[str, Any], decoder: Sequence[str], padded: tuple[int, int], real: tuple[int, int], image: Image.Image
) -> list[dict[str, Any]]:
    """A deformable encoder's layers (the sampled layers that are not the decoder's object attention), for the point
    view: the sampling points and weights of the queries of the finest level's positions, in image pixels; none
    when they would exceed `ENCODER_POINTS_MAX` (a full-size model on a large image)."""
    layers = [(n, r) for n, r in maps.items() if isinstance(r, SampledAttention) and n not in decoder]
    if not layers:
        return []
    h0, w0 = layers[0][1].spatial_shapes[0]  # the finest level: its positions lead the queries
    per_layer = h0 * w0 * layers[0][1].weights[0, 0].numel()
    if per_layer * len(layers) > ENCODER_POINTS_MAX:
        return []
    out = []
    for name, record in layers:
        samples = sampled_points(record, list(range(h0 * w0)), padded, real, (image.height, image.width))
        out.append(
            {
                "name": name,
                "grid": [h0, w0],
                "heads": int(samples.weights.shape[1]),
                "points": _packed(samples.points.float().numpy()),  # (h0 w0, h, L, K, 2)
                "weights": _packed(samples.weights.float().numpy()),  # (h0 w0, h, L, K)
                "shape": list(samples.weights.shape),
            }
        )
    return out


def detector_explorer_data(
    model: nn.Module,
    info: ModelInfo,
    images: Sequence[tuple[str, Image.Image]],
    threshold: float,
    postprocessing: Any = None,
    name: str = "",
) -> dict[str, Any]:
    """Everything a detector's explorer page shows: each image's detections and, for the one clicked, what its
    query attended to in every decoder layer, and the model's costs at that image's size (`detector_image_data`);
    the model's costs at its own `img_size`; the colours of the feature levels, as `vitkit attention`'s figure
    colours them (`vitkit.viz.detection.POINT_COLOURS`)."""
    if not images:
        raise ValueError("the explorer needs at least one image")
    pages = [detector_image_data(model, info, image, threshold, postprocessing, label) for label, image in images]
    layers = counted(len(model.object_attention_layers()), "decoder layer")
    return _page("detector", model, name, layers, threshold=threshold, images=pages, level_colours=list(POINT_COLOURS))


def _top(model: nn.Module, output: torch.Tensor, class_names: Sequence[str] | None) -> list[list[Any]]:
    """The most probable classes [name, probability] of a classifier's output (1, K); none for a backbone."""
    if getattr(model.config, "num_classes", 0) <= 0:
        return []
    probabilities = output.float().softmax(dim=-1)[0].cpu()
    values, indices = probabilities.topk(min(TOP, probabilities.numel()))
    return [
        [class_names[k] if class_names else str(k), float(p)] for p, k in zip(values, indices.tolist(), strict=True)
    ]


@torch.no_grad()
def grid_explorer_data(
    model: nn.Module,
    images: Sequence[tuple[str, Image.Image]],
    mean: Sequence[float],
    std: Sequence[float],
    class_names: Sequence[str] | None = None,
    name: str = "",
) -> dict[str, Any]:
    """A page for a model whose attention is laid on the image by its `spatial_attention` (Swin's windows, BoTNet's
    feature maps): for each layer its grid and each cell's keys (`vitkit.models.interface.SpatialAttention`), and
    per image each cell's weights over its keys, quantised per row; the prediction; the costs."""
    config = model.config
    img_size = to_2tuple(config.img_size)
    device = next(model.parameters()).device
    layers: list[dict[str, Any]] = []
    pages = []
    framing = framing_of(model)
    for label, image in images:
        pixels = preprocess(image, img_size, config.in_chans, tuple(mean), tuple(std), framing)[None].to(device)
        model.eval()
        with capture_attention(model) as maps:
            output = model(pixels)
        spatial = model.spatial_attention(maps, img_size)
        if not layers:
            layers = [
                {
                    "name": a.layer,
                    "grid": list(a.grid),
                    "heads": a.weights.shape[1],
                    "keys_per_cell": a.keys.shape[1],
                    "keys": _packed(a.keys.to(torch.int32).numpy()),
                    "note": a.note,
                }
                for a in spatial
            ]
        weights = []
        for a in spatial:
            codes, scales = quantise(a.weights[0].float().cpu())  # (h, Q, K), per row
            weights.append({"attention": _packed(codes), "scales": _packed(scales)})
        pages.append(
            {
                "label": label,
                "view": _png(model_view(image, img_size, channels=config.in_chans, framing=framing)),
                "layers": weights,
                "top": _top(model, output, class_names),
            }
        )
    return _page("grid", model, name, counted(len(layers), "attention layer"), layers=layers, images=pages)


def _page(kind: str, model: nn.Module, name: str, described: str, **fields: Any) -> dict[str, Any]:
    """A page's data: its kind, the model in words (`name`, its family, `described`), `fields`, the costs and the
    colour map."""
    described = f"{family_of(model).display_name}, {described}"
    return {
        "kind": kind,
        "model": f"{name}: {described}" if name else described,
        **fields,
        "costs": costs(model),
        "colormap": [list(rgb) for rgb in COLORMAP],
    }
