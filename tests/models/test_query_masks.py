"""The mask head's formula, written out in float64 with its weights off their initial values: the pixel embeddings
x + GELU(W LayerNorm(depthwise 3x3 (x)) + b) of the finest level upsampled to stride 4 (RF-DETR's block), each
pixel's channels normalised (not the map's), and a query's mask logits the dot product of its MLP embedding with
them."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

import vitkit
from vitkit.models.query_masks import QueryMasks, mask_size


def test_pixel_embeddings_and_mask_logits_follow_the_formula():
    torch.manual_seed(0)
    D, B, Q = 8, 2, 3
    head = QueryMasks(D).double()
    with torch.no_grad():
        for p in head.parameters():
            p.add_(torch.randn_like(p) * 0.5)
    finest = torch.randn(B, D, 5, 6, dtype=torch.float64)
    size = mask_size(37, 46)  # a padded image of 37x46: logits 10x12
    assert size == (10, 12)
    pixels = head.pixels(finest, size)

    x = F.interpolate(finest, size=size, mode="bilinear", align_corners=False)  # (B, D, 10, 12)
    neighbours = F.unfold(x, 3, padding=1).view(B, D, 9, *size)  # each pixel's 3x3 neighbourhood, per channel
    kernel = head.pixel_dwconv.weight.view(D, 9)
    y = torch.einsum("bdkhw,dk->bdhw", neighbours, kernel) + head.pixel_dwconv.bias[None, :, None, None]
    mean, var = y.mean(1, keepdim=True), y.var(1, unbiased=False, keepdim=True)  # over each pixel's channels
    y = (y - mean) / torch.sqrt(var + 1e-6) * head.pixel_ln.weight[None, :, None, None]
    y = y + head.pixel_ln.bias[None, :, None, None]
    y = torch.einsum("ed,bdhw->behw", head.pixel_linear.weight, y) + head.pixel_linear.bias[None, :, None, None]
    expected = x + 0.5 * y * (1 + torch.erf(y / math.sqrt(2)))
    torch.testing.assert_close(pixels, expected, rtol=1e-12, atol=1e-12)

    states = torch.randn(4, B, Q, D, dtype=torch.float64)  # 4 decoder layers' queries
    first, second, third = head.mask_embed
    embedding = third(torch.relu(second(torch.relu(first(states)))))  # (4, B, Q, D)
    logits = head(states, pixels)
    assert logits.shape == (4, B, Q, *size)
    for layer, image, query in ((0, 0, 0), (3, 1, 2), (2, 0, 1)):
        want = (embedding[layer, image, query][:, None, None] * expected[image]).sum(0)
        torch.testing.assert_close(logits[layer, image, query], want, rtol=1e-12, atol=1e-12)


def test_a_checkpoint_of_mask_dinos_pixel_path_loads_into_it(tmp_path):
    """A detector saved with Mask DINO's pixel path (earlier vitkit versions' mask head: conv 3x3, GroupNorm, ReLU,
    conv 1x1) loads into a model made so, and predicts the masks it predicted."""
    torch.manual_seed(0)
    model = vitkit.create_model("deformable_detr_digits", masks=True, enc_layers=1, dec_layers=2).eval()
    model.mask_head.use_mask_dino_pixels()
    with torch.no_grad():
        for p in model.mask_head.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    images = torch.randn(1, 3, 96, 96)
    with torch.no_grad():
        want = model.predict(images)["pred_masks"]
    vitkit.save_pretrained(model, tmp_path / "old")
    loaded = vitkit.from_pretrained(tmp_path / "old").eval()
    assert hasattr(loaded.mask_head, "pixel_conv") and not hasattr(loaded.mask_head, "pixel_dwconv")
    with torch.no_grad():
        torch.testing.assert_close(loaded.predict(images)["pred_masks"], want)
    fresh = vitkit.create_model("deformable_detr_digits", masks=True, enc_layers=1, dec_layers=2)
    assert not hasattr(fresh.mask_head, "pixel_conv")  # a new model makes them with the depthwise block


def test_a_lenient_load_of_the_earlier_head_takes_its_weights(tmp_path):
    """`load_weights(..., strict=False)` of a checkpoint of the earlier head loads its pixel path's weights too."""
    torch.manual_seed(0)
    model = vitkit.create_model("deformable_detr_digits", masks=True, enc_layers=1, dec_layers=2)
    model.mask_head.use_mask_dino_pixels()
    with torch.no_grad():
        model.mask_head.pixel_conv.weight.normal_()
    vitkit.save_pretrained(model, tmp_path / "old")
    fresh = vitkit.create_model("deformable_detr_digits", masks=True, enc_layers=1, dec_layers=2)
    report = vitkit.load_weights(fresh, tmp_path / "old" / "model.safetensors", strict=False)
    assert report.missing == [] and report.unexpected == []
    torch.testing.assert_close(fresh.mask_head.pixel_conv.weight, model.mask_head.pixel_conv.weight)
