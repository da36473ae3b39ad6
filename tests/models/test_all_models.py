"""Every registered model: timm's parameter layout, forward shape, gradients to every parameter, backends agree,
the model interface (`vitkit.models.interface.VitkitModel`, and `VitkitDetector` for a detector family), gradient
checkpointing.

A family added to the registry is covered here automatically; it only needs a row in FAMILIES saying how to shrink
it for a quick forward/backward while keeping the variant's width, heads and patch, how many blocks
`set_grad_checkpointing` wraps, and which parameters get no gradient at initialisation. What forward returns comes
from the family's task (classifier logits, or a detector's dict as `VitkitDetector` describes it).
"""

import copy
import dataclasses
import inspect
from collections.abc import Callable
from typing import Any

import pytest
import timm
import torch
from torch import nn

import vitkit
from vitkit.layers import SampledAttention, capture_attention, set_attention_backend, to_2tuple
from vitkit.models.interface import VitkitDetector, VitkitModel, has_no_object_logit, predicts_masks
from vitkit.models.registry import DETECTION, families, family, family_of, model_entry, replace_config


def task_outputs(model: nn.Module) -> object:
    """The shapes forward returns for 2 images, as the model's task says: classifier logits (2, num_classes), or a
    detector's dict (`VitkitDetector`): the last decoder layer's predictions (K + 1 or K class logits, as the model
    declares `no_object_logit`) and, with `config.aux_loss`, those of every earlier decoder layer (one
    cross-attention layer each, `object_attention_layers`)."""
    c = model.config
    if family_of(model).task != DETECTION:
        return (2, c.num_classes)
    logits = c.num_classes + has_no_object_logit(model)  # K, and "no object" where the model declares one
    layer = {"pred_logits": (2, c.num_queries, logits), "pred_boxes": (2, c.num_queries, 4)}
    earlier = len(model.object_attention_layers()) - 1 if c.aux_loss else 0
    masks = {}
    if predicts_masks(model):  # the last layer's mask logits at a quarter of the image's size
        masks["pred_masks"] = (2, c.num_queries, *(side // 4 for side in to_2tuple(c.img_size)))
    return {**layer, "aux_outputs": [layer] * earlier, **masks}


def deformable_detr_outputs(model: nn.Module) -> object:
    """A detector's dict (`task_outputs`) and, two-stage, the encoder's proposals `enc_outputs`: K logits and a box
    for each of the N tokens of all levels."""
    shapes = task_outputs(model)
    c = model.config
    if c.two_stage:
        N = sum(h * w for h, w in model.level_sizes(to_2tuple(c.img_size)))
        shapes["enc_outputs"] = {"pred_logits": (2, N, c.num_classes), "pred_boxes": (2, N, 4)}
    return shapes


def deformable_detr_no_gradient(c: Any) -> frozenset[str]:
    """What a fresh Deformable DETR gives no gradient, from the paper's initialisation:

    - every box head's last layer starts at zero (weight and bias), so nothing flows back through it to the head's
      first two layers (the last layer itself gets its gradient);
    - every deformable attention's `sampling_offsets` and `attention_weights` start with zero weights (the offsets'
      bias a fixed pattern of directions, the weights' bias zero), so the query changes neither where nor with what
      weight a head samples: the gradient to the queries is zero. The encoder's tokens reach the loss as values too,
      but `level_embed` only through the positions added to the queries, so it gets none. (The offsets and weights
      themselves get theirs: their output moves the samples and their softmax.)
    - with denoising queries, `label_embed`: only training with the ground truth feeds it (`forward(..., denoising)`).
    """
    heads = [f"bbox_embed.{i}." for i in range(c.dec_layers + c.two_stage)] if c.box_refine else ["bbox_embed."]
    first_two = {f"{head}layers.{i}.{p}" for head in heads for i in (0, 1) for p in ("weight", "bias")}
    return frozenset({*first_two, "level_embed", *(["label_embed.weight"] if c.dn_queries else [])})


def shrunk_backbone(c: Any) -> dict:
    """A detector's backbone with one block per stage: a ResNet's depths, or a Swin's or ViT's (`backbone_args`); a
    windowed ViT keeps a windowed block (of 2x2 windows) and a global one."""
    if c.backbone == "resnet":
        return dict(backbone_depths=(1, 1, 1, 1))
    args = dict(c.backbone_args)
    config = model_entry(c.backbone).config
    if hasattr(config, "depths"):
        return dict(backbone_args={**args, "depths": (1,) * len(config.depths)})
    if args.get("window_size"):
        return dict(backbone_args={**args, "depth": 2, "window_size": 2, "global_blocks": (1,)})
    return dict(backbone_args={**args, "depth": 1})


def backbone_blocks(c: Any) -> int:
    """The blocks of a detector's backbone: a ResNet's residual blocks, a Swin's or ViT's transformer blocks."""
    if c.backbone == "resnet":
        return sum(c.backbone_depths)
    config = replace_config(model_entry(c.backbone).config, **dict(c.backbone_args))
    return sum(config.depths) if hasattr(config, "depths") else config.depth


@dataclasses.dataclass(frozen=True)
class FamilyRow:
    """How the tests below run the models of one family."""

    shrink: Callable[[Any], dict]  # config -> fields that make the variant quick, keeping its width, heads and patch
    blocks: Callable[[Any], int]  # config -> how many blocks `set_grad_checkpointing` wraps
    outputs: Callable[[nn.Module], object] = task_outputs  # model -> the shapes forward returns for 2 images
    # trainable parameters a fresh model gives no gradient (or config -> them, when they depend on the variant)
    no_gradient_at_init: frozenset[str] | Callable[[Any], frozenset[str]] = frozenset()


FAMILIES = {
    "vit": FamilyRow(
        shrink=lambda c: dict(img_size=2 * c.patch_size, depth=1),
        blocks=lambda c: c.depth,  # the encoder blocks
    ),
    "swin": FamilyRow(
        shrink=lambda c: dict(img_size=c.patch_size * 8 * 2, depths=(1,) * len(c.depths)),
        blocks=lambda c: sum(c.depths),  # the blocks of every stage
    ),
    "botnet": FamilyRow(
        shrink=lambda c: dict(img_size=64),
        blocks=lambda c: sum(c.depths),  # the bottleneck and BoT blocks of every stage
    ),
    "detr": FamilyRow(
        shrink=lambda c: dict(img_size=64, backbone_depths=(1, 1, 1, 1), enc_layers=1, dec_layers=2),
        blocks=lambda c: sum(c.backbone_depths) + c.enc_layers + c.dec_layers,  # residual blocks, encoder, decoder
        # DETR's decoder slots start at zero, so every value of the first decoder self-attention is its value bias:
        # the attention weights never matter (no gradient to q and k), and with the biases' zero init
        # (nn.MultiheadAttention's) the output projection and the norm after it see zeros until those biases move.
        no_gradient_at_init=frozenset(
            f"decoder.layers.0.{p}.weight" for p in ("self_attn.qkv", "self_attn.proj", "norm1")
        ),
    ),
    "deformable_detr": FamilyRow(
        shrink=lambda c: dict(
            img_size=64, **shrunk_backbone(c), enc_layers=1, dec_layers=2, num_queries=min(c.num_queries, 16)
        ),  # 64x64: 85 tokens on 4 levels (8x8 .. 1x1), enough for two-stage's 16 proposals
        blocks=lambda c: backbone_blocks(c) + c.enc_layers + c.dec_layers,  # backbone blocks, encoder, decoder
        outputs=deformable_detr_outputs,
        no_gradient_at_init=deformable_detr_no_gradient,
    ),
}
DROP_RATES = ("drop_rate", "attn_drop_rate", "drop_path_rate")


def without_dropout(name: str) -> dict:
    """Config fields that turn off every dropout of `name` shrunk (`small_model`), its transformer backbone's too."""
    config = model_entry(name).config
    fields = {f.name for f in dataclasses.fields(config)}
    off = {rate: 0.0 for rate in DROP_RATES if rate in fields}
    if getattr(config, "backbone", "resnet") != "resnet":
        body = {f.name for f in dataclasses.fields(model_entry(config.backbone).config)}
        shrunk = row(name).shrink(config)["backbone_args"]
        off["backbone_args"] = {**shrunk, **{rate: 0.0 for rate in DROP_RATES if rate in body}}
    return off

ALL = vitkit.list_models()


def row(name: str) -> FamilyRow:
    """The FAMILIES row of model `name`'s family."""
    entry = model_entry(name)
    assert entry.family in FAMILIES, f"add a row for family {entry.family!r} to FAMILIES"
    return FAMILIES[entry.family]


def small_model(name: str, **overrides) -> nn.Module:
    """`name` shrunk by its FAMILIES row for 5 classes, built with seed 0."""
    shrink = row(name).shrink(model_entry(name).config)
    torch.manual_seed(0)
    return vitkit.create_model(name, num_classes=5, **{**shrink, **overrides})


def output_shapes(out):
    """The shape of each tensor in `out` (a tensor, or dicts and lists of them), in the same structure."""
    if isinstance(out, torch.Tensor):
        return tuple(out.shape)
    if isinstance(out, dict):
        return {key: output_shapes(value) for key, value in out.items()}
    return [output_shapes(value) for value in out]


def expected_shapes(name: str, model: nn.Module) -> object:
    return row(name).outputs(model)


def square_mean(out) -> torch.Tensor:
    """A scalar that depends on every output tensor: the sum of their mean squares."""
    if isinstance(out, torch.Tensor):
        return out.square().mean()
    return sum(square_mean(value) for value in (out.values() if isinstance(out, dict) else out))


def attended_shape(record: torch.Tensor | SampledAttention) -> tuple[int, int, int]:
    """(B, queries, keys) of what `capture_attention` recorded for one layer: a dense map (B, heads, queries, keys),
    or a deformable layer's samples, whose keys are the pixels of all its levels."""
    if isinstance(record, SampledAttention):
        B, Q = record.locations.shape[:2]  # (B, Q, heads, L, K, 2)
        return B, Q, sum(h * w for h, w in record.spatial_shapes)
    return tuple(record.shape[i] for i in (0, 2, 3))


def images(model: nn.Module, batch: int = 2) -> torch.Tensor:
    size = model.config.img_size
    return torch.randn(batch, model.config.in_chans, *((size, size) if isinstance(size, int) else size))


def test_registry_is_not_empty():
    assert len(ALL) >= 14


@pytest.mark.parametrize("name", ALL)
def test_parameter_layout_equals_timm(name):
    if name not in timm.list_models():
        pytest.skip(f"timm has no {name}")
    with torch.device("meta"):
        ours = vitkit.create_model(name)
        # timm builds some (vit_huge_patch14_224) without a head by default: compare at the same number of classes
        theirs = timm.create_model(name, pretrained=False, num_classes=ours.config.num_classes).state_dict()
        ours = ours.state_dict()
    assert {k: tuple(v.shape) for k, v in ours.items()} == {k: tuple(v.shape) for k, v in theirs.items()}


@pytest.mark.parametrize("name", ALL)
def test_small_forward_backward_reaches_every_parameter(name):
    model = small_model(name)
    x = images(model)
    model.train()
    out = model(x)
    assert output_shapes(out) == expected_shapes(name, model)
    square_mean(out).backward()
    no_grad = {n for n, p in model.named_parameters() if p.requires_grad and (p.grad is None or not p.grad.any())}
    expected = row(name).no_gradient_at_init
    assert no_grad == (expected(model.config) if callable(expected) else expected)

    model.eval()
    with torch.no_grad():
        fast = model(x)
        slow = set_attention_backend(model, "math")(x)
    torch.testing.assert_close(fast, slow, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", ALL)
def test_model_provides_the_interface(name):
    model = small_model(name).eval()
    assert isinstance(model, VitkitModel)
    config = model.config
    assert dataclasses.is_dataclass(config) and type(config).__dataclass_params__.frozen
    assert {"img_size", "in_chans", "num_classes"} <= {f.name for f in dataclasses.fields(config)}
    x = images(model)
    with torch.no_grad(), capture_attention(model) as maps:
        out = model(x)
        features = model.forward_features(x)
    torch.testing.assert_close(model.forward_head(features), out)
    assert output_shapes(out) == expected_shapes(name, model)
    assert model.forward_head(features, pre_logits=True).shape[0] == 2

    # token_grid: (P, (Hp, Wp)) exactly when every attention layer attends over the same P + Hp * Wp tokens of
    # each image (attention pooling's one probe query over them too); None when the captured maps are windows
    # (batch B * nW) or differ in size between layers.
    shapes = {attended_shape(attn) for attn in maps.values()}
    grid = model.token_grid(tuple(x.shape[-2:]))
    if grid is None:
        assert len(shapes) > 1 or next(iter(shapes))[0] != 2
        if family_of(model).task != DETECTION:  # a classifier says why, in its family's words, for `vitkit attention`
            assert isinstance(model.attention_layout(), str) and model.attention_layout().startswith(("its", "each"))
    else:
        prefix, (Hp, Wp) = grid
        T = prefix + Hp * Wp
        probe = {(2, 1, T)} if getattr(config, "global_pool", None) == "map" else set()
        assert shapes == {(2, T, T)} | probe


CLASSIFIERS = [n for n in ALL if family(model_entry(n).family).task != DETECTION]


@pytest.mark.parametrize("name", CLASSIFIERS)
def test_reset_classifier_as_timm_s(name):
    """timm's `reset_classifier(num_classes)` and `get_classifier()`: a fresh head on the same pooled features, the
    config following; 0 classes: the pooled features out."""
    model = small_model(name).double().eval()
    x = images(model).double()
    distilled = getattr(model.config, "distilled", False)
    with torch.no_grad():
        pooled = model.forward_head(model.forward_features(x), pre_logits=True)
        model.reset_classifier(7)
        head = model.get_classifier()[0] if distilled else model.get_classifier()
        assert isinstance(head, nn.Linear) and head.weight.dtype == torch.float64 and model.config.num_classes == 7
        torch.nn.init.normal_(head.weight)
        logits = model(x)
        if distilled:  # the mean of the class and distillation tokens' heads
            tokens = model.forward_features(x)
            expected = (head(tokens[:, 0]) + model.head_dist(tokens[:, 1])) / 2
        else:
            expected = head(pooled)
        torch.testing.assert_close(logits, expected)
        model.reset_classifier(0)
        assert model.config.num_classes == 0
        heads = model.get_classifier() if distilled else [model.get_classifier()]
        assert all(isinstance(h, nn.Identity) for h in heads)
        torch.testing.assert_close(model(x), pooled)
        model.reset_classifier(3)  # from none: in the model's dtype
        assert model(x).shape == (2, 3) and model(x).dtype == torch.float64
    with pytest.raises(ValueError, match="num_classes must be >= 0"):
        model.reset_classifier(-1)


def test_every_family_has_a_row():
    assert set(FAMILIES) == {fam.name for fam in families()}


@pytest.mark.parametrize("name", ALL)
def test_model_provides_what_its_family_declares(name):
    """Every model names its parameters without weight decay (`no_weight_decay`: parameters of ndim > 1); a model of
    a detector family provides `VitkitDetector`, its `predict` being forward's last-layer predictions."""
    model = small_model(name).eval()
    params = dict(model.named_parameters())
    no_decay = model.no_weight_decay()
    assert isinstance(no_decay, set) and no_decay <= set(params)
    assert all(params[n].ndim > 1 for n in no_decay)
    if family_of(model).task != DETECTION:
        return
    assert isinstance(model, VitkitDetector)
    assert isinstance(model.backbone, nn.Module)
    layers = model.object_attention_layers()
    assert layers and set(layers) <= {n for n, _ in model.named_modules()}
    x = images(model)
    with torch.no_grad():
        out, predicted = model(x), model.predict(x)
    assert set(predicted) == {"pred_logits", "pred_boxes", *(["pred_masks"] if predicts_masks(model) else [])}
    torch.testing.assert_close(predicted, {k: out[k] for k in predicted})


@pytest.mark.parametrize("name", ALL)
def test_cost_takes_the_declared_arguments(name):
    with torch.device("meta"):
        model = vitkit.create_model(name)
    declared = list(inspect.signature(VitkitModel.cost).parameters.values())[1:]  # without self
    ours = list(inspect.signature(model.cost).parameters.values())
    assert [(p.name, p.default) for p in ours] == [(p.name, p.default) for p in declared]


def _forward_saving(model: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, int]:
    """model(x) and the number of tensors autograd saved for backward outside checkpointed regions."""
    saved = 0

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        nonlocal saved
        saved += 1
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        return model(x), saved


@pytest.mark.parametrize("name", ALL)
def test_grad_checkpointing_keeps_gradients_and_state(name):
    plain = small_model(name, **without_dropout(name)).train()
    wrapped = copy.deepcopy(plain)
    units = plain.shard_units()
    assert len(units) == row(name).blocks(plain.config)
    submodules = {id(m) for m in plain.modules()}
    assert all(isinstance(u, nn.Module) and id(u) in submodules and u is not plain for u in units)
    assert len({id(u) for u in units}) == len(units)
    assert wrapped.set_grad_checkpointing() == row(name).blocks(plain.config)
    assert list(wrapped.state_dict()) == list(plain.state_dict())
    x = images(plain)
    out, saved = _forward_saving(plain, x)
    square_mean(out).backward()
    out_wrapped, saved_wrapped = _forward_saving(wrapped, x)
    square_mean(out_wrapped).backward()
    assert saved_wrapped < saved  # the blocks' activations were not kept
    torch.testing.assert_close(out_wrapped, out)
    for (param_name, p), q in zip(plain.named_parameters(), wrapped.parameters(), strict=True):
        assert (p.grad is None) == (q.grad is None), param_name
        assert p.grad is None or torch.allclose(q.grad, p.grad), param_name
    for (key, a), b in zip(plain.state_dict().items(), wrapped.state_dict().values(), strict=True):
        assert torch.equal(a, b), key  # BatchNorm statistics moved once, as without checkpointing

    # Off in eval (and under no_grad), and after disabling.
    plain.eval()
    wrapped.eval()
    assert _forward_saving(wrapped, x)[1] == _forward_saving(plain, x)[1]
    with torch.no_grad():
        torch.testing.assert_close(wrapped(x), plain(x))
    assert wrapped.train().set_grad_checkpointing(False) == 0
    assert _forward_saving(wrapped, x)[1] == saved
