"""Analytic costs against torch's FlopCounterMode, the notes' closed forms, and the measured CPU attention kernel."""

import contextlib
import dataclasses
import json

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import vitkit
from vitkit.analysis import PeakMemory, measure_matmul_flops, measure_saved_bytes, profile
from vitkit.analysis.memory import inference_peak_bytes
from vitkit.cost import CostContext, trace
from vitkit.layers import Attention
from vitkit.models.registry import DETECTION, family_of, model_entry

# Deformable DETR's ResNet-50 variants with two encoder and two decoder layers: every kind of row of their six and
# six (box refinement's chain included) in half the time; on the meta device torch samples through a Python
# decomposition of grid_sample
SHRUNK = {name: {"enc_layers": 2, "dec_layers": 2} for name in vitkit.list_models() if "deformable_detr_resnet" in name}


def _short_backbone(name: str) -> dict:
    """A detector's Swin backbone with a block per stage, or its ViT with two blocks (every kind of row)."""
    body = model_entry(model_entry(name).config.backbone).config
    return {"depths": (1,) * len(body.depths)} if hasattr(body, "depths") else {"depth": 2}


SHRUNK |= {  # the detectors on Swin and ViT backbones likewise
    name: {"enc_layers": 2, "dec_layers": 2, "backbone_args": _short_backbone(name)}
    for name in vitkit.list_models("deformable_detr_*")
    if model_entry(name).config.backbone != "resnet"
}


def counted_matmul_flops(model: torch.nn.Module, size: tuple[int, int], batch: int = 1) -> int:
    """FlopCounterMode's total for a forward pass with explicit (math) attention, which it counts fully."""
    x = torch.randn(batch, model.config.in_chans, *size, device=next(model.parameters()).device)
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(x)
    return counter.get_total_flops()


def counted_train_matmul_flops(model: torch.nn.Module, size: tuple[int, int], batch: int = 1) -> int:
    """FlopCounterMode's total for a forward and a backward pass from the sum of every output (a detector's
    auxiliary outputs, a two-stage detector's encoder outputs and a mask head's masks included), the input's gradient
    computed too."""
    x = torch.randn(batch, model.config.in_chans, *size, device=next(model.parameters()).device, requires_grad=True)
    with FlopCounterMode(display=False) as counter:
        out = model(x)
        outputs = [out] if isinstance(out, torch.Tensor) else [out["pred_logits"], out["pred_boxes"]]
        if not isinstance(out, torch.Tensor):
            more = [*out.get("aux_outputs", []), *([out["enc_outputs"]] if "enc_outputs" in out else [])]
            outputs += [t for extra in more for t in (extra["pred_logits"], extra["pred_boxes"])]
            outputs += [out["pred_masks"]] if "pred_masks" in out else []
        sum(t.sum() for t in outputs).backward()
    return counter.get_total_flops()


def other_sizes(name: str) -> list[tuple[int, int]]:
    """The default size and a larger, non-square one the family accepts."""
    config = model_entry(name).config
    size = config.img_size if isinstance(config.img_size, tuple) else (config.img_size, config.img_size)
    patch = getattr(config, "patch_size", 1)
    step = 64 if name.startswith("swin") else -(-32 // patch) * patch  # whole patches
    return [size, (size[0] + step, size[1] + 2 * step)]


@pytest.mark.parametrize("name", vitkit.list_models())
def test_analytic_matmul_flops_equal_flop_counter_for_every_model(name):
    has_dynamic = "dynamic_img_size" in {f.name for f in dataclasses.fields(model_entry(name).config)}
    default, larger = other_sizes(name)
    # BoTNet's relative tables fix its size; a transformer-backed detector's larger size is the ViT's and Swin's own
    sizes = [default] if not has_dynamic or "backbone_args" in SHRUNK.get(name, {}) else [default, larger]
    for size in sizes:
        overrides = {"dynamic_img_size": size != default} if has_dynamic else {}
        with torch.device("meta"):  # shapes only: FlopCounterMode counts from shapes
            model = vitkit.create_model(name, attn_backend="math", **overrides, **SHRUNK.get(name, {}))
        report = profile(model, size, batch=2)
        counted = counted_matmul_flops(model, size, batch=2)
        assert report.matmul_flops == counted, size
        assert report.params == sum(p.numel() for p in model.parameters())
        assert report.flops == counted + report.other_flops
    # training: the matmuls of a forward and a backward pass, counted once at the last size
    train_matmul_flops = report.train_flops - 2 * report.other_flops
    counted = counted_train_matmul_flops(model, size, batch=2)
    if family_of(model).task == DETECTION:
        # frozen backbone stages (the ResNet stem and first stage) and DETR's first decoder layer's zero target take
        # no gradient; the analytic 3x counts one for every product (equal where nothing is frozen: deformable_detr_
        # digits trains its stem)
        assert 0.94 * train_matmul_flops <= counted <= train_matmul_flops
    else:
        assert train_matmul_flops == counted


def test_stock_counter_misses_the_cpu_attention_kernel_and_vitkit_does_not():
    torch.manual_seed(0)
    model = vitkit.create_model("vit_small_patch16_224", depth=2, img_size=64).eval()  # sdpa backend, real CPU run
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad(), FlopCounterMode(display=False) as stock:
        model(x)
    report = profile(model, measure=True)
    attention = sum(op.matmul_flops for op in report.ops if op.op in ("q@k^T", "attn@v"))
    N, C = (64 // 16) ** 2 + 1, 384
    assert attention == 2 * 2 * (2 * N**2 * C)  # 2 layers x (q@k^T, attn@v) x 2 FLOPs per multiply-add of N^2 C
    assert stock.get_total_flops() == report.matmul_flops - attention  # the stock counter sees no attention
    assert report.measured_matmul_flops == report.matmul_flops == measure_matmul_flops(model, (64, 64))


def test_tiny_vit_totals_follow_its_dimensions():
    B, H, W, p, C, depth, h, K = 2, 32, 48, 8, 32, 2, 2, 10  # batch, image, patch, width, blocks, heads, classes
    P = (H // p) * (W // p)  # patches
    N, F = P + 1, 4 * C  # tokens with the class token, MLP width
    model = vitkit.create_model(
        "vit_tiny_patch16_224", img_size=32, patch_size=p, embed_dim=C, depth=depth, num_heads=h, num_classes=K,
        attn_backend="math", dynamic_img_size=True,
    )  # fmt: skip
    report = profile(model, (H, W), batch=B)
    macs_per_block = (
        B * N * C * 3 * C  # qkv
        + B * N * N * C  # q@k^T: (B, h, N, d) @ (B, h, d, N), h * d = C
        + B * N * N * C  # attn@v
        + B * N * C * C  # proj
        + B * N * C * F  # fc1
        + B * N * F * C  # fc2
    )
    macs = B * P * C * 3 * p * p + depth * macs_per_block + B * C * K  # patch embedding, blocks, head
    other_per_block = (
        2 * 8 * B * N * C  # norm1, norm2: 8 FLOPs per element
        + B * N * 3 * C  # qkv bias
        + B * N * C  # q * scale
        + 5 * B * h * N * N  # softmax: 5 FLOPs per element
        + B * N * C  # proj bias
        + 2 * B * N * C  # the two residual adds
        + B * N * F  # fc1 bias
        + 8 * B * N * F  # GELU: 8 FLOPs per element
        + B * N * C  # fc2 bias
    )
    other = (
        B * P * C  # patch embedding bias
        + 31 * C * P  # the 4x4 position table resampled to the 4x6 grid once: bicubic, 16 products + 15 sums
        + B * N * C  # + position embedding
        + depth * other_per_block
        + 8 * B * N * C  # final norm
        + B * K  # head bias
    )
    assert (report.macs, report.matmul_flops, report.other_flops) == (macs, 2 * macs, other)
    assert report.flops == 2 * macs + other
    assert counted_train_matmul_flops(model, (H, W), batch=B) == 3 * 2 * macs  # backward: two products per product
    assert report.train_flops == 3 * 2 * macs + 2 * other
    assert report.params == (
        3 * p * p * C + C  # patch embedding
        + C + ((32 // p) ** 2 + 1) * C  # class token, position embedding (at the 32x32 training size)
        + depth * (2 * 2 * C + 3 * C * C + 3 * C + C * C + C + C * F + F + F * C + C)  # norms, qkv, proj, fc1, fc2
        + 2 * C + C * K + K  # final norm, head
    )  # fmt: skip


def test_attention_rows_follow_the_closed_forms():
    B, N, C, h = 2, 50, 96, 4
    ops = {op.op: op for op in trace(Attention(C, h), torch.empty(B, N, C))}
    assert ops["qkv"].macs == 3 * B * N * C**2  # the notes wrote 3BC^2: the projection runs for all N tokens
    assert ops["q@k^T"].macs == B * N**2 * C
    assert ops["attn@v"].macs == B * N**2 * C  # the notes wrote BN^2: every weight multiplies a d-vector per head
    assert ops["proj"].macs == B * N * C**2
    assert ops["softmax"].flops == 5 * B * h * N**2
    assert ops["qkv"].flops == 2 * 3 * B * N * C**2 + B * N * 3 * C  # + one add per output for the bias
    assert list(ops) == ["qkv", "q*scale", "q@k^T", "softmax", "attn@v", "merge_heads", "proj"]


def test_explicit_attention_costs_n_squared_memory_and_fused_does_not(native_bf16):
    B, N, C, h = 2, 400, 64, 4
    fp32, bf16 = CostContext(), CostContext(torch.bfloat16)
    fused = trace(Attention(C, h, backend="sdpa"), torch.empty(B, N, C), ctx=fp32)
    reference = trace(Attention(C, h, backend="math"), torch.empty(B, N, C), ctx=fp32)
    nn_bytes = B * h * N * N * 4
    # the reference keeps the logits and the weights at once; the fused kernel never writes an N x N tensor
    assert inference_peak_bytes(reference) >= 2 * nn_bytes > nn_bytes > inference_peak_bytes(fused)
    assert all(op.out_bytes < nn_bytes for op in fused)
    assert sum(op.macs for op in fused) == sum(op.macs for op in reference)
    with vitkit.capture_attention(layer := Attention(C, h).eval()):  # in inference capturing forms the weights,
        captured = trace(layer, torch.empty(B, N, C), ctx=fp32)  # in one buffer
    assert nn_bytes < inference_peak_bytes(captured) < 2 * nn_bytes
    bf16_rows = trace(Attention(C, h).eval(), torch.empty(B, N, C), ctx=bf16)
    assert [op.op for op in captured] == [op.op for op in bf16_rows]
    with vitkit.capture_attention(layer.train()):  # with its backward to keep, the logits and the weights both
        assert inference_peak_bytes(trace(layer, torch.empty(B, N, C), ctx=fp32)) >= 2 * nn_bytes


@pytest.mark.parametrize("backend", ["sdpa", "math", "auto"])
@pytest.mark.parametrize("capture", [False, True])
def test_attention_estimate_equals_measured_peak_for_each_path(backend, capture):
    torch.manual_seed(0)
    B, N, C, h = 2, 60, 32, 4
    layer = Attention(C, h, backend=backend).bfloat16().eval()
    x = torch.randn(B, N, C, dtype=torch.bfloat16)
    context = vitkit.capture_attention(layer) if capture else contextlib.nullcontext()
    with torch.no_grad(), context, PeakMemory() as measured:
        layer(x)
        ops = trace(layer, x, ctx=CostContext(torch.bfloat16))
    # the explicit path's baddbmm takes a zero scalar it ignores: 2 bytes no operator list states
    assert 0 <= measured.peak - inference_peak_bytes(ops) <= 2


def test_notes_example_vit_small():
    report = profile("vit_small_patch16_224")
    assert report.params == 22_050_664
    assert report.matmul_flops == 9_197_764_608  # torch's FlopCounterMode with explicit attention
    assert round(report.matmul_flops / 1e9, 2) == 9.20


def test_other_sizes_and_errors():
    report = profile("vit_small_patch16_224", img_size=(256, 320), batch=3)
    assert report.img_size == (256, 320) and report.batch == 3
    assert report.params == 22_050_664  # the same variant, its table resampled
    with pytest.raises(ValueError, match="image width 300 is not a positive multiple of patch size 16"):
        profile("vit_small_patch16_224", img_size=(256, 300))
    with pytest.raises(ValueError, match="expected images of size 224x224, got 256x256"):
        profile(vitkit.create_model("vit_tiny_patch16_224", depth=1), img_size=256)
    with pytest.raises(ValueError, match="batch must be >= 1, got 0"):
        profile("vit_tiny_patch16_224", batch=0)
    with pytest.raises(ValueError, match="profile needs a vitkit model .* Linear lacks config"):
        profile(torch.nn.Linear(2, 2))


def test_json_fields_are_the_stable_interface():
    data = profile("deit_tiny_distilled_patch16_224").to_dict()
    assert set(data) == {
        "model", "img_size", "batch", "backend", "dtype", "device", "params", "macs", "matmul_flops", "other_flops",
        "flops", "activation_bytes", "train_flops", "train_activation_bytes", "ops", "measured_matmul_flops",
        "measured_activation_bytes",
    }  # fmt: skip
    assert set(data["ops"][0]) == {"module", "op", "in_shape", "out_shape", "macs", "flops", "bytes"}
    json.dumps(data)


@pytest.mark.parametrize(
    ("name", "size", "tolerance"),
    [
        ("vit_small_patch16_224", 224, 0.0),
        ("deit_tiny_distilled_patch16_224", 320, 0.0),
        ("swin_tiny_patch4_window7_224", 224, 0.0),
        ("swin_tiny_patch4_window7_224", 256, 0.0),  # maps padded to whole windows, masks made for the size
        ("botnet26t_256", 256, 0.0),
    ],
)
@pytest.mark.parametrize("backend", ["sdpa", "math"])
def test_activation_memory_estimate_against_measured_peak(name, size, tolerance, backend):
    torch.manual_seed(0)
    dynamic = {"dynamic_img_size": True} if size != model_entry(name).config.img_size else {}
    model = vitkit.create_model(name, attn_backend=backend, **dynamic).eval()
    report = profile(model, size, batch=4, measure=True)
    assert report.measured_activation_bytes > 0
    assert (
        abs(report.activation_bytes - report.measured_activation_bytes) <= tolerance * report.measured_activation_bytes
    )


def test_peak_memory_counts_what_stays_alive():
    with PeakMemory() as memory:
        a = torch.ones(1000)  # 4,000 bytes
        b = a + 1  # 8,000 bytes alive
        view = b[:10]  # a view: no new storage
        del a
        c = b * 2  # 8,000 bytes alive again (b and c)
    assert memory.peak == 8000
    assert memory.current == 8000
    del b, c, view
    assert memory.current == 0


def test_peak_memory_ignores_tensors_that_existed_before():
    x = torch.ones(1000)
    with PeakMemory() as memory:
        x.view(10, 100)
        x.add_(1)
        x.to(torch.float32)
    assert memory.peak == 0


@pytest.mark.parametrize(
    ("name", "size", "tolerance"),
    [
        ("vit_small_patch16_224", 224, 0.01),
        ("swin_tiny_patch4_window7_224", 224, 0.01),
        ("botnet26t_256", 256, 0.01),
    ],
)
@pytest.mark.parametrize("backend", ["sdpa", "math"])
def test_training_memory_estimate_against_what_autograd_saves(name, size, tolerance, backend):
    torch.manual_seed(0)
    model = vitkit.create_model(name, attn_backend=backend, img_size=size).train()
    estimate = profile(model, size, batch=2).train_activation_bytes
    measured = measure_saved_bytes(model, torch.randn(2, 3, size, size))
    assert abs(estimate - measured) <= tolerance * measured


def test_profile_counts_the_attention_path_for_its_device_and_dtype(native_bf16):
    def attention_rows(**kwargs):
        report = profile("vit_small_patch16_224", batch=2, **kwargs)
        return report, [op.op for op in report.ops if op.module == "blocks.0.attn"]

    fp32, fused = attention_rows()
    bf16_cpu, explicit = attention_rows(dtype=torch.bfloat16)
    bf16_gpu, on_gpu = attention_rows(dtype=torch.bfloat16, device="cuda")  # needs no GPU: shapes only
    assert (bf16_cpu.dtype, bf16_cpu.device, bf16_gpu.device) == ("bfloat16", "cpu", "cuda")
    assert fused == on_gpu == ["qkv", "q*scale", "q@k^T", "softmax", "attn@v", "merge_heads", "proj"]
    assert explicit == [
        "qkv",
        "q_copy",
        "k_copy",
        "q*scale",
        "q@k^T",
        "softmax",
        "v_copy",
        "attn@v",
        "merge_heads",
        "proj",
    ]
    nn_bytes = 2 * 6 * 197 * 197 * 2  # one layer's (B, h, N, N) weights in bf16
    assert bf16_cpu.train_activation_bytes - bf16_gpu.train_activation_bytes == 12 * nn_bytes  # kept by each layer
    assert 2 * bf16_gpu.activation_bytes == fp32.activation_bytes
    assert bf16_cpu.matmul_flops == bf16_gpu.matmul_flops == fp32.matmul_flops
