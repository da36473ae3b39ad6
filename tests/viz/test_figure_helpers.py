"""The figure helpers: saving a picture, and the fonts that draw a text."""

from __future__ import annotations

import pytest
from PIL import Image

from vitkit.viz.attention import FONT, font_characters, fonts_for, save_picture


def test_save_picture_refuses_folders_and_names_without_a_suffix(tmp_path):
    picture = Image.new("RGB", (4, 4))
    with pytest.raises(IsADirectoryError, match="is a folder: expected a file name such as"):
        save_picture(picture, tmp_path)
    with pytest.raises(ValueError, match="has no suffix"):
        save_picture(picture, tmp_path / "figure")
    assert save_picture(picture, tmp_path / "a" / "b.png").is_file()


def test_fonts_for_names_the_fonts_that_draw_each_character():
    assert fonts_for(["αλεπού", "собака", "Hauskatze"]) == ([FONT], "")
    families, missing = fonts_for(["猫 cat", "魚"])
    assert families[0] == FONT
    from matplotlib import font_manager

    drawn = set().union(*(font_characters(font_manager.findfont(f)) for f in families))
    assert all((ord(c) in drawn) != (c in missing) for c in "猫魚")
    assert set(missing) <= set("猫魚")
