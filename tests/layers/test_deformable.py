"""Multi-scale deformable attention: the reference against transformers' and the paper's equation, the gather path
against the reference (forward and backward), dispatch, capture, dense maps, errors, and the layer's cost rows
against torch's counters and measured memory."""

import functools
import importlib.util
import math
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

import vitkit
import vitkit.kernels.deformable as deformable
from vitkit.analysis import PeakMemory
from vitkit.analysis.memory import inference_peak_bytes, saved_for_backward_bytes, training_peak_bytes
from vitkit.cost import CostContext, trace
from vitkit.kernels.deformable import (
    gathered_deformable_attention,
    levelwise_deformable_attention,
    reference_deformable_attention,
)
from vitkit.layers import (
    Attention,
    MultiScaleDeformableAttention,
    SampledAttention,
    attention_layers,
    capture_attention,
    set_attention_backend,
)

SHAPES = ((5, 7), (3, 4), (1, 2))  # levels of different sizes, one a single row
B, Q, D, HEADS, K = 2, 6, 16, 2, 3
L, N = len(SHAPES), sum(H * W for H, W in SHAPES)


@functools.cache
def dispatcher_flops() -> type:
    """The counting mode of tests/analysis/test_elementwise_flops.py: every operator dispatched, counted by the rule
    a trace counts with."""
    path = Path(__file__).parents[1] / "analysis" / "test_elementwise_flops.py"
    spec = importlib.util.spec_from_file_location("elementwise_flops", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.DispatcherFlops


def make_layer(backend: str = "auto", dtype: torch.dtype = torch.float64, seed: int = 0, **sizes):
    """A layer with every weight moved off its initial value: offsets of a few pixels that take points off the maps,
    attention weights far from uniform."""
    torch.manual_seed(seed)
    kwargs = {"dim": D, "num_heads": HEADS, "num_levels": L, "num_points": K, **sizes}
    layer = MultiScaleDeformableAttention(**kwargs, backend=backend).to(dtype)
    with torch.no_grad():
        for p in layer.parameters():
            p.add_(torch.randn_like(p) * (0.5 if p is layer.sampling_offsets.weight else 0.3))
    return layer


def inputs(kind: int = 2, dtype: torch.dtype = torch.float64, seed: int = 1, batch: int = B, queries: int = Q):
    """query (B, Q, D), reference points (B, Q, L, kind): points in [-0.2, 1.2] (some off the maps) or boxes
    (cx, cy, w, h), and values (B, N, D)."""
    torch.manual_seed(seed)
    query = torch.randn(batch, queries, D, dtype=dtype)
    ref = torch.rand(batch, queries, L, kind, dtype=dtype)
    ref[..., :2] = ref[..., :2] * 1.4 - 0.2
    value = torch.randn(batch, N, D, dtype=dtype)
    return query, ref, value


def random_samples(dtype=torch.float64, seed=2):
    """Values (B, N, h, d), locations (B, Q, h, L, K, 2) in [-0.3, 1.3] and weights (B, Q, h, L, K) summing to one."""
    torch.manual_seed(seed)
    value_heads = torch.randn(B, N, HEADS, D // HEADS, dtype=dtype)
    locations = torch.rand(B, Q, HEADS, L, K, 2, dtype=dtype) * 1.6 - 0.3
    weights = torch.randn(B, Q, HEADS, L * K, dtype=dtype).softmax(-1).view(B, Q, HEADS, L, K)
    return value_heads, locations, weights


def transformers_attention(value_heads, shapes, locations, weights):
    """transformers' pure-PyTorch multi-scale deformable attention (its `MultiScaleDeformableAttention` module)."""
    from transformers.models.deformable_detr.modeling_deformable_detr import MultiScaleDeformableAttention

    spatial = torch.tensor(shapes)
    starts = torch.cat([spatial.new_zeros(1), spatial.prod(1).cumsum(0)[:-1]])
    return MultiScaleDeformableAttention()(value_heads, spatial, list(shapes), starts, locations, weights, 64)


def bilinear(value_map: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """value_map (H, W, C) read at normalised points (x, y) (each (P,)): the four pixels around the point (pixel
    centres at (i + 0.5) / size), weighted by their bilinear shares, zero outside the map -> (P, C)."""
    H, W, C = value_map.shape
    px, py = x * W - 0.5, y * H - 0.5
    x0, y0 = px.floor(), py.floor()
    out = value_map.new_zeros(len(x), C)
    for dx in (0, 1):
        for dy in (0, 1):
            xi, yi = x0 + dx, y0 + dy
            share = (1 - (px - xi).abs()) * (1 - (py - yi).abs())  # (P,)
            inside = (xi >= 0) & (xi < W) & (yi >= 0) & (yi < H)
            pixels = value_map[yi.long().clamp(0, H - 1), xi.long().clamp(0, W - 1)]  # (P, C)
            out = out + torch.where(inside[:, None], share[:, None] * pixels, 0.0)
    return out


def papers_equation(layer, query, ref, value, shapes, padding_mask=None):
    """Equation 3 of the paper, one level, head and point at a time:
    W_o [sum_m W_m sum_l sum_k A_mlqk x_l(phi_l(p_q) + Delta p_mlqk)], written from the layer's weights."""
    Bq, Qq, _ = query.shape
    h, Ln, Kn, d = layer.num_heads, layer.num_levels, layer.num_points, layer.head_dim
    x = value @ layer.value_proj.weight.T + layer.value_proj.bias  # (B, N, D)
    if padding_mask is not None:
        x = x * (~padding_mask)[..., None]
    offsets = (query @ layer.sampling_offsets.weight.T + layer.sampling_offsets.bias).view(Bq, Qq, h, Ln, Kn, 2)
    logits = (query @ layer.attention_weights.weight.T + layer.attention_weights.bias).view(Bq, Qq, h, Ln * Kn)
    A = (logits.exp() / logits.exp().sum(-1, keepdim=True)).view(Bq, Qq, h, Ln, Kn)
    heads = torch.zeros(Bq, Qq, h, d, dtype=query.dtype)
    start = 0
    for level, (H, W) in enumerate(shapes):
        x_l = x[:, start : start + H * W].view(Bq, H, W, h, d)
        start += H * W
        for m in range(h):
            for k in range(Kn):
                delta = offsets[:, :, m, level, k]  # (B, Q, 2)
                if ref.shape[-1] == 2:  # offsets in pixels of level l
                    loc = ref[:, :, level] + delta / torch.tensor([W, H], dtype=query.dtype)
                else:  # offsets in half the box's size over K
                    loc = ref[:, :, level, :2] + delta / Kn * ref[:, :, level, 2:] * 0.5
                for b in range(Bq):
                    read = bilinear(x_l[b, :, :, m], loc[b, :, 0], loc[b, :, 1])  # (Q, d)
                    heads[b, :, m] += A[b, :, m, level, k, None] * read
    return heads.reshape(Bq, Qq, h * d) @ layer.output_proj.weight.T + layer.output_proj.bias


# --- the reference ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("shapes", [SHAPES, ((4, 4), (8, 3), (2, 9))])
def test_reference_equals_transformers_in_float64(shapes):
    value_heads, locations, weights = random_samples()
    value_heads = torch.randn(B, sum(H * W for H, W in shapes), HEADS, D // HEADS, dtype=torch.float64)
    outside = (locations < 0) | (locations > 1)
    assert outside.any() and (~outside).any()  # points off the maps and on them
    expected = transformers_attention(value_heads, shapes, locations, weights)
    for spatial in (shapes, torch.tensor(shapes)):  # pairs or an (L, 2) tensor
        out = reference_deformable_attention(value_heads, spatial, locations, weights)
        torch.testing.assert_close(out, expected, rtol=0, atol=1e-14)


@pytest.mark.parametrize("kind", [2, 4])
@pytest.mark.parametrize("backend", ["math", "gather"])
def test_layer_equals_the_papers_equation_and_transformers_layer(kind, backend):
    from transformers import DeformableDetrConfig
    from transformers.models.deformable_detr.modeling_deformable_detr import (
        DeformableDetrMultiscaleDeformableAttention,
    )

    layer = make_layer(backend)
    query, ref, value = inputs(kind)
    mask = torch.zeros(B, N, dtype=torch.bool)
    mask[1, -9:] = True  # the second sample's last tokens are padding
    with torch.no_grad():
        out = layer(query, ref, value, SHAPES, mask)
        torch.testing.assert_close(out, papers_equation(layer, query, ref, value, SHAPES, mask), rtol=0, atol=1e-13)
        config = DeformableDetrConfig(d_model=D, num_feature_levels=L, use_timm_backbone=False, backbone_config=None)
        theirs = DeformableDetrMultiscaleDeformableAttention(config, HEADS, K).double()
        theirs.load_state_dict(layer.state_dict())  # the same parameter names and layout
        spatial = torch.tensor(SHAPES)
        starts = torch.cat([spatial.new_zeros(1), spatial.prod(1).cumsum(0)[:-1]])
        expected, weights = theirs(
            query, ~mask, encoder_hidden_states=value, reference_points=ref, spatial_shapes=spatial,
            spatial_shapes_list=list(SHAPES), level_start_index=starts,
        )  # fmt: skip
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-13)


# --- the gather and the levelwise path against the reference ----------------------------------------------------


def forward_backward(layer, query, ref, value, mask=None):
    """The layer's output and the gradients of a fixed random projection of it to the query, reference points,
    values and every parameter."""
    query, ref, value = (t.detach().clone().requires_grad_(True) for t in (query, ref, value))
    layer.zero_grad(set_to_none=True)
    out = layer(query, ref, value, SHAPES, mask)
    projection = torch.randn(out.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    (out * projection.to(out.dtype)).sum().backward()
    grads = {"query": query.grad, "reference_points": ref.grad, "value": value.grad}
    grads |= {name: p.grad for name, p in layer.named_parameters()}
    return out.detach(), grads


def by_path(layer, *args, **kwargs):
    """`forward_backward` in training mode on each path: the gather, the levelwise path and the reference ("math")."""
    results = {}
    for path, backend in (("gather", "gather"), ("levelwise", "levelwise"), ("reference", "math")):
        layer.backend = backend
        assert layer.path(True) == path
        results[path] = forward_backward(layer.train(), *args, **kwargs)
    layer.backend = "auto"
    return results


@pytest.mark.parametrize("kind", [2, 4])
@pytest.mark.parametrize("masked", [False, True])
def test_fast_paths_equal_reference_forward_and_backward_in_float64(kind, masked):
    layer = make_layer()
    query, ref, value = inputs(kind)
    mask = (torch.arange(N) >= N - 7).expand(B, N).clone() if masked else None
    results = by_path(layer, query, ref, value, mask)
    expected, expected_grads = results.pop("reference")
    for path, (out, grads) in results.items():
        torch.testing.assert_close(out, expected, rtol=0, atol=1e-13, msg=path)
        assert len(grads) == 3 + 8  # inputs, and weight and bias of four linear layers
        for name, grad in grads.items():
            assert expected_grads[name].abs().max() > 0, name
            torch.testing.assert_close(grad, expected_grads[name], rtol=0, atol=1e-12, msg=f"{path} {name}")
    with torch.no_grad():  # the in-place arithmetic of the inference path
        torch.testing.assert_close(layer.eval()(query, ref, value, SHAPES, mask), expected, rtol=0, atol=1e-13)


@pytest.mark.parametrize("in_cache", [True, False])
@pytest.mark.parametrize("rows", [1, 3, 4])
@pytest.mark.parametrize("needed", ["all", "value", "locations", "weights", "locations and weights"])
def test_levelwise_backward_passes_gradcheck(monkeypatch, needed, rows, in_cache):
    """The written-out backward against finite differences, for every input and for each alone (the others given
    without gradients, as a frozen projection gives them), with points on and off the maps of uneven levels, in
    chunks of 1, 3 (the last one short) and all 4 rows of (batch, head), the weights' gradient in one product and
    sum (chunks in cache) and a channel at a time (larger ones)."""
    monkeypatch.setattr(deformable, "chunk_rows", lambda total, row_bytes, device: rows)
    monkeypatch.setattr(deformable, "in_cache", lambda samples: in_cache)
    shapes = ((4, 5), (3, 2), (1, 3))
    torch.manual_seed(4)
    value_heads = torch.randn(2, sum(H * W for H, W in shapes), 2, 3, dtype=torch.float64)
    locations = torch.rand(2, 5, 2, len(shapes), 2, 2, dtype=torch.float64) * 1.6 - 0.3
    weights = torch.rand(2, 5, 2, len(shapes), 2, dtype=torch.float64)
    names = ("value", "locations", "weights")
    tensors = [
        t.requires_grad_(needed == "all" or name in needed)
        for name, t in zip(names, (value_heads, locations, weights), strict=True)
    ]

    def attend(value_heads, locations, weights):
        return levelwise_deformable_attention(value_heads, shapes, locations, weights)

    assert torch.autograd.gradcheck(attend, tensors)
    torch.testing.assert_close(
        attend(*tensors), reference_deformable_attention(value_heads, shapes, locations, weights)
    )


def test_levelwise_leaves_the_callers_points_alone():
    """One level and one query: the points' new layout is their old one, and the arithmetic in place still goes to a
    copy (the points are what `capture_attention` records)."""
    torch.manual_seed(5)
    value_heads = torch.randn(1, 12, 2, 3, dtype=torch.float64)
    locations = torch.rand(1, 1, 2, 1, 3, 2, dtype=torch.float64)
    weights = torch.rand(1, 1, 2, 1, 3, dtype=torch.float64)
    before = locations.clone()
    out = levelwise_deformable_attention(value_heads, ((3, 4),), locations, weights)
    assert torch.equal(locations, before)
    torch.testing.assert_close(out, reference_deformable_attention(value_heads, ((3, 4),), locations, weights))


@pytest.mark.parametrize("attend", [gathered_deformable_attention, levelwise_deformable_attention])
def test_fast_paths_equal_reference_at_the_borders(attend):
    """Points on pixel centres, on the maps' edges, half a pixel and a pixel outside, and far away."""
    value_heads, _, _ = random_samples()
    edges = torch.tensor([-2.0, -0.1, 0.0, 0.5 / 7, 0.25, 1 - 0.5 / 7, 1.0, 1.1, 3.0], dtype=torch.float64)
    xy = torch.cartesian_prod(edges, edges)  # (81, 2)
    locations = xy.view(1, -1, 1, 1, 1, 2).expand(B, -1, HEADS, L, K, 2).contiguous()
    weights = torch.rand(B, len(xy), HEADS, L, K, dtype=torch.float64)
    expected = reference_deformable_attention(value_heads, SHAPES, locations, weights)
    torch.testing.assert_close(attend(value_heads, SHAPES, locations, weights), expected)


def largest_error(result, expected) -> float:
    """The largest absolute difference relative to the largest magnitude of `expected`."""
    return ((result.double() - expected.double()).abs().max() / expected.double().abs().max()).item()


@pytest.mark.parametrize("kind", [2, 4])
@pytest.mark.parametrize(
    ("dtype", "forward_tolerance", "gradient_tolerance", "between_paths"),
    [
        (torch.float32, 2e-6, 5e-6, None),  # measured: <= 7.1e-7 forward and backward
        (torch.bfloat16, 0.06, 0.15, (0.01, 0.03)),  # measured: 4.6e-2, 9.2e-2; between the paths 2.5e-3, 1.2e-2
    ],
)
def test_every_path_in_lower_precision(kind, dtype, forward_tolerance, gradient_tolerance, between_paths):
    """Every path in float32 and bfloat16 against the float64 reference, forward and backward (errors relative to
    the largest output or gradient); in bfloat16 the fast paths also against the reference (bfloat16's rounding of
    the inputs and weights dominates the error against float64, the same for all)."""
    layer = make_layer()
    query, ref, value = inputs(kind)
    expected, expected_grads = by_path(layer, query, ref, value)["reference"]
    low = make_layer(dtype=dtype)
    low.load_state_dict(layer.state_dict())
    results = by_path(low, *(t.to(dtype) for t in (query, ref, value)))
    for path, (out, grads) in results.items():
        assert out.dtype == dtype and largest_error(out, expected) <= forward_tolerance, path
        for name, grad in grads.items():
            assert largest_error(grad, expected_grads[name]) <= gradient_tolerance, f"{path} {name}"
    if between_paths is not None:
        reference, reference_grads = results.pop("reference")
        for path, (out, grads) in results.items():
            assert largest_error(out, reference) <= between_paths[0], path
            for name, grad in grads.items():
                assert largest_error(grad, reference_grads[name]) <= between_paths[1], f"{path} {name}"


@pytest.mark.parametrize("backend", ["gather", "math"])
def test_padding_mask_zeroes_the_padded_values(backend):
    layer = make_layer(backend).eval()
    query, ref, value = inputs()
    mask = torch.rand(B, N) < 0.3
    changed = value.masked_fill(mask[..., None], 100.0)  # only the padded tokens change
    with torch.no_grad():
        out = layer(query, ref, value, SHAPES, mask)
        torch.testing.assert_close(layer(query, ref, changed, SHAPES, mask), out, rtol=0, atol=1e-13)
        assert not torch.allclose(layer(query, ref, changed, SHAPES), out)  # unmasked they are read


# --- dispatch, backends, capture ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("backend", "in_training", "in_eval"),
    [
        ("auto", "levelwise", "gather"),
        ("gather", "gather", "gather"),
        ("levelwise", "levelwise", "levelwise"),
        ("math", "reference", "reference"),
    ],
)
def test_path_per_backend_and_mode_is_what_forward_and_cost_run(monkeypatch, backend, in_training, in_eval):
    layer = make_layer(backend, dtype=torch.float32)
    query, ref, value = inputs(dtype=torch.float32)
    called = []
    for path, fn in deformable.PATHS.items():
        monkeypatch.setitem(deformable.PATHS, path, lambda *a, path=path, fn=fn: called.append(path) or fn(*a))
    for training, expected in ((True, in_training), (False, in_eval)):
        layer.train(training)
        assert layer.path(training) == expected
        layer(query, ref, value, SHAPES)
        assert called.pop() == expected
        ops = trace(layer, query, ref, value, SHAPES)
        names = {op.op for op in ops}
        marks = {"gather": "embedding_bag", "levelwise": "weights_levels", "reference": "weighted"}
        assert {path for path, mark in marks.items() if mark in names} == {expected}


def test_set_attention_backend_reaches_deformable_layers():
    model = nn.ModuleDict({"self_attn": Attention(D, HEADS), "cross_attn": make_layer()})
    assert [name for name, _ in attention_layers(model)] == ["self_attn", "cross_attn"]
    for backend in ("math", "auto"):  # names of both kinds
        set_attention_backend(model, backend)
        assert model["cross_attn"].backend == model["self_attn"].backend == backend
    set_attention_backend(model, "sdpa")  # the dense layer's alone
    assert (model["self_attn"].backend, model["cross_attn"].backend) == ("sdpa", "auto")
    set_attention_backend(model, "gather")  # the deformable layer's alone
    assert (model["self_attn"].backend, model["cross_attn"].backend) == ("sdpa", "gather")
    with vitkit.layers.attention_backend(model, "math"):  # for a block: every layer's own comes back after it
        assert model["self_attn"].backend == model["cross_attn"].backend == "math"
    assert (model["self_attn"].backend, model["cross_attn"].backend) == ("sdpa", "gather")
    with pytest.raises(ValueError, match="backend"):
        MultiScaleDeformableAttention(D, HEADS, backend="flash")
    with pytest.raises(ValueError, match="backend"):
        MultiScaleDeformableAttention(D, HEADS, backend="sdpa")  # a dense layer's name


@pytest.mark.parametrize("kind", [2, 4])
@pytest.mark.parametrize("backend", ["gather", "math"])
def test_capture_records_the_layers_locations_and_weights(kind, backend):
    model = nn.ModuleDict({"cross_attn": make_layer(backend)}).eval()
    layer = model["cross_attn"]
    query, ref, value = inputs(kind)
    with torch.no_grad(), capture_attention(model) as maps:
        out = layer(query, ref, value, SHAPES)
    record = maps["cross_attn"]
    assert isinstance(record, SampledAttention) and record.spatial_shapes == SHAPES
    with torch.no_grad():
        locations = layer.sampling_locations(query, ref, SHAPES)
        logits = layer.attention_weights(query).view(B, Q, HEADS, L * K)
        heads = layer.value_proj(value).view(B, N, HEADS, D // HEADS)
        rebuilt = layer.output_proj(reference_deformable_attention(heads, SHAPES, record.locations, record.weights))
    torch.testing.assert_close(record.locations, locations, rtol=0, atol=0)
    torch.testing.assert_close(record.weights, logits.softmax(-1).view(B, Q, HEADS, L, K), rtol=0, atol=0)
    torch.testing.assert_close(rebuilt, out, rtol=0, atol=1e-13)  # the record is what the layer attended with
    assert record.locations.shape == (B, Q, HEADS, L, K, 2) and record.weights.shape == (B, Q, HEADS, L, K)
    layer.train()  # a record is detached, in training too
    with capture_attention(model) as maps:
        layer(query.requires_grad_(), ref, value, SHAPES)
    assert not maps["cross_attn"].locations.requires_grad and not maps["cross_attn"].weights.requires_grad
    assert layer.capture_hook is None  # removed on exit


def brute_force_maps(record: SampledAttention) -> list[torch.Tensor]:
    """Each point's weight spread over the four pixels around it, pixel by pixel: a pixel off the map gives its share
    to the nearest pixel on the map -> one (B, h, Q, H W) map per level."""
    Bn, Qn, h, Ln, Kn, _ = record.locations.shape
    maps = []
    for level, (H, W) in enumerate(record.spatial_shapes):
        grid = torch.zeros(Bn, h, Qn, H, W, dtype=torch.float64)
        for b, q, m, k in torch.cartesian_prod(*(torch.arange(n) for n in (Bn, Qn, h, Kn))).tolist():
            x, y = record.locations[b, q, m, level, k].tolist()
            px, py = x * W - 0.5, y * H - 0.5
            for xi in (math.floor(px), math.floor(px) + 1):
                for yi in (math.floor(py), math.floor(py) + 1):
                    share = (1 - abs(px - xi)) * (1 - abs(py - yi)) * record.weights[b, q, m, level, k].item()
                    grid[b, m, q, min(max(yi, 0), H - 1), min(max(xi, 0), W - 1)] += share
        maps.append(grid.flatten(-2))
    return maps


def test_dense_maps_put_the_weights_where_the_points_are():
    layer = make_layer()
    query, ref, value = inputs(batch=1, queries=3)
    with torch.no_grad(), capture_attention(nn.ModuleDict({"a": layer})) as maps:
        layer(query, ref, value, SHAPES)
    record = maps["a"]
    assert (record.locations < 0).any() and (record.locations > 1).any()  # some points off the maps
    dense = record.dense_maps()
    assert [m.shape for m in dense] == [(1, HEADS, 3, H * W) for H, W in SHAPES]
    torch.testing.assert_close(sum(m.sum(-1) for m in dense), torch.ones(1, HEADS, 3, dtype=torch.float64))
    for got, expected in zip(dense, brute_force_maps(record), strict=True):
        torch.testing.assert_close(got, expected, rtol=0, atol=1e-14)
    # a point on a pixel centre puts all its weight on that pixel
    centre = torch.tensor([(2 + 0.5) / 7, (1 + 0.5) / 5], dtype=torch.float64)
    one = SampledAttention(centre.view(1, 1, 1, 1, 1, 2), torch.ones(1, 1, 1, 1, 1), ((5, 7),))
    assert one.dense_maps()[0].view(5, 7)[1, 2] == 1 and one.dense_maps()[0].sum() == 1


# --- errors ------------------------------------------------------------------------------------------------------


def test_wrong_shapes_say_what_was_expected_and_what_came():
    layer = make_layer()
    query, ref, value = inputs()
    cases = [
        ((query[..., :-1], ref, value, SHAPES), r"query must be \(B, N, 16\), got shape \(2, 6, 15\)"),
        ((query, ref, value[:1], SHAPES), r"query \(2, 6, 16\) and value \(1, 49, 16\) must share the batch"),
        ((query, ref[..., :1], value, SHAPES), r"reference_points must be \(2, 6, 3, 2\) points or \(2, 6, 3, 4\)"),
        ((query, ref, value, SHAPES[:2]), r"spatial_shapes must give the layer's 3 levels, got 2"),
        ((query, ref, value[:, :-1], SHAPES), r"value has 48 tokens, but spatial_shapes .* have sum\(H \* W\) = 49"),
        ((query, ref, value, torch.tensor(SHAPES, dtype=torch.float32)), r"spatial_shapes must be an \(L, 2\) int"),
        ((query, ref, value, ((5, 7), (3, 0), (1, 2))), r"L >= 1 pairs \(H, W\) of positive sizes, got"),
    ]
    for args, message in cases:
        with pytest.raises(ValueError, match=message):
            layer(*args)
    with pytest.raises(ValueError, match=r"padding_mask must be a bool tensor of shape \(2, 49\) .* got torch.float"):
        layer(query, ref, value, SHAPES, torch.zeros(B, N))
    with pytest.raises(ValueError, match="dim 30 is not divisible by num_heads 4"):
        MultiScaleDeformableAttention(30, 4)
    with pytest.raises(ValueError, match="num_points must be >= 1, got 0"):
        MultiScaleDeformableAttention(D, HEADS, num_points=0)


# --- cost --------------------------------------------------------------------------------------------------------


class Holder(nn.Module):
    """The layer as a model holds it (`attn`): its linear layers' rows are then the layer's, as in a model."""

    def __init__(self, layer: nn.Module) -> None:
        super().__init__()
        self.attn = layer

    def forward(self, *args: torch.Tensor) -> torch.Tensor:
        return self.attn(*args)


def layer_cost(layer, query, ref, value, mask=None, dtype=torch.float32):
    return trace(Holder(layer), query, ref, value, SHAPES, mask, ctx=CostContext(dtype))


@pytest.mark.parametrize("kind", [2, 4])
@pytest.mark.parametrize(("backend", "training"), [("gather", False), ("math", False), ("auto", True)])
def test_cost_flops_equal_the_counters(kind, backend, training):
    """On each path: the gather and the reference in inference, the levelwise path in training."""
    layer = make_layer(backend, dtype=torch.float32).train(training)
    query, ref, value = inputs(kind, dtype=torch.float32)
    mask = torch.rand(B, N) < 0.2
    with torch.no_grad(), FlopCounterMode(display=False) as matmul:
        layer(query, ref, value, SHAPES, mask)
    with torch.no_grad(), dispatcher_flops()() as dispatcher:
        layer(query, ref, value, SHAPES, mask)
    ops = layer_cost(layer, query, ref, value, mask)
    assert sum(op.matmul_flops for op in ops) == matmul.get_total_flops() > 0
    assert sum(op.flops for op in ops) == dispatcher.flops > 0 and not dispatcher.unknown
    # the closed forms: four linear layers; bilinear sampling 8 FLOPs per sampled channel on either path
    d = D // HEADS
    assert sum(op.macs for op in ops) == B * N * D * D + B * Q * D * HEADS * L * K * 3 + B * Q * D * D
    sampled = B * Q * HEADS * L * K * d
    bilinear = [op.flops for op in ops if op.op.startswith("grid_sample") or op.op == "embedding_bag"]
    assert sum(bilinear) == deformable.BILINEAR_FLOPS * sampled


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("backend", ["gather", "math", "auto"])
def test_cost_memory_against_measured(dtype, backend):
    """Inference: the estimated peak equals the measured one. Training: what autograd saves equals the estimate
    (the query, an input that requires grad, left out of both), and the peak of a step (forward, zero_grad,
    backward) is within 5% of the estimate on the reference (measured here and at other sizes: within 6%), 8% on the
    levelwise path ("auto" in training; measured here 4-7% over, a fixed 2-5 KB, and within 1% at 300 queries) and
    10% on the gather (measured: up to 9% under; the embedding bag's backward holds the gradients of both the table
    and the per-sample weights, where the estimate counts one input's gradient per operator)."""
    layer = make_layer(backend, dtype=dtype)
    query, ref, value = inputs(4, dtype=dtype, batch=2, queries=30)
    mask = torch.rand(B, N) < 0.2
    with torch.no_grad(), PeakMemory() as measured:
        layer.eval()(query, ref, value, SHAPES, mask)
    ops = layer_cost(layer, query, ref, value, mask, dtype)
    # the gather's per-level constants, made by torch.tensor from lists, reach the dispatcher only as the input of
    # `lift_fresh`: PeakMemory cannot see them (they are alive at the peak)
    unseen = sum(op.out_bytes for op in ops if op.op.startswith("level_") and op.op != "level_scale")
    assert inference_peak_bytes(ops) == measured.peak + unseen > unseen

    ops = layer_cost(layer.train(), query, ref, value, mask, dtype)
    query.requires_grad_(True)
    existing = {t.untyped_storage().data_ptr() for t in (*layer.parameters(), query, ref, value, mask)}
    saved = {}

    def pack(t):
        if t.untyped_storage().data_ptr() not in existing:
            saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        layer(query, ref, value, SHAPES, mask)
    assert saved_for_backward_bytes(ops) == sum(saved.values())

    def step():
        out = layer(query, ref, value, SHAPES, mask)
        layer.zero_grad(set_to_none=True)
        query.grad = None
        out.sum().backward()

    with PeakMemory() as measured:
        step()
        step()  # with the first step's gradients alive until zero_grad
    grads = {"attn": sum(p.numel() * p.element_size() for p in layer.parameters())}
    estimate = training_peak_bytes(ops, grads)
    assert abs(estimate - measured.peak) <= {"gather": 0.10, "auto": 0.08, "math": 0.05}[backend] * measured.peak
