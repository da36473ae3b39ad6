"""`vitkit attention` on a digit: the figure and the prediction it prints (checked against an explicit forward
pass), options that do not apply refused, model directories without their data's description, a backbone with
registers (the shares of its registers printed, checked against the captured weights), and the detector path."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from vitkit import capture_attention, create_model, save_pretrained
from vitkit.cli import main
from vitkit.data import load_builtin, load_digits_detect, write_coco_folder, write_image_folder
from vitkit.detection import Postprocessing
from vitkit.viz.attention import COLORMAP
from vitkit.viz.detection import POINT_COLOURS
from vitkit.weights import ModelInfo, export_weights

TINY = dict(img_size=28, patch_size=7, embed_dim=16, depth=2, num_heads=2, num_classes=10)
NAMES = tuple("zero one two three four five six seven eight nine".split())
MEAN, STD = (0.1307,), (0.3081,)
NOTE = "holds no description of the data its model was trained on"  # what a directory written otherwise is told


@pytest.fixture(scope="module")
def digit(tmp_path_factory):
    """A 28x28 MNIST seven as a PNG file."""
    _, test, info = load_builtin("mnist5k")
    folder = write_image_folder(test, info.classes, tmp_path_factory.mktemp("digits"), per_class=1)
    return sorted((folder / "7").glob("*.png"))[0]


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return create_model("vit_tiny_patch16_224", **TINY).eval()


@pytest.fixture(scope="module")
def dirs(model, tmp_path_factory):
    """Model directories of one model: as vitkit train writes it (the data's description too), with its names and
    normalisation only, with neither, and exported for Hugging Face transformers (names as id2label)."""
    root = tmp_path_factory.mktemp("models")
    trained = ModelInfo(NAMES, MEAN, STD, data="builtin:mnist5k", val_fraction=0.0, split_seed=0)
    save_pretrained(model, root / "trained", trained)
    save_pretrained(model, root / "named", ModelInfo(NAMES, MEAN, STD))
    save_pretrained(model, root / "bare")
    export_weights(model, root / "hf", "hf", ModelInfo(NAMES))
    return root


def _explicit(model, path, mean, std) -> torch.Tensor:
    """Class probabilities of a 28x28 image, preprocessed with numpy alone."""
    pixels = np.asarray(Image.open(path).convert("RGB"), dtype=np.float32) / 255  # (H, W, 3)
    x = (torch.from_numpy(pixels) - torch.tensor(mean)) / torch.tensor(std)  # (H, W, 3)
    with torch.no_grad():
        return model(x.permute(2, 0, 1)[None]).softmax(-1)[0]  # (K,)


def _printed_prediction(text: str) -> tuple[str, float]:
    line = next(line for line in text.splitlines() if line.startswith("predicted "))
    name, probability = line.removeprefix("predicted ").split(" (")
    return name, float(probability.rstrip(")"))


def test_the_figure_and_the_prediction(model, dirs, digit, capsys, tmp_path):
    target = tmp_path / "new" / "folder" / "seven.png"
    assert main(["attention", "--model-dir", str(dirs / "trained"), str(digit), "--out", str(target)]) == 0
    out, err = capsys.readouterr()
    probabilities = _explicit(model, digit, MEAN, STD)
    name, probability = _printed_prediction(out)
    assert name == NAMES[int(probabilities.argmax())]
    assert probability == pytest.approx(probabilities.max().item(), abs=1e-4)
    assert out.splitlines()[-1] == f"layer 1 (of 0..1), mean of 2 heads -> {target}" and err == ""
    assert len(out.splitlines()) == 2 and "register" not in out  # no registers: no table of their shares
    picture = Image.open(target)
    assert picture.format == "PNG" and picture.width > 1.5 * picture.height  # the image beside its map
    pixels = np.asarray(picture.convert("RGB")).reshape(-1, 3).astype(int)
    for end in (COLORMAP[0], COLORMAP[-1]):  # the colour bar (the maps are blended, never the pure ends)
        assert (np.abs(pixels - np.array(end)).max(axis=1) <= 12).any()


@pytest.mark.parametrize(
    "extra, rows, maps",
    [(["--head", "all"], 1, 2), (["--grid"], 2, 4), (["--rollout"], 1, 1), (["--layer", "0", "--head", "1"], 1, 1)],
)
def test_every_head_the_grid_and_rollout(dirs, digit, capsys, tmp_path, extra, rows, maps):
    target = tmp_path / "figure.png"
    assert main(["attention", "--model-dir", str(dirs / "trained"), str(digit), "--out", str(target), *extra]) == 0
    one = tmp_path / "one.png"
    assert main(["attention", "--model-dir", str(dirs / "trained"), str(digit), "--out", str(one)]) == 0
    width, height = Image.open(target).size
    one_width, one_height = Image.open(one).size
    if rows > 1:
        assert height > rows * 0.8 * one_height
    if maps > 1:
        assert width > one_width


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--rollout", "--layer", "1"], "layer 1 does not apply to attention rollout"),
        (["--rollout", "--head", "0"], "head 0 does not apply to attention rollout"),
        (["--grid", "--rollout"], "rollout and grid do not combine"),
        (["--grid", "--head", "all"], "head all does not apply to a grid"),
        (["--grid", "--layer", "-1"], "layer -1 does not apply to a grid"),
        (["--layer", "5"], "layer 5 is out of range for a model with 2 attention layers (valid: 0..1, or -2..-1"),
        (["--head", "2"], "head 2 is out of range for 2 heads (valid: 0..1, or -2..-1 from the end)"),
        (["--threshold", "0.3"], "--threshold is a detector's smallest class probability;"),
        (["--alpha", "2"], "alpha must be in [0, 1], got 2.0"),
    ],
)
def test_options_that_do_not_apply_are_errors(dirs, digit, capsys, tmp_path, extra, message):
    target = tmp_path / "figure.png"
    assert main(["attention", "--model-dir", str(dirs / "trained"), str(digit), "--out", str(target), *extra]) == 2
    assert message in capsys.readouterr().err
    assert not target.exists()


def test_a_head_that_is_no_number_is_a_usage_error(dirs, digit, capsys, tmp_path):
    with pytest.raises(SystemExit):
        main(
            ["attention", "--model-dir", str(dirs / "trained"), str(digit), "--out", str(tmp_path / "f.png")]
            + ["--head", "x"]
        )
    assert "expected a head index, 'mean' or 'all', got 'x'" in capsys.readouterr().err


@pytest.mark.parametrize(
    "directory, names, mean, std",
    [
        ("named", NAMES, MEAN, STD),  # names and normalisation in config.json
        ("bare", None, (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),  # neither: indices, ImageNet's statistics
        ("hf", NAMES, (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),  # id2label, no preprocessor_config.json
    ],
)
def test_a_directory_without_its_datas_description(model, dirs, digit, capsys, tmp_path, directory, names, mean, std):
    target = tmp_path / "figure.png"
    args = ["attention", "--model-dir", str(dirs / directory), str(digit), "--out", str(target), "--grid"]
    assert main(args) == 0
    out, err = capsys.readouterr()
    assert err.count(NOTE) == 1  # said once, though every layer and head is drawn
    probabilities = _explicit(model, digit, mean, std)
    k = int(probabilities.argmax())
    name, probability = _printed_prediction(out)
    assert name == (names[k] if names else str(k))
    assert probability == pytest.approx(probabilities[k].item(), abs=1e-4)
    assert target.is_file()


RGB_MEAN, RGB_STD = (0.5, 0.4, 0.3), (0.25, 0.2, 0.3)


@pytest.fixture(scope="module")
def registers(tmp_path_factory):
    """A DINOv2 backbone with 4 registers and no classifier at 56x56, its learned tokens, position table and q / k
    projections drawn anew (at initialisation the registers are all but equal); its model directory (normalisation
    in config.json, not the data's description) and a 56x56 RGB image (preprocessing is then normalisation alone)."""
    torch.manual_seed(0)
    model = create_model("vit_small_patch14_reg4_dinov2", img_size=56, depth=2)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for token in (model.cls_token, model.reg_token, model.pos_embed):
            token.copy_(torch.randn(token.shape, generator=g))
        for block in model.blocks:
            block.attn.qkv.weight.copy_(torch.randn(block.attn.qkv.weight.shape, generator=g) * 0.1)
    root = tmp_path_factory.mktemp("registers")
    save_pretrained(model.eval(), root / "model", ModelInfo(mean=RGB_MEAN, std=RGB_STD))
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (56, 56, 3), dtype=np.uint8)).save(root / "image.png")
    return model, root / "model", root / "image.png"


def test_a_backbone_with_registers_prints_their_shares(registers, capsys, tmp_path):
    model, directory, image = registers
    target = tmp_path / "registers.png"
    assert main(["attention", "--model-dir", str(directory), str(image), "--out", str(target), "--head", "all"]) == 0
    out, err = capsys.readouterr()
    pixels = np.asarray(Image.open(image).convert("RGB"), dtype=np.float32) / 255  # (H, W, 3)
    x = (torch.from_numpy(pixels) - torch.tensor(RGB_MEAN)) / torch.tensor(RGB_STD)  # (H, W, 3)
    with torch.no_grad(), capture_attention(model) as captured:
        model(x.permute(2, 0, 1)[None])
    last = list(captured.values())[-1][0].double()  # (h, N, N): class, 4 registers, 16 patches
    lines = out.splitlines()
    assert lines[0].startswith("attention to the tokens before the patches, per map: from the class token")
    assert lines[1].split() == "map from class register 0 register 1 register 2 register 3 registers".split()
    assert len(lines) == 2 + 2 * 6 + 1  # the words, the header, two rows per head, the file; nothing predicted
    for j in range(6):
        class_token, patches = lines[2 + 2 * j], lines[3 + 2 * j]
        assert class_token.startswith(f"  head {j}  class token ") and patches.startswith(
            f"  head {j}  patches (mean) "
        )
        expected = last[j, 0, :5]  # the class token's row, its own column and the registers'
        printed = [float(v) for v in class_token.split()[-6:]]
        np.testing.assert_allclose(printed, [*expected, expected[1:].sum()], atol=6e-5)
        expected = last[j, 5:, :5].mean(dim=0)  # the patches' rows, the same columns, averaged
        np.testing.assert_allclose([float(v) for v in patches.split()[-6:]], [*expected, expected[1:].sum()], atol=6e-5)
    assert lines[-1] == f"layer 1 (of 0..1), each of 6 heads -> {target}"
    assert err.count(NOTE) == 1
    picture = Image.open(target)
    assert picture.format == "PNG" and picture.width > 3 * picture.height  # the image beside six maps in a row


@pytest.fixture(scope="module")
def detector(tmp_path_factory):
    """An untrained tiny detector's model directory, as vitkit train writes one, and a digits-detect canvas."""
    torch.manual_seed(0)
    layout = dict(backbone_width=8, hidden_dim=16, num_heads=2, dim_feedforward=32, num_queries=6, num_classes=10)
    model = create_model("detr_digits", **layout)
    root = tmp_path_factory.mktemp("detector")
    classes = tuple(str(k) for k in range(10))
    described = ModelInfo(classes, (0.5,) * 3, (0.25,) * 3, category_ids=tuple(range(10)), data="builtin:digits-detect")
    save_pretrained(model, root / "model", described)
    save_pretrained(model, root / "bare")  # not the data's description
    _, val, _ = load_digits_detect()
    write_coco_folder(val, root / "coco", "val", limit=1)
    return root / "model", sorted((root / "coco" / "val").glob("*.png"))[0]


def test_the_detector_figure(detector, capsys, tmp_path):
    directory, canvas = detector
    target = tmp_path / "new" / "objects.png"
    args = ["attention", "--model-dir", str(directory), str(canvas), "--out", str(target), "--threshold", "0"]
    assert main(args) == 0
    out = capsys.readouterr().out
    title = "decoder layer 3 (of 0..3) cross-attention of each object's query, mean of 2 heads  ·  6 objects above 0.00"
    assert out.startswith(f"{title}\n")  # the figure's title says the same
    assert out.splitlines()[-1] == f"figure written to {target}" and target.is_file()
    for extra, message in [
        (["--rollout"], "a detector's figure shows each object"),
        (["--grid"], "--grid draws a classifier's layers and heads"),
        (["--head", "all"], "--head all draws a classifier's heads"),
        (["--head", "2"], "head 2 is out of range for 2 heads"),
    ]:
        assert main([*args, *extra]) == 2
        assert message in capsys.readouterr().err
    bare = ["attention", "--model-dir", str(directory.parent / "bare"), str(canvas), "--out", str(tmp_path / "b.png")]
    assert main([*bare, "--threshold", "0"]) == 0
    out, err = capsys.readouterr()
    assert out.startswith(f"{title}\n") and err.count(NOTE) == 1
    assert main([*args[:-1], "0.999"]) == 0  # nothing is that sure: the title says so in a whole sentence
    assert capsys.readouterr().out.startswith(
        "decoder layer 3 (of 0..3): no object above 1.00, so no query to draw; a lower threshold shows the likeliest"
    )


@pytest.fixture(scope="module")
def deformable(detector, tmp_path_factory):
    """A small Deformable DETR's model directory (its cross-attention moved off its initial values), with the
    sigmoid postprocessing its training writes, and the digits-detect canvas."""
    torch.manual_seed(0)
    layout = dict(hidden_dim=32, num_heads=2, dim_feedforward=64, num_queries=5, num_classes=10, backbone_width=8)
    model = create_model("deformable_detr_digits", **layout, enc_layers=1, dec_layers=2)
    with torch.no_grad():
        for layer in model.decoder.layers:
            layer.cross_attn.sampling_offsets.weight.normal_(0, 0.05)
            layer.cross_attn.attention_weights.weight.normal_(0, 0.3)
    directory = tmp_path_factory.mktemp("deformable") / "model"
    classes = tuple(str(k) for k in range(10))
    reading = Postprocessing(classification="focal", no_object_logit=False).to_dict()
    info = ModelInfo(classes, (0.5,) * 3, (0.25,) * 3, tuple(range(10)), reading, data="builtin:digits-detect")
    save_pretrained(model, directory, info)
    return directory, detector[1]


def test_the_deformable_detector_figure_draws_sampling_points(deformable, capsys, tmp_path):
    """A deformable detector's figure is its queries' sampling points (one dot per point, per panel), not maps."""
    directory, canvas = deformable
    target = tmp_path / "points.png"
    args = ["attention", "--model-dir", str(directory), str(canvas), "--out", str(target), "--threshold", "0"]
    assert main([*args, "--layer", "0", "--head", "1"]) == 0
    out = capsys.readouterr().out
    title = "decoder layer 0 (of 0..1) sampling points of each object's query, head 1 of 2  ·  5 objects above 0.00"
    assert out.startswith(f"{title}\n") and out.splitlines()[-1] == f"figure written to {target}"
    assert len(out.splitlines()) == 2 + 5  # title, five detections, the file
    picture = Image.open(target)
    assert picture.format == "PNG" and picture.width > 1.5 * picture.height
    pixels = np.asarray(picture.convert("RGB")).reshape(-1, 3).astype(int)
    for colour in POINT_COLOURS[:3]:  # a dot of every level (no colour bar: COLORMAP's ends are absent)
        rgb = np.array([int(colour[i : i + 2], 16) for i in (1, 3, 5)])
        assert (np.abs(pixels - rgb).max(axis=1) <= 12).any()
    assert not (np.abs(pixels - np.array(COLORMAP[0])).max(axis=1) <= 6).any()
    assert main([*args, "--head", "2"]) == 2
    assert "head 2 is out of range for 2 heads" in capsys.readouterr().err


def test_a_detector_on_a_windowed_vit_draws_its_points_and_lays_its_backbone_attention_on_the_image(
    detector, capsys, tmp_path
):
    """deformable_detr_vit_tiny with a windowed ViT (2x2 windows, the second block global): `vitkit attention` draws
    its queries' sampling points and `vitkit explore` writes its page, as for a ResNet's; `capture_attention` records
    the backbone's windowed blocks, which the ViT lays on the image (each patch's row over its window, summing to
    one)."""
    torch.manual_seed(0)
    windows = dict(depth=2, embed_dim=32, num_heads=2, window_size=2, global_blocks=(1,))
    layout = dict(hidden_dim=32, num_heads=2, dim_feedforward=64, num_queries=5, num_classes=10)
    model = create_model("deformable_detr_vit_tiny", **layout, backbone_args=windows, enc_layers=1, dec_layers=1)
    directory = tmp_path / "model"
    reading = Postprocessing(classification="focal", no_object_logit=False).to_dict()
    info = ModelInfo(tuple(map(str, range(10))), (0.5,) * 3, (0.25,) * 3, tuple(range(10)), reading)
    save_pretrained(model, directory, info)
    canvas = detector[1]
    figure, page = tmp_path / "points.png", tmp_path / "page.html"
    common = ["--model-dir", str(directory), str(canvas), "--threshold", "0"]
    assert main(["attention", *common, "--out", str(figure)]) == 0
    assert "sampling points of each object's query" in capsys.readouterr().out and Image.open(figure).width > 0
    assert main(["explore", *common, "--out", str(page)]) == 0
    assert "detection(s) above 0.00" in capsys.readouterr().out and page.stat().st_size > 0

    x = torch.randn(1, 3, 96, 128)  # a 6x8 grid of patches: 3x4 windows
    body = model.eval().backbone.body
    with torch.no_grad(), capture_attention(model) as maps:
        model(x)
    assert maps["backbone.body.blocks.0.attn"].shape == (12, 2, 1 + 4, 1 + 4)  # class token + 2x2 patches a window
    assert maps["backbone.body.blocks.1.attn"].shape == (1, 2, 1 + 48, 1 + 48)
    laid = body.spatial_attention({k.removeprefix("backbone.body."): v for k, v in maps.items()}, (96, 128))
    assert [(a.grid, tuple(a.keys.shape)) for a in laid] == [((6, 8), (48, 4)), ((6, 8), (48, 48))]
    assert laid[0].keys[9].tolist() == [0, 1, 8, 9]  # patch (1, 1) is in the first window
    for a in laid:
        torch.testing.assert_close(a.weights.sum(-1), torch.ones(1, 2, 48))


@pytest.mark.parametrize("out", ["figure.xyz", "figure"])
def test_an_out_that_cannot_take_a_picture_is_refused_before_the_model_is_read(tmp_path, capsys, out):
    missing = tmp_path / "no_model_here"  # read after the check: the error is about --out, not the model
    assert main(["attention", "--model-dir", str(missing), str(tmp_path / "x.png"), "--out", str(tmp_path / out)]) == 2
    err = capsys.readouterr().err
    assert str(tmp_path / out) in err and ".png" in err and "no_model_here" not in err
