"""`TrainConfig`: every field is a `vitkit train` option, resuming with the saved settings, the default model, the
held-out fraction, absolute paths, checkpoint files, the command line of hints."""

from __future__ import annotations

import dataclasses
import json
import shlex
import shutil

import pytest
import torch
from PIL import Image

import vitkit
from vitkit.cli import build_parser
from vitkit.data import DEFAULT_VAL_FRACTION, write_shapes_folder
from vitkit.models.registry import model_entry
from vitkit.train import DEFAULT_DETECTOR, DEFAULT_MODEL, TrainConfig
from vitkit.train.recipe import recipe_for
from vitkit.train.resume import _comparable

# The recipes --help names: the classifiers', the small DETRs' (their registry entries' own), DETR's, and for
# Deformable DETR its two small variants' (deformable_detr_small's sized from the data) and the family's.
CLASSIFIER_RECIPE = recipe_for("classification", DEFAULT_MODEL)
SMALL_DETR_RECIPE = recipe_for("detection", "detr_digits")
DETR_RECIPE = recipe_for("detection", "detr_resnet50")
SMALL_DEFORMABLE_RECIPE = recipe_for("detection", "deformable_detr_digits")
DEFORMABLE_RECIPE = recipe_for("detection", "deformable_detr_resnet50")


def test_every_field_is_a_train_option():
    train = next(a for a in build_parser()._actions if a.dest == "command").choices["train"]
    options = {a.dest: a for a in train._actions}
    assert {f.name for f in dataclasses.fields(TrainConfig)} <= set(options)
    assert options["model_args"].option_strings == ["--model-arg"]
    # a task-dependent default names the value of each recipe
    recipes = f"{CLASSIFIER_RECIPE.epochs}; small DETRs {SMALL_DETR_RECIPE.epochs}; DETR {DETR_RECIPE.epochs}"
    recipes += f"; deformable_detr_digits {SMALL_DEFORMABLE_RECIPE.epochs}"
    recipes += "; deformable_detr_small, deformable_detr_vit_tiny from the data"
    recipes += f"; Deformable DETR {DEFORMABLE_RECIPE.epochs}"
    assert options["epochs"].help == f"passes over the training data (default: {recipes})"
    assert options["lr"].help.endswith(
        "(default: 0.002; small DETRs 0.0003; DETR 0.0001; deformable_detr_digits 0.0003; deformable_detr_small, "
        "deformable_detr_vit_tiny 0.0006; Deformable DETR 0.0002)"
    )
    assert options["precision"].choices == ("fp32", "bf16", "auto")


def test_for_resume_replaces_the_given_fields_of_the_saved_config(tmp_path):
    assert TrainConfig.for_resume(tmp_path, epochs=3) == TrainConfig(out=str(tmp_path), epochs=3)
    saved = TrainConfig(out="elsewhere", epochs=5, lr=0.01, model="vit_small_patch16_224", model_args={"depth": 2})
    saved.save(tmp_path)
    resumed = TrainConfig.for_resume(tmp_path, workers=2)
    assert resumed == dataclasses.replace(saved, out=str(tmp_path), workers=2)
    assert TrainConfig.for_resume(tmp_path, epochs=7).epochs == 7


def test_default_model_is_the_digits_vit_with_no_replaced_fields():
    resolved = TrainConfig().resolved()
    assert resolved.model == DEFAULT_MODEL == "vit_digits_patch7_28" and resolved.model_args == {}
    assert TrainConfig(model_args={"depth": 6}).resolved().model_args == {"depth": 6}
    digits = model_entry(DEFAULT_MODEL).config
    assert (digits.img_size, digits.patch_size, digits.embed_dim, digits.depth) == (28, 7, 128, 4)
    assert (digits.num_heads, digits.mlp_ratio, digits.num_classes) == (4, 2.0, 10)


def test_a_recipe_warmup_is_at_most_a_fifth_of_a_short_run():
    assert TrainConfig().resolved().warmup_epochs == 2.0  # the recipe's, in its 40 epochs
    assert TrainConfig(epochs=2).resolved().warmup_epochs == pytest.approx(0.4)
    assert TrainConfig(epochs=1).resolved().warmup_epochs == pytest.approx(0.2)
    assert TrainConfig(epochs=10).resolved().warmup_epochs == 2.0
    assert TrainConfig(epochs=2, warmup_epochs=2.0).resolved().warmup_epochs == 2.0  # given: kept


def _tree(root, splits=("train", "val")):
    for split in splits:
        for name in ("a", "b"):
            (root / split / name).mkdir(parents=True)
    return root


def test_val_fraction_resolves_where_it_applies_and_an_ignored_one_says_so(tmp_path, digit_folder, digits_coco):
    assert TrainConfig().val_fraction is None
    folder = TrainConfig(data=str(digit_folder))
    assert folder.resolved().val_fraction == DEFAULT_VAL_FRACTION == 0.1 and folder.ignored() == []
    assert TrainConfig(data=str(digit_folder), val_fraction=0.3).resolved().val_fraction == 0.3
    tree = _tree(tmp_path / "tree")
    assert TrainConfig(data=str(tree)).resolved().val_fraction is None and TrainConfig(data=str(tree)).ignored() == []
    given = TrainConfig(data=str(tree), val_fraction=0.1)  # the default value, given: still said
    assert given.resolved().val_fraction is None
    assert given.ignored() == [f"val_fraction 0.1 is ignored: {tree} has a val/ folder, which is the validation split"]
    assert TrainConfig(val_fraction=0.2).ignored() == [
        "val_fraction 0.2 is ignored: builtin:mnist5k is a bundled dataset with its own test split"
    ]
    assert "is detection data" in TrainConfig(data=str(digits_coco), val_fraction=0.2).ignored()[0]
    with pytest.raises(ValueError, match=r"val_fraction must be in \(0, 1\), got 1.5"):
        TrainConfig(val_fraction=1.5)


def test_augmentation_defaults_follow_the_data_and_apply_to_their_task(digit_folder, digits_coco):
    detector = TrainConfig(data=str(digits_coco)).resolved()
    assert (detector.hflip, detector.scale_jitter, detector.crop) == (0.5, 0.25, 0.5)  # a COCO folder's
    given = TrainConfig(data=str(digits_coco), hflip=0.0, crop=0.2).resolved()
    assert (given.hflip, given.scale_jitter, given.crop) == (0.0, 0.25, 0.2)
    classifier = TrainConfig(data=str(digit_folder), hflip=0.25).resolved()
    assert (classifier.hflip, classifier.scale_jitter, classifier.crop) == (0.25, None, None)
    with pytest.raises(ValueError, match=r"option\(s\) \['crop'\] do not apply to classification"):
        TrainConfig(data=str(digit_folder), crop=0.5).resolved()
    with pytest.raises(ValueError, match=r"option\(s\) \['min_scale'\] do not apply to detection"):
        TrainConfig(data=str(digits_coco), min_scale=0.5).resolved()
    with pytest.raises(ValueError, match="crop must be a probability in \\[0, 1\\], got 1.5"):
        TrainConfig(crop=1.5)
    with pytest.raises(ValueError, match="scale_jitter must be in \\[0, 1\\)"):
        TrainConfig(scale_jitter=-0.1)


def test_paths_are_resolved_absolute(tmp_path, monkeypatch):
    _tree(tmp_path / "data", splits=("train",))
    (tmp_path / "model.pth").write_bytes(b"")
    monkeypatch.chdir(tmp_path)
    resolved = TrainConfig(data="data", init="model.pth").resolved()
    assert resolved.data == str(tmp_path / "data") and resolved.init == str(tmp_path / "model.pth")
    assert TrainConfig(data="builtin:mnist5k").resolved().data == "builtin:mnist5k"


def test_a_checkpoint_file_trains_the_named_or_the_default_model(tmp_path, digits_coco):
    (tmp_path / "weights.pth").write_bytes(b"")
    init = str(tmp_path / "weights.pth")
    assert TrainConfig(init=init, model="vit_small_patch16_224").resolved().model == "vit_small_patch16_224"
    assert TrainConfig(init=init).resolved().model == DEFAULT_MODEL
    detector = TrainConfig(init=init, data=str(digits_coco)).resolved()
    assert detector.model == DEFAULT_DETECTOR and detector.task == "detection"
    with pytest.raises(FileNotFoundError, match="init .*missing.pth not found"):
        TrainConfig(init=str(tmp_path / "missing.pth")).resolved()


def test_command_gives_back_the_configuration(tmp_path):
    config = TrainConfig(
        model="swin_tiny_patch4_window7_224", init=None, data=str(tmp_path / "my data"), val_fraction=0.2,
        model_args={"depths": (2, 2), "qkv_bias": False, "attn_backend": "math", "embed_dim": 48, "tag": "1"},
        epochs=3, lr=1e-4, mixup=0.2, grad_checkpointing=True, out=str(tmp_path / "run"),
    )  # fmt: skip
    words = shlex.split(config.command("--force"))
    assert words[:2] == ["vitkit", "train"] and words[-3:] == ["--out", str(tmp_path / "run"), "--force"]
    args = build_parser().parse_args(words[1:])
    given = {f.name: getattr(args, f.name) for f in dataclasses.fields(TrainConfig) if hasattr(args, f.name)}
    assert TrainConfig(**given) == config and args.force


def test_minimal_leaves_out_what_resolution_fills_in(digit_folder):
    """A resumed run's saved settings hold every resolved value; hints show only the ones that were chosen."""
    chosen = TrainConfig(data=str(digit_folder), lr=0.1, epochs=3, model_args={"depth": 2})
    assert chosen.resolved().minimal() == chosen
    detector = TrainConfig(data="builtin:digits-detect", model="detr_resnet50", epochs=2)
    assert detector.resolved().minimal() == detector


def test_hints_leave_out_the_device_the_machine_picks_anyway(monkeypatch):
    """A resumed run's settings hold the device it ran on; a hint built from them names it only where the machine
    would pick another."""
    config = TrainConfig(device="cpu", epochs=3, out="runs/x")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert config.minimal().command() == "vitkit train --epochs 3 --out runs/x"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert config.minimal().command() == "vitkit train --epochs 3 --device cpu --out runs/x"


def test_a_learning_rate_below_the_recipes_end_takes_the_end_along(tmp_path, digit_folder):
    """The recipe's min_lr (1e-5) above a fine-tuning rate of 1e-6 would make the cosine rise: it scales with the
    rate given (the recipe's share of its own rate); a min_lr given above lr is an error."""
    config = TrainConfig(data=str(digit_folder), lr=1e-6, out=str(tmp_path))
    assert config.resolved().min_lr == pytest.approx(1e-6 * 1e-5 / 2e-3)
    assert TrainConfig(data=str(digit_folder), lr=1e-3, out=str(tmp_path)).resolved().min_lr == 1e-5
    with pytest.raises(ValueError, match="min_lr 2e-06 is above lr 1e-06: the cosine decay would raise"):
        TrainConfig(data=str(digit_folder), lr=1e-6, min_lr=2e-6, out=str(tmp_path)).resolved()


def test_a_classifier_that_fills_the_backbone_keeps_the_variants_recipe(tmp_path):
    """--init with a whole detector fine-tunes on the family's recipe; with a classifier, which fills the backbone
    alone while the rest trains from its initialisation, a variant keeps its own (from-scratch) recipe."""
    small = recipe_for("detection", "deformable_detr_vit_tiny")
    vit = tmp_path / "vit"
    vitkit.save_pretrained(vitkit.create_model("vit_tiny_patch16_224", depth=1, num_classes=3), vit)
    assert recipe_for("detection", "deformable_detr_vit_tiny", str(vit)) == small
    torch.save(vitkit.create_model("vit_tiny_patch16_224", depth=1, num_classes=3).state_dict(), tmp_path / "vit.pth")
    assert recipe_for("detection", "deformable_detr_vit_tiny", str(tmp_path / "vit.pth")) == small
    detector = tmp_path / "detector"
    vitkit.save_pretrained(vitkit.create_model("deformable_detr_digits", enc_layers=1, dec_layers=1), detector)
    assert recipe_for("detection", "deformable_detr_small", str(detector)) == DEFORMABLE_RECIPE  # the family's
    assert small.lr != DEFORMABLE_RECIPE.lr


def test_a_detector_run_saved_before_tiles_resumes_on_whole_images(tmp_path):
    """A config.json without `tile` is a detector's from before tiles: it trained whole images, whatever the recipe
    would pick now, and a resume compares 0 and None alike."""
    saved = dataclasses.replace(TrainConfig(out=str(tmp_path)), detection_loss="focal").to_dict()
    del saved["tile"]
    (tmp_path / "config.json").write_text(json.dumps(saved))
    assert TrainConfig.load(tmp_path).tile == 0
    classifier = TrainConfig(out=str(tmp_path)).to_dict()
    del classifier["tile"]
    (tmp_path / "config.json").write_text(json.dumps(classifier))
    assert TrainConfig.load(tmp_path).tile is None  # a classifier has no tiles
    assert _comparable({"tile": 0})["tile"] == _comparable({})["tile"] is None


def test_a_hint_to_start_afresh_keeps_an_option_typed_as_the_old_data_chose_it(tmp_path):
    """`vitkit train --resume --data OTHER --img-size 128` on a run whose data chose 128: the hint that trains the
    new data in a new folder keeps the size typed, though it equals the saved value, where the new data would choose
    another (images twice the size: 256)."""
    small = write_shapes_folder(tmp_path / "small", train=8, val=4)
    large = tmp_path / "large"
    shutil.copytree(small, large)
    for split in ("train", "val"):
        for image in (large / split).glob("*.png"):
            with Image.open(image) as read:
                doubled = read.resize((read.width * 2, read.height * 2))
            doubled.save(image)
        path = large / "annotations" / f"instances_{split}.json"
        data = json.loads(path.read_text())
        for image in data["images"]:
            image["width"], image["height"] = image["width"] * 2, image["height"] * 2
        for ann in data["annotations"]:
            ann["bbox"] = [2 * v for v in ann["bbox"]]
            ann["segmentation"] = [[2 * v for v in polygon] for polygon in ann["segmentation"]]
            ann["area"] *= 4
        path.write_text(json.dumps(data))
    out = tmp_path / "run"
    out.mkdir()
    saved = TrainConfig(data=str(small), out=str(out)).resolved()
    saved.save(out)
    assert saved.img_size == 128 and TrainConfig(data=str(large)).resolved().img_size == 256
    assert TrainConfig.for_resume(out, data=str(large)).fresh().img_size is None  # the new data's choice
    assert TrainConfig.for_resume(out, data=str(large), img_size=128).fresh().img_size == 128


def test_a_hint_to_start_afresh_on_other_data_leaves_the_choices_the_old_data_made(tmp_path):
    """A resumed run's saved settings hold what its data chose (image size, batch, masks); a hint that starts the run
    afresh on other data leaves those for the new data to choose, and keeps what that run was given."""
    shapes = write_shapes_folder(tmp_path / "shapes", train=8, val=4)  # segmentations: masks chosen
    boxes = write_shapes_folder(tmp_path / "boxes", train=8, val=4, seed=1)
    for split in ("train", "val"):
        path = boxes / "annotations" / f"instances_{split}.json"
        data = json.loads(path.read_text())
        for ann in data["annotations"]:
            ann.pop("segmentation")
        path.write_text(json.dumps(data))
    out = tmp_path / "run"
    given = TrainConfig(data=str(shapes), epochs=3, lr=1e-4, out=str(out))
    resolved = given.resolved()
    assert resolved.model_args == {"masks": True} and resolved.img_size is not None
    assert resolved.minimal() == given  # the data's choices, masks among them, are the data's again
    out.mkdir()
    resolved.save(out)
    same = TrainConfig.for_resume(out, epochs=5)
    assert same.fresh() == dataclasses.replace(given, epochs=5)
    other = TrainConfig.for_resume(out, data=str(boxes))
    assert other.fresh() == dataclasses.replace(given, data=str(boxes))  # no masks=true, no image size
    assert other.minimal().model_args == {"masks": True}  # what the saved settings alone would name


@pytest.mark.parametrize("seed", [-1, 2**32])
def test_a_seed_numpy_and_torch_cannot_take_is_refused_naming_the_option(seed):
    with pytest.raises(ValueError, match=rf"seed must be in 0 \.\. 2\*\*32 - 1, got {seed}"):
        TrainConfig(seed=seed)
