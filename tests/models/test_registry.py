"""The registry: names, overrides, errors."""

import dataclasses

import pytest
import torch

import vitkit
from vitkit.models.registry import closest_models, family, model_entry, published_weights, register_family


def test_required_variants_are_registered():
    required = [
        *(f"vit_{size}_patch16_224" for size in ("tiny", "small", "base", "large")),
        "vit_base_patch32_224",
        "vit_base_patch32_384",
        "vit_small_patch16_384",
        "vit_base_patch16_384",
        *(f"deit_{size}_patch16_224" for size in ("tiny", "small", "base")),
        *(f"deit_{size}_distilled_patch16_224" for size in ("tiny", "small", "base")),
    ]
    assert set(required) <= set(vitkit.list_models())


def test_list_models_pattern():
    names = vitkit.list_models("deit_*distilled*")
    assert names == sorted(names) and len(names) == 3
    assert all(n.startswith("deit_") and "distilled" in n for n in names)
    assert vitkit.list_models("no_such_*") == []


def test_unknown_name_lists_closest():
    with pytest.raises(ValueError, match=r"unknown model 'vit_smal_patch16_224'; closest: vit_small_patch16_224"):
        vitkit.create_model("vit_smal_patch16_224")
    # names holding what was typed first, those starting with it before the others
    assert closest_models("swin_tiny")[:2] == ["swin_tiny_patch4_window7_224", "deformable_detr_swin_tiny"]
    assert closest_models("vit_smal")[:2] == ["vit_small_patch16_224", "vit_small_patch16_384"]
    assert closest_models("qqqq") == []


def test_where_messages_send_people_for_the_lists_names_the_command_and_the_function():
    """The same message reaches people at the command line and in Python: it names both ways to the list."""
    count = len(vitkit.list_models())
    with pytest.raises(ValueError) as caught:
        vitkit.create_model("qqqq")
    assert str(caught.value) == f"unknown model 'qqqq'; see `vitkit models` / vitkit.list_models() ({count} models)"
    with pytest.raises(ValueError) as caught:
        published_weights("botnet50")
    assert str(caught.value).endswith("(`vitkit models --pretrained` / vitkit.list_pretrained() list those that are)")


def test_overrides_replace_config_fields():
    model = vitkit.create_model("vit_tiny_patch16_224", num_classes=7, img_size=32, depth=2)
    assert model.config == dataclasses.replace(
        model_entry("vit_tiny_patch16_224").config, num_classes=7, img_size=32, depth=2
    )
    assert len(model.blocks) == 2
    assert model(torch.randn(1, 3, 32, 32)).shape == (1, 7)
    with pytest.raises(dataclasses.FrozenInstanceError):
        model.config.depth = 3  # configs are frozen


def test_bad_overrides():
    with pytest.raises(ValueError, match=r"ViTConfig has no field\(s\) \['dpeth'\]"):
        vitkit.create_model("vit_tiny_patch16_224", dpeth=2)
    with pytest.raises(ValueError, match="embed_dim 192 is not divisible by num_heads 5"):
        vitkit.create_model("vit_tiny_patch16_224", num_heads=5)
    with pytest.raises(ValueError, match=r"global_pool must be one of \('token', .*'map'\), got 'max'"):
        vitkit.create_model("vit_tiny_patch16_224", global_pool="max")
    with pytest.raises(ValueError, match="image height 100 is not a multiple of patch size 16"):
        vitkit.create_model("vit_tiny_patch16_224", img_size=100)
    with pytest.raises(ValueError, match="attention backend must be one of"):
        vitkit.create_model("vit_tiny_patch16_224", attn_backend="xformers")


@pytest.mark.parametrize(
    ("name", "overrides", "message"),
    [
        ("vit_tiny_patch16_224", dict(qkv_bias="False"), "ViTConfig.qkv_bias takes bool, got 'False'"),
        ("vit_tiny_patch16_224", dict(depth=2.5), "ViTConfig.depth takes int, got 2.5"),
        ("vit_tiny_patch16_224", dict(depth=True), "ViTConfig.depth takes int, got True"),
        ("vit_tiny_patch16_224", dict(img_size=28.0), r"img_size takes int \| tuple\[int, int\], got 28.0"),
        ("vit_tiny_patch16_224", dict(patch_size=0), "ViTConfig.patch_size must be > 0, got 0"),
        ("vit_tiny_patch16_224", dict(drop_path_rate=1.0), r"drop_path_rate must be in \[0, 1\), got 1.0"),
        ("swin_tiny_patch4_window7_224", dict(depths=3), r"SwinConfig.depths takes tuple\[int, ...\], got 3"),
        ("swin_tiny_patch4_window7_224", dict(window_size=7.0), "SwinConfig.window_size takes int, got 7.0"),
        ("botnet26t_256", dict(num_heads="4"), "BotNetConfig.num_heads takes int, got '4'"),
    ],
)
def test_config_values_of_the_wrong_type_or_range(name, overrides, message):
    with pytest.raises(ValueError, match=message):
        vitkit.create_model(name, **overrides)


def test_lists_are_taken_as_tuples():
    model = vitkit.create_model("vit_tiny_patch16_224", depth=1, img_size=[32, 48])
    assert model.config.img_size == (32, 48)
    assert vitkit.create_model("swin_tiny_patch4_window7_224", depths=[1, 1, 1, 1]).config.depths == (1, 1, 1, 1)


def test_a_family_must_provide_the_model_interface():
    class Partial(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x

    with pytest.raises(TypeError, match=r"Partial lacks \['forward_features', 'forward_head', 'cost', "):
        register_family("partial", dict, Partial)
    with pytest.raises(ValueError, match="unknown model family 'partial'"):
        family("partial")


def test_a_detector_family_must_declare_its_class_logits():
    detr = family("detr").model_cls

    class Undeclared(detr):  # DETR's methods, and its declaration taken away
        no_object_logit = None

    with pytest.raises(TypeError, match=r"Undeclared must declare no_object_logit \(a bool"):
        register_family("undeclared", dict, Undeclared, task="detection")
    with pytest.raises(ValueError, match="unknown model family 'undeclared'"):
        family("undeclared")
    assert family("detr").model_cls.no_object_logit is True
    assert family("deformable_detr").model_cls.no_object_logit is False
