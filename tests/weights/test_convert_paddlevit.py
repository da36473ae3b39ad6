"""PaddleViT's ViT and DeiT (`.pdparams`, read without Paddle) <-> vitkit's ViT: the model built from the file's
shapes gives the outputs of an independent float64 reimplementation of PaddleViT's forward (`test_pdparams`), and
the file written back holds PaddleViT's names and shapes (Linear weights [in, out]) with the same values. The
weights are random, off any initial symmetry."""

import numpy as np
import pytest
import torch
from test_pdparams import paddlevit_forward, paddlevit_state

import vitkit
from vitkit.weights import load_report
from vitkit.weights.pdparams import read_pdparams, write_pdparams

SIZES = dict(depth=2, embed_dim=48, num_heads=4, mlp_ratio=2.0, num_classes=5, patch_size=8, img_size=32)


@pytest.mark.parametrize("kind", ["vit", "deit_distilled"])
def test_paddlevit_loads_and_writes_back(kind, tmp_path):
    state = paddlevit_state(kind, **SIZES)
    write_pdparams({k: torch.from_numpy(v) for k, v in state.items()}, tmp_path / "theirs.pdparams")
    ours = vitkit.from_pretrained(tmp_path / "theirs.pdparams", num_heads=4)
    report = load_report(ours)
    assert report.format == "paddlevit" and ours.config.distilled == (kind == "deit_distilled")
    ours = ours.double()
    x = np.random.default_rng(0).standard_normal((2, 3, 32, 32))
    with torch.no_grad():
        logits = ours(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(logits, paddlevit_forward(state, x, num_heads=4), atol=1e-6, rtol=1e-6)

    vitkit.export_weights(ours, tmp_path / "back.pdparams", format="paddlevit")
    back = read_pdparams(tmp_path / "back.pdparams")
    assert set(back) == set(state)
    for key, value in state.items():
        assert tuple(back[key].shape) == value.shape, key
        np.testing.assert_allclose(back[key].double().numpy(), value, atol=1e-6, rtol=1e-6)


def test_paddlevit_needs_its_head_count(tmp_path):
    state = paddlevit_state("vit", **SIZES)
    write_pdparams({k: torch.from_numpy(v) for k, v in state.items()}, tmp_path / "theirs.pdparams")
    with pytest.raises(ValueError, match="PaddleViT state dict does not say its number of heads"):
        vitkit.from_pretrained(tmp_path / "theirs.pdparams")


def test_paddlevit_takes_square_images(tmp_path):
    model = vitkit.create_model("vit_tiny_patch16_224", **dict(SIZES, img_size=(16, 64)))
    with pytest.raises(ValueError, match=r"PaddleViT's ViT / DeiT needs square images \(this model: 16x64\)"):
        vitkit.export_weights(model, tmp_path / "x.pdparams", format="paddlevit")
    state = paddlevit_state("vit", **SIZES)
    write_pdparams({k: torch.from_numpy(v) for k, v in state.items()}, tmp_path / "theirs.pdparams")
    ours = vitkit.from_pretrained(tmp_path / "theirs.pdparams", num_heads=4)
    report = load_report(ours)
    assert ours.config.img_size == 32 and report.assumed[0].startswith("img_size 32: a square 4x4 grid")
