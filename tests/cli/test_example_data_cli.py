"""`vitkit example-data NAME OUT`: writes a COCO-format folder that `load_coco_folder` reads, says what it holds and
what to run next, and refuses a folder that holds files unless --force."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from vitkit.cli import main
from vitkit.data import detection_stats, load_coco_folder, load_digits_detect
from vitkit.data.shapes import CLASSES


def test_shapes_folder_and_what_it_holds(tmp_path, capsys):
    out = tmp_path / "shapes"
    assert main(["example-data", "shapes", "--out", str(out), "--train", "8", "--val", "4", "--seed", "2"]) == 0
    train, val, info = load_coco_folder(out, short_side=None)
    assert (len(train), len(val)) == (8, 4) and info.classes == CLASSES
    text = capsys.readouterr().out
    stats = [detection_stats(train), detection_stats(val)]
    assert text.splitlines() == [
        f"wrote shapes to {out}",
        f"train: {stats[0].summary().splitlines()[0]}",
        *(f"  {line}" for line in stats[0].summary().splitlines()[1:]),
        f"val: {stats[1].summary().splitlines()[0]}",
        *(f"  {line}" for line in stats[1].summary().splitlines()[1:]),
        f"next: vitkit train --data {out}",
    ]
    assert text.splitlines()[1].startswith("train: 8 images (") and "circle: " in text and "% small (< 32 px)" in text
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}

    assert main(["example-data", "shapes", "--out", str(out), "--train", "8", "--val", "4"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"vitkit example-data: error: {out} is not empty: expected a new or empty folder")
    assert "--force" in err
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before  # nothing written

    assert (
        main(["example-data", "shapes", "--out", str(out), "--train", "8", "--val", "4", "--seed", "2", "--force"]) == 0
    )
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before  # the same seed, the same bytes


def test_digits_detect_folder(tmp_path, capsys):
    out = tmp_path / "digits"
    out.mkdir()  # an empty folder is fine
    assert main(["example-data", "digits-detect", "--out", str(out), "--train", "5", "--val", "3"]) == 0
    train, val, info = load_coco_folder(out, short_side=None)
    assert (len(train), len(val)) == (5, 3) and info.classes == tuple("0123456789")
    builtin_train, builtin_val, _ = load_digits_detect(seed=0)
    for i in range(3):  # the builtin set's validation canvases, and its training canvases of the first epoch
        assert np.array_equal(np.asarray(Image.open(out / "val" / f"{i:06d}.png")), builtin_val.canvas(i)[0])
        assert np.array_equal(np.asarray(Image.open(out / "train" / f"{i:06d}.png")), builtin_train.canvas(i)[0])
    assert "train: 5 images (96x96 px)" in capsys.readouterr().out


def test_bad_arguments(tmp_path, capsys):
    (tmp_path / "file").write_text("x")
    assert main(["example-data", "shapes", "--out", str(tmp_path / "file")]) == 2
    assert f"{tmp_path / 'file'} is a file: expected a new or empty folder" in capsys.readouterr().err
    assert main(["example-data", "shapes", "--out", str(tmp_path / "new"), "--train", "0"]) == 2
    assert "expected at least 1 train and 1 val image, got train=0 and val=100" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["example-data", "coco", "--out", str(tmp_path / "new")])
    assert "invalid choice: 'coco'" in capsys.readouterr().err
    assert main(["example-data", "shapes", "--out", str(tmp_path / "file" / "sub")]) == 2
    said = f"{tmp_path / 'file'} is a file, so {tmp_path / 'file' / 'sub'} cannot be a folder"
    assert said in capsys.readouterr().err
    assert main(["example-data", "shapes", "--out", str(tmp_path / "new"), "--seed", "-1"]) == 2
    assert "seed must be in 0 .. 2**32 - 1, got -1" in capsys.readouterr().err
    # more than the disk holds: refused before the first file, naming what it would take
    assert main(["example-data", "shapes", "--out", str(tmp_path / "new"), "--train", str(10**15)]) == 2
    assert "images of shapes take about 36,000,000,000.0 GB, and the disk of" in capsys.readouterr().err
    assert not (tmp_path / "new").exists()
