"""save_pretrained / from_pretrained: config.json + model.safetensors, no pickle, clear errors."""

import json

import pytest
import torch
from safetensors.torch import load_file

import vitkit


@pytest.mark.parametrize("name", ["vit_tiny_patch16_224", "deit_tiny_distilled_patch16_224"])
def test_round_trip_gives_equal_logits(tmp_path, name):
    torch.manual_seed(0)
    model = vitkit.create_model(name, depth=2, img_size=(32, 48), num_classes=10, global_pool="token").eval()
    vitkit.save_pretrained(model, tmp_path / "m")
    assert sorted(p.name for p in (tmp_path / "m").iterdir()) == ["config.json", "model.safetensors"]
    saved = json.loads((tmp_path / "m" / "config.json").read_text())
    assert saved["family"] == "vit" and saved["config"]["img_size"] == [32, 48] and saved["config"]["depth"] == 2
    assert set(load_file(tmp_path / "m" / "model.safetensors")) == set(model.state_dict())

    loaded = vitkit.from_pretrained(tmp_path / "m")
    assert loaded.config == model.config and not loaded.training
    x = torch.randn(2, 3, 32, 48)
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), model(x), atol=0, rtol=0)


def test_from_pretrained_overrides(tmp_path):
    model = vitkit.create_model("vit_tiny_patch16_224", depth=1, img_size=32).eval()
    vitkit.save_pretrained(model, tmp_path)
    loaded = vitkit.from_pretrained(tmp_path, attn_backend="math", dynamic_img_size=True)
    assert loaded.blocks[0].attn.backend == "math"
    x = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), model(x), atol=1e-5, rtol=1e-5)
    assert loaded(torch.randn(1, 3, 48, 64)).shape == (1, 1000)


def test_from_pretrained_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json not found"):
        vitkit.from_pretrained(tmp_path)
    with pytest.raises(FileNotFoundError, match=r"nowhere does not exist: expected a model directory") as err:
        vitkit.from_pretrained(tmp_path / "nowhere")
    assert "is a model's name" not in str(err.value)
    hint = r"vit_tiny_patch16_224 is a model's name: vitkit.create_model\('vit_tiny_patch16_224', pretrained=True\)"
    with pytest.raises(FileNotFoundError, match=hint):  # a registered name, where a folder was expected
        vitkit.from_pretrained("vit_tiny_patch16_224")
    model = vitkit.create_model("vit_tiny_patch16_224", depth=1, img_size=32)
    vitkit.save_pretrained(model, tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())

    config["config"]["depth"] = 2
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"model.safetensors is a ViT with depth 1, the model has 2: .* depth=1"):
        vitkit.from_pretrained(tmp_path)

    config["config"]["depth"], config["config"]["embed_dim"] = 1, 96
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"is a ViT with embed_dim 192, the model has 96: .* embed_dim=192"):
        vitkit.from_pretrained(tmp_path)

    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match="config.json is not valid JSON"):
        vitkit.from_pretrained(tmp_path)

    (tmp_path / "config.json").write_text(json.dumps({"format_version": 5, "family": "vit", "config": {"depht": 1}}))
    with pytest.raises(ValueError, match=r"field\(s\) \['depht'\] that ViTConfig does not know"):
        vitkit.from_pretrained(tmp_path)

    vitkit.save_pretrained(model, tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"\x00garbage")
    with pytest.raises(ValueError, match="model.safetensors is not a readable safetensors file"):
        vitkit.from_pretrained(tmp_path)


def test_save_rejects_foreign_modules(tmp_path):
    with pytest.raises(ValueError, match="Linear is not a vitkit model"):
        vitkit.save_pretrained(torch.nn.Linear(2, 2), tmp_path)


def test_an_unknown_override_is_the_callers_not_the_files(tmp_path):
    """A field given to replace one of a saved config's that the config has not is worded as `create_model` words
    it, not blamed on the directory's config.json (which `from_pretrained` and `vitkit train --init` read)."""
    from vitkit.weights import saved_config

    vitkit.save_pretrained(vitkit.create_model("vit_digits_patch7_28"), tmp_path)
    for load in (vitkit.from_pretrained, saved_config):
        with pytest.raises(ValueError, match=r"ViTConfig has no field\(s\) \['deptth'\]; its fields are") as err:
            load(tmp_path, deptth=2)
        assert "config.json" not in str(err.value)
