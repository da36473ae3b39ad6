"""optimize(): fp32 in, fp32 out, bf16 logits close to fp32, the original model untouched."""

import copy
import sys

import pytest
import torch

import vitkit
from vitkit.detection import pad_images
from vitkit.layers import Mlp
from vitkit.layers.norm import FrozenBatchNorm2d
from vitkit.perf import optimize
from vitkit.perf.optimize import PackedLinear, packed_linear_supported

needs_packing = pytest.mark.skipif(not packed_linear_supported(), reason="no oneDNN bf16 linear on this CPU")

SMALL = {
    "vit_small_patch16_224": dict(depth=4),
    "deit_tiny_distilled_patch16_224": dict(depth=4),
    "swin_tiny_patch4_window7_224": dict(depths=(2, 2, 2, 2)),
    "botnet26t_256": dict(),
}


@pytest.mark.parametrize("name", list(SMALL))
def test_bf16_logits_within_two_percent_of_fp32(name):
    torch.manual_seed(0)
    model = vitkit.create_model(name, **SMALL[name]).eval()
    size = model.config.img_size
    x = torch.randn(2, 3, size, size)
    with torch.no_grad():
        reference = model(x)
        fast = optimize(model, "bf16")
        out = fast(x)
    assert out.dtype == torch.float32 and out.shape == reference.shape
    relative = (out - reference).norm() / reference.norm()
    assert relative < 2e-2
    assert next(model.parameters()).dtype == torch.float32  # the original is left as it was
    linears = sum(isinstance(m, torch.nn.Linear) for m in model.modules())
    if packed_linear_supported():  # every linear reordered once, every Mlp's GELU fused into its fc1
        assert sum(isinstance(m, PackedLinear) for m in fast.modules()) == linears
        assert all(m.fc1.activation == "gelu" for m in fast.modules() if isinstance(m, Mlp))
    else:  # cast once, at optimize time
        assert all(m.weight.dtype == torch.bfloat16 for m in fast.modules() if isinstance(m, torch.nn.Linear))
    norms = [m for m in fast.modules() if isinstance(m, (torch.nn.LayerNorm, torch.nn.BatchNorm2d))]
    assert norms and all(p.dtype == torch.float32 for m in norms for p in m.parameters())


@pytest.mark.parametrize("name", ["vit_small_patch16_224", "botnet26t_256"])
def test_off_the_cpu_layer_norms_take_the_activations_dtype_and_batch_norms_stay_fp32(name):
    # CUDA's layer norm kernel wants its parameters in its input's dtype (CPU's takes fp32 ones with bf16 inputs);
    # a model on the meta device stands for one on a GPU here
    model = vitkit.create_model(name, **SMALL[name]).to("meta")
    fast = optimize(model, "bf16")
    layer_norms = [m for m in fast.modules() if isinstance(m, torch.nn.LayerNorm)]
    batch_norms = [m for m in fast.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    assert layer_norms or batch_norms
    assert all(p.dtype == torch.bfloat16 for m in layer_norms for p in m.parameters())
    assert all(p.dtype == torch.float32 for m in batch_norms for p in m.parameters())
    assert all(m.weight.dtype == torch.bfloat16 for m in fast.modules() if isinstance(m, torch.nn.Linear))


def test_fp32_is_exact_and_uses_the_auto_attention():
    model = vitkit.create_model("vit_tiny_patch16_224", depth=2, attn_backend="math").eval()
    x = torch.randn(2, 3, 224, 224)
    fast = optimize(model, "fp32")
    assert {layer.backend for _, layer in vitkit.layers.attention_layers(fast)} == {"auto"}
    assert not any(isinstance(m, PackedLinear) for m in fast.modules())
    assert model.blocks[0].attn.backend == "math"
    with torch.no_grad():
        torch.testing.assert_close(fast(x), model(x), atol=1e-5, rtol=1e-5)


def test_errors():
    model = vitkit.create_model("vit_tiny_patch16_224", depth=1)
    with pytest.raises(ValueError, match="precision must be one of \\['bf16', 'fp32'\\], got 'fp16'"):
        optimize(model, "fp16")
    with pytest.raises(ValueError, match="floating-point image tensor, got torch.uint8"):
        optimize(model, "bf16")(torch.zeros(1, 3, 224, 224, dtype=torch.uint8))


def test_compiled_matches_eager():
    torch.manual_seed(0)
    model = vitkit.create_model("vit_tiny_patch16_224", depth=1, img_size=32).eval()
    x = torch.randn(2, 3, 32, 32)
    compiled = optimize(model, "fp32", compile=True)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x), atol=1e-4, rtol=1e-4)


def test_bf16_without_packed_linears_falls_back_to_plain_ones(monkeypatch):
    module = sys.modules["vitkit.perf.optimize"]  # the package attribute of that name is the function
    monkeypatch.setattr(module, "packed_linear_supported", lambda: False)
    torch.manual_seed(0)
    model = vitkit.create_model("vit_tiny_patch16_224", depth=2, img_size=32).eval()
    x = torch.randn(2, 3, 32, 32)
    fast = optimize(model, "bf16")
    assert not any(isinstance(m, PackedLinear) for m in fast.modules())
    with torch.no_grad():
        assert (fast(x) - model(x)).norm() / model(x).norm() < 2e-2


@needs_packing  # elsewhere the probe says False before it reaches the operators
def test_probe_reports_missing_operators(monkeypatch):
    def missing(*args, **kwargs):
        raise RuntimeError("no such operator")

    monkeypatch.setattr(PackedLinear, "_pack", staticmethod(missing))
    assert packed_linear_supported.__wrapped__() is False


@needs_packing
@pytest.mark.parametrize("activation", ["none", "gelu"])
def test_packed_linear_matches_linear_and_saves_like_one(activation):
    torch.manual_seed(0)
    linear = torch.nn.Linear(40, 24).bfloat16()
    packed = PackedLinear.from_linear(linear, activation)
    x = torch.randn(3, 5, 40, dtype=torch.bfloat16)
    expected = torch.nn.functional.linear(x.float(), linear.weight.float(), linear.bias.float())
    if activation == "gelu":
        expected = torch.nn.functional.gelu(expected)
    with torch.no_grad():
        out = packed(x)
        torch.testing.assert_close(out.float(), expected, atol=2e-2, rtol=1e-2)  # one bf16 rounding of the result
        torch.testing.assert_close(packed.weight, linear.weight, atol=0, rtol=0)
        assert list(packed.state_dict()) == ["weight", "bias"]
        torch.testing.assert_close(packed.state_dict()["weight"], linear.weight.detach(), atol=0, rtol=0)
        copied = copy.deepcopy(packed)
        torch.testing.assert_close(copied(x), out, atol=0, rtol=0)
        assert copied.weight is copied.weight  # made once, then kept
        other = torch.nn.Linear(40, 24).bfloat16()
        copied.load_state_dict(other.state_dict())  # reorders the new weight and forgets the kept dense one
        torch.testing.assert_close(copied.weight, other.weight, atol=0, rtol=0)
        with pytest.raises(RuntimeError, match="size mismatch for weight"):
            copied.load_state_dict(torch.nn.Linear(41, 24).bfloat16().state_dict())


@needs_packing
def test_packed_linear_rejects_inputs_it_cannot_take():
    packed = PackedLinear.from_linear(torch.nn.Linear(8, 4))
    with pytest.raises(ValueError, match=r"bf16 CPU inputs \(\.\.\., 8\); got torch.float32 \(2, 8\)"):
        packed(torch.randn(2, 8))
    with pytest.raises(ValueError, match=r"got torch.bfloat16 \(2, 7\)"):
        packed(torch.randn(2, 7, dtype=torch.bfloat16))


@needs_packing
def test_optimized_model_saves_copies_and_gives_input_gradients(tmp_path):
    torch.manual_seed(0)
    model = vitkit.create_model("vit_tiny_patch16_224", depth=2, img_size=32).eval()
    fast = optimize(model, "bf16")
    assert not any(m.training for m in fast.modules())
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        out = fast(x)
    torch.save(fast, tmp_path / "fast.pt")  # the reordered weights are pickled dense and reordered on load
    for other in (torch.load(tmp_path / "fast.pt", weights_only=False), copy.deepcopy(fast)):
        with torch.no_grad():
            torch.testing.assert_close(other(x), out, atol=0, rtol=0)
    # The oneDNN operator has no backward: an input that requires grad takes F.linear, and gets the gradient of
    # the same model built from plain bf16 layers.
    plain = optimize(model, "bf16")
    for layer in list(plain.modules()):
        for name, child in list(layer.named_children()):
            if isinstance(child, PackedLinear):
                linear = torch.nn.Linear(child.in_features, child.out_features).bfloat16().requires_grad_(False)
                linear.weight.copy_(child.weight), linear.bias.copy_(child.bias)
                act = torch.nn.GELU() if child.activation == "gelu" else torch.nn.Identity()
                setattr(layer, name, torch.nn.Sequential(linear, act))
    grads = []
    for net in (fast, plain):
        xi = x.clone().requires_grad_(True)
        net(xi).square().sum().backward()
        grads.append(xi.grad)
    assert grads[0].abs().sum() > 0
    torch.testing.assert_close(grads[0], grads[1], atol=0, rtol=0)


def random_frozen_norms(model: torch.nn.Module) -> None:
    """Frozen norms away from the identity, so that folding them has something to get right."""
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, FrozenBatchNorm2d):
                module.weight.copy_(torch.rand(module.weight.shape, generator=g) + 0.5)
                module.bias.copy_(torch.randn(module.bias.shape, generator=g) * 0.1)
                module.running_mean.copy_(torch.randn(module.running_mean.shape, generator=g) * 0.1)
                module.running_var.copy_(torch.rand(module.running_var.shape, generator=g) + 0.5)


def detector_outputs(model: torch.nn.Module) -> dict:
    g = torch.Generator().manual_seed(1)
    images, mask = pad_images([torch.randn(3, 96, 128, generator=g), torch.randn(3, 80, 96, generator=g)])
    with torch.no_grad():
        return model(images, mask)


def test_detector_folds_its_frozen_norms_and_keeps_its_outputs():
    torch.manual_seed(0)
    model = vitkit.create_model("detr_tiny").eval()
    random_frozen_norms(model)
    norms = sum(isinstance(m, FrozenBatchNorm2d) for m in model.modules())
    reference = detector_outputs(model)
    fast = optimize(model, "fp32")
    assert norms > 0 and not any(isinstance(m, FrozenBatchNorm2d) for m in fast.modules())
    assert sum(isinstance(m, FrozenBatchNorm2d) for m in model.modules()) == norms  # the original keeps its own
    out = detector_outputs(fast)
    assert set(out) == set(reference) and len(out["aux_outputs"]) == len(reference["aux_outputs"])
    for key in ("pred_logits", "pred_boxes"):
        torch.testing.assert_close(out[key], reference[key], atol=1e-4, rtol=1e-4)


def test_detector_in_bf16_keeps_boxes_within_a_percent():
    torch.manual_seed(0)
    model = vitkit.create_model("detr_tiny").eval()
    random_frozen_norms(model)
    reference = detector_outputs(model)
    out = detector_outputs(optimize(model, "bf16"))
    assert out["pred_boxes"].dtype == torch.float32 and out["aux_outputs"][0]["pred_logits"].dtype == torch.float32
    assert (out["pred_boxes"] - reference["pred_boxes"]).abs().max() < 1e-2
    logits = reference["pred_logits"]
    assert (out["pred_logits"] - logits).norm() / logits.norm() < 2e-2
