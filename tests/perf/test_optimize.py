"""optimize(): fp32 in, fp32 out, bf16 logits close to fp32, the original model untouched."""

import pytest
import torch

import vitkit
from vitkit.perf import optimize

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
    linear = next(m for m in fast.modules() if isinstance(m, torch.nn.Linear))
    assert linear.weight.dtype == torch.bfloat16  # cast once, at optimize time
    norms = [m for m in fast.modules() if isinstance(m, (torch.nn.LayerNorm, torch.nn.BatchNorm2d))]
    assert norms and all(p.dtype == torch.float32 for m in norms for p in m.parameters())


def test_fp32_is_exact_and_uses_the_fused_attention():
    model = vitkit.create_model("vit_tiny_patch16_224", depth=2, attn_backend="math").eval()
    x = torch.randn(2, 3, 224, 224)
    fast = optimize(model, "fp32")
    assert {layer.backend for _, layer in vitkit.layers.attention_layers(fast)} == {"sdpa"}
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
