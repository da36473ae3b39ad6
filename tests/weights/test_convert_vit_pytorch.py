"""lucidrains' vit-pytorch (`ViT` with a class token or mean pooling, `SimpleViT`) <-> vitkit's ViT: the vitkit model
built from their state dict's shapes gives their outputs in float64, and the state dict written back loads into
their classes with `load_state_dict(strict=True)` and gives them again. Their heads are 3 x 20 wide on a 48-wide
model, so a head width taken from the model width, or patches flattened in another order, would show."""

import pytest
import torch
import vit_pytorch

import vitkit
from vitkit.weights import FieldsNeeded, load_report

SIZES = dict(image_size=32, patch_size=8, num_classes=5, dim=48, depth=2, heads=3, mlp_dim=80, dim_head=20)


def _moved(model, seed=0):
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.2 * torch.randn(p.shape, generator=generator, dtype=p.dtype))
    return model.double().eval()


def _reference(kind):
    torch.manual_seed(0)
    if kind == "simple":
        return vit_pytorch.SimpleViT(**SIZES)
    return vit_pytorch.ViT(**SIZES, pool=kind)


@pytest.mark.parametrize("kind", ["cls", "mean", "simple"])
def test_vit_pytorch_loads_and_writes_back(kind, tmp_path):
    theirs = _moved(_reference(kind))
    torch.save(theirs.state_dict(), tmp_path / "theirs.pth")
    fields = {"num_heads": 3, **({"img_size": 32} if kind == "simple" else {})}
    ours = vitkit.from_pretrained(tmp_path / "theirs.pth", **fields)
    report = load_report(ours)
    ours = ours.double()
    assert report.format == "vit-pytorch" and ours.config.head_dim == 20
    x = torch.randn(2, 3, 32, 32, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), theirs(x), atol=1e-6, rtol=1e-6)

    vitkit.export_weights(ours, tmp_path / "back.pth", format="vit-pytorch")
    back = _reference(kind).double().eval()
    back.load_state_dict(torch.load(tmp_path / "back.pth", weights_only=True), strict=True)
    with torch.no_grad():
        torch.testing.assert_close(back(x), theirs(x), atol=1e-6, rtol=1e-6)


def test_big_vision_table_is_simple_vits():
    from vit_pytorch.simple_vit import posemb_sincos_2d

    from vitkit.layers import big_vision_sincos_2d

    torch.testing.assert_close(big_vision_sincos_2d(48, (3, 5))[0], posemb_sincos_2d(3, 5, 48), atol=1e-6, rtol=0)


def test_convert_cli_builds_the_model_from_the_shapes(tmp_path, capsys):
    from vitkit.cli import main

    theirs = _moved(_reference("cls")).float()
    torch.save(theirs.state_dict(), tmp_path / "theirs.pth")
    assert main(["convert", str(tmp_path / "theirs.pth"), str(tmp_path / "out"), "--from", "vit-pytorch"]) == 2
    assert "does not say its number of heads: give it with --model-arg num_heads=H" in capsys.readouterr().err
    assert main(["convert", str(tmp_path / "theirs.pth"), str(tmp_path / "out"), "--set", "num_heads=3"]) == 0
    ours = vitkit.from_pretrained(tmp_path / "out")
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), theirs(x), atol=1e-5, rtol=1e-5)


def test_export_names_what_vit_pytorch_cannot_express(tmp_path):
    model = vitkit.create_model("vit_tiny_patch16_224", depth=1, img_size=32)
    with pytest.raises(ValueError, match=r"vit-pytorch's ViT needs patch_norm=True \(this model: False\)"):
        vitkit.export_weights(model, tmp_path / "x.pth", format="vit-pytorch")


def test_a_non_square_model_needs_its_image_size(tmp_path):
    """vit-pytorch's ViT takes (H, W) images; its table's rows say the grid's size, not its shape. Rows that are no
    square number need img_size; a square number is read as a square grid and the report says so; with img_size
    given the model equals theirs."""
    sizes = dict(SIZES, image_size=(16, 64))  # a 2 x 8 grid: 16 rows, read as 4 x 4 unless told
    theirs = _moved(vit_pytorch.ViT(**sizes))
    torch.save(theirs.state_dict(), tmp_path / "wide.pth")
    ours = vitkit.from_pretrained(tmp_path / "wide.pth", num_heads=3)
    report = load_report(ours)
    assert ours.config.img_size == 32
    assert report.assumed == [
        "img_size 32: a square 4x4 grid from the position table's 16 patch rows (give img_size for a model built "
        "for other images)"
    ]
    assert "assumed: img_size 32" in report.summary()
    ours = vitkit.from_pretrained(tmp_path / "wide.pth", num_heads=3, img_size=(16, 64))
    report = load_report(ours)
    assert report.assumed == []
    x = torch.randn(2, 3, 16, 64, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(ours.double()(x), theirs(x), atol=1e-6, rtol=1e-6)
    with pytest.raises(ValueError, match="img_size 16x16 is a 2x2 grid of 8-pixel patches, but the vit-pytorch"):
        vitkit.from_pretrained(tmp_path / "wide.pth", num_heads=3, img_size=16)

    torch.save(_moved(vit_pytorch.ViT(**dict(SIZES, image_size=(32, 48)))).state_dict(), tmp_path / "w.pth")
    with pytest.raises(FieldsNeeded, match=r"24 patch rows of 8-pixel patches, not a square grid, .*: give img_size="):
        vitkit.from_pretrained(tmp_path / "w.pth", num_heads=3)


def test_convert_names_the_layout_a_file_is_in(tmp_path, capsys):
    from vitkit.cli import main

    torch.save(_reference("cls").state_dict(), tmp_path / "theirs.pth")
    src, out = str(tmp_path / "theirs.pth"), str(tmp_path / "out")
    assert main(["convert", src, out, "--set", "num_heads=3", "--from", "paddlevit"]) == 2
    assert "is in the vit-pytorch layout, not paddlevit's: read it as vit-pytorch" in capsys.readouterr().err
    # a registered model named for it: the fields its shapes fix would not make that model fit
    assert main(["convert", src, out, "--set", "num_heads=3", "--model", "vit_small_patch16_224"]) == 2
    err = capsys.readouterr().err
    assert "is a vit-pytorch file, which builds its own model from its shapes" in err and "drop --model" in err
    timm_file = tmp_path / "timm.pth"
    torch.save(vitkit.create_model("vit_tiny_patch16_224", depth=1, img_size=32).state_dict(), timm_file)
    assert main(["convert", str(timm_file), out, "--from", "vit-pytorch"]) == 2
    err = capsys.readouterr().err
    assert "not in the vit-pytorch layout; it looks like a vitkit vit checkpoint: name the model with --model" in err
