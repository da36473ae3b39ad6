"""Weight-decay groups and the warmup + cosine schedule, against explicit rules written here."""

from __future__ import annotations

import math

import pytest
import torch

from vitkit import create_model
from vitkit.train import create_optimizer, param_groups, warmup_cosine


def test_no_decay_on_norms_biases_tokens_and_position_tables():
    model = create_model("deit_tiny_distilled_patch16_224", img_size=32, patch_size=8, depth=2, init_values=1e-5)
    decayed, plain = param_groups(model, 0.05)
    names = {id(p): n for n, p in model.named_parameters()}
    expected_plain = {
        n
        for n, p in model.named_parameters()
        if n.endswith(".bias") or "norm" in n or n.endswith(".gamma") or n in ("cls_token", "dist_token", "pos_embed")
    }
    assert {names[id(p)] for p in plain["params"]} == expected_plain
    assert {names[id(p)] for p in decayed["params"]} == {n for n, _ in model.named_parameters()} - expected_plain
    assert "blocks.0.attn.qkv.weight" not in expected_plain and "patch_embed.proj.weight" not in expected_plain
    assert (decayed["weight_decay"], plain["weight_decay"]) == (0.05, 0.0)


def test_swin_relative_position_tables_are_not_decayed():
    model = create_model("swin_tiny_patch4_window7_224", img_size=56, depths=(1, 1), num_heads=(1, 2), embed_dim=16)
    _, plain = param_groups(model, 0.05)
    names = {id(p): n for n, p in model.named_parameters()}
    tables = {n for n, _ in model.named_parameters() if n.endswith("relative_position_bias_table")}
    assert tables and tables <= {names[id(p)] for p in plain["params"]}


def test_optimizer_is_adamw_with_decoupled_decay():
    model = torch.nn.Linear(3, 2)
    optimizer = create_optimizer(model, lr=0.1, weight_decay=0.5)
    assert isinstance(optimizer, torch.optim.AdamW)
    before = model.weight.detach().clone()
    model.weight.grad = torch.zeros_like(model.weight)
    model.bias.grad = torch.zeros_like(model.bias)
    optimizer.step()
    # With zero gradients only the decoupled decay moves the weights: w <- w * (1 - lr * wd); biases stay.
    torch.testing.assert_close(model.weight.detach(), before * (1 - 0.1 * 0.5))
    with pytest.raises(ValueError, match="learning rate"):
        create_optimizer(model, lr=0.0, weight_decay=0.0)


def test_fused_on_cpu_and_equal_to_the_reference_adamw():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.LayerNorm(4))
    reference = torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.LayerNorm(4))
    reference.load_state_dict(model.state_dict())
    optimizer = create_optimizer(model, lr=0.01, weight_decay=0.1)
    assert optimizer.defaults["fused"] is True
    # torch's single-tensor loop, the unfused reference, over the same decay groups
    loop = torch.optim.AdamW(param_groups(reference, 0.1), lr=0.01, foreach=False)
    for _ in range(3):
        x = torch.randn(8, 5)
        for net, opt in ((model, optimizer), (reference, loop)):
            net(x).square().mean().backward()
            opt.step()
            opt.zero_grad()
    for p, q in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(p, q, atol=1e-6, rtol=1e-6)


def test_warmup_then_cosine_schedule():
    total, warmup, lr, min_lr = 20, 5, 1.0, 0.1
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=lr)
    scheduler = warmup_cosine(optimizer, total, warmup, min_lr / lr)
    seen = []
    for _ in range(total):
        seen.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    expected = [lr * (s + 1) / warmup for s in range(warmup)]
    expected += [
        min_lr + (lr - min_lr) * 0.5 * (1 + math.cos(math.pi * (s - warmup) / (total - warmup - 1)))
        for s in range(warmup, total)
    ]
    assert seen == pytest.approx(expected)
    assert seen[warmup] == pytest.approx(lr) and seen[-1] == pytest.approx(min_lr)


def test_a_detectors_backbone_learns_at_its_own_rate():
    model = create_model("detr_tiny", backbone_width=8, hidden_dim=16, num_heads=2, dim_feedforward=32)
    groups = param_groups(model, 1e-4, backbone_lr=1e-5)
    names = {id(p): n for n, p in model.named_parameters()}
    backbone = {n for n, _ in model.named_parameters() if n.startswith("backbone.")}
    assert [g.get("lr") for g in groups] == [None, None, 1e-5, 1e-5]
    assert {names[id(p)] for g in groups[2:] for p in g["params"]} == backbone
    assert {names[id(p)] for g in groups[:2] for p in g["params"]} == set(names.values()) - backbone
    assert [g["weight_decay"] for g in groups] == [1e-4, 0.0, 1e-4, 0.0]
    optimizer = create_optimizer(model, lr=1e-4, weight_decay=1e-4, backbone_lr=1e-5)
    schedule = warmup_cosine(optimizer, total_steps=10, warmup_steps=0, min_factor=0.1)
    for _ in range(5):
        optimizer.step()
        schedule.step()
    factor = [g["lr"] / g["initial_lr"] for g in optimizer.param_groups]
    assert factor == pytest.approx([factor[0]] * 4) and factor[0] < 1  # both rates follow one schedule
    with pytest.raises(ValueError, match="Linear has no backbone"):
        param_groups(torch.nn.Linear(2, 2), 0.0, backbone_lr=1e-5)


@pytest.mark.parametrize(
    "name, fields",
    [
        ("vit_small_patch16_224", dict(img_size=32, patch_size=8, depth=2)),
        ("vit_small_patch16_224", dict(img_size=32, patch_size=8, depth=2, class_token=False, global_pool="avg")),
        ("deit_tiny_distilled_patch16_224", dict(img_size=32, patch_size=8, depth=2)),
        ("swin_tiny_patch4_window7_224", dict(img_size=56, depths=(1, 1), num_heads=(1, 2), embed_dim=16)),
    ],
)
def test_no_weight_decay_is_timms(name, fields):
    """The parameters a model names as not decayed are those timm names for its model of the same layout
    (`no_weight_decay()`, and `no_weight_decay_keywords()` where timm has it)."""
    timm = pytest.importorskip("timm")
    ours = create_model(name, **fields)
    theirs = timm.create_model(name, pretrained=False, **fields)
    params = {n for n, _ in theirs.named_parameters()}
    assert {n for n, _ in ours.named_parameters()} == params  # timm's layout: the names compare
    named = theirs.no_weight_decay()
    keywords = theirs.no_weight_decay_keywords() if hasattr(theirs, "no_weight_decay_keywords") else set()
    expected = {n for n in params if n in named or any(word in n for word in keywords)}
    assert expected and ours.no_weight_decay() == expected
