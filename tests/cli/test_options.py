"""FIELD=VALUE parsing shared by `vitkit train --model-arg` and `vitkit convert --set`."""

import pytest

from vitkit.cli.options import parse_assignment


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("depth=6", ("depth", 6)),
        ("mlp_ratio=2.5", ("mlp_ratio", 2.5)),
        ("qkv_bias=false", ("qkv_bias", False)),
        ("qkv_bias=False", ("qkv_bias", False)),
        ("init_values=None", ("init_values", None)),
        ("img_size=[224, 320]", ("img_size", (224, 320))),
        ("attn_backend=math", ("attn_backend", "math")),
    ],
)
def test_values(text, expected):
    assert parse_assignment(text) == expected


def test_missing_value_is_an_error():
    with pytest.raises(ValueError, match="expects FIELD=VALUE, got 'depth'"):
        parse_assignment("depth")
