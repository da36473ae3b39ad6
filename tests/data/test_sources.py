"""Bundled data and ImageFolder trees: contents, splits, layouts and the errors for folders that are not datasets."""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from vitkit.data import (
    DataInfo,
    list_builtin,
    load_builtin,
    load_data,
    load_eval_split,
    load_folder,
    stratified_split,
    write_image_folder,
)


def _write(path: Path, size: tuple[int, int] = (8, 8), mode: str = "RGB", value: int = 128) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new(mode, size, value if mode in ("L", "P") else (value,) * len(mode)).save(path)
    return path


def test_mnist5k_is_bundled_small_and_stratified():
    packaged = files("vitkit.data") / "builtin" / "mnist5k.npz"
    assert packaged.is_file()
    assert Path(str(packaged)).stat().st_size < 5 * 2**20
    train, test, info = load_builtin("mnist5k")
    assert (len(train), len(test)) == (4000, 1000)
    assert info.classes == tuple("0123456789") and info.source == "builtin:mnist5k"
    assert np.bincount(train.labels).tolist() == [400] * 10
    assert np.bincount(test.labels).tolist() == [100] * 10
    assert train.images.shape == (4000, 28, 28) and train.images.dtype == np.uint8
    # Training and test images are different samples (no image shared between the splits).
    train_rows = {row.tobytes() for row in train.images}
    assert not any(row.tobytes() in train_rows for row in test.images)
    image = train.load(0)
    assert image.mode == "L" and image.size == (28, 28)
    np.testing.assert_array_equal(np.asarray(image), train.images[0])
    assert "mnist5k" in list_builtin()


def test_mnist5k_statistics_match_the_data():
    train, _, info = load_builtin("mnist5k")
    pixels = train.images.astype(np.float64) / 255
    assert pixels.mean() == pytest.approx(info.mean[0], abs=0.01)
    assert pixels.std() == pytest.approx(info.std[0], abs=0.01)


def test_unknown_builtin_names_the_bundled_ones():
    with pytest.raises(ValueError, match="mnist5k"):
        load_data("builtin:cifar")


def test_flat_folder_split_is_stratified_seeded_and_disjoint(tmp_path):
    for name, count in (("cat", 10), ("dog", 20)):
        for i in range(count):
            _write(tmp_path / name / f"{i}.png")
    (tmp_path / "dog" / "notes.txt").write_text("not an image")
    train, val, info = load_folder(tmp_path, val_fraction=0.2, seed=3)
    assert info.classes == ("cat", "dog") and info.val_fraction == 0.2 and info.split_seed == 3
    assert (len(train), len(val)) == (24, 6)
    assert sorted(val.labels) == [0, 0, 1, 1, 1, 1]
    assert not set(train.paths) & set(val.paths)
    assert all(p.suffix == ".png" for p in train.paths + val.paths)
    assert load_folder(tmp_path, 0.2, 3)[1].paths == val.paths
    assert load_folder(tmp_path, 0.2, 4)[1].paths != val.paths


def test_stratified_split_holds_out_the_fraction_of_every_class():
    labels = [0] * 10 + [1] * 30
    kept, held = stratified_split(labels, 0.1, 0)
    assert sorted(kept + held) == list(range(40))
    assert [labels[i] for i in held].count(0) == 1 and [labels[i] for i in held].count(1) == 3


def test_train_val_layout(tmp_path):
    for split in ("train", "val"):
        for name in ("a", "b"):
            _write(tmp_path / split / name / "x.jpg")
    _write(tmp_path / "train" / "a" / "nested" / "y.png")
    train, val, info = load_folder(tmp_path)
    assert info.classes == ("a", "b") and info.val_fraction == 0.0
    assert (len(train), len(val)) == (3, 2)
    assert train.labels == [0, 0, 1]


def test_val_classes_must_match_train_classes(tmp_path):
    for name in ("a", "b"):
        _write(tmp_path / "train" / name / "x.png")
    _write(tmp_path / "val" / "b" / "x.png")
    with pytest.raises(ValueError, match=r"train/ has classes \['a', 'b'\] but val/ has \['b'\]"):
        load_folder(tmp_path)


def test_empty_and_classless_folders_are_clear_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="not a directory"):
        load_folder(tmp_path / "missing")
    with pytest.raises(ValueError, match="has no class folders"):
        load_folder(tmp_path)
    _write(tmp_path / "loose.png")
    with pytest.raises(ValueError, match="has no class folders"):
        load_folder(tmp_path)
    (tmp_path / "empty_class").mkdir()
    _write(tmp_path / "full" / "x.png")
    with pytest.raises(ValueError, match=r"\['empty_class'\] hold no images"):
        load_folder(tmp_path)


def test_split_too_small_to_validate(tmp_path):
    _write(tmp_path / "a" / "x.png")
    _write(tmp_path / "b" / "x.png")
    with pytest.raises(ValueError, match="leaves 2 to train and 0 to validate") as err:
        load_folder(tmp_path, val_fraction=0.1)
    assert str(err.value).endswith(  # the ways out
        f"hold out more (a larger val_fraction), or split the folder yourself: {tmp_path}/train/<class>/ and "
        f"{tmp_path}/val/<class>/"
    )
    with pytest.raises(ValueError, match="val_fraction must be in"):
        load_folder(tmp_path, val_fraction=0.0)


def test_write_image_folder_round_trips(tmp_path):
    _, test, info = load_builtin("mnist5k")
    write_image_folder(test, info.classes, tmp_path, per_class=2)
    files_found = load_eval_split(str(tmp_path), info)
    assert len(files_found) == 20
    for index in range(len(files_found)):
        stored = int(files_found.paths[index].stem)
        assert files_found.labels[index] == test.labels[stored]
        np.testing.assert_array_equal(np.asarray(files_found.load(index)), test.images[stored])


def test_eval_split_defaults_to_the_training_hold_out(tmp_path):
    for name in ("a", "b"):
        for i in range(10):
            _write(tmp_path / name / f"{i}.png")
    _, val, info = load_folder(tmp_path, 0.3, 1)
    assert load_eval_split(None, info).paths == val.paths
    assert len(load_eval_split(str(tmp_path), info)) == 20  # a folder given explicitly is evaluated whole
    other = DataInfo(info.source, ("a", "c"), info.mean, info.std, info.val_fraction, info.split_seed)
    with pytest.raises(ValueError, match="the model knows"):
        load_eval_split(str(tmp_path), other)


def _tree(root: Path, classes: tuple[str, ...] = ("a", "b"), per_class: int = 10) -> Path:
    for name in classes:
        for i in range(per_class):
            _write(root / name / f"{i}.png")
    return root


def test_train_folder_alone_is_the_training_split_with_a_hold_out(tmp_path):
    _tree(tmp_path / "train")
    train, val, info = load_folder(tmp_path, seed=2)
    assert info.classes == ("a", "b")  # not one class named "train"
    assert (len(train), len(val)) == (18, 2) and info.val_fraction == 0.1 and info.split_seed == 2
    assert sorted(val.labels) == [0, 1] and not set(train.paths) & set(val.paths)
    assert all(p.parent.parent == tmp_path / "train" for p in train.paths + val.paths)
    assert load_eval_split(None, info).paths == val.paths  # eval finds the same held-out images
    with pytest.raises(ValueError, match="holds train/ but no val/"):
        load_eval_split(str(tmp_path), info)


def test_folders_beside_train_are_named_as_not_read(tmp_path, caplog):
    _tree(tmp_path / "train")
    _tree(tmp_path / "test", per_class=1)
    with caplog.at_level("WARNING", logger="vitkit.data"):
        load_folder(tmp_path)
    assert "folder(s) ['test'] beside train/ are not read" in caplog.text
    _tree(tmp_path / "only_val" / "val")
    with pytest.raises(ValueError, match="has val/ but no train/"):
        load_folder(tmp_path / "only_val")


@pytest.mark.parametrize("layout", ["flat", "train", "train_val"])
def test_fewer_than_two_classes_is_an_error(tmp_path, layout):
    folders = {"flat": [tmp_path], "train": [tmp_path / "train"], "train_val": [tmp_path / "train", tmp_path / "val"]}
    for folder in folders[layout]:
        _tree(folder, classes=("cat",))
    with pytest.raises(ValueError, match=r"has 1 class folder \('cat'\): a classifier needs at least two classes"):
        load_folder(tmp_path)


def test_an_ignored_val_fraction_says_so(tmp_path, caplog):
    for split in ("train", "val"):
        _tree(tmp_path / split, per_class=2)
    with caplog.at_level("WARNING", logger="vitkit.data"):
        load_folder(tmp_path)  # not given: nothing to say
        load_folder(tmp_path, val_fraction=0.1)  # the default
        assert caplog.text == ""
        train, val, info = load_data(str(tmp_path), val_fraction=0.3)
    assert f"val_fraction 0.3 is ignored: {tmp_path} has a val/ folder" in caplog.text
    assert (len(train), len(val), info.val_fraction) == (4, 4, 0.0)
    caplog.clear()
    with caplog.at_level("WARNING", logger="vitkit.data"):
        load_data("builtin:mnist5k", val_fraction=0.25)
    assert "val_fraction 0.25 is ignored: builtin:mnist5k is a bundled dataset" in caplog.text
