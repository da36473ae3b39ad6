"""`vitkit check-data`: a clean folder passes without a warning; each pattern behind "mAP stays at 0" (category ids from
0 with a gap, a rare class, a class in val only, boxes in another image's coordinates, mostly background, a file in
both splits, files training would skip, categories of one name) gets its warning, counted against the folder as
written; --plot draws the training images with their boxes (as stored and as augmented) and their masks, and
`vitkit train` prints the check's line and warnings. A COCO file without image sizes is read with the files' own."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from vitkit.cli import main
from vitkit.data import write_shapes_folder
from vitkit.data.check import check_detection_folder


@pytest.fixture(scope="module")
def shapes(tmp_path_factory):
    return write_shapes_folder(tmp_path_factory.mktemp("shapes") / "clean", train=40, val=6)


def _edit(root: Path, split: str, change) -> None:
    path = root / "annotations" / f"instances_{split}.json"
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def test_a_clean_folder_is_described_without_warnings(shapes, capsys):
    check = check_detection_folder(shapes)
    assert check.warnings == () and check.duplicates == ()
    train = json.loads((shapes / "annotations" / "instances_train.json").read_text())
    (split,) = [s for s in check.splits if s.split == "train"]
    assert split.stats.images == len(train["images"]) and split.stats.boxes == len(train["annotations"])
    assert sum(split.sizes) == split.stats.boxes
    assert split.sizes[0] == sum(a["area"] < 32 * 32 for a in train["annotations"])  # COCO's small, by area
    assert check.summary() == f"train 40 images, {split.stats.boxes} boxes, val 6 images, " + (
        f"{check.splits[1].stats.boxes} boxes; 4 classes"
    )
    assert main(["check-data", str(shapes)]) == 0
    out = capsys.readouterr().out
    assert "categories (file id -> class index, name): 1 -> 0 circle" in out and out.rstrip().endswith("no warnings")


def test_each_problem_gets_its_warning(shapes, tmp_path):
    root = tmp_path / "bad"
    shutil.copytree(shapes, root)

    def renumber(data):  # ids 0, 1, 3, 4; the last class keeps one box in train
        old = {c["id"]: new for c, new in zip(data["categories"], (0, 1, 3, 4), strict=True)}
        for c in data["categories"]:
            c["id"] = old[c["id"]]
        for a in data["annotations"]:
            a["category_id"] = old[a["category_id"]]
        return old

    def train_edit(data):
        renumber(data)
        fours = [a for a in data["annotations"] if a["category_id"] == 4]
        data["annotations"] = [a for a in data["annotations"] if a["category_id"] != 4] + fours[:1]
        for a in data["annotations"][:6]:  # boxes in a larger image's coordinates: wholly outside
            a["bbox"] = [a["bbox"][0] + 500, a["bbox"][1] + 500, a["bbox"][2], a["bbox"][3]]

    def val_edit(data):
        renumber(data)
        data["annotations"] = [a for a in data["annotations"] if a["image_id"] == data["images"][0]["id"]]

    _edit(root, "train", train_edit)
    _edit(root, "val", val_edit)
    first_val = json.loads((root / "annotations" / "instances_val.json").read_text())["images"][1]["file_name"]
    shutil.copy(root / "train" / "000003.png", root / "val" / first_val)  # a training image in val too
    check = check_detection_folder(root)
    text = "\n".join(check.warnings)
    assert check.category_ids == (0, 1, 3, 4)
    assert "category ids [0, 1, 3, 4] start at 0 and skip 2: vitkit maps them" in text
    assert "rare classes in train, fewer than 10 boxes: cross (1)" in text
    assert "train: 6 of" in text and "6 wholly outside" in text
    assert "val: 5 of 6 images have no box" in text
    assert f"1 image of val also in train (000003.png = {first_val})" in text
    assert "train: entries left out (outside image: 6): annotation " in text and "; ... 1 more" in text
    assert "loading: skipped 6 (outside image: 6)" in check.report()


@pytest.mark.parametrize("augmented", [False, True], ids=["stored", "augmented"])
def test_plot_draws_training_images_with_their_boxes(shapes, tmp_path, capsys, augmented):
    plot = tmp_path / "grid.png"
    args = ["check-data", str(shapes), "--plot", str(plot)] + (["--augmented"] if augmented else [])
    assert main(args) == 0
    assert f"sample images written to {plot}" in capsys.readouterr().out
    picture = np.asarray(Image.open(plot).convert("RGB"))
    assert picture.shape[0] > 300 and picture.shape[1] > 1000  # 12 images, 4 a row
    assert main(["check-data", str(shapes), "--augmented"]) == 2
    assert "give --plot PNG" in capsys.readouterr().err


def test_plot_fills_the_masks_of_a_folder_with_segmentations(shapes, tmp_path):
    """The shapes folder's objects have polygons: the plot fills them; the same folder without them draws the boxes
    alone, the same picture but for the objects' insides."""
    bare = tmp_path / "boxes_only"
    shutil.copytree(shapes, bare)
    _edit(bare, "train", lambda data: [a.pop("segmentation") for a in data["annotations"]])
    pictures = []
    for root in (shapes, bare):
        assert main(["check-data", str(root), "--plot", str(tmp_path / f"{root.name}.png")]) == 0
        pictures.append(np.asarray(Image.open(tmp_path / f"{root.name}.png").convert("RGB")).astype(int))
    filled, boxes_only = pictures
    assert filled.shape == boxes_only.shape
    changed = (filled != boxes_only).any(axis=-1)
    changed[:60] = False  # the title names the folder
    assert 0.01 < changed.mean() < 0.3  # the objects' insides, not the whole picture


def test_plot_draws_crowd_regions_named_apart(shapes, tmp_path, monkeypatch):
    """Crowd regions (iscrowd 1) are not training objects, yet evaluation ignores detections on them: the stored
    plot draws each with its mask, named "crowd: CLASS", at its annotated box."""
    root = tmp_path / "crowd"
    shutil.copytree(shapes, root)
    crowd = {}

    def mark(data):
        names = {c["id"]: c["name"] for c in data["categories"]}
        seen = set()
        for ann in data["annotations"]:
            if ann["image_id"] not in seen:  # the first object of every image
                seen.add(ann["image_id"])
                ann["iscrowd"] = 1
                x, y, w, h = ann["bbox"]
                crowd[(x, y, x + w, y + h)] = f"crowd: {names[ann['category_id']]}"

    _edit(root, "train", mark)
    drawn = []

    def draw(image, boxes, names, scores, classes, empty, masks):
        drawn.append((boxes, names, masks))
        return image

    monkeypatch.setattr("vitkit.cli.check_data.draw_detections", draw)
    assert main(["check-data", str(root), "--plot", str(tmp_path / "grid.png")]) == 0
    assert len(drawn) == 12
    for boxes, names, masks in drawn:
        regions = [(tuple(box), name) for box, name in zip(boxes, names, strict=True) if name.startswith("crowd: ")]
        assert len(regions) == 1  # each image's first object
        (box, name), *_ = regions
        assert crowd[min(crowd, key=lambda b: np.abs(np.subtract(b, box)).max())] == name
        assert min(np.abs(np.subtract(b, box)).max() for b in crowd) < 1e-3
        assert len(masks) == len(boxes) and masks[names.index(name)].any()


@pytest.mark.parametrize("scale", [1, 257], ids=["8-bit values", "full range"])
def test_16_bit_images_that_would_be_black_in_8_bits_are_warned_of(shapes, tmp_path, scale):
    """The shapes' pixels written as 16-bit PNG: 0..255 as stored (a microscope's 8-bit values in 16 bits) is nearly
    black once scaled to 8 bits and warned of with its fix; spread over 0..65535, it is not."""
    root = tmp_path / "deep"
    shutil.copytree(shapes, root)
    for path in (root / "train").glob("*.png"):
        grey = np.asarray(Image.open(path).convert("L")).astype(np.uint16) * scale
        Image.fromarray(grey).save(path)  # mode I;16
    check = check_detection_folder(root)
    dark = [w for w in check.warnings if "nearly black" in w]
    if scale == 1:
        (warning,) = dark
        assert warning.startswith("train: 8 of the 8 images decoded are 16-bit with values up to 2")
        assert "of 0..65535" in warning and "stretch each file to its full range" in warning
    else:
        assert dark == []


def test_images_that_decode_but_training_refuses_are_warned_of(shapes, tmp_path):
    """Float TIFFs of 0..255 (ImageJ's float output) decode, but vitkit reads float images as 0..1 and training
    would skip them: the check decodes a sample as training does and names them with the reason."""
    root = tmp_path / "float"
    shutil.copytree(shapes, root)
    train = json.loads((root / "annotations" / "instances_train.json").read_text())
    for entry in train["images"]:
        path = root / "train" / entry["file_name"]
        grey = np.asarray(Image.open(path).convert("L")).astype(np.float32)
        Image.fromarray(grey, "F").save(path.with_suffix(".tif"))
        path.unlink()
        entry["file_name"] = Path(entry["file_name"]).with_suffix(".tif").name
    (root / "annotations" / "instances_train.json").write_text(json.dumps(train))
    (warning,) = [w for w in check_detection_folder(root).warnings if "cannot be read" in w]
    assert warning.startswith("train: 8 image files cannot be read")
    assert "000000.tif: float image (mode F) has values in [" in warning
    assert "vitkit reads float images as intensities in [0, 1]" in warning


def test_objects_without_a_segmentation_among_masked_ones_are_warned_of(shapes, tmp_path):
    """Masks train only when every object has one: a few without turn the mask head off, and the check says so."""
    root = tmp_path / "partial"
    shutil.copytree(shapes, root)
    _edit(root, "train", lambda data: [ann.pop("segmentation") for ann in data["annotations"][:3]])
    check = check_detection_folder(root)
    (train,) = [s for s in check.splits if s.split == "train"]
    (warning,) = [w for w in check.warnings if "segmentation" in w]
    assert warning.startswith(
        f"train: 3 of {train.stats.boxes} objects have no segmentation: the mask head trains only"
    )
    assert not [w for w in check_detection_folder(shapes).warnings if "segmentation" in w]


def test_a_coco_file_without_image_sizes_reads_them_from_the_files(shapes, tmp_path):
    """Some exporters leave out `width` and `height`: the sizes come from the files' headers, the boxes are the
    same, the report says how many were read; a wrong size given is still refused."""
    from vitkit.data import load_coco_folder

    root = tmp_path / "sizeless"
    shutil.copytree(shapes, root)
    _edit(root, "val", lambda data: [e.pop(k) for e in data["images"] for k in ("width", "height")])
    _, expected, _ = load_coco_folder(shapes, val_only=True, short_side=None)
    _, val, _ = load_coco_folder(root, val_only=True, short_side=None)
    assert [s.size for s in val.samples] == [s.size for s in expected.samples]
    assert all(np.array_equal(a.boxes, b.boxes) for a, b in zip(val.samples, expected.samples, strict=True))
    assert val.report.sized_from_files == 6 and "read the size of 6 images from the file" in str(val.report)
    _edit(root, "val", lambda data: data["images"][0].update(width=0))
    _, val, _ = load_coco_folder(root, val_only=True, short_side=None)
    assert val.report.counts() == {"bad image entry": 1}


def test_files_training_would_skip_and_categories_of_one_name_are_warned_of(shapes, tmp_path, capsys):
    """From the files' headers: a file that is not an image, and one whose entry gives its width and height swapped;
    a file rotated by its EXIF orientation, annotated upright, passes. Two category ids named alike are named."""
    root = tmp_path / "files"
    shutil.copytree(shapes, root)
    entries = json.loads((root / "annotations" / "instances_train.json").read_text())["images"]
    text_file, swapped = entries[0]["file_name"], next(e for e in entries[1:] if e["width"] != e["height"])
    (root / "train" / text_file).write_text("not an image")

    def train_edit(data):
        entry = next(e for e in data["images"] if e["id"] == swapped["id"])
        entry["width"], entry["height"] = entry["height"], entry["width"]
        data["categories"][1]["name"] = data["categories"][0]["name"]

    def val_edit(data):
        data["categories"][1]["name"] = data["categories"][0]["name"]

    _edit(root, "train", train_edit)
    _edit(root, "val", val_edit)
    turned = [e for e in entries if e["width"] != e["height"]][-1]  # stored sideways, EXIF orientation 6: its entry
    # says the upright size
    path = root / "train" / turned["file_name"]
    exif = Image.Exif()
    exif[0x0112] = 6
    Image.open(path).convert("RGB").transpose(Image.Transpose.ROTATE_90).save(path, exif=exif)
    check = check_detection_folder(root)
    (train,) = [s for s in check.splits if s.split == "train"]
    assert [item.split(": ")[0] for item in train.unreadable] == [
        str(root / "train" / text_file),
        str(root / "train" / swapped["file_name"]),
    ]
    w, h = swapped["width"], swapped["height"]
    assert train.unreadable[1].endswith(f"the file is {w}x{h}, the annotations say {h}x{w}")
    text = "\n".join(check.warnings)
    skipped = "train: 2 image files cannot be read or differ in size from their annotations, and training skips them"
    assert skipped in text
    name = json.loads((shapes / "annotations" / "instances_train.json").read_text())["categories"][0]["name"]
    assert f"categories of one name: 1 and 2 ({name!r}): they are trained as different classes" in text
    assert main(["check-data", str(root)]) == 0 and "training skips them" in capsys.readouterr().out


def test_an_area_larger_than_its_box_is_warned_of(shapes, tmp_path):
    """COCO's size ranges read the annotations' area: an export that writes the image's area for every object
    (sahi's terrain example does) makes every object 'large'; the check names it with the first such object."""
    root = tmp_path / "areas"
    shutil.copytree(shapes, root)
    train = json.loads((root / "annotations" / "instances_train.json").read_text())
    first = train["annotations"][0]
    image = next(e for e in train["images"] if e["id"] == first["image_id"])

    def whole_image(data):
        for a in data["annotations"][:3]:
            a["area"] = image["width"] * image["height"]
        x, y, w, h = data["annotations"][3]["bbox"]  # two thirds outside the image, its area the whole box's:
        data["annotations"][3]["bbox"] = [-x - 2 * w, y, x + 3 * w, h]  # clipped to a third, yet no error
        data["annotations"][3]["area"] = (x + 3 * w) * h

    _edit(root, "train", whole_image)
    check = check_detection_folder(root)
    (split,) = [s for s in check.splits if s.split == "train"]
    w, h = first["bbox"][2:]
    assert split.area_over_box == (
        3,
        f"{image['width'] * image['height']} px for a {w:.0f}x{h:.0f} box in {image['file_name']}",
    )
    text = "\n".join(check.warnings)
    assert f"train: 3 of {split.stats.boxes} objects have an area larger than their box" in text
    assert check_detection_folder(shapes).splits[0].area_over_box == (0, "")  # masks' areas fit their boxes


def test_a_category_without_a_box_anywhere_is_named_once(shapes, tmp_path):
    """labelme2coco's `_background_` (id 0, no annotation): a class the model would learn to score, named as unused
    rather than as rare."""
    root = tmp_path / "background"
    shutil.copytree(shapes, root)

    def add_background(data):
        data["categories"].insert(0, {"id": 0, "name": "_background_"})

    _edit(root, "train", add_background)
    _edit(root, "val", add_background)
    check = check_detection_folder(root)
    text = "\n".join(check.warnings)
    assert "categories without a box in any split: _background_: each is still a class" in text
    assert "_background_ (0)" not in text


def test_masks_off_their_boxes_are_warned_of(shapes, tmp_path):
    """Segmentations paired with other objects' boxes (two objects of an image with their polygons swapped) lie off
    their boxes: the check counts each and names the first; the clean folder has none."""
    root = tmp_path / "swapped"
    shutil.copytree(shapes, root)
    swapped = []

    def swap(data):
        by_image = {}
        for ann in data["annotations"]:
            by_image.setdefault(ann["image_id"], []).append(ann)
        for anns in by_image.values():
            if len(swapped) < 6 and len(anns) >= 2:
                a, b = anns[:2]
                (ax, ay, aw, ah), (bx, by, bw, bh) = a["bbox"], b["bbox"]
                if ax + aw <= bx or bx + bw <= ax or ay + ah <= by or by + bh <= ay:  # apart: each mask off the other
                    a["segmentation"], b["segmentation"] = b["segmentation"], a["segmentation"]
                    swapped.extend([a["id"], b["id"]])

    _edit(root, "train", swap)
    assert len(swapped) == 6
    check = check_detection_folder(root)
    (train,) = [s for s in check.splits if s.split == "train"]
    assert train.masks_off_boxes[0] == 6 and train.masks_off_boxes[1].startswith("a mask at [")
    (warning,) = [w for w in check.warnings if "lie off their boxes" in w]
    assert warning.startswith(f"train: 6 of {train.stats.boxes} objects' masks lie off their boxes (for example a mask")
    assert all(s.masks_off_boxes == (0, "") for s in check_detection_folder(shapes).splits)


def test_a_file_named_by_two_image_entries_is_warned_of(shapes, tmp_path):
    """Two entries for one file (an export merged from two): each trains with its own boxes, the other's as
    background; the check names the file and the ids."""
    root = tmp_path / "twice"
    shutil.copytree(shapes, root)

    def split_entry(data):
        first = data["images"][0]
        data["images"].append({**first, "id": 9999})
        mine = [a for a in data["annotations"] if a["image_id"] == first["id"]]
        mine[-1]["image_id"] = 9999  # one of its objects under the second entry

    _edit(root, "train", split_entry)
    train = json.loads((root / "annotations" / "instances_train.json").read_text())
    name, first_id = Path(train["images"][0]["file_name"]).name, train["images"][0]["id"]
    check = check_detection_folder(root)
    (split,) = [s for s in check.splits if s.split == "train"]
    assert split.shared_files == ((name, (first_id, 9999)),)
    (warning,) = [w for w in check.warnings if "more than one image entry" in w]
    assert warning.startswith(f"train: 1 image file named by more than one image entry (for example {name}: ids ")
    assert all(s.shared_files == () for s in check_detection_folder(shapes).splits)


@pytest.mark.parametrize(
    "ids, said",
    [
        ((0, 1, 2, 3), "category ids 0-3 start at 0:"),
        ((1, 2, 4, 9), "category ids [1, 2, 4, 9] skip 3, 5, 6, 7 and 8:"),
        ((2, 1, 3), "category ids [2, 1, 3] are not in increasing order:"),
        ((0, 2, 1), "category ids [0, 2, 1] start at 0 and are not in increasing order:"),
        (tuple(range(1, 30, 2)), "skip 2, 4, 6, 8, 10 and 9 more:"),
    ],
)
def test_the_category_id_warning_says_what_it_found(ids, said):
    """The warning names what holds of the ids (start at 0, the numbers skipped, the order), not a list of what
    might, and shows ids that run without a gap as a range."""
    from vitkit.data.check import _id_list, _id_problems

    assert said in f"category ids {_id_list(ids)} {_id_problems(ids)}:"


def test_a_missing_image_is_named(tmp_path):
    """check-data names each entry left out, the missing file's path with it, not only their count."""
    root = write_shapes_folder(tmp_path / "shapes", train=8, val=4)
    (root / "train" / "000002.png").unlink()
    text = "\n".join(check_detection_folder(root).warnings)
    assert f"train: entries left out (missing file: 1): image 3: missing file ({root / 'train' / '000002.png'})" in text


def test_a_builtin_dataset_is_no_folder_to_check_and_the_message_says_how_to_see_it(capsys):
    assert main(["check-data", "builtin:digits-detect"]) == 2
    said = "builtin:digits-detect is a dataset that comes with vitkit, not a folder of annotations to check; to see"
    err = capsys.readouterr().err
    assert said in err and "vitkit example-data digits-detect --out DIR" in err
