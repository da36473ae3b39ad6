"""PaddlePaddle `.pdparams` files (vitkit.weights.pdparams): written and read back as paddle.save and paddle.load
do, sliced big arrays and PaddleViT's training checkpoints read, pickles that would run code refused before
anything runs, and clear errors for files that are not state dicts.

Also the reference for PaddleViT's ViT and DeiT (BR-IDL/PaddleViT, image_classification/ViT/vit.py and
image_classification/DeiT/deit.py), for the converter's tests (``from test_pdparams import paddlevit_state,
paddlevit_forward, paddlevit_tokens``, as tests import their sibling modules): `paddlevit_state` makes a random state
dict in PaddleViT's names and Paddle's shapes (Linear weights [in, out]), `paddlevit_forward` runs PaddleViT's eval
forward on it in float64 NumPy, written from their source; a test here holds both against timm through PaddleViT's
own converter table (their load_pytorch_weights.py).

Letters: B images, C channels, p patch side, N patches, T tokens (prefix tokens + N), D width, h heads,
d = D / h head width, K classes.
"""

from __future__ import annotations

import math
import os
import pickle
from collections import OrderedDict
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy.special import erf

from vitkit.weights.pdparams import NAME_TABLE, SLICE_TABLE, is_pdparams, read_pdparams, write_pdparams

KINDS = ("vit", "deit", "deit_distilled")  # PaddleViT's VisionTransformer (ViT and DeiT), DistilledVisionTransformer
LAYER_NORM_EPS = 1e-6  # every nn.LayerNorm of PaddleViT's ViT and DeiT: epsilon=1e-6


def paddlevit_state(
    kind: str,
    depth: int,
    embed_dim: int,
    num_heads: int,
    mlp_ratio: float,
    num_classes: int,
    patch_size: int,
    img_size: int,
    in_chans: int = 3,
    seed: int = 0,
) -> dict[str, np.ndarray]:
    """A random float32 state dict of PaddleViT's ViT ("vit"), DeiT ("deit": the same VisionTransformer class) or
    distilled DeiT ("deit_distilled": DistilledVisionTransformer), in the order of Paddle's `state_dict()` (a layer's
    own parameters, then its sublayers') and Paddle's shapes: Linear weights [in, out], Conv2D [out, in, kh, kw].

    Values keep activations O(1) (matrices ~ 1 / sqrt(fan_in), norms around 1, biases and tokens nonzero), so that
    no weight hides behind a zero or an identity.
    """
    if kind not in KINDS:
        raise ValueError(f"kind {kind!r} is not one of {KINDS}")
    if embed_dim % num_heads:
        raise ValueError(f"embed_dim {embed_dim} is not a multiple of num_heads {num_heads}")
    rng = np.random.default_rng(seed)
    prefix = 2 if kind == "deit_distilled" else 1  # class token, and the distillation token after it
    num_patches = (img_size // patch_size) ** 2
    hidden = int(embed_dim * mlp_ratio)  # PaddleViT's Mlp: int(embed_dim * mlp_ratio)
    state: dict[str, np.ndarray] = {}

    def normal(shape: tuple[int, ...], std: float) -> np.ndarray:
        return (rng.standard_normal(shape) * std).astype(np.float32)

    def linear(name: str, fan_in: int, fan_out: int) -> None:
        state[f"{name}.weight"] = normal((fan_in, fan_out), fan_in**-0.5)  # Paddle's nn.Linear: [in, out]
        state[f"{name}.bias"] = normal((fan_out,), 0.1)

    def layer_norm(name: str) -> None:
        state[f"{name}.weight"] = 1 + normal((embed_dim,), 0.1)
        state[f"{name}.bias"] = normal((embed_dim,), 0.1)

    state["position_embedding"] = normal((1, prefix + num_patches, embed_dim), 0.5)
    state["cls_token"] = normal((1, 1, embed_dim), 0.5)
    if kind == "deit_distilled":
        state["dist_token"] = normal((1, 1, embed_dim), 0.5)
    conv_fan_in = in_chans * patch_size * patch_size
    state["patch_embedding.patch_embedding.weight"] = normal(
        (embed_dim, in_chans, patch_size, patch_size), conv_fan_in**-0.5
    )  # Conv2D: [out, in, kh, kw]
    state["patch_embedding.patch_embedding.bias"] = normal((embed_dim,), 0.1)
    for i in range(depth):
        layer = f"encoder.layers.{i}"
        layer_norm(f"{layer}.attn_norm")
        linear(f"{layer}.attn.qkv", embed_dim, 3 * embed_dim)  # output columns (3, h, d): q, k, v, each by head
        linear(f"{layer}.attn.out", embed_dim, embed_dim)
        layer_norm(f"{layer}.mlp_norm")
        linear(f"{layer}.mlp.fc1", embed_dim, hidden)
        linear(f"{layer}.mlp.fc2", hidden, embed_dim)
    layer_norm("encoder.encoder_norm")
    linear("classifier", embed_dim, num_classes)
    if kind == "deit_distilled":
        linear("classifier_dist", embed_dim, num_classes)
    return state


def _linear(x: np.ndarray, p: dict[str, np.ndarray], name: str) -> np.ndarray:
    """Paddle's nn.Linear: x @ W + b with W [in, out]."""
    return x @ p[f"{name}.weight"] + p[f"{name}.bias"]


def _layer_norm(x: np.ndarray, p: dict[str, np.ndarray], name: str) -> np.ndarray:
    """Paddle's nn.LayerNorm over the last axis (biased variance), epsilon 1e-6 as PaddleViT sets it."""
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + LAYER_NORM_EPS) * p[f"{name}.weight"] + p[f"{name}.bias"]


def _gelu(x: np.ndarray) -> np.ndarray:
    """Paddle's nn.GELU() (approximate=False): the exact, erf form."""
    return 0.5 * x * (1 + erf(x / math.sqrt(2)))


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def paddlevit_tokens(state: dict[str, np.ndarray], images: np.ndarray, num_heads: int) -> np.ndarray:
    """PaddleViT's encoder output (B, T, D) for images (B, C, H, W): the tokens after `encoder.encoder_norm`,
    class token first, then the distillation token when the state has one, then the patches in row-major order.
    float64 throughout; the images must be of the size the position table was made for (PaddleViT never resamples).
    """
    p = {k: np.asarray(v, dtype=np.float64) for k, v in state.items()}
    x = np.asarray(images, dtype=np.float64)
    B, C, H, W = x.shape
    conv = p["patch_embedding.patch_embedding.weight"]  # (D, C, p, p)
    D, _, ph, pw = conv.shape
    if H % ph or W % pw:
        raise ValueError(f"image {H}x{W} is not a multiple of the patch {ph}x{pw}")
    gh, gw = H // ph, W // pw
    # Conv2D with kernel = stride = p, then flatten(2).transpose([0, 2, 1]): one row per patch, row-major.
    patches = x.reshape(B, C, gh, ph, gw, pw).transpose(0, 2, 4, 1, 3, 5).reshape(B, gh * gw, C * ph * pw)
    x = patches @ conv.reshape(D, C * ph * pw).T + p["patch_embedding.patch_embedding.bias"]  # (B, N, D)
    prefix = [p["cls_token"]] + ([p["dist_token"]] if "dist_token" in p else [])  # each (1, 1, D)
    x = np.concatenate([np.broadcast_to(t, (B, 1, D)) for t in prefix] + [x], axis=1)  # (B, T, D)
    if p["position_embedding"].shape[1] != x.shape[1]:
        raise ValueError(f"{x.shape[1]} tokens, position table {p['position_embedding'].shape}")
    x = x + p["position_embedding"]
    T = x.shape[1]
    depth = len({k.split(".")[2] for k in p if k.startswith("encoder.layers.")})
    for i in range(depth):
        layer = f"encoder.layers.{i}"
        qkv = _linear(_layer_norm(x, p, f"{layer}.attn_norm"), p, f"{layer}.attn.qkv")  # (B, T, 3 h d)
        d = qkv.shape[-1] // 3 // num_heads
        # Attention.forward: qkv.chunk(3, axis=-1), then each [B, T, h d] -> [B, T, h, d] -> [B, h, T, d].
        q, k, v = (t.reshape(B, T, num_heads, d).transpose(0, 2, 1, 3) for t in np.split(qkv, 3, axis=-1))
        attn = _softmax((q * d**-0.5) @ k.transpose(0, 1, 3, 2))  # (B, h, T, T)
        z = (attn @ v).transpose(0, 2, 1, 3).reshape(B, T, num_heads * d)  # (B, h, T, d) -> (B, T, h d)
        x = x + _linear(z, p, f"{layer}.attn.out")
        y = _gelu(_linear(_layer_norm(x, p, f"{layer}.mlp_norm"), p, f"{layer}.mlp.fc1"))  # (B, T, hidden)
        x = x + _linear(y, p, f"{layer}.mlp.fc2")
    return _layer_norm(x, p, "encoder.encoder_norm")


def paddlevit_forward(state: dict[str, np.ndarray], images: np.ndarray, num_heads: int) -> np.ndarray:
    """PaddleViT's eval-mode logits (B, K) in float64: `classifier` on the class token; for the distilled DeiT the
    mean of `classifier` on the class token and `classifier_dist` on the distillation token (its eval forward).
    The two heads apart: `paddlevit_tokens` and Paddle's x @ W + b."""
    p = {k: np.asarray(v, dtype=np.float64) for k, v in state.items()}
    tokens = paddlevit_tokens(state, images, num_heads)  # (B, T, D)
    logits = _linear(tokens[:, 0], p, "classifier")
    if "classifier_dist.weight" not in p:
        return logits
    return (logits + _linear(tokens[:, 1], p, "classifier_dist")) / 2


# PaddleViT's load_pytorch_weights.py (ViT and DeiT), timm name -> PaddleViT name, as prefixes; their `_set_value`
# transposes every 2-D tensor (the Linear weights) and nothing else.
PADDLEVIT_FROM_TIMM = (
    ("cls_token", "cls_token"),
    ("dist_token", "dist_token"),
    ("pos_embed", "position_embedding"),
    ("patch_embed.proj.", "patch_embedding.patch_embedding."),
    ("blocks.{i}.norm1.", "encoder.layers.{i}.attn_norm."),
    ("blocks.{i}.norm2.", "encoder.layers.{i}.mlp_norm."),
    ("blocks.{i}.mlp.fc1.", "encoder.layers.{i}.mlp.fc1."),
    ("blocks.{i}.mlp.fc2.", "encoder.layers.{i}.mlp.fc2."),
    ("blocks.{i}.attn.qkv.", "encoder.layers.{i}.attn.qkv."),
    ("blocks.{i}.attn.proj.", "encoder.layers.{i}.attn.out."),
    ("norm.", "encoder.encoder_norm."),
    ("head_dist.", "classifier_dist."),
    ("head.", "classifier."),
)


def _timm_state(state: dict[str, np.ndarray], depth: int) -> dict[str, torch.Tensor]:
    """A PaddleViT state dict in timm's names and shapes, by PaddleViT's converter table read backwards."""
    out = {}
    for key, value in state.items():
        hits = [
            ours.format(i=i) + key[len(theirs.format(i=i)) :]
            for ours, theirs in PADDLEVIT_FROM_TIMM
            for i in range(depth)
            if key.startswith(theirs.format(i=i))
        ]
        assert len(set(hits)) == 1, f"{key}: {hits}"
        tensor = torch.from_numpy(value).double()
        out[hits[0]] = tensor.T if tensor.ndim == 2 else tensor  # Linear: Paddle [in, out] -> torch [out, in]
    return out


TINY = dict(depth=2, embed_dim=16, num_heads=4, mlp_ratio=2.0, num_classes=5, patch_size=4, img_size=8)


@pytest.mark.parametrize("kind", KINDS)
def test_paddlevit_state_layout(kind):
    """The keys, in Paddle's order, and shapes of PaddleViT's models (as their state_dict() lists them)."""
    state = paddlevit_state(kind, depth=1, embed_dim=8, num_heads=2, mlp_ratio=4.0, num_classes=5, patch_size=4,
                            img_size=8)  # fmt: skip
    distilled = kind == "deit_distilled"
    expected = [
        ("position_embedding", (1, 6 if distilled else 5, 8)),
        ("cls_token", (1, 1, 8)),
        *([("dist_token", (1, 1, 8))] if distilled else []),
        ("patch_embedding.patch_embedding.weight", (8, 3, 4, 4)),
        ("patch_embedding.patch_embedding.bias", (8,)),
        ("encoder.layers.0.attn_norm.weight", (8,)),
        ("encoder.layers.0.attn_norm.bias", (8,)),
        ("encoder.layers.0.attn.qkv.weight", (8, 24)),
        ("encoder.layers.0.attn.qkv.bias", (24,)),
        ("encoder.layers.0.attn.out.weight", (8, 8)),
        ("encoder.layers.0.attn.out.bias", (8,)),
        ("encoder.layers.0.mlp_norm.weight", (8,)),
        ("encoder.layers.0.mlp_norm.bias", (8,)),
        ("encoder.layers.0.mlp.fc1.weight", (8, 32)),
        ("encoder.layers.0.mlp.fc1.bias", (32,)),
        ("encoder.layers.0.mlp.fc2.weight", (32, 8)),
        ("encoder.layers.0.mlp.fc2.bias", (8,)),
        ("encoder.encoder_norm.weight", (8,)),
        ("encoder.encoder_norm.bias", (8,)),
        ("classifier.weight", (8, 5)),
        ("classifier.bias", (5,)),
        *([("classifier_dist.weight", (8, 5)), ("classifier_dist.bias", (5,))] if distilled else []),
    ]
    assert [(k, v.shape) for k, v in state.items()] == expected
    assert all(v.dtype == np.float32 for v in state.values())


@pytest.mark.parametrize("kind", KINDS)
def test_paddlevit_forward_matches_timm(kind):
    """The reference forward equals timm's ViT / distilled DeiT (float64) on the weights PaddleViT's converter table
    maps across: PaddleViT checked its ported weights the same way (their outputs equal timm's)."""
    from timm.models.deit import VisionTransformerDistilled
    from timm.models.vision_transformer import VisionTransformer

    state = paddlevit_state(kind, **TINY)
    cls = VisionTransformerDistilled if kind == "deit_distilled" else VisionTransformer
    model = cls(**TINY).double().eval()
    model.load_state_dict(_timm_state(state, TINY["depth"]))
    images = np.random.default_rng(1).standard_normal((2, 3, 8, 8))
    with torch.no_grad():
        x = torch.from_numpy(images)
        tokens, logits = model.forward_features(x).numpy(), model(x).numpy()
    np.testing.assert_allclose(paddlevit_tokens(state, images, TINY["num_heads"]), tokens, rtol=0, atol=1e-12)
    np.testing.assert_allclose(paddlevit_forward(state, images, TINY["num_heads"]), logits, rtol=0, atol=1e-12)
    assert np.abs(logits).max() > 0.1  # the comparison is not between near-zero outputs


# --- the file format ---------------------------------------------------------------------------------------------


def test_round_trip(tmp_path):
    """write_pdparams then read_pdparams gives the same names, order, dtypes, shapes and values; the file is what
    paddle.save writes: a protocol 4 pickle of a dict of arrays and a name table that lists every entry."""
    g = torch.Generator().manual_seed(0)
    state = {
        "encoder.layers.0.attn.qkv.weight": torch.randn(8, 24, generator=g),
        "transposed": torch.randn(3, 5, generator=g).T,  # not contiguous
        "f64": torch.randn(4, dtype=torch.float64, generator=g),
        "f16": torch.randn(2, 3, generator=g).half(),
        "i64": torch.arange(-3, 6, dtype=torch.int64).reshape(3, 3),
        "flag": torch.tensor([True, False]),
        "scalar": torch.tensor(2.5),
        "empty": torch.zeros(0, 4),
    }
    path = tmp_path / "x.pdparams"
    write_pdparams(state, path)
    assert path.read_bytes()[:2] == b"\x80\x04"  # PROTO 4
    with open(path, "rb") as f:
        raw = pickle.load(f)
    assert type(raw) is dict and list(raw) == [*state, NAME_TABLE]
    assert raw[NAME_TABLE] == {k: k for k in state}
    assert all(isinstance(raw[k], np.ndarray) for k in state)
    assert is_pdparams(path)
    back = read_pdparams(path)
    assert list(back) == list(state)
    for key, tensor in state.items():
        assert back[key].dtype == tensor.dtype and back[key].shape == tensor.shape, key
        assert back[key].is_contiguous() and torch.equal(back[key], tensor), key


def test_paddlevit_state_round_trip(tmp_path):
    """A state dict in PaddleViT's layout comes back under Paddle's names and in Paddle's shapes, unchanged."""
    state = paddlevit_state("deit_distilled", **TINY)
    path = tmp_path / "deit.pdparams"
    write_pdparams({k: torch.from_numpy(v) for k, v in state.items()}, path)
    back = read_pdparams(path)
    assert list(back) == list(state)
    assert all(np.array_equal(back[k].numpy(), v) for k, v in state.items())


def _paddle_save_dict(arrays: dict[str, np.ndarray], path: os.PathLike, protocol: int, slice_elements: int) -> None:
    """Write `arrays` as paddle.save writes a state dict (`_build_saved_state_dict`, `_unpack_saved_dict`), except
    that arrays are sliced above `slice_elements` values rather than Paddle's (2**30 - 1) // itemsize."""
    saved = {**arrays, NAME_TABLE: {k: f"param_{i}.w_0" for i, k in enumerate(arrays)}}
    if protocol < 4:
        info = {}
        for key, value in arrays.items():
            if value.size > slice_elements:
                flat = value.flatten()
                names = [f"{key}@@.{i}" for i in range(math.ceil(value.size / slice_elements))]
                info[key] = {"OriginShape": value.shape, "slices": names}
                del saved[key]
                for i, name in enumerate(names):
                    saved[name] = flat[i * slice_elements : (i + 1) * slice_elements]
        if info:
            saved[SLICE_TABLE] = info
    with open(path, "wb") as f:
        pickle.dump(saved, f, protocol=protocol)


@pytest.mark.parametrize("protocol", [2, 3, 4])
def test_reads_every_protocol_and_joins_slices(tmp_path, protocol):
    """Protocols 2 and 3 (Paddle before 2.1.1, or protocol=2/3) slice big arrays into flat parts that are joined
    again; protocol 2 also spells bytes through _codecs.encode and bytes(); a big-endian array comes back native."""
    g = np.random.default_rng(0)
    arrays = {
        "big": g.standard_normal((4, 5, 3)).astype(np.float32),  # 60 values: 4 slices of 16 under protocols 2, 3
        "small": g.standard_normal(7),
        "empty": np.zeros((0, 3), np.float32),
        "big_endian": np.arange(6, dtype=">i4").reshape(2, 3),
    }
    path = tmp_path / "p.pdparams"
    _paddle_save_dict(arrays, path, protocol, slice_elements=16)
    if protocol < 4:
        with open(path, "rb") as f:
            assert pickle.load(f)[SLICE_TABLE]["big"]["slices"] == [f"big@@.{i}" for i in range(4)]
    assert is_pdparams(path)
    back = read_pdparams(path)
    assert sorted(back) == sorted(arrays)
    for key, value in arrays.items():
        assert back[key].shape == value.shape and np.array_equal(back[key].numpy(), value), key
    assert back["big_endian"].dtype == torch.int32


class _PaddleTensor:
    """Stands for a Paddle Tensor in a pickle: paddle.save's `_pickle_save` reduces one to tuple((name, array))."""

    def __init__(self, name: str, data: np.ndarray) -> None:
        self.name, self.data = name, data


def test_reads_paddlevit_training_checkpoint(tmp_path):
    """PaddleViT's training checkpoints, {"model": state_dict(), "optimizer": ..., "epoch": ...}, pickled by Paddle
    with each tensor as builtins.tuple((name, array)) and the state dict an OrderedDict: the model's entries come
    back."""
    state = paddlevit_state("vit", **TINY)
    model = OrderedDict((k, _PaddleTensor(f"p_{i}.w_0", v)) for i, (k, v) in enumerate(state.items()))
    optimizer = {"p_0.w_0_moment1_0": _PaddleTensor("p_0.w_0_moment1_0", np.ones(3, np.float32)),
                 "LR_Scheduler": {"last_epoch": 3, "last_lr": 0.1}}  # fmt: skip
    path = tmp_path / "Epoch-3-Loss-1.2.pdparams"
    with open(path, "wb") as f:
        pickler = pickle.Pickler(f, protocol=4)
        pickler.dispatch_table = {_PaddleTensor: lambda t: (tuple, ((t.name, t.data),))}
        pickler.dump({"model": model, "optimizer": optimizer, "epoch": 3})
    assert b"builtins" in path.read_bytes() and b"OrderedDict" in path.read_bytes()
    back = read_pdparams(path)
    assert list(back) == list(state)
    assert all(np.array_equal(back[k].numpy(), v) for k, v in state.items())


# --- refusals and errors -----------------------------------------------------------------------------------------


class _Call:
    """Pickles as a call of `function(*args)`: what a malicious pickle does on load."""

    def __init__(self, function, *args) -> None:
        self.function, self.args = function, args

    def __reduce__(self):
        return self.function, self.args


@pytest.mark.parametrize(
    "payload, named",
    [
        (lambda marker: _Call(os.system, f"touch {marker}"), "system"),
        (lambda marker: _Call(eval, f"__import__('pathlib').Path({str(marker)!r}).touch()"), "builtins.eval"),
        (lambda marker: _Call(exec, f"open({str(marker)!r}, 'w').close()"), "builtins.exec"),
    ],
)
def test_refuses_code_and_never_runs_it(tmp_path, payload, named):
    """A pickle that would call os.system, eval or exec is refused, naming the global, and the call never happens;
    the same bytes through plain pickle.load do run it (so the payload is live)."""
    marker = tmp_path / "ran"
    path = tmp_path / "evil.pdparams"
    arrays = {"w": np.ones(3, np.float32), "b": payload(marker)}
    with open(path, "wb") as f:
        pickle.dump(arrays, f, protocol=4)
    assert is_pdparams(path)  # the sniff only looks at the start: reading is what refuses
    with pytest.raises(ValueError, match=f"refused: its pickle would call .*{named}"):
        read_pdparams(path)
    assert not marker.exists()
    with open(path, "rb") as f:
        pickle.load(f)
    assert marker.exists()


def test_refuses_paddle_static_lod_tensor(tmp_path):
    """Paddle pickles a static-graph LoDTensor as eval("data", {"data": array}): refused like any eval."""
    path = tmp_path / "static.pdparams"
    with open(path, "wb") as f:
        pickle.dump({"w": _Call(eval, "data", {"data": np.ones(2)})}, f, protocol=4)
    with pytest.raises(ValueError, match="builtins.eval"):
        read_pdparams(path)


def _pickle_file(tmp_path: Path, obj: object, protocol: int = 4) -> Path:
    """`obj` pickled with plain pickle.dump into x.pdparams."""
    path = tmp_path / "x.pdparams"
    with open(path, "wb") as f:
        pickle.dump(obj, f, protocol=protocol)
    return path


def test_not_a_pickle(tmp_path):
    path = tmp_path / "text.pdparams"
    path.write_text("not weights at all\n")
    with pytest.raises(ValueError, match=r"text.pdparams is not a pickle \(it starts with b'not weig'\)"):
        read_pdparams(path)
    assert not is_pdparams(path)


def test_pickle_protocol_paddle_does_not_write(tmp_path):
    path = _pickle_file(tmp_path, {"w": np.ones(2)}, protocol=5)
    with pytest.raises(ValueError, match="is a pickle of protocol 5.*2, 3, 4"):
        read_pdparams(path)
    assert not is_pdparams(path)


def test_truncated(tmp_path):
    path = tmp_path / "cut.pdparams"
    write_pdparams({"w": torch.ones(100)}, path)
    path.write_bytes(path.read_bytes()[:150])
    with pytest.raises(ValueError, match="is not a readable pickle \\(truncated or damaged\\)"):
        read_pdparams(path)


def test_pickle_of_a_list(tmp_path):
    path = _pickle_file(tmp_path, [np.ones(2)])
    with pytest.raises(ValueError, match="holds a list, expected a dict of parameter names to arrays"):
        read_pdparams(path)
    assert not is_pdparams(path)


@pytest.mark.parametrize(
    "value, message",
    [
        (np.array(["a", 1, None], dtype=object), "w is an array of object, expected numbers"),
        (np.array(["ab", "c"]), "w is an array of <U2, expected numbers"),
        (3, "entry 'w' is a int, expected a dict of parameter names to NumPy arrays"),
        ({"nested": np.ones(2)}, "entry 'w' is a dict"),
    ],
)
def test_entries_that_are_not_numeric_arrays(tmp_path, value, message):
    path = _pickle_file(tmp_path, {"ok": np.ones(2, np.float32), "w": value})
    with pytest.raises(ValueError, match=message):
        read_pdparams(path)


def test_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError):
        read_pdparams(tmp_path / "absent.pdparams")
    assert not is_pdparams(tmp_path / "absent.pdparams")


def test_is_pdparams_tells_torch_files_apart(tmp_path):
    """torch.save's zip archives and its legacy pickles (which start with a pickled magic number) are not taken
    for .pdparams; a directory is not one either."""
    zipped, legacy = tmp_path / "a.pth", tmp_path / "b.pth"
    torch.save({"w": torch.ones(2)}, zipped)
    torch.save({"w": torch.ones(2)}, legacy, _use_new_zipfile_serialization=False)
    assert not is_pdparams(zipped) and not is_pdparams(legacy) and not is_pdparams(tmp_path)


@pytest.mark.parametrize(
    "state, message",
    [
        ({"w": torch.ones(2, dtype=torch.bfloat16)}, "w is bfloat16, which NumPy has no dtype for"),
        ({"w": np.ones(2)}, "entry 'w' is a ndarray, expected names \\(str\\) to tensors"),
        ({3: torch.ones(2)}, "entry 3 is a Tensor"),
    ],
)
def test_write_refuses(tmp_path, state, message):
    with pytest.raises(ValueError, match=message):
        write_pdparams(state, tmp_path / "x.pdparams")
