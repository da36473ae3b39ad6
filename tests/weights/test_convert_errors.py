"""Bad checkpoints give a clear ValueError / OSError naming the file; nothing in a file is ever run."""

import json
import pickle
import re

import pytest
import torch
import torchvision
from safetensors.torch import save_file
from torchvision.models.vision_transformer import VisionTransformer

import vitkit

TINY = dict(img_size=32, patch_size=4, embed_dim=32, depth=2, num_heads=4, mlp_ratio=2.0, num_classes=5)


def tiny_vit() -> torch.nn.Module:
    return vitkit.create_model("vit_base_patch16_224", **TINY)


class CreatesMarker:
    """Unpickling this calls open(marker, "w"): the file appears if a loader runs code from the pickle."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return open, (self.marker, "w")


def test_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match=re.escape(f"{tmp_path / 'nope.pth'} not found")):
        vitkit.load_weights(tiny_vit(), tmp_path / "nope.pth")
    with pytest.raises(FileNotFoundError, match="holds no weight file: expected one of"):
        vitkit.load_weights(tiny_vit(), tmp_path)


@pytest.mark.parametrize("suffix", [".pth", ".safetensors"])
def test_truncated_file(tmp_path, suffix):
    path = tmp_path / f"ckpt{suffix}"
    state = tiny_vit().state_dict()
    torch.save(state, path) if suffix == ".pth" else save_file(state, path)
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    kind = "PyTorch checkpoint (truncated or damaged)" if suffix == ".pth" else "safetensors file"
    with pytest.raises(ValueError, match=re.escape(f"{path} is not a readable {kind}")):
        vitkit.load_weights(tiny_vit(), path)


@pytest.mark.parametrize(
    "content", [b"", b"\x80\x02garbage" * 40, bytes(range(256)) * 4], ids=["empty", "pickle", "bin"]
)
def test_garbage_file(tmp_path, content):
    path = tmp_path / "ckpt.bin"
    path.write_bytes(content)
    with pytest.raises(ValueError, match=re.escape(f"{path} is not a readable PyTorch checkpoint")):
        vitkit.load_weights(tiny_vit(), path)


@pytest.mark.filterwarnings("ignore:Detected pickle protocol")
def test_pickle_that_runs_code_is_refused(tmp_path):
    marker = tmp_path / "marker"
    path = tmp_path / "evil.pth"
    torch.save({**tiny_vit().state_dict(), "payload": CreatesMarker(marker)}, path)
    with pytest.raises(ValueError, match=re.escape(f"{path} refused: its pickle would call ") + r".*open"):
        vitkit.load_weights(tiny_vit(), path)
    assert not marker.exists()

    plain = tmp_path / "evil.bin"  # a plain pickle, not torch.save's zip archive
    plain.write_bytes(pickle.dumps(CreatesMarker(marker)))
    with pytest.raises(ValueError, match=re.escape(str(plain))):
        vitkit.load_weights(tiny_vit(), plain)
    assert not marker.exists()

    hf_dir = tmp_path / "hf"  # through a Hugging Face directory's pytorch_model.bin
    hf_dir.mkdir()
    (hf_dir / "config.json").write_text(json.dumps({"model_type": "vit", "hidden_size": 32}))
    torch.save({"payload": CreatesMarker(marker)}, hf_dir / "pytorch_model.bin")
    with pytest.raises(ValueError, match=re.escape(f"{hf_dir / 'pytorch_model.bin'} refused")):
        vitkit.from_pretrained(hf_dir)
    assert not marker.exists()


def test_checkpoint_of_another_architecture(tmp_path):
    path = tmp_path / "resnet18.pth"
    torch.save(torchvision.models.resnet18(num_classes=5).state_dict(), path)
    with pytest.raises(ValueError, match=re.escape(f"{path} is not a checkpoint of a vit model in a known format")):
        vitkit.load_weights(tiny_vit(), path)

    deeper = tmp_path / "vit3.pth"
    torch.save(
        VisionTransformer(32, 4, num_layers=3, num_heads=4, hidden_dim=32, mlp_dim=64, num_classes=5).state_dict(),
        deeper,
    )
    message = f"{deeper} is a ViT with depth 3, the model has 2: build the model with depth=3"
    with pytest.raises(ValueError, match=re.escape(message)):
        vitkit.load_weights(tiny_vit(), deeper)


def test_not_a_state_dict(tmp_path):
    path = tmp_path / "list.pt"
    torch.save([torch.zeros(2)], path)
    with pytest.raises(ValueError, match=re.escape(f"{path} holds a list, expected a state dict")):
        vitkit.load_weights(tiny_vit(), path)
    torch.save({"epoch": 3, "weights": [torch.zeros(1)]}, path)
    with pytest.raises(ValueError, match=r"none of the entries \['state_dict', 'model', 'model_ema'\]"):
        vitkit.load_weights(tiny_vit(), path)
    (tmp_path / "ckpt.npy").write_bytes(b"\x93NUMPY")
    with pytest.raises(ValueError, match="unknown checkpoint type '.npy'"):
        vitkit.load_weights(tiny_vit(), tmp_path / "ckpt.npy")


def test_hf_directories_vitkit_cannot_build(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert"}))
    save_file({"x": torch.zeros(1)}, tmp_path / "model.safetensors")
    with pytest.raises(
        ValueError,
        match=r"model_type 'bert' is not supported; supported: \['clip', 'clip_vision_model', 'deformable_detr', "
        r"'deit', 'detr', 'dinov2', 'dinov2_with_registers', 'siglip', 'siglip_vision_model', 'swin', 'vit', "
        r"'vitdet'\]",
    ):
        vitkit.from_pretrained(tmp_path)

    import transformers

    config = transformers.ViTConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64)
    transformers.ViTModel(config, add_pooling_layer=False).save_pretrained(tmp_path / "act")
    settings = json.loads((tmp_path / "act" / "config.json").read_text())
    (tmp_path / "act" / "config.json").write_text(json.dumps({**settings, "hidden_act": "silu"}))
    with pytest.raises(ValueError, match="hidden_act 'silu' is not supported"):
        vitkit.from_pretrained(tmp_path / "act")

    deit = transformers.DeiTConfig(**{**settings, "model_type": "deit", "num_labels": 3, "hidden_act": "gelu"})
    single_head = transformers.DeiTForImageClassification(deit).eval()
    single_head.save_pretrained(tmp_path / "deit")
    with pytest.raises(ValueError, match="is a DeiTForImageClassification: a distillation token but one classifier"):
        vitkit.from_pretrained(tmp_path / "deit")
    # Its encoder loads into a distilled model that keeps its own heads.
    encoder = dict(embed_dim=32, depth=1, num_heads=4, mlp_ratio=2.0, layer_norm_eps=1e-12)
    ours = vitkit.create_model("deit_tiny_distilled_patch16_224", **encoder).eval()
    assert vitkit.load_weights(ours, tmp_path / "deit", reset_head=True).head_reset
    x = torch.randn(1, 3, 224, 224)
    with torch.no_grad():
        expected = single_head.deit(pixel_values=x).last_hidden_state
        torch.testing.assert_close(ours.forward_features(x), expected, atol=1e-5, rtol=1e-5)


def test_fields_that_would_not_make_the_model_fit_say_so(tmp_path):
    """timm's EVA-02 has a ViT's patch embedding, position table and blocks, so its shapes read as ViT settings; but
    its attention has separate q and v biases: the error says that those settings alone would leave its keys
    unmatched, not only which to set. A plain ViT of another width gets the settings alone."""
    import timm

    eva = timm.create_model("eva02_tiny_patch14_224", pretrained=False).state_dict()
    with pytest.raises(vitkit.weights.CheckpointMismatch) as err:
        vitkit.load_weights(vitkit.create_model("vit_tiny_patch16_224"), eva)
    unmatched = r"Those settings alone would leave \d+ of its keys unmatched \(blocks.0.attn.q_bias"
    assert re.search(unmatched, str(err.value))
    assert "architecture vitkit does not read" in str(err.value) and err.value.fields["qkv_bias"] is False
    tiny = vitkit.create_model("vit_tiny_patch16_224", depth=2).state_dict()
    with pytest.raises(vitkit.weights.CheckpointMismatch) as err:
        vitkit.load_weights(vitkit.create_model("vit_small_patch16_224", depth=2), tiny)
    assert "alone would leave" not in str(err.value) and err.value.fields["embed_dim"] == 192


def test_a_file_without_a_config_names_both_lists_of_models(tmp_path):
    """Read from Python or reached from a command, the message names both ways to the registered models."""
    torch.save(tiny_vit().state_dict(), tmp_path / "w.pth")
    with pytest.raises(ValueError) as caught:
        vitkit.from_pretrained(tmp_path / "w.pth")
    assert str(caught.value) == (
        f"{tmp_path / 'w.pth'} is a checkpoint file without a config: build the registered model it fits and load "
        "the file into it (vitkit.create_model(name), vitkit.load_weights(model, path); see `vitkit models` / "
        "vitkit.list_models())"
    )
