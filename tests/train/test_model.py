"""Fine-tuning initialisation and gradient checkpointing."""

from __future__ import annotations

import copy

import pytest
import torch
from timm.layers import resample_abs_pos_embed as timm_resample

from vitkit import create_model, save_pretrained
from vitkit.cli.messages import TRAIN, cli_message
from vitkit.train import enable_grad_checkpointing, load_for_finetune
from vitkit.weights import ModelNeeded, load_report, model_info

TINY = dict(img_size=28, patch_size=7, embed_dim=16, depth=2, num_heads=2, num_classes=10)


def test_finetune_resamples_positions_and_replaces_a_head_of_another_size(tmp_path):
    torch.manual_seed(0)
    source = create_model("vit_tiny_patch16_224", **TINY)
    save_pretrained(source, tmp_path)
    model = load_for_finetune(str(tmp_path), num_classes=3, img_size=56)
    assert model.config.num_classes == 3 and model.config.img_size == 56
    reference_pos = timm_resample(source.pos_embed.detach(), (8, 8), (4, 4), num_prefix_tokens=1)
    torch.testing.assert_close(model.pos_embed.detach(), reference_pos)
    state, source_state = model.state_dict(), source.state_dict()
    for name, value in state.items():
        if name.startswith("head."):
            assert value.shape[0] == 3
        elif name != "pos_embed":
            assert torch.equal(value, source_state[name]), name
    same = load_for_finetune(str(tmp_path), num_classes=10)
    assert all(torch.equal(v, source_state[k]) for k, v in same.state_dict().items())


def test_finetune_from_a_timm_repository_on_the_hub(hub_cache, timm_vit):
    """--init hf-hub:timm/NAME.TAG (a timm repository in the test's offline cache): the model of its config.json,
    every tensor but the head as timm's, the position table resampled, the source recorded at its commit; the same
    with --model naming the variant."""
    theirs, folder = timm_vit
    hub_cache.put("timm/vit_tiny_patch16_224.augreg_in21k_ft_in1k", folder)
    source = "hf-hub:timm/vit_tiny_patch16_224.augreg_in21k_ft_in1k"
    for model in (
        load_for_finetune(source, num_classes=3, img_size=112),
        load_for_finetune(source, num_classes=3, model="vit_tiny_patch16_224", img_size=112),
    ):
        assert model.head.weight.shape == (3, 192) and model.pos_embed.shape == (1, 50, 192)
        assert torch.equal(model.blocks[11].attn.qkv.weight, theirs.blocks[11].attn.qkv.weight)
        assert load_report(model).source == f"{source}@0123456789abcdef0123456789abcdef01234567"
        assert model_info(model).classes is None  # ImageNet's names are not the data's
        assert model_info(model).mean == (0.5, 0.5, 0.5)  # the weights' normalisation, with --model too


def test_finetune_refuses_shapes_it_cannot_adapt(tmp_path):
    save_pretrained(create_model("vit_tiny_patch16_224", **TINY), tmp_path)
    with pytest.raises(ValueError):
        load_for_finetune(str(tmp_path), num_classes=10, embed_dim=32)


def test_a_checkpoint_file_alone_needs_the_model_named(tmp_path):
    torch.save(create_model("vit_tiny_patch16_224", **TINY).state_dict(), tmp_path / "w.pt")
    with pytest.raises(ModelNeeded, match="w.pt is a checkpoint file without a config") as caught:
        load_for_finetune(tmp_path / "w.pt", num_classes=10)
    assert "vitkit.create_model(name)" in str(caught.value)
    assert "name the model with --model" in cli_message(caught.value, TRAIN)


def test_grad_checkpointing_recomputes_blocks_and_keeps_gradients():
    torch.manual_seed(0)
    plain = create_model("vit_tiny_patch16_224", **TINY).train()
    wrapped = copy.deepcopy(plain)
    assert enable_grad_checkpointing(wrapped) == 2
    assert list(wrapped.state_dict()) == list(plain.state_dict())
    calls = []
    for block in wrapped.blocks:
        block.norm1.register_forward_pre_hook(lambda *_: calls.append(1))  # the first thing a block computes
    x = torch.randn(3, 3, 28, 28)
    plain(x).square().sum().backward()
    wrapped(x).square().sum().backward()
    assert len(calls) == 4  # each block's forward ran twice: once forward, once recomputed in backward
    for (name, p), q in zip(plain.named_parameters(), wrapped.parameters(), strict=True):
        torch.testing.assert_close(q.grad, p.grad, msg=name)
    calls.clear()
    with torch.no_grad():
        torch.testing.assert_close(wrapped.eval()(x), plain.eval()(x))
    assert len(calls) == 2
    copied = copy.deepcopy(wrapped)  # the EMA copy: its blocks must run its own weights
    with torch.no_grad():
        copied.blocks[0].attn.proj.weight.zero_()
        assert not torch.allclose(copied(x), wrapped(x))


def test_grad_checkpointing_needs_a_vitkit_model():
    with pytest.raises(ValueError, match="gradient checkpointing needs a vitkit model .* Linear lacks config, "):
        enable_grad_checkpointing(torch.nn.Linear(2, 2))


def test_finetune_with_a_model_named_reads_a_folder_whose_config_is_none_of_a_model(tmp_path):
    """A folder of weights beside a config.json that names no model (another tool's): with --model naming the
    architecture its weights load, as before, and nothing is read from that config."""
    from safetensors.torch import save_file

    source = create_model("vit_tiny_patch16_224", **TINY)
    save_file(source.state_dict(), tmp_path / "model.safetensors")
    (tmp_path / "config.json").write_text('{"note": "written by another tool"}')
    fields = {k: v for k, v in TINY.items() if k != "num_classes"}
    model = load_for_finetune(str(tmp_path), num_classes=TINY["num_classes"], model="vit_tiny_patch16_224", **fields)
    assert torch.equal(model.blocks[0].attn.qkv.weight, source.blocks[0].attn.qkv.weight)
    assert model_info(model).mean is None
