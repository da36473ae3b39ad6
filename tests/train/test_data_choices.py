"""How a recipe with a pixel budget sizes a detection run from its data (`vitkit.train.recipe.data_choices`)."""

import json

import pytest
from PIL import Image

from vitkit.data import DetectionStats
from vitkit.models.registry import model_entry
from vitkit.train import TrainConfig
from vitkit.train.config import recipe_defaults
from vitkit.train.recipe import data_choices, recipe_for, tile_choice

RECIPE = recipe_for("detection", "deformable_detr_small")  # batch 16, budget 1.8e8 pixels
MODEL = model_entry("deformable_detr_small").config  # 20 queries


def stats(images=300, short=128.0, long=160.0, p10=20.0, max_objects=5, p90=60.0) -> DetectionStats:
    return DetectionStats(
        images=images, boxes=3 * images, classes=("a", "b"), boxes_per_class=(2 * images, images),
        max_objects=max_objects, median_objects=3.0, short_side_median=short, short_side_min=int(short),
        short_side_max=int(short), long_side_median=long, long_side_min=int(long), long_side_max=int(long),
        box_size_median=40.0, box_size_p10=p10, small_share=0.3, box_size_p90=p90,
    )  # fmt: skip


def chosen(*args, **kwargs) -> dict:
    return {c.field: c.value for c in data_choices(*args, **kwargs)}


def test_the_side_keeps_the_images_unless_the_small_boxes_need_more():
    assert RECIPE.pixel_budget == 1.8e8
    # 128 x 160 images, boxes large enough: the stored side; 1.8e8 / (300 * 128 * 160) = 29.3 epochs; 300 // 128 = 2,
    # a power of two
    assert chosen(stats(), RECIPE, MODEL, True) == {"img_size": 128, "epochs": 29, "batch_size": 2}
    # the smallest tenth of the boxes at 8 px: enlarged 12 / 8 = 1.5 times, 192; 1.8e8 / (300 * 192 * 240) = 13
    assert chosen(stats(p10=8.0), RECIPE, MODEL, True)["img_size"] == 192
    assert chosen(stats(p10=8.0), RECIPE, MODEL, True)["epochs"] == 13
    # at most twice the stored size (3 px boxes would ask for 4 times), rounded to 16
    assert chosen(stats(p10=3.0, short=100, long=100), RECIPE, MODEL, True)["img_size"] == 192
    # within 64..800 pixels
    assert chosen(stats(short=40, long=40), RECIPE, MODEL, True)["img_size"] == 64
    assert chosen(stats(short=1200, long=1600), RECIPE, MODEL, True)["img_size"] == 800


def test_epochs_batch_and_queries_follow_the_data():
    big = chosen(stats(images=100_000), RECIPE, MODEL, True)
    assert (big["epochs"], big["batch_size"]) == (3, 16)  # at least 3 epochs, the recipe's batch
    assert chosen(stats(images=10), RECIPE, MODEL, True)["epochs"] == 200  # at most 200
    assert chosen(stats(images=10), RECIPE, MODEL, True)["batch_size"] == 2
    assert chosen(stats(images=1000), RECIPE, MODEL, True)["batch_size"] == 4  # 1000 // 128 = 7: 4
    assert chosen(stats(images=2100), RECIPE, MODEL, True)["batch_size"] == 16  # 16, the recipe's
    crowded = chosen(stats(max_objects=15), RECIPE, MODEL, True)
    assert crowded["num_queries"] == 30  # 2 per object of the fullest image, more than the model's 20
    assert "num_queries" not in chosen(stats(max_objects=15), RECIPE, MODEL, False)  # fine-tuning keeps the model's
    assert "num_queries" not in chosen(stats(max_objects=10), RECIPE, MODEL, True)


def test_a_given_side_sizes_the_epochs_and_a_recipe_without_budget_chooses_nothing():
    given = chosen(stats(), RECIPE, MODEL, True, img_size=256)
    assert given == {"epochs": 7, "batch_size": 2}  # 1.8e8 / (300 * 256 * 320) = 6.9
    assert data_choices(stats(), recipe_for("detection", "deformable_detr_digits"), MODEL, True) == []
    reasons = {c.field: c.why for c in data_choices(stats(p10=8.0), RECIPE, MODEL, True)}
    assert reasons["img_size"] == (
        "median shorter side 128 px, enlarged: the smallest tenth of the boxes (8 px) to >= 12 px"
    )
    assert reasons["epochs"] == "300 training images of about 192x240 px, a budget of 1.8e+08 pixels"
    one = {c.field: c.why for c in data_choices(stats(images=1), RECIPE, MODEL, True)}  # counted in the singular
    assert one["epochs"].startswith("1 training image of about") and one["batch_size"].startswith(
        "1 training image: 1 step an epoch"
    )


@pytest.mark.parametrize("field", ["epochs", "batch_size"])
def test_help_says_a_budget_sizes_from_the_data(field):
    assert "deformable_detr_small, deformable_detr_vit_tiny from the data" in recipe_defaults(field)


def test_a_papers_recipe_keeps_small_images_small(tmp_path):
    """DETR's paper recipe (no budget) on 128-px images: the run trains at the data's side, not the model's 800 (39x
    the pixels), and says why; at the model's side or above, or with a side given, nothing is chosen."""
    from vitkit.data import write_shapes_folder
    from vitkit.train import TrainConfig
    from vitkit.train.recipe import paper_side_choice

    (choice,) = paper_side_choice(stats(), 800)
    assert (choice.field, choice.value) == ("img_size", 128)
    assert choice.why == "median shorter side 128 px; the model's 800 px would train on 39x the pixels"
    assert paper_side_choice(stats(short=1000, long=1300), 800) == []
    folder = write_shapes_folder(tmp_path / "shapes", train=4, val=2)  # 120-160 px images
    config = TrainConfig(data=str(folder), model="detr_resnet50", out=str(tmp_path / "run"))
    # the shapes have segmentations: a paper's recipe turns the mask head on as the default detector's does
    assert config.resolved().img_size == 128 and [c.field for c in config.data_choices()] == ["img_size", "masks"]
    assert config.resolved().model_args == {"masks": True}
    boxes = TrainConfig(data=str(folder), model="detr_resnet50", model_args={"masks": False}, img_size=400)
    assert boxes.resolved().img_size == 400 and boxes.data_choices() == []


def test_tiles_for_large_images_of_objects_that_shrinking_would_lose():
    # 1200 px images: at 800 px the smallest tenth of the boxes, 15 px, would be 10 px, below 12: tiles, whose
    # overlap (a quarter) holds the 90th percentile of the box sizes, 38 px -> 152 px, at least 384
    choice = tile_choice(stats(short=1200.0, long=1600.0, p10=15.0, p90=38.0))
    assert choice.field == "tile" and choice.value == 384 and "would shrink to 10 px at 800 px" in choice.why
    assert tile_choice(stats(short=1200.0, long=1600.0, p10=15.0, p90=150.0)).value == 608  # 600 -> a multiple of 16
    assert tile_choice(stats(short=1200.0, long=1600.0, p10=15.0, p90=400.0)).value == 800  # at most 800
    assert tile_choice(stats(short=1200.0, long=1600.0, p10=20.0)) is None  # 13 px at 800: whole images
    assert tile_choice(stats(short=800.0, long=1000.0, p10=5.0)) is None  # not shrunk: whole images, enlarged


def test_a_run_in_tiles_is_sized_from_its_tiles_and_tile_0_keeps_whole_images(tmp_path):
    """A COCO folder of 1200x1600 images of 12-20 px boxes: the recipe picks tiles, says so first, and sizes the
    epochs and batch from the tiles; `tile=0` trains on the images resized, with no tiles picked."""
    for split, count in (("train", 3), ("val", 1)):
        (tmp_path / split).mkdir()
        images, annotations = [], []
        for i in range(count):
            Image.new("RGB", (1200, 1600)).save(tmp_path / split / f"{i}.png")
            images.append({"id": i + 1, "file_name": f"{i}.png", "height": 1600, "width": 1200})
            for k in range(40):
                side = 12 + k % 9
                box = [30.0 * (k % 8) + 100 * i, 38.0 * (k // 8) + 200, side, side]
                annotations.append({"id": len(annotations) + 1, "image_id": i + 1, "category_id": 1, "bbox": box,
                                    "area": side * side, "iscrowd": 0})  # fmt: skip
        document = {"images": images, "annotations": annotations, "categories": [{"id": 1, "name": "dot"}]}
        (tmp_path / split / "annotations.json").write_text(json.dumps(document))
    choices = TrainConfig(data=str(tmp_path)).data_choices()
    assert [c.field for c in choices][:2] == ["tile", "img_size"] and choices[0].value == 384
    assert choices[1].value == 384  # the tiles at full resolution
    epochs = next(c for c in choices if c.field == "epochs")
    assert epochs.why.startswith("72 training tiles of about 384x384 px")  # 3 images of 4 x 6 tiles
    whole = {c.field: c.value for c in TrainConfig(data=str(tmp_path), tile=0).data_choices()}
    assert "tile" not in whole and whole["img_size"] == 800
    assert TrainConfig(data=str(tmp_path), tile=0).resolved().tile_side is None
    with pytest.raises(ValueError, match="tile 8: a training tile of under 32 px holds a few pixels of an object"):
        TrainConfig(data=str(tmp_path), tile=8).resolved()
