"""The shared Attention: sdpa == math == an explicit per-head loop, capture, errors."""

import copy
import dataclasses
import json

import pytest
import torch
import torch.nn.functional as F

import vitkit
from vitkit.kernels import attention
from vitkit.layers import Attention, attention_layers, capture_attention, set_attention_backend


def explicit_attention(layer: Attention, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """Multi-head attention written the slow way: separate q, k, v slices and a loop over heads."""
    B, N, C = x.shape
    h, d = layer.num_heads, C // layer.num_heads
    w, b = layer.qkv.weight, layer.qkv.bias
    q_all, k_all, v_all = (x @ w[i * C : (i + 1) * C].T + b[i * C : (i + 1) * C] for i in range(3))
    heads = []
    for j in range(h):
        q, k, v = (t[..., j * d : (j + 1) * d] for t in (q_all, k_all, v_all))
        logits = q @ k.transpose(1, 2) / d**0.5
        if bias is not None:
            logits = logits + bias.expand(B, h, N, N)[:, j]
        heads.append(torch.softmax(logits, dim=-1) @ v)
    return layer.proj(torch.cat(heads, dim=-1))


@pytest.mark.parametrize("with_bias", [False, True])
def test_backends_agree_with_explicit_forward_and_backward(with_bias):
    torch.manual_seed(0)
    layer = Attention(32, num_heads=4)
    x = torch.randn(2, 10, 32)
    bias = torch.randn(1, 4, 10, 10, requires_grad=True) if with_bias else None
    results = {}
    for backend in ("sdpa", "math"):
        layer.backend = backend
        xi = x.clone().requires_grad_(True)
        layer.zero_grad()
        out = layer(xi, bias)
        out.square().sum().backward()
        grads = [xi.grad.clone(), layer.qkv.weight.grad.clone(), layer.proj.weight.grad.clone()]
        if with_bias:
            grads.append(bias.grad.clone())
            bias.grad = None
        results[backend] = (out.detach(), grads)
    reference = explicit_attention(layer, x, bias)
    torch.testing.assert_close(results["sdpa"][0], reference, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(results["math"][0], reference, atol=1e-5, rtol=1e-5)
    for g_sdpa, g_math in zip(results["sdpa"][1], results["math"][1], strict=True):
        torch.testing.assert_close(g_sdpa, g_math, atol=1e-5, rtol=1e-5)


def test_bias_broadcasts_per_sample():
    torch.manual_seed(0)
    layer = Attention(16, num_heads=2)
    x = torch.randn(3, 5, 16)
    bias = torch.randn(3, 2, 5, 5)
    torch.testing.assert_close(layer(x, bias), explicit_attention(layer, x, bias), atol=1e-5, rtol=1e-5)


def test_dim_not_divisible_by_heads_names_both_numbers():
    with pytest.raises(ValueError, match="dim 30 is not divisible by num_heads 4"):
        Attention(30, num_heads=4)


def test_unknown_backend_is_rejected():
    with pytest.raises(ValueError, match="'flash3'"):
        Attention(16, num_heads=2, backend="flash3")
    with pytest.raises(ValueError, match="backend must be one of"):
        set_attention_backend(Attention(16, 2), "bogus")


class TwoLayers(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.first = Attention(16, num_heads=2)
        self.second = Attention(16, num_heads=4)

    def forward(self, x):
        return self.second(self.first(x))


@pytest.mark.parametrize("backend", ["sdpa", "math"])
def test_capture_records_probabilities_in_forward_order(backend):
    torch.manual_seed(0)
    model = set_attention_backend(TwoLayers(), backend)
    x = torch.randn(2, 7, 16)
    expected_out = model(x)
    with capture_attention(model) as maps:
        out = model(x)
    torch.testing.assert_close(out, expected_out)  # capturing does not change the result
    assert list(maps) == ["first", "second"]
    assert maps["first"].shape == (2, 2, 7, 7) and maps["second"].shape == (2, 4, 7, 7)
    for attn in maps.values():
        torch.testing.assert_close(attn.sum(-1), torch.ones(attn.shape[:-1]))
        assert not attn.requires_grad
    # The recorded weights are those of an explicit computation.
    layer = model.first
    q, k, _ = layer.qkv(x).reshape(2, 7, 3, 2, 8).permute(2, 0, 3, 1, 4)
    torch.testing.assert_close(maps["first"], torch.softmax(q @ k.transpose(-2, -1) / 8**0.5, -1).detach())


def test_capture_only_inside_context_and_selected_layers():
    model = TwoLayers()
    x = torch.randn(1, 4, 16)
    with capture_attention(model, layers=["second"]) as maps:
        model(x)
        assert list(maps) == ["second"]
    assert all(layer.capture_hook is None for _, layer in attention_layers(model))
    model(x)
    assert list(maps) == ["second"]  # nothing recorded after the context closed


def test_captures_nest_and_take_one_name():
    model = TwoLayers()
    x = torch.randn(1, 4, 16)
    with capture_attention(model) as outer:
        with capture_attention(model, layers="first") as inner:  # one name, not its letters
            model(x)
        assert list(inner) == ["first"] and list(outer) == ["first", "second"]  # in forward order, both
        torch.testing.assert_close(outer["first"], inner["first"])
        model(x)
    assert all(layer.capture_hook is None for _, layer in attention_layers(model))


def test_capture_errors():
    with pytest.raises(ValueError, match="no vitkit Attention layers"):
        with capture_attention(torch.nn.Linear(2, 2)):
            pass
    with pytest.raises(ValueError, match="no attention layer named"):
        with capture_attention(TwoLayers(), layers=["third"]):
            pass


def test_sdpa_does_not_form_weights_outside_capture(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.Tensor, "softmax", lambda self, *a, **k: calls.append(1) or torch.softmax(self, *a, **k))
    layer = Attention(16, num_heads=2)
    layer(torch.randn(1, 4, 16))
    assert calls == []
    with capture_attention(layer):
        layer(torch.randn(1, 4, 16))
    assert calls == [1]


def count_fused_calls(monkeypatch) -> list[int]:
    import vitkit.layers.attention as attention

    calls = []
    fused = attention.F.scaled_dot_product_attention
    monkeypatch.setattr(attention.F, "scaled_dot_product_attention", lambda *a, **k: calls.append(1) or fused(*a, **k))
    return calls


def test_auto_forms_weights_only_for_small_bf16_calls_on_cpu(monkeypatch, native_bf16):
    calls = count_fused_calls(monkeypatch)
    layer = Attention(32, num_heads=4)  # "auto" is the default
    assert layer.backend == "auto"
    with torch.no_grad():
        layer(torch.randn(2, 10, 32))
        assert len(calls) == 1  # fp32: the fused kernel
        layer.bfloat16()(torch.randn(2, 10, 32, dtype=torch.bfloat16))
        assert len(calls) == 1  # bf16, 2 x 4 x 10 x 10 weights: explicit
        layer.explicit_max_bytes = 2 * 4 * 10 * 10 * 2 - 1
        layer(torch.randn(2, 10, 32, dtype=torch.bfloat16))
        assert len(calls) == 2  # one byte over the budget, in training mode (costed with its backward): fused
        layer.eval()(torch.randn(2, 10, 32, dtype=torch.bfloat16))
        assert len(calls) == 2  # in eval without a gradient: query blocks, each within the budget
    layer(torch.randn(2, 10, 32, dtype=torch.bfloat16, requires_grad=True))
    assert len(calls) == 3  # ... and with a gradient to keep: fused
    set_attention_backend(layer, "auto", explicit_max_bytes=2 * 4 * 10 * 10 * 2)
    cpu, size = torch.device("cpu"), 2 * 4 * 10 * 10 * 2
    assert layer.path(cpu, torch.bfloat16, size) == "explicit"
    assert layer.path(cpu, torch.bfloat16, size + 1) == "blocked"
    assert layer.path(cpu, torch.bfloat16, size + 1, grad=True) == "fused"
    assert layer.path(torch.device("cuda"), torch.bfloat16, size) == "fused"  # no device needed


def test_auto_keeps_the_fused_kernel_where_bf16_is_emulated(monkeypatch):
    # Without bf16 instructions torch's bf16 batched products are emulated, ~20x slower than the fused kernel
    from vitkit.kernels import probe

    emulated = probe.AttentionTimes(fused=0.01, explicit=0.2, fused_grad=0.03, explicit_grad=0.6)
    monkeypatch.setattr(probe, "cpu_bf16_attention", lambda: emulated)
    layer = Attention(32, num_heads=4).eval()
    assert {layer.path(torch.device("cpu"), torch.bfloat16, size) for size in (1, 10**12)} == {"fused"}
    with vitkit.capture_attention(layer):  # capture still forms the weights
        assert layer.path(torch.device("cpu"), torch.bfloat16, 1) == "explicit"


def test_auto_takes_the_fused_kernel_for_inference_on_amx(monkeypatch):
    # With AMX tiles torch's fused kernel runs its blocks on them: faster than the explicit and blocked paths
    # without a gradient; with one, the explicit path's backward is the faster
    from vitkit.kernels import probe

    amx = probe.AttentionTimes(fused=1.1e-3, explicit=1.6e-3, fused_grad=9e-3, explicit_grad=4e-3)
    monkeypatch.setattr(probe, "cpu_bf16_attention", lambda: amx)
    layer = Attention(32, num_heads=4).eval()
    cpu = torch.device("cpu")
    assert {layer.path(cpu, torch.bfloat16, size) for size in (1, 10**12)} == {"fused"}
    assert layer.path(cpu, torch.bfloat16, 1, grad=True) == "explicit"
    assert layer.path(cpu, torch.bfloat16, 10**12, grad=True) == "fused"
    assert layer.path(cpu, torch.float32, 1, grad=True) == "fused"
    with vitkit.capture_attention(layer):  # capture still forms the weights
        assert layer.path(cpu, torch.bfloat16, 1) == "explicit"


def test_cpu_amx_agrees_with_the_kernels_cpu_flags():
    from pathlib import Path

    from vitkit.kernels.probe import cpu_amx

    cpuinfo = Path("/proc/cpuinfo")
    if not cpuinfo.exists():
        pytest.skip("no /proc/cpuinfo to compare with")
    flags = {f for line in cpuinfo.read_text().splitlines() if line.startswith("flags") for f in line.split()}
    assert cpu_amx() is ("amx_bf16" in flags)


def test_the_bf16_attention_probe_times_each_path_once_per_machine(tmp_path, monkeypatch):
    from vitkit.kernels import probe

    monkeypatch.setenv("VITKIT_CACHE", str(tmp_path))
    probe.cpu_bf16_attention.cache_clear()
    # asked from inside a cost trace's device, a memory measurement's hooks and autocast: timed outside all of them
    hooks = torch.autograd.graph.saved_tensors_hooks(lambda t: None, lambda t: None)
    with torch.device("meta"), hooks, torch.autocast("cpu", torch.bfloat16), torch.no_grad():
        times = probe.cpu_bf16_attention()
    assert min(times.fused, times.explicit, times.fused_grad, times.explicit_grad) > 0
    assert probe.known_cpu_bf16_attention() is times  # a traced call reads what this process measured
    cached = json.loads((tmp_path / probe.ATTENTION_FILE).read_text())
    assert cached[probe.probe_key()] == dataclasses.asdict(times)
    cached[probe.probe_key()] = {"fused": 2.0, "explicit": 1.0, "fused_grad": 1.0, "explicit_grad": 2.0}
    (tmp_path / probe.ATTENTION_FILE).write_text(json.dumps(cached))
    probe.cpu_bf16_attention.cache_clear()
    assert probe.known_cpu_bf16_attention() is None  # not measured in this process: nothing to read
    monkeypatch.setattr(probe, "_time_attention", lambda: pytest.fail("measured again"))
    times = probe.cpu_bf16_attention()  # another process reads the machine's figures
    assert times.explicit_faster(grad=False) and not times.explicit_faster(grad=True)
    layer, cpu = Attention(32, num_heads=4).eval(), torch.device("cpu")
    assert layer.path(cpu, torch.bfloat16, 1) == "explicit" and layer.path(cpu, torch.bfloat16, 1, grad=True) == "fused"
    cached[probe.probe_key()] = {"fused": 2.0}  # a file of an older vitkit: measured again
    (tmp_path / probe.ATTENTION_FILE).write_text(json.dumps(cached))
    probe.cpu_bf16_attention.cache_clear()
    fused_faster = {"fused": 1, "explicit": 2, "fused_grad": 1, "explicit_grad": 2}
    monkeypatch.setattr(probe, "_time_attention", lambda: fused_faster)
    assert not probe.cpu_bf16_attention().explicit_faster(grad=False)
    probe.cpu_bf16_attention.cache_clear()


@pytest.mark.parametrize("rows_bytes", [1, 8 * 53 * 8 * 5, 10**9])  # a row a block, 5 rows, one block
@pytest.mark.parametrize("bias_shape", [None, (2, 4, 37, 53), (37, 53), (2, 1, 1, 53), (53,), "mask"])
def test_blocked_attention_equals_the_formula(rows_bytes, bias_shape):
    torch.manual_seed(0)
    q, k = torch.randn(2, 4, 37, 16, dtype=torch.float64), torch.randn(2, 4, 53, 16, dtype=torch.float64)
    v = torch.randn(2, 4, 53, 24, dtype=torch.float64)
    if bias_shape == "mask":
        bias = torch.rand(2, 1, 37, 53) > 0.3
        bias[..., 0] = True  # every row may attend somewhere
    else:
        bias = None if bias_shape is None else torch.randn(bias_shape, dtype=torch.float64)
    expected = attention.reference_attention(q, k, v, bias, 0.3)
    torch.testing.assert_close(attention.blocked_attention(q, k, v, bias, 0.3, rows_bytes), expected)


def test_blocked_layer_in_bf16_matches_fp32_and_keeps_one_block(native_bf16):
    from vitkit.analysis import inference_peak_bytes
    from vitkit.analysis.memory import PeakMemory
    from vitkit.cost import CostContext, trace

    torch.manual_seed(0)
    B, N, C, h = 2, 150, 32, 4
    layer = Attention(C, h, explicit_max_bytes=B * h * 16 * N * 2).eval()  # 16 query rows a block in bf16
    with torch.no_grad():
        for p in layer.parameters():
            p.add_(torch.randn_like(p) * 0.2)
    x, bias = torch.randn(B, N, C), torch.randn(1, h, N, N)
    expected = layer(x, bias)  # fp32: the fused kernel
    fast = copy.deepcopy(layer).bfloat16()
    xb = x.bfloat16()
    assert fast.path(xb.device, torch.bfloat16, B * h * N * N * 2) == "blocked"
    with torch.no_grad(), PeakMemory() as measured:
        out = fast(xb, bias)
    whole = copy.deepcopy(fast)
    whole.explicit_max_bytes = B * h * N * N * 2  # the explicit path: the same products on the whole weights
    with torch.no_grad():
        torch.testing.assert_close(out, whole(xb, bias), atol=1e-2, rtol=1e-2)
    torch.testing.assert_close(out.float(), expected, atol=0.1, rtol=0.1)  # bf16 against fp32's fused kernel
    ops = trace(fast, x, bias, ctx=CostContext(torch.bfloat16))
    assert 0 <= measured.peak - inference_peak_bytes(ops) <= 2  # baddbmm's ignored zero scalar aside
    assert inference_peak_bytes(ops) < B * h * N * N * 2  # never the whole N x N weights
    explicit = trace(Attention(C, h).bfloat16().eval(), x, ctx=CostContext(torch.bfloat16))
    assert [op.macs for op in ops if op.macs] == [op.macs for op in explicit if op.macs]
    assert sum(op.flops for op in ops) == sum(op.flops for op in explicit) + B * h * N * N  # + the bias add


def test_attention_dropout_on_cpu_takes_the_explicit_path(monkeypatch):
    # torch's fused CPU kernel has no dropout (sdpa would fall back to its math kernel): the explicit path drops
    calls = count_fused_calls(monkeypatch)
    torch.manual_seed(0)
    layer = Attention(32, num_heads=4, attn_drop=0.5).train()
    x = torch.randn(2, 10, 32)
    torch.manual_seed(1)
    out = layer(x)
    assert calls == []
    # the formula with the same draws: the weights' dropout is the only random step
    torch.manual_seed(1)
    q, k, v = layer.qkv(x).reshape(2, 10, 3, 4, 8).permute(2, 0, 3, 1, 4)
    weights = F.dropout((q @ k.transpose(-2, -1) * layer.scale).softmax(-1), 0.5)
    assert (weights == 0).any()
    expected = layer.proj((weights @ v).transpose(1, 2).reshape(2, 10, 32))
    torch.testing.assert_close(out, expected)
    assert layer.path(torch.device("cpu"), torch.float32, 0, dropout=0.5) == "explicit"
    assert layer.path(torch.device("cuda"), torch.float32, 0, dropout=0.5) == "fused"  # its kernels drop
    with torch.no_grad():
        layer.eval()(x)
    assert calls == [1]  # no dropout in eval: the fused kernel again


def test_auto_in_bf16_matches_the_fused_kernel_forward_and_backward():
    torch.manual_seed(0)
    reference = Attention(64, num_heads=4)
    x = torch.randn(3, 50, 64)
    bias = torch.randn(1, 4, 50, 50)
    expected = explicit_attention(reference, x, bias)  # fp32
    errors = {}
    for backend in ("sdpa", "auto"):
        layer = set_attention_backend(Attention(64, num_heads=4), backend)
        layer.load_state_dict(reference.state_dict())
        layer.bfloat16()
        xb = x.bfloat16().requires_grad_(True)
        out = layer(xb, bias.bfloat16())
        out.float().square().sum().backward()
        errors[backend] = ((out.float() - expected).abs().max().item(), xb.grad.float())
    assert errors["auto"][0] < 2e-2 and errors["auto"][0] <= 2 * errors["sdpa"][0]
    torch.testing.assert_close(errors["auto"][1], errors["sdpa"][1], atol=5e-2, rtol=5e-2)


@pytest.mark.parametrize("backend", ["sdpa", "math", "auto"])
def test_frozen_projections_with_a_trainable_bias(backend):
    # Fine-tuning only a position table: q and k carry no grad, the bias does (bf16 under autocast on CPU).
    torch.manual_seed(0)
    layer = set_attention_backend(Attention(32, num_heads=4), backend).requires_grad_(False)
    bias = torch.zeros(1, 4, 10, 10, requires_grad=True)
    x = torch.randn(2, 10, 32)
    with torch.autocast("cpu", torch.bfloat16):
        out = layer(x, bias)
    out.float().square().sum().backward()
    reference = torch.zeros(1, 4, 10, 10, requires_grad=True)
    explicit_attention(layer, x, reference).square().sum().backward()
    torch.testing.assert_close(bias.grad, reference.grad, atol=0.1, rtol=0.1)  # bf16 against fp32


def test_fp32_bias_on_bf16_logits_forward_and_backward():
    # Swin under autocast: bf16 q, k, v from the linear layers, an fp32 relative-position table as the bias.
    torch.manual_seed(0)
    layer = Attention(32, num_heads=4)
    x = torch.randn(2, 10, 32)
    bias = torch.randn(1, 4, 10, 10, requires_grad=True)
    expected = explicit_attention(layer, x, bias)
    expected.square().sum().backward()
    expected_grad, bias.grad = bias.grad, None
    with torch.autocast("cpu", torch.bfloat16):
        out = layer(x, bias)  # "auto": explicit for these bf16 logits
    out.float().square().sum().backward()
    torch.testing.assert_close(out.float(), expected, atol=3e-2, rtol=3e-2)
    torch.testing.assert_close(bias.grad, expected_grad, atol=0.1, rtol=0.1)


@pytest.mark.parametrize("backend", ["sdpa", "math"])
def test_attend_broadcasts_and_takes_boolean_masks_like_the_fused_kernel(backend):
    torch.manual_seed(0)
    layer = Attention(32, num_heads=4, backend=backend)
    q = torch.randn(2, 4, 5, 8)
    k, v = torch.randn(1, 4, 7, 8), torch.randn(2, 1, 7, 6)  # broadcast over batch, over heads; dv != d
    mask = torch.rand(2, 1, 5, 7) > 0.3
    mask[..., 0] = True  # every query may attend somewhere
    expected = torch.nn.functional.scaled_dot_product_attention(
        q, k.expand(2, 4, 7, 8), v.expand(2, 4, 7, 6), attn_mask=mask, scale=8**-0.5
    )
    merged = expected.transpose(1, 2).reshape(2, 5, 4 * 6)  # (B, Nq, h, dv) -> (B, Nq, h dv): the heads merged
    torch.testing.assert_close(layer.attend(q, k, v, mask), merged, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("backend", ["sdpa", "math", "auto"])
def test_empty_batch(backend):
    layer = Attention(16, num_heads=2, backend=backend).bfloat16()
    assert layer(torch.zeros(0, 4, 16, dtype=torch.bfloat16)).shape == (0, 4, 16)


def multihead_reference(layer: Attention, query, key, value, mask):
    """torch's nn.MultiheadAttention with the layer's weights: in_proj = qkv (rows q | k | v), out_proj = proj."""
    C = query.shape[-1]
    mha = torch.nn.MultiheadAttention(C, layer.num_heads, batch_first=True)
    with torch.no_grad():
        mha.in_proj_weight.copy_(layer.qkv.weight)
        mha.in_proj_bias.copy_(layer.qkv.bias)
        mha.out_proj.load_state_dict(layer.proj.state_dict())
    padding = None if mask is None else ~mask[:, 0, 0]  # (B, Nk), True: ignore
    return mha(query, key, value, key_padding_mask=padding, need_weights=False)[0]


@pytest.mark.parametrize("backend", ["sdpa", "math", "auto"])
@pytest.mark.parametrize("pattern", ["q=k", "k=v", "all differ"])
def test_cross_attention_matches_multihead_attention(backend, pattern):
    torch.manual_seed(0)
    layer = Attention(32, num_heads=4, backend=backend)
    x, memory, pos = torch.randn(2, 7, 32), torch.randn(2, 11, 32), torch.randn(2, 11, 32)
    mask = torch.ones(2, 1, 1, 11, dtype=torch.bool)
    mask[1, ..., 8:] = False  # the second image's last keys are padding
    if pattern == "q=k":  # DETR's encoder: positions on queries and keys, not on values
        query, key, value, mask = memory + pos, memory + pos, memory, mask
        out = layer(query, mask, value=memory)
    elif pattern == "k=v":  # one memory for keys and values
        query, key, value = x, memory, memory
        out = layer(x, mask, key=memory)
    else:  # DETR's cross-attention
        query, key, value = x, memory + pos, memory
        out = layer(x, mask, key=key, value=memory)
    expected = multihead_reference(layer, query, key, value, mask)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    for dtype in (torch.bfloat16,) if backend == "auto" else ():  # auto's explicit path in bf16 on CPU
        bf16 = layer.to(dtype)(*(t.to(dtype) for t in (query,)), mask, key=key.to(dtype), value=value.to(dtype))
        torch.testing.assert_close(bf16.float(), expected, atol=5e-2, rtol=5e-2)


def test_cross_attention_gradients_and_capture():
    torch.manual_seed(0)
    layer = Attention(16, num_heads=2, backend="sdpa")
    tgt, memory = torch.randn(2, 3, 16, requires_grad=True), torch.randn(2, 5, 16, requires_grad=True)
    layer(tgt, key=memory).sum().backward()
    grads = [tgt.grad.clone(), memory.grad.clone(), layer.qkv.weight.grad.clone()]
    tgt.grad = memory.grad = layer.qkv.weight.grad = None
    layer.backend = "math"
    with capture_attention(layer) as maps:
        layer(tgt, key=memory).sum().backward()
    for expected, got in zip(grads, [tgt.grad, memory.grad, layer.qkv.weight.grad], strict=True):
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    assert maps[""].shape == (2, 2, 3, 5)  # (B, heads, queries, keys): the per-object maps of DETR
    torch.testing.assert_close(maps[""].sum(-1), torch.ones(2, 2, 3))


def test_cross_attention_inputs_are_checked():
    layer = Attention(16, num_heads=2)
    with pytest.raises(ValueError, match=r"attention key must be \(B, N, 16\), got shape \(2, 5, 8\)"):
        layer(torch.randn(2, 3, 16), key=torch.randn(2, 5, 8))
    with pytest.raises(ValueError, match="must share the batch, and key and value the tokens"):
        layer(torch.randn(2, 3, 16), key=torch.randn(2, 5, 16), value=torch.randn(2, 4, 16))


@pytest.mark.parametrize("pattern", ["self", "q=k", "k=v", "all differ"])
def test_cross_attention_cost_equals_flop_counter(pattern):
    from torch.utils.flop_counter import FlopCounterMode

    from vitkit.analysis import inference_peak_bytes
    from vitkit.analysis.memory import PeakMemory
    from vitkit.cost import trace

    layer = Attention(32, num_heads=4, backend="math").eval()
    x, memory, pos = torch.randn(2, 7, 32), torch.randn(2, 11, 32), torch.randn(2, 11, 32)
    cases = {  # queries and forward keywords
        "self": (x, {}),
        "q=k": (pos, {"value": memory}),
        "k=v": (x, {"key": memory}),
        "all differ": (x, {"key": pos, "value": memory}),
    }
    query, run = cases[pattern]
    ops = trace(layer, query, **run)
    with torch.no_grad(), FlopCounterMode(display=False) as counter, PeakMemory() as memory_peak:
        layer(query, **run)
    assert sum(op.matmul_flops for op in ops) == counter.get_total_flops()
    assert inference_peak_bytes(ops) == memory_peak.peak
    projections = [op for op in ops if op.macs and op.op not in ("q@k^T", "attn@v")][:-1]  # the output's last
    assert len(projections) == {"self": 1, "q=k": 2, "k=v": 2, "all differ": 3}[pattern]  # inputs shared, GEMMs too
