"""16-bit and float image files are scaled to 8 bits by their range, not clipped; what cannot be converted is
refused with the reason."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from vitkit.data import (
    ImageFiles,
    ImageModeError,
    TransformedImages,
    Unreadable,
    UnreadableImageError,
    convert_image,
    eval_transform,
    load_folder,
    open_image,
    to_8bit,
)

# Dark, middle and bright 16-bit values; clipping to 8 bits would make all but 0 white.
VALUES16 = np.array([[0, 1000, 4000, 12850], [30000, 40000, 65000, 65535]], dtype=np.uint16)


def _scaled(values: np.ndarray, top: float) -> np.ndarray:
    return np.rint(values.astype(np.float64) * 255 / top).astype(np.uint8)


@pytest.mark.parametrize("suffix", [".png", ".tif"])
def test_16_bit_grayscale_file_is_scaled_not_clipped(tmp_path, suffix):
    path = tmp_path / f"gray16{suffix}"
    Image.fromarray(VALUES16).save(path)
    assert Image.open(path).mode == "I;16"  # what PIL makes of the file
    image = open_image(path)
    assert image.mode == "L"
    np.testing.assert_array_equal(np.asarray(image), _scaled(VALUES16, 65535))
    assert np.asarray(image)[0, 1] == 4  # 1000 / 65535 of full scale, not white
    # Through the loader as a model sees it, in both channel counts.
    for channels in (1, 3):
        sample, _ = TransformedImages(ImageFiles([path], [0]), eval_transform((2, 4), channels))[(0, 0)]
        for c in range(channels):
            np.testing.assert_array_equal(sample[c].numpy(), _scaled(VALUES16, 65535))


def test_16_bit_pgm_with_a_smaller_maxval_is_scaled_by_it(tmp_path):
    path = tmp_path / "gray12.pgm"
    values = np.array([[0, 100, 2048, 4095]], dtype=">u2")
    path.write_bytes(b"P5\n4 1\n4095\n" + values.tobytes())  # 12-bit samples in a 16-bit PGM
    np.testing.assert_array_equal(np.asarray(open_image(path)), _scaled(values, 4095))


def test_big_endian_and_32_bit_integer_images(tmp_path):
    big = Image.frombytes("I;16B", (4, 2), VALUES16.astype(">u2").tobytes())
    np.testing.assert_array_equal(np.asarray(to_8bit(big)), _scaled(VALUES16, 65535))
    path = tmp_path / "int32.tif"
    values = np.array([[0, 2**20, 2**31 - 1]], dtype=np.int32)
    Image.fromarray(values).save(path)  # BitsPerSample 32 in the TIFF header
    np.testing.assert_array_equal(np.asarray(open_image(path)), _scaled(values, 2**32 - 1))


def test_float_image_is_read_as_intensities_in_0_1(tmp_path):
    values = np.array([[0.0, 0.1, 0.5, 1.0]], dtype=np.float32)
    path = tmp_path / "float.tif"
    Image.fromarray(values).save(path)
    np.testing.assert_array_equal(np.asarray(open_image(path)), np.rint(values.astype(np.float64) * 255))

    Image.fromarray(values * 1000).save(path)
    with pytest.raises(UnreadableImageError, match=r"float image \(mode F\) has values in \[0, 1000\]") as caught:
        open_image(path)
    assert isinstance(caught.value, OSError) and caught.value.reason.startswith("float image")
    # In a loader the file is skipped with that reason, not trained on clipped.
    sample = TransformedImages(ImageFiles([path], [0]), eval_transform((1, 4), 3))[(0, 0)]
    assert isinstance(sample, Unreadable) and "has values in [0, 1000]" in sample.error


def test_values_beyond_the_bit_depth_and_unsupported_modes_are_refused():
    wide = Image.fromarray(np.array([[0, 70000]], dtype=np.int32))  # mode I without a header: 16 bits
    with pytest.raises(ImageModeError, match=r"16-bit image \(mode I\) has values in \[0, 70000\]"):
        to_8bit(wide)
    with pytest.raises(ImageModeError, match="image mode LAB is not supported"):
        convert_image(Image.new("LAB", (2, 2)), 3)


def test_a_folder_of_16_bit_images_trains_on_scaled_pixels(tmp_path):
    for name, offset in (("dark", 0), ("bright", 50000)):
        (tmp_path / name).mkdir()
        for i in range(5):
            Image.fromarray((VALUES16 // 4 + offset + i).astype(np.uint16)).save(tmp_path / name / f"{i}.png")
    train, val, info = load_folder(tmp_path, val_fraction=0.2)
    images = TransformedImages(train, eval_transform((2, 4), 1))
    for index in range(len(train)):
        sample, label = images[(index, 0)]
        raw = np.asarray(Image.open(train.paths[index]), dtype=np.float64)
        torch.testing.assert_close(sample[0], torch.from_numpy(_scaled(raw, 65535)))
        assert (sample.float().mean() > 150) == (info.classes[label] == "bright")
