"""BoTNet against timm's botnet26t_256 and torchvision's ResNet-50, backends, capture, input checks, save/load."""

from __future__ import annotations

import copy
from collections import Counter

import pytest
import timm
import torch
import torchvision
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from vitkit.analysis import profile
from vitkit.layers.attention import capture_attention
from vitkit.models import botnet
from vitkit.models.botnet import BotNetConfig, BottleneckAttn
from vitkit.models.registry import create_model, list_models, model_entry
from vitkit.weights import from_pretrained, save_pretrained


def randomize_batchnorm(model: nn.Module) -> None:
    """Random BatchNorm affine parameters and statistics: timm zero-initialises the last BN of every residual
    branch, which would hide the attention from the comparison."""
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                n = m.num_features
                m.weight.copy_(torch.rand(n, generator=g) + 0.5)
                m.bias.copy_(torch.randn(n, generator=g) * 0.1)
                m.running_mean.copy_(torch.randn(n, generator=g) * 0.1)
                m.running_var.copy_(torch.rand(n, generator=g) + 0.5)


# botnet26t_256 narrowed for fast tests: the same blocks, 1/8 of the channels (2 to 16 channels per head).
TINY = dict(img_size=64, num_classes=10, stem_chs=16, widths=(32, 64, 128, 256))


@pytest.fixture(scope="module")
def timm_botnet26t():
    torch.manual_seed(0)
    model = timm.create_model("botnet26t_256", pretrained=False).eval()
    randomize_batchnorm(model)
    return model


def test_registered():
    assert {"botnet50", "botnet26t_256"} <= set(list_models("botnet*"))
    assert "2101.11605" in model_entry("botnet50").paper
    model = create_model("botnet26t_256", **{**TINY, "num_classes": 0})
    assert type(model) is botnet.BotNet
    assert model(torch.randn(1, 3, 64, 64)).shape == (1, 256)  # no fc: pooled features


def test_state_dict_names_and_shapes_equal_timm(timm_botnet26t):
    ours = {k: tuple(v.shape) for k, v in create_model("botnet26t_256").state_dict().items()}
    theirs = {k: tuple(v.shape) for k, v in timm_botnet26t.state_dict().items()}
    assert ours == theirs


def test_logits_equal_timm(timm_botnet26t):
    model = create_model("botnet26t_256").eval()
    model.load_state_dict(timm_botnet26t.state_dict(), strict=True)
    x = torch.randn(1, 3, 256, 256, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        logits = model(x)
        torch.testing.assert_close(logits, timm_botnet26t(x), rtol=1e-5, atol=1e-5)
        assert logits.std() > 0.1  # the attention blocks and the head contribute (no zero-initialised branches)
        # Features reach ~50 here; float32 rounding, summed in another order, is ~1e-5 of that.
        features = model.forward_features(x)
        expected = timm_botnet26t.forward_features(x)
        torch.testing.assert_close(features, expected, rtol=1e-5, atol=1e-5 * expected.abs().max().item())
    assert features.shape == (1, model.num_features, 8, 8)


def test_botnet50_matches_resnet50_with_c5_convs_replaced():
    model = create_model("botnet50")
    resnet = torchvision.models.resnet50()
    replaced = [resnet.layer4[i].conv2.weight for i in range(3)]  # the three c5 3x3 convs (512 -> 512)
    C, heads = 512, 4
    # qkv 1x1 conv (3C x C) per block; relative tables (2H - 1 + 2W - 1, d): 14x14 maps (224 / 16) in the
    # first c5 block, which pools after attending, then 7x7.
    attention = 3 * (3 * C * C) + sum((2 * s - 1) * 2 * (C // heads) for s in (14, 7, 7))
    expected = sum(p.numel() for p in resnet.parameters()) - sum(w.numel() for w in replaced) + attention
    assert sum(p.numel() for p in model.parameters()) == expected
    attn = [m for m in model.modules() if isinstance(m, BottleneckAttn)]
    assert [(a.feat_size, a.num_heads, type(a.pool)) for a in attn] == [
        ((14, 14), 4, nn.AvgPool2d),
        ((7, 7), 4, nn.Identity),
        ((7, 7), 4, nn.Identity),
    ]
    # The paper lists BoT50 at 20.8M parameters, truncating as it does for ResNet-50 (25.56M listed as 25.5M).
    assert 20.8e6 <= expected < 20.9e6

    # Everything but the attention has ResNet-50's shapes.
    ours = Counter(
        tuple(p.shape) for name, p in model.named_parameters() if ".self_attn." not in name
    )  # post_attn BN stands where bn2 was
    theirs = Counter(tuple(p.shape) for p in resnet.parameters()) - Counter(tuple(w.shape) for w in replaced)
    assert ours == theirs


def test_botnet50_forward_shapes():
    model = create_model("botnet50", img_size=64, num_classes=10).eval()  # 64 input: c5 maps 4x4 then 2x2
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        features = model.forward_features(x)
        assert features.shape == (2, 2048, 2, 2)
        assert model.forward_head(features, pre_logits=True).shape == (2, model.num_features)
        assert model(x).shape == (2, 10)


def test_sdpa_matches_math_forward_backward():
    torch.manual_seed(0)
    sdpa = create_model("botnet26t_256", **TINY, attn_backend="sdpa")
    randomize_batchnorm(sdpa)
    math = create_model("botnet26t_256", **TINY, attn_backend="math")
    math.load_state_dict(sdpa.state_dict())
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        torch.testing.assert_close(sdpa.eval()(x), math.eval()(x), rtol=1e-5, atol=1e-5)

    # Gradients through the whole network (training-mode BatchNorm) in float64, where both backends must agree
    # to rounding; the relative logits depend on q, so sdpa's additive mask carries gradient too.
    results = []
    for model in (sdpa, math):
        model.double().train()
        out = model(x.double())
        out.square().sum().backward()
        results.append((out, {n: p.grad for n, p in model.named_parameters()}))
    torch.testing.assert_close(results[0][0], results[1][0], rtol=1e-10, atol=1e-12)
    for name, grad in results[0][1].items():
        torch.testing.assert_close(grad, results[1][1][name], rtol=1e-9, atol=1e-12, msg=name)
    assert results[0][1]["stages.3.1.self_attn.pos_embed.height_rel"].abs().sum() > 0


def test_capture_attention_maps():
    torch.manual_seed(0)
    model = create_model("botnet26t_256", **{**TINY, "img_size": 128}).eval()
    x = torch.randn(2, 3, 128, 128)
    with torch.no_grad():
        plain = model(x)
        with capture_attention(model) as maps:
            captured = model(x)
    # 128 input: c4 maps are 8x8; the first c5 block attends at 8x8 and then pools to 4x4.
    expected = {"stages.2.1.self_attn": 64, "stages.3.0.self_attn": 64, "stages.3.1.self_attn": 16}
    assert {name: a.shape for name, a in maps.items()} == {name: (2, 4, n, n) for name, n in expected.items()}
    for attn in maps.values():
        torch.testing.assert_close(attn.sum(-1), torch.ones(attn.shape[:-1]))
    torch.testing.assert_close(captured, plain, rtol=1e-5, atol=1e-5)


def test_bad_inputs_raise():
    model = create_model("botnet26t_256", **TINY)
    with pytest.raises(ValueError, match="expects images \\(B, C, H, W\\)"):
        model(torch.randn(3, 64, 64))
    with pytest.raises(ValueError, match="floating-point images, got dtype torch.uint8"):
        model(torch.zeros(1, 3, 64, 64, dtype=torch.uint8))
    with pytest.raises(ValueError, match="built for 3 input channels, got 1"):
        model(torch.randn(1, 1, 64, 64))
    with pytest.raises(ValueError, match="takes 64x64 images only.*4x4 feature map.*got 96x96 images"):
        model(torch.randn(1, 3, 96, 96))


@pytest.mark.parametrize(
    "fields, message",
    [
        (dict(img_size=100), "not a multiple of the network stride 32"),
        (dict(stem_type="5x5"), "stem_type must be one of"),
        (dict(bot_depths=(0, 0, 0, 4)), "bot_depths\\[3\\]=4 must be in \\[0, 3\\]"),
        (dict(bot_depths=(0, 0, 0, 0)), "no BoT block"),
        (dict(depths=(2, 2, 2)), "one entry per stage"),
        (dict(num_heads=3), "num_heads 3 does not divide"),
        (dict(attn_backend="flash"), "attention backend must be one of"),
    ],
)
def test_bad_config_raises(fields, message):
    with pytest.raises(ValueError, match=message):
        BotNetConfig(**fields)


def test_save_and_load_round_trip(tmp_path):
    torch.manual_seed(0)
    model = create_model("botnet26t_256", **{**TINY, "img_size": (64, 96)}).eval()
    randomize_batchnorm(model)
    save_pretrained(model, tmp_path / "bot")
    loaded = from_pretrained(tmp_path / "bot")
    assert loaded.config == model.config
    x = torch.randn(2, 3, 64, 96)
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), model(x), rtol=0, atol=0)
    math = from_pretrained(tmp_path / "bot", attn_backend="math")
    with torch.no_grad():
        torch.testing.assert_close(math(x), copy.deepcopy(model)(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["botnet50", "botnet26t_256"])
def test_analytic_cost_equals_flop_counter(name):
    with torch.device("meta"):  # shapes only: FlopCounterMode counts from shapes
        model = create_model(name, attn_backend="math").eval()
    report = profile(model, batch=2)
    x = torch.empty(2, 3, *report.img_size, device="meta")
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(x)
    assert report.matmul_flops == counter.get_total_flops()
    assert report.params == sum(p.numel() for p in model.parameters())
    rows = {(op.module, op.op) for op in report.ops}
    assert ("stages.3.0.self_attn.pos_embed", "bmm") in rows  # the relative logits: q against the tables
    assert ("stages.3.0.self_attn.pool", "avg_pool2d") in rows


def test_init_reaches_every_parameter_and_zero_init_last_as_timm():
    torch.manual_seed(0)
    model = create_model("botnet26t_256", **TINY).train()
    model(torch.randn(2, 3, 64, 64)).square().mean().backward()
    assert [n for n, p in model.named_parameters() if p.grad is None or not p.grad.any()] == []

    ours = create_model("botnet26t_256", img_size=64, zero_init_last=True)
    theirs = timm.create_model("botnet26t_256", pretrained=False, img_size=64)

    def zeroed(m: nn.Module) -> set[str]:
        return {n for n, p in m.named_parameters() if not p.any()}

    assert zeroed(ours) == zeroed(theirs)
    assert {n for n in zeroed(ours) if n.endswith("weight")} == {
        n for n in ours.state_dict() if n.endswith("conv3_1x1.bn.weight")
    }
