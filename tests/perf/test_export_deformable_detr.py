"""`export_model` for Deformable DETR: graph inputs images + pixel_mask, outputs pred_logits (B, Q, K) + pred_boxes,
a dynamic batch and image size, exported on the reference path of its deformable attention (`grid_sample`: the
"math" backend ONNX export uses for every attention layer) and checked here against the PyTorch model, on its default
("auto": the gather) path, on padded batches of sizes other than the export's own check."""


import pytest
import torch
from test_export_detr import assert_matches_pytorch

import vitkit
from vitkit.detection import pad_images
from vitkit.layers import attention_layers
from vitkit.perf.export import CHECK_BATCHES, EXPORT_BATCH, _signature, export_model

# deformable_detr_digits' layout (3 levels, strides 8..32, box refinement) at a size that exports in a minute or two
TINY = dict(hidden_dim=32, num_heads=2, dim_feedforward=64, num_queries=7, num_classes=5, backbone_width=8)
SIZE = (96, 128)  # the export size
OUTPUTS = ("pred_logits", "pred_boxes")


def tiny_deformable_detr(**overrides) -> torch.nn.Module:
    torch.manual_seed(0)
    model = vitkit.create_model("deformable_detr_digits", **TINY, enc_layers=1, dec_layers=2, **overrides).eval()
    with torch.no_grad():  # offsets and weights that depend on the query, so that sampling follows the inputs
        for _, layer in attention_layers(model):
            if hasattr(layer, "sampling_offsets"):
                layer.sampling_offsets.weight.normal_(0, 0.05)
                layer.attention_weights.weight.normal_(0, 0.3)
    return model


def batches(size: tuple[int, int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """One image filling `size` alone (batch 1), and four of different sizes padded to `size` (batch 4)."""
    assert EXPORT_BATCH not in (1, 4)
    g = torch.Generator().manual_seed(1)
    H, W = size
    one = pad_images([torch.randn(3, H, W, generator=g)])
    shapes = [(H, W), (H - 17, W), (H, W // 2 + 3), (40, 48)]
    four = pad_images([torch.randn(3, h, w, generator=g) for h, w in shapes])
    return [one, four]


def test_library_exports_deformable_detr_at_any_batch_and_image_size(tmp_path):
    ort = pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    model = tiny_deformable_detr(masks=True)  # with a mask head: its logits are a third output
    with torch.no_grad():  # pixel embeddings off their init: masks that follow the image
        model.mask_head.pixel_linear.bias.normal_(0, 1)
    backends = [layer.backend for _, layer in attention_layers(model)]
    report = export_model(model, tmp_path / "deformable.onnx", "onnx", img_size=SIZE)
    assert list(tmp_path.iterdir()) == [report.path]
    outputs = (*OUTPUTS, "pred_masks")
    assert report.inputs == ("images", "pixel_mask") and report.outputs == outputs and report.attn_backend == "math"
    assert report.dynamic_img_size and report.img_size == SIZE and report.batch_sizes == CHECK_BATCHES
    assert report.check_sizes[0] == SIZE and report.check_sizes[1] != SIZE
    assert 0 <= report.max_diff <= report.atol == 1e-4
    assert [layer.backend for _, layer in attention_layers(model)] == backends == ["auto"] * len(backends)
    session = ort.InferenceSession(str(report.path), providers=["CPUExecutionProvider"])
    images_in, mask_in = session.get_inputs()
    assert (images_in.name, images_in.shape) == ("images", ["batch", 3, "height", "width"])
    assert (mask_in.name, mask_in.shape, mask_in.type) == ("pixel_mask", ["batch", "height", "width"], "tensor(bool)")
    logits_out, boxes_out, masks_out = session.get_outputs()  # K sigmoid logits, no "no object"; no auxiliary ones
    assert (logits_out.name, logits_out.shape[1:]) == ("pred_logits", [7, 5])
    assert (boxes_out.name, boxes_out.shape[1:]) == ("pred_boxes", [7, 4])
    assert (masks_out.name, masks_out.shape[1]) == ("pred_masks", 7)  # (B, Q, H / 4, W / 4)
    for size in [SIZE, (97, 131), (200, 75)]:  # none a multiple of the stride 32
        for images, mask in batches(size):
            with torch.no_grad():
                expected = model(images, mask)  # the gather path
            got = session.run(None, {"images": images.numpy(), "pixel_mask": mask.numpy()})
            for name, value in zip(outputs, got, strict=True):
                torch.testing.assert_close(torch.from_numpy(value), expected[name], atol=1e-4, rtol=0)
            if not mask.all():  # the padding mask reaches the graph
                all_real = session.run(None, {"images": images.numpy(), "pixel_mask": (mask | True).numpy()})
                assert not torch.allclose(torch.from_numpy(all_real[0]), torch.from_numpy(got[0]), atol=1e-3)


def test_torchscript_keeps_the_batch_dynamic_and_fixes_the_image_size(tmp_path):
    """TorchScript's trace bakes the levels' sizes into the graph: the export says its image size is fixed, and the
    file takes any batch at that size, padded images included (their mask reaching it), with the PyTorch model's
    outputs (gather path)."""
    model = tiny_deformable_detr()
    report = export_model(model, tmp_path / "deformable.pt", "torchscript", img_size=SIZE)
    assert not report.dynamic_img_size and report.check_sizes == (SIZE, SIZE)
    assert report.attn_backend == "sdpa" and 0 <= report.max_diff <= report.atol
    assert all(layer.backend == "auto" for _, layer in attention_layers(model))  # the caller's model is untouched
    assert_matches_pytorch(model, report.path, "torchscript", [SIZE], fixed=True)  # padded batches, the mask read


# ViTDet's windows (5x5 patches: no side of the grids checked is a multiple) and a global block, with the class
# token copied into every window
WINDOWED = dict(depth=2, window_size=5, global_blocks=(1,), rel_pos=True)


@pytest.mark.parametrize("backbone_args", [dict(depth=1), WINDOWED], ids=["plain", "windowed"])
def test_onnx_of_a_vit_backbone_takes_any_size_and_a_swin_backbone_its_own(tmp_path, backbone_args):
    """A ViT backbone (its maps padded to the pyramid's multiple, upsampled by 2x2 blocks; with windows, its grid
    padded to whole windows) exports for any image size; a Swin backbone at the size it was traced at (its windows
    fix it), which the export says."""
    ort = pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    torch.manual_seed(0)
    vit = dict(backbone="vit_tiny_patch16_224", backbone_args=backbone_args, backbone_scales=(2.0, 1.0, 0.5))
    model = vitkit.create_model("deformable_detr_digits", **TINY, **vit, enc_layers=1, dec_layers=1).eval()
    report = export_model(model, tmp_path / "m.onnx", "onnx", img_size=SIZE)
    # checked by the export on padded batches at 96x128 and 120x168 (no multiple of the backbone's 32)
    assert report.dynamic_img_size and report.check_sizes[1] == (120, 168)
    assert 0 <= report.max_diff <= report.atol
    session = ort.InferenceSession(str(report.path), providers=["CPUExecutionProvider"])
    assert session.get_inputs()[0].shape == ["batch", 3, "height", "width"]
    if backbone_args is WINDOWED:  # at other sizes too, on padded batches: 1 to 3 windows a side
        for size in [(160, 224), (64, 80)]:
            for images, mask in batches(size):
                got = session.run(None, {"images": images.numpy(), "pixel_mask": mask.numpy()})
                with torch.no_grad():
                    expected = model(images, mask)
                for name, value in zip(OUTPUTS, got, strict=False):
                    torch.testing.assert_close(torch.from_numpy(value), expected[name], atol=1e-4, rtol=0)
        return
    swin = dict(backbone="swin_tiny_patch4_window7_224", backbone_args=dict(depths=(1, 1, 1, 1)))
    model = vitkit.create_model("deformable_detr_digits", **TINY, **swin, enc_layers=1, dec_layers=1)
    assert not _signature(model, "onnx").dynamic_img_size  # exported at one size (exported and checked there)
