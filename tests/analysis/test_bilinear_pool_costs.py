"""ViT and BoTNet with the bilinear pool (`global_pool="bilinear"`): they build and train, and their analytic costs
equal what the dispatcher counts (FlopCounterMode, PeakMemory), as every registered model's do in test_profile.py."""

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import vitkit
from vitkit.analysis import profile
from vitkit.layers import BilinearPool, set_attention_backend

BOTNET_TINY = dict(img_size=64, stem_chs=16, widths=(32, 64, 128, 256))  # botnet26t_256's blocks, 1/8 of the width
SMALL = [
    ("vit_tiny_patch16_224", dict(img_size=64, depth=1)),  # 16 patch tokens after the class token
    ("vit_tiny_patch16_224", dict(img_size=64, depth=1, class_token=False, bilinear_dim=None)),  # all 192 channels
    ("botnet26t_256", BOTNET_TINY),  # a 2x2 final map of 256 channels, projected to 64
    ("botnet26t_256", dict(BOTNET_TINY, bilinear_dim=None)),
]
IDS = ["vit", "vit-full-width", "botnet", "botnet-full-width"]


def small_bilinear(name: str, overrides: dict) -> torch.nn.Module:
    torch.manual_seed(0)
    return vitkit.create_model(name, num_classes=5, global_pool="bilinear", **overrides)


def pool_of(model: torch.nn.Module) -> BilinearPool:
    (pool,) = [m for m in model.modules() if isinstance(m, BilinearPool)]
    return pool


@pytest.mark.parametrize(("name", "overrides"), SMALL, ids=IDS)
def test_bilinear_models_run_forward_and_backward_to_every_parameter(name, overrides):
    model = small_bilinear(name, overrides).train()
    pool, size = pool_of(model), model.config.img_size
    width = (overrides.get("bilinear_dim", 64) or model.num_features) ** 2
    assert pool.num_features == width
    x = torch.randn(2, 3, size, size)
    out = model(x)
    assert out.shape == (2, 5)
    out.square().mean().backward()
    assert {n for n, p in model.named_parameters() if p.requires_grad and (p.grad is None or not p.grad.any())} == set()

    model.eval()
    with torch.no_grad():
        features = model.forward_features(x)
        pooled = model.forward_head(features, pre_logits=True)
        assert pooled.shape == (2, width)
        torch.testing.assert_close(torch.linalg.vector_norm(pooled, dim=1), torch.ones(2))  # L2-normalised
        torch.testing.assert_close(model.forward_head(features), model(x))
        torch.testing.assert_close(set_attention_backend(model, "math")(x), set_attention_backend(model, "sdpa")(x))


@pytest.mark.parametrize(("name", "overrides"), SMALL, ids=IDS)
def test_bilinear_models_cost_what_the_dispatcher_counts(name, overrides):
    model = small_bilinear(name, overrides).eval()
    size = model.config.img_size
    report = profile(model, size, batch=2, measure=True)
    assert report.matmul_flops == report.measured_matmul_flops
    assert report.activation_bytes == pytest.approx(report.measured_activation_bytes, rel=0.01)
    pool = [op for op in report.ops if op.module in ("pool", "head.pool")]  # ViT, BoTNet
    reduce = [op for op in pool if op.op == "reduce_a"]  # the projection to bilinear_dim
    assert len(reduce) == (1 if model.config.bilinear_dim else 0)
    (M, N), (product,) = pool_of(model).dims * (2 // len(pool_of(model).dims)), [op for op in pool if op.op == "bmm"]
    width = model.config.bilinear_dim or M
    assert product.out_shape == (2, width, width if model.config.bilinear_dim else N)  # fA^T fB


@pytest.mark.parametrize(("name", "size"), [("vit_small_patch16_224", 224), ("botnet26t_256", 256)])
def test_full_size_bilinear_models_cost_what_flop_counter_counts(name, size):
    with torch.device("meta"):  # shapes only
        model = vitkit.create_model(name, global_pool="bilinear", attn_backend="math")
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(torch.randn(1, 3, size, size, device="meta"))
    report = profile(model, size)
    assert report.matmul_flops == counter.get_total_flops()
    assert report.params == sum(p.numel() for p in model.parameters())
    head = [op for op in report.ops if op.module == "head" and op.macs]
    assert [op.in_shape for op in head] == [(1, 64 * 64)]


def test_bilinear_vit_adds_the_projection_and_resizes_the_head():
    with torch.device("meta"):
        token = vitkit.create_model("vit_small_patch16_224").state_dict()
        bilinear = vitkit.create_model("vit_small_patch16_224", global_pool="bilinear").state_dict()
    assert set(bilinear) == set(token) | {"pool.reduce_a.weight", "pool.reduce_a.bias"}
    assert bilinear["pool.reduce_a.weight"].shape == (64, 384)
    assert bilinear["head.weight"].shape == (1000, 64 * 64)


def test_pool_options_are_checked():
    with pytest.raises(ValueError, match=r"global_pool must be one of \('token', .*'map'\), got 'max'"):
        vitkit.create_model("vit_tiny_patch16_224", global_pool="max")
    with pytest.raises(ValueError, match="distilled=True needs class_token=True and global_pool='token'"):
        vitkit.create_model("deit_tiny_distilled_patch16_224", global_pool="bilinear")
    with pytest.raises(ValueError, match="bilinear_dim must be > 0 or None, got 0"):
        vitkit.create_model("vit_tiny_patch16_224", global_pool="bilinear", bilinear_dim=0)
    with pytest.raises(ValueError, match="global_pool must be 'avg' or 'bilinear', got 'token'"):
        vitkit.create_model("botnet26t_256", global_pool="token")
    with pytest.raises(ValueError, match="BotNetConfig.bilinear_dim takes int | None, got 2.5"):
        vitkit.create_model("botnet26t_256", global_pool="bilinear", bilinear_dim=2.5)
