"""`export_model` / `vitkit export` for DETR: graph inputs images + pixel_mask, outputs pred_logits + pred_boxes, a
dynamic batch and image size, checked here against the PyTorch model on padded batches independently of the
export's own check; and the mask resampling the export relies on, against `F.interpolate` in PyTorch and ONNX."""

import warnings
from collections.abc import Callable

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import vitkit
from vitkit.cli import main
from vitkit.detection import pad_images
from vitkit.layers import attention_layers
from vitkit.layers.pos_embed import nearest_mask
from vitkit.perf.export import CHECK_BATCHES, EXPORT_BATCH, export_model

# detr_tiny's layout at a size that runs in milliseconds: ResNet-18 blocks 16 wide, D = 32, 2 + 2 layers.
TINY = dict(backbone_width=16, hidden_dim=32, num_heads=4, dim_feedforward=64, num_queries=7, num_classes=5)
SIZE = (128, 160)  # the export size
OUTPUTS = ("pred_logits", "pred_boxes")


def tiny_detr(**overrides) -> nn.Module:
    torch.manual_seed(0)
    return vitkit.create_model("detr_tiny", **{**TINY, **overrides}).eval()


def batches(size: tuple[int, int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """One image filling `size` alone (batch 1), and four of different sizes padded to `size` (batch 4)."""
    assert EXPORT_BATCH not in (1, 4)
    g = torch.Generator().manual_seed(1)
    H, W = size
    one = pad_images([torch.randn(3, H, W, generator=g)])
    shapes = [(H, W), (H - 17, W), (H, W // 2 + 3), (33, 40)]
    four = pad_images([torch.randn(3, h, w, generator=g) for h, w in shapes])
    return [one, four]


Runner = Callable[[torch.Tensor, torch.Tensor], list[torch.Tensor]]  # (images, pixel_mask) -> outputs in order


def load_onnx(path, size: tuple[int, int] | None) -> Runner:
    """ONNX Runtime on the file; `size` None: H and W must be symbolic in the graph, else fixed at `size`."""
    ort = pytest.importorskip("onnxruntime")
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    H, W = size or ("height", "width")
    images_in, mask_in = session.get_inputs()
    assert (images_in.name, images_in.shape, images_in.type) == ("images", ["batch", 3, H, W], "tensor(float)")
    assert (mask_in.name, mask_in.shape, mask_in.type) == ("pixel_mask", ["batch", H, W], "tensor(bool)")
    logits_out, boxes_out, *masks_out = session.get_outputs()  # the last layer's predictions only: no auxiliary ones
    assert (logits_out.name, logits_out.shape[1:]) == ("pred_logits", [7, 6])
    assert (boxes_out.name, boxes_out.shape[1:]) == ("pred_boxes", [7, 4])
    assert [(out.name, out.shape[1]) for out in masks_out] in ([], [("pred_masks", 7)])  # (B, Q, H / 4, W / 4)

    def run(images: torch.Tensor, mask: torch.Tensor) -> list[torch.Tensor]:
        got = session.run(None, {"images": images.numpy(), "pixel_mask": mask.numpy()})
        return [torch.from_numpy(a) for a in got]

    return run


def load_torchscript(path, size: tuple[int, int] | None) -> Runner:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # torch.jit's deprecation notice
        module = torch.jit.load(str(path))

    def run(images: torch.Tensor, mask: torch.Tensor) -> list[torch.Tensor]:
        with torch.no_grad():
            return list(module(images, mask))

    return run


LOADERS = {"onnx": load_onnx, "torchscript": load_torchscript}


def assert_matches_pytorch(model, path, format: str, sizes: list[tuple[int, int]], fixed: bool) -> None:
    """The exported file gives the model's pred_logits and pred_boxes on padded batches at `sizes`, and the
    padding mask reaches it (the same images read as all real give other predictions)."""
    run = LOADERS[format](path, sizes[0] if fixed else None)
    for size in sizes:
        for images, mask in batches(size):
            with torch.no_grad():
                expected = model(images, mask)
            got = run(images, mask)
            for name, value in zip([k for k in expected if k != "aux_outputs"], got, strict=True):
                torch.testing.assert_close(value, expected[name], atol=1e-4, rtol=0)
            if not mask.all():
                all_real = run(images, torch.ones_like(mask))
                assert not torch.allclose(all_real[0], got[0], atol=1e-3)


@pytest.mark.parametrize("format", ["onnx", "torchscript"])
def test_library_exports_detr_at_any_batch_and_image_size(tmp_path, format):
    # the ONNX graph of a DETR with its mask head returns the mask logits too (D + M = 40: the head's GroupNorms
    # split it into 8 groups); DETR without it is exported in both formats elsewhere
    masks = format == "onnx"
    model = tiny_detr(**({"masks": True, "num_heads": 8} if masks else {}))
    backends = [layer.backend for _, layer in attention_layers(model)]
    report = export_model(model, tmp_path / "detr.bin", format, img_size=SIZE)
    assert list(tmp_path.iterdir()) == [report.path] and report.path == tmp_path / "detr.bin"
    assert report.inputs == ("images", "pixel_mask") and report.outputs == OUTPUTS + ("pred_masks",) * masks
    assert report.dynamic_img_size and report.img_size == SIZE and report.batch_sizes == CHECK_BATCHES
    assert report.check_sizes[0] == SIZE and report.check_sizes[1] != SIZE  # checked at a second size too
    assert 0 <= report.max_diff <= report.atol == 1e-4
    assert report.attn_backend == {"onnx": "math", "torchscript": "sdpa"}[format]
    assert [layer.backend for _, layer in attention_layers(model)] == backends  # original untouched
    summary = report.summary()
    outputs = ", ".join(report.outputs)
    assert f"inputs images, pixel_mask, outputs {outputs}; images of any size (exported at 128x160)" in summary
    assert "batch sizes 1, 3 (images 128x160, 152x200): max abs diff" in summary
    # other sizes than the exported and checked ones, none a multiple of the backbone stride 32
    assert_matches_pytorch(model, report.path, format, [SIZE, (97, 131), (200, 75)], fixed=False)


def test_cli_exports_a_fixed_size_detr(tmp_path, capsys):
    pytest.importorskip("onnxruntime")
    model = tiny_detr(img_size=SIZE, dynamic_img_size=False)
    vitkit.save_pretrained(model, tmp_path / "model")
    out = tmp_path / "export" / "detr.onnx"
    args = ["export", "--model-dir", str(tmp_path / "model"), "--format", "onnx"]
    assert main([*args, "--img-size", "96", "--out", str(out)]) == 2  # the model's own size check, before any export
    assert "expected images of size 128x160, got 96x96" in capsys.readouterr().err
    assert not out.parent.exists()
    assert main([*args, "--out", str(out)]) == 0
    assert list(out.parent.iterdir()) == [out]
    printed = capsys.readouterr().out
    assert f"wrote onnx model to {out} (inputs images, pixel_mask, outputs pred_logits, pred_boxes; " in printed
    assert "images of 128x160, any batch size; attention backend math)" in printed
    assert "checked against PyTorch at batch sizes 1, 3: max abs diff" in printed
    assert_matches_pytorch(model, out, "onnx", [SIZE], fixed=True)  # H and W fixed in the graph


def downsampled(n: int, stride: int) -> int:
    """A ResNet's feature size for an input side n: the 7x7 stem conv, the max pool and 3x3 convs, all stride 2."""
    for kernel in (7, 3, *[3] * (stride.bit_length() - 3)):
        n = (n + 2 * (kernel // 2) - kernel) // 2 + 1
    return n


class MaskToFeatures(nn.Module):
    def forward(self, mask: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
        return nearest_mask(mask, features.shape[-2:])


def test_mask_resampling_matches_interpolate_in_pytorch_and_onnx(tmp_path):
    """DETR resamples the pixel mask to the feature map as `F.interpolate(mode="nearest")` does; written as index
    arithmetic, ONNX Runtime reads the same rows and columns at every size (its nearest Resize, at some sizes, not)."""
    ort = pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    assert [downsampled(n, 32) for n in (128, 160, 97)] == [4, 5, 4]
    assert [downsampled(n, 16) for n in (128, 97)] == [8, 7]
    Dim = torch.export.Dim
    example = (torch.ones(2, 64, 96, dtype=torch.bool), torch.ones(2, 4, 2, 3))
    dynamic = ({0: Dim("B"), 1: Dim("H"), 2: Dim("W")}, {0: Dim("B2"), 2: Dim("h"), 3: Dim("w")})
    program = torch.onnx.export(MaskToFeatures().eval(), example, dynamo=True, dynamic_shapes=dynamic, verbose=False)
    program.save(str(tmp_path / "mask.onnx"))
    session = ort.InferenceSession(str(tmp_path / "mask.onnx"), providers=["CPUExecutionProvider"])
    mask_name, features_name = (i.name for i in session.get_inputs())
    g = torch.Generator().manual_seed(0)
    for H in range(2, 700):
        mask = torch.rand(1, H, 3, generator=g) > 0.5
        for h in {downsampled(H, 32), downsampled(H, 16), H // 3 + 1, H}:  # DETR's strides, and other ratios
            expected = F.interpolate(mask[None].float(), size=(h, 2))[0].bool()  # DETR's resampling
            assert torch.equal(nearest_mask(mask, (h, 2)), expected), (H, h)
            got = session.run(None, {mask_name: mask.numpy(), features_name: np.zeros((1, 4, h, 2), np.float32)})
            assert np.array_equal(got[0], expected.numpy()), (H, h)



@pytest.mark.parametrize("name, smallest", [("detr_digits", 32), ("deformable_detr_small", 48)])
def test_an_example_too_small_for_the_graph_to_stay_dynamic_is_refused_naming_the_size_that_works(
    tmp_path, name, smallest
):
    """At 16 px a detector's coarsest map is 1 wide, a size the export fixes as a constant (ONNX Runtime then fails
    at other sizes, blaming the export): refused before any export work, naming the smallest size whose maps are 2
    wide."""
    model = vitkit.create_model(name, num_classes=2)
    with pytest.raises(ValueError, match=rf"a 16x16 example gives this detector a feature map 1 wide, .* export at "
                       rf"{smallest} px or more: the graph takes images of any size"):  # fmt: skip
        export_model(model, tmp_path / "model.onnx", "onnx", img_size=16)
    assert not list(tmp_path.iterdir())
